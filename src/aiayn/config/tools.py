"""The settings of the tools other than train (conf/evaluate.yaml, translate.yaml, average.yaml,
export.yaml, visualize.yaml, prepare.yaml) as schemas: each tool's config starts from its schema
(``defaults: [/schema/tool/<tool>@_here_, ...]``), so a setting a tool does not have, or a value of
the wrong type, is refused in one line while Hydra composes, before anything is loaded. What types
cannot say (ranges, paths, one setting against another) each tool checks itself; ``ckpt`` is
typed ``Any`` because it may be a list (aiayn.checkpoints.given).

The defaults live here, one place each; a tool's yaml sets only what needs an interpolation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# The noqa comments: OmegaConf reads these annotations and takes Optional[...], not X | None.
# ``decoding`` is typed by the tools' yaml (``/schema/decoding_overrides@decoding``), after the
# task that evaluate.py may compose with its own decoding.


@dataclass
class DecodeSwitches:
    """Switches that make decoding faster (aiayn.decoding.speed), and the batch; evaluate and translate take them."""

    precision: str = "fp32"  # fp32 | bf16 | fp16: weights and activations in that type (bf16/fp16 for GPUs)
    int8: bool = False  # int8 dynamic quantisation of the linear layers (CPU; outputs change a little)
    compile: bool = False  # the decoder step through torch.compile (GPU; on a CPU minutes of compiling for ~1.1×)
    # fp32 products through oneDNN, weights packed once (CPU; faster on AMD CPUs; last bits differ from the default)
    onednn: bool = False
    # the incremental decoder step through ONNX Runtime (CPU; the onnx extra; last bits differ from the default)
    onnxruntime: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:<index>
    # sentences of similar length a batch; one default for evaluate, translate and aiayn.load's model.translate, so
    # that their samples (decoding.sampling) match for the same seed and input
    batch_size: int = 128


@dataclass
class EvaluateConfig(DecodeSwitches):
    # one checkpoint file (step…ckpt or last.ckpt), or a list of several: an ensemble
    ckpt: Any = MISSING
    split: str = "test"  # test | val | a split name of the task (e.g. test_2017_flickr, newstest2013)
    # k: average ckpt and the k-1 checkpoints before it by step in its folder (§6.1: 5 base, 20 big)
    average_last: Optional[int] = None  # noqa: UP045
    decoding: Any = None  # typed by schema/decoding_overrides (the yaml's defaults); null: the checkpoint's own
    # tokens a batch of the perplexity pass; null: the task's evaluation batch (task.datamodule.eval_max_tokens),
    # as its validation and test had it
    max_tokens: Optional[int] = None  # noqa: UP045
    out: Optional[str] = None  # noqa: UP045  the folder to write into; null: <run dir>/eval (eval/ beside a checkpoint outside a run)
    # auto (online with an API key, else offline) | online | offline | disabled; null: as its training
    # run, auto where that logged to W&B, else disabled (aiayn.cli.evaluation_runs)
    wandb: Optional[str] = None  # noqa: UP045
    # an MLflow tracking URI (logger.mlflow's store, e.g. sqlite:///mlruns/mlflow.db): the evaluation is
    # also a run there, in the training run's experiment; null ($MLFLOW_TRACKING_URI unset in conf/evaluate.yaml):
    # the training run's store where it logged to MLflow, else none
    mlflow: Optional[str] = None  # noqa: UP045
    task: Any = None  # task=<name>: conf/task/<name>.yaml instead of the checkpoint's task
    # paths.data_root: where the task's files are read (conf/evaluate.yaml: $AIAYN_DATA_ROOT, else the checkpoint's run's)
    paths: Any = None


@dataclass
class TranslateConfig(DecodeSwitches):
    ckpt: Any = MISSING  # the checkpoint (engine=aiayn), or a list of several: an ensemble
    engine: str = "aiayn"  # aiayn | ctranslate2: a CTranslate2 export of src/export.py, given as model_dir=
    model_dir: Optional[str] = None  # noqa: UP045  engine=ctranslate2: the exported folder
    average_last: Optional[int] = None  # noqa: UP045  k: the average of ckpt and the k-1 before it (§6.1)
    input: Optional[str] = None  # noqa: UP045  the file to translate (null or -: stdin)
    out: Optional[str] = None  # noqa: UP045  the file to write, its folder created (null or -: stdout)
    decoding: Any = None  # typed by schema/decoding_overrides; null: the checkpoint's (the export's) own
    buffer_size: int = 4096  # lines read, sorted by length and batched together
    # true: each line answered alone as soon as read; false: whole chunks; auto: true for a terminal,
    # and from a pipe the lines that have arrived are translated before waiting for more.
    interactive: Any = "auto"


@dataclass
class AverageConfig:
    ckpt: Any = MISSING  # the newest checkpoint to average (a file), or a run dir / its checkpoints/ (its newest)
    # how many checkpoints, ending at ckpt; null: the run's own checkpoint.average_last (§6.1: base 5, big 20)
    average_last: Optional[int] = None  # noqa: UP045
    out: str = MISSING  # the averaged checkpoint to write


@dataclass
class ExportConfig:
    ckpt: Any = MISSING  # one checkpoint file (step…ckpt or last.ckpt)
    format: str = "hf"  # hf | ctranslate2
    out: str = MISSING  # the folder to write (new, empty, or an earlier export, which is replaced)
    average_last: Optional[int] = None  # noqa: UP045  k: the average of ckpt and the k-1 before it (§6.1)
    quantization: Optional[str] = None  # noqa: UP045  format=ctranslate2: int8, int8_float32, float16, ...
    decoding: Any = None  # typed by schema/decoding_overrides: what the export records; null: the checkpoint's


@dataclass
class VisualizeConfig:
    ckpt: Any = None  # a checkpoint written by src/train.py
    text: str = "A man is riding a bike."
    out: Optional[str] = None  # noqa: UP045  default: <run>/attention/<checkpoint>_<sentence> (training's pictures kept)
    device: str = "auto"  # auto | cpu | cuda | cuda:<index>
    positional_encoding: bool = True  # also draw positional_encoding.png (§3.5, the model's d_model)
    positional_encoding_positions: int = 128
    decoding: Any = None  # typed by schema/decoding_overrides; null: the checkpoint's own


@dataclass
class PrepareConfig:
    seed: int = 1234
    task: Any = MISSING  # task=<name>: no default, as preparing WMT14 downloads gigabytes
    paths: Any = None
    decoding: Any = None  # what the task decodes with (conf/decoding/): composed with it, unused here


TOOLS = {"evaluate": EvaluateConfig, "translate": TranslateConfig, "average": AverageConfig,
         "export": ExportConfig, "visualize": VisualizeConfig, "prepare": PrepareConfig}

for _name, _schema in TOOLS.items():
    ConfigStore.instance().store(group="schema/tool", name=_name, node=_schema)
