"""The Lightning Trainer's arguments as a schema (``trainer.*``), so that conf/train.yaml sets only
what aiayn changes and every other argument is still one ``trainer.<name>=`` away, typo-checked
while Hydra composes (``trainer.max_step=10`` is refused, naming the schema).

Lightning's own defaults, as its Trainer's signature gives them (``logger``, ``callbacks`` and
``plugins`` are left out: src/train.py passes them). tests/config/test_trainer_schema.py checks
this against the installed Lightning, so that it cannot drift. Importing this module does not
import Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Trainer arguments src/train.py gives itself.
PASSED_BY_TRAIN = ("logger", "callbacks", "plugins")


@dataclass
class TrainerConfig:
    """lightning.pytorch.Trainer's arguments and defaults (Lightning 2.6)."""

    accelerator: Any = "auto"
    strategy: Any = "auto"
    devices: Any = "auto"
    num_nodes: Any = 1
    precision: Any = None
    fast_dev_run: Any = False
    max_epochs: Any = None
    min_epochs: Any = None
    max_steps: Any = -1
    min_steps: Any = None
    max_time: Any = None
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    limit_predict_batches: Any = None
    overfit_batches: Any = 0.0
    val_check_interval: Any = None
    check_val_every_n_epoch: Any = 1
    num_sanity_val_steps: Any = None
    log_every_n_steps: Any = None
    enable_checkpointing: Any = None
    enable_progress_bar: Any = None
    enable_model_summary: Any = None
    accumulate_grad_batches: Any = 1
    gradient_clip_val: Any = None
    gradient_clip_algorithm: Any = None
    deterministic: Any = None
    benchmark: Any = None
    inference_mode: Any = True
    use_distributed_sampler: Any = True
    profiler: Any = None
    detect_anomaly: Any = False
    barebones: Any = False
    sync_batchnorm: Any = False
    reload_dataloaders_every_n_epochs: Any = 0
    default_root_dir: Any = None
    enable_autolog_hparams: Any = True
    model_registry: Any = None
