"""The Lightning Trainer's arguments as a schema (``trainer.*``), so that conf/train.yaml sets only
what aiayn changes and every other argument is still one ``trainer.<name>=`` away, typo-checked
while Hydra composes (``trainer.max_step=10`` is refused, naming the schema).

Lightning's own defaults, as its Trainer's signature gives them (``logger``, ``callbacks`` and
``plugins`` are left out: train.py (aiayn.cli.train_run) passes them). tests/config/test_trainer_schema.py checks
this against the installed Lightning, so that it cannot drift. Importing this module does not
import Lightning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiayn.errors import ConfigError

# Trainer arguments train.py (aiayn.cli.train_run) gives itself.
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


def check_length(trainer: Mapping[str, Any], train_steps: Any) -> None:
    """A run trains ``optim.train_steps`` steps: ``trainer.max_steps`` is derived from it
    (conf/train.yaml) and ``trainer.max_epochs`` stays -1 (no limit), so that no second setting
    stops training at another step than the plan says; no lower bound it cannot meet, and validation
    by steps, not in every n-th epoch. A ConfigError naming the one to give instead."""
    steps, epochs = trainer.get("max_steps"), trainer.get("max_epochs")
    # null given (a key left out is not): Lightning's Trainer would fail on it (before: "'<' not supported ...")
    if train_steps is not None and (steps is not None or "max_steps" in trainer) and steps != train_steps:
        wanted = f"optim.train_steps={steps}" if _whole(steps) and steps > 0 else "optim.train_steps"
        raise ConfigError(f"trainer.max_steps={'null' if steps is None else steps} differs from optim.train_steps="
                          f"{train_steps}, the run's steps (trainer.max_steps follows it); give {wanted} instead")
    if epochs is not None and (not _whole(epochs) or epochs != -1):
        raise ConfigError(f"trainer.max_epochs={epochs} could stop training before optim.train_steps={train_steps} "
                          f"steps; a run trains optim.train_steps steps, however many epochs they take: leave "
                          f"trainer.max_epochs at -1 and give optim.train_steps")
    # Lightning's lower bounds never make a run longer than max_steps: one above it is never met.
    least = trainer.get("min_steps")
    if least is not None and (not _whole(least) or least < 0):
        raise ConfigError(f"trainer.min_steps must be a whole number of steps, 0 or more (the steps before early "
                          f"stopping may end a run; null: none), got {least!r}")
    if least is not None and train_steps is not None and least > train_steps:
        raise ConfigError(f"trainer.min_steps={least} is more than optim.train_steps={train_steps}, the run's steps, "
                          f"so it cannot be met; give optim.train_steps={least} to train that long")
    if trainer.get("min_epochs") is not None:
        raise ConfigError(f"trainer.min_epochs={trainer['min_epochs']}: a run's length is counted in steps "
                          f"(optim.train_steps), not epochs; leave trainer.min_epochs out (trainer.min_steps: the "
                          f"steps before early stopping may end a run)")
    # The plan validates every trainer.val_check_interval steps; Lightning would do it only in every n-th epoch.
    if trainer.get("check_val_every_n_epoch") is not None:
        raise ConfigError(f"trainer.check_val_every_n_epoch={trainer['check_val_every_n_epoch']}: a run validates "
                          f"every trainer.val_check_interval optimizer steps, whatever the epoch; leave "
                          f"trainer.check_val_every_n_epoch at null and set trainer.val_check_interval")
    check_validation_interval(trainer)


def check_validation_interval(trainer: Mapping[str, Any]) -> None:
    """A ConfigError unless ``trainer.val_check_interval`` is a whole number of steps (null: every
    epoch), which the plan counts and describes. A fraction of an epoch is refused here: Lightning
    takes one only with ``trainer.check_val_every_n_epoch`` set, which :func:`check_length` keeps
    null (before: shown as planned by ``--cfg job``, then refused by Lightning's Trainer naming
    ``check_val_every_n_epoch=None``)."""
    interval = trainer.get("val_check_interval")
    if interval is not None and (not _whole(interval) or interval <= 0):
        raise ConfigError(f"trainer.val_check_interval must be a whole number of steps (null: every epoch; a run "
                          f"validates across epochs, not at a fraction of one), got {interval!r}")


# Lightning's batch limits, each a fraction of the batches or a whole number of them, and what null means.
BATCH_LIMITS = {"limit_train_batches": "null: every batch", "limit_val_batches": "null: every batch",
                "limit_test_batches": "null: every batch", "limit_predict_batches": "null: every batch",
                "overfit_batches": "0: off"}


def check_lightning_values(trainer: Mapping[str, Any]) -> None:
    """A ConfigError for a value Lightning's Trainer would refuse only when a run builds it (after
    the data are prepared), so that ``--cfg job`` refuses it too, in the same line: the precision,
    the batch limits, the smoke test's steps, the clipping algorithm and the time limit."""
    precision = trainer.get("precision")
    if precision is not None and str(precision).strip().lower() != "auto":
        taken = _precisions()
        if str(precision) not in taken:  # as aiayn.config.hardware gives it to Lightning
            raise ConfigError(f"trainer.precision={precision} is not a precision Lightning takes; give one of "
                              f"{', '.join(taken)} (null: bf16-mixed or 16-mixed on a GPU, 32-true on the CPU)")
    for key, otherwise in BATCH_LIMITS.items():
        value = trainer.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                                  or (value > 1 and value % 1)):
            raise ConfigError(f"trainer.{key} must be a fraction of the batches in [0.0, 1.0] or a whole number of "
                              f"batches ({otherwise}), got {value!r}")
    smoke = trainer.get("fast_dev_run")
    if smoke is not None and not isinstance(smoke, bool) and (not _whole(smoke) or smoke < 0):
        raise ConfigError(f"trainer.fast_dev_run must be true, false or a whole number of steps, 0 or more (Lightning's "
                          f"smoke test), got {smoke!r}")
    algorithm = trainer.get("gradient_clip_algorithm")
    if algorithm is not None and str(algorithm).lower() not in ("norm", "value"):
        raise ConfigError(f"trainer.gradient_clip_algorithm must be norm or value (null: norm), got {algorithm!r}")
    _check_time_limit(trainer.get("max_time"))


# What Lightning's Timer takes for trainer.max_time: DD:HH:MM:SS, or a mapping of timedelta's arguments.
_DURATION = re.compile(r"(\d+):(\d\d):(\d\d):(\d\d)")
_TIMEDELTA_KEYS = ("weeks", "days", "hours", "minutes", "seconds", "milliseconds", "microseconds")


def _check_time_limit(limit: Any) -> None:
    """``trainer.max_time`` as the Timer takes it; a number of seconds or ``H:MM:SS`` gets the value to give."""
    if limit is None or (isinstance(limit, str) and _DURATION.fullmatch(limit.strip())):
        return
    if isinstance(limit, Mapping):
        if limit and all(key in _TIMEDELTA_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool)
                         for key, value in limit.items()):
            return
        raise ConfigError(f"trainer.max_time={dict(limit)}: a mapping takes numbers for {', '.join(_TIMEDELTA_KEYS)} "
                          "(e.g. trainer.max_time={hours:12}), or give DD:HH:MM:SS (00:12:00:00)")
    seconds = _seconds(limit)
    example = "00:12:00:00 for 12 hours" if seconds is None else (
        f"{seconds // 86400:02d}:{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}")
    raise ConfigError(f"trainer.max_time={limit} is not a duration Lightning takes; give DD:HH:MM:SS "
                      f"(trainer.max_time={example}) or a mapping such as {{hours:12}}")


def _seconds(limit: Any) -> int | None:
    """A whole number of seconds, or ``[[H:]M]:S`` read as such; None for anything else."""
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
        return limit
    parts = str(limit).strip().split(":")
    if 1 < len(parts) <= 3 and all(part.isdigit() for part in parts):
        return sum(int(part) * 60 ** power for power, part in enumerate(reversed(parts)))
    return None


def rank_limits(trainer: Mapping[str, Any], processes: int, accumulate: int) -> dict[str, int]:
    """What Lightning is given for the batch limits that are whole numbers (``trainer.limit_train_batches``,
    ``overfit_batches``, ``limit_val_batches``, ``limit_test_batches``), which count the batches of the run's
    whole order, every process's: Lightning counts each process's, so each gets its share (rank r takes
    batches r, r + processes, …; an evaluation's share rounded up), and the epoch, its steps and the
    batches scored are the same on any number of processes (before: the number was each process's,
    so the recipe and the dev and test figures changed with them). A ConfigError for an epoch cut
    inside a step of ``processes`` × ``accumulate`` batches, which Lightning would take short (fewer
    tokens than the plan's step, and validation off its steps); ``overfit_batches`` is the epoch's
    limit in ``limit_train_batches``' place."""
    key = "overfit_batches" if _number(trainer.get("overfit_batches")) and trainer["overfit_batches"] > 0 else \
        "limit_train_batches"
    limit, step = trainer.get(key), processes * accumulate
    # a number of batches cuts a step unless a multiple of it; a fraction (of each process's, whose counts are equal),
    # unless each process takes one batch a step  (other values: refused as Lightning's)
    cuts = limit % step != 0 if _whole(limit) else accumulate > 1 and limit != 1.0
    if step > 1 and _number(limit) and limit >= 0 and cuts:
        inside = f"a step of {accumulate} accumulated batches" if processes == 1 else \
            f"a step of {step} batches ({processes} processes × {accumulate})"
        raise ConfigError(f"trainer.{key}={limit} ends an epoch inside {inside}, which Lightning would take short "
                          f"(fewer tokens than the plan's step, validation off its steps); give a whole number of "
                          f"batches, a multiple of {step} ({BATCH_LIMITS[key]})")
    shares = {}
    for name in ("limit_train_batches", "overfit_batches", "limit_val_batches", "limit_test_batches"):
        value = trainer.get(name)
        if processes > 1 and _whole(value) and value > 0:
            shares[name] = value // processes if name in ("limit_train_batches", "overfit_batches") else \
                -(-value // processes)
    return shares


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _precisions() -> tuple[str, ...]:
    """The precisions Lightning's Trainer takes, as strings (``16`` and ``"16"`` alike)."""
    from typing import get_args

    from lightning.fabric.connector import _PRECISION_INPUT_INT, _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    return tuple(dict.fromkeys(str(value) for kind in (_PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS,
                                                       _PRECISION_INPUT_INT) for value in get_args(kind)))


def smoke_test(trainer: Mapping[str, Any]) -> int:
    """The steps of Lightning's smoke test (``trainer.fast_dev_run``: true is 1), 0 for none."""
    value = trainer.get("fast_dev_run")
    return int(value) if isinstance(value, (bool, int)) and value else 0


def stopped_sooner(trainer: Mapping[str, Any]) -> str:
    """What may end training before ``optim.train_steps``, as the plan says it: Lightning's smoke
    test (``trainer.fast_dev_run``), ``trainer.max_time`` (a wall-time limit), or nothing."""
    steps = smoke_test(trainer)
    if steps:
        return (f" (trainer.fast_dev_run={trainer['fast_dev_run']}: Lightning's smoke test instead, {steps} "
                f"step{'s' if steps > 1 else ''} and as many batches of validation and test, no checkpoint, no logger)")
    limit = trainer.get("max_time")
    return f" (or trainer.max_time={limit}, whichever comes first)" if limit else ""


def warmup_outlasts_the_run(optim: Mapping[str, Any], trainer: Mapping[str, Any]) -> str | None:
    """The warning of a warmup longer than the run (``optim.warmup_steps`` above ``optim.train_steps``, which
    ``trainer.max_steps`` follows): Eq. 3's rate rises through every step and never reaches its peak. A warning, not
    a refusal: a short debugging run may keep its recipe's warmup. Not at equality, where the last step takes the peak
    (``debug=tiny optim.train_steps=2``, as the tests run it: a run of warmup alone, said by the plan's steps and
    warmup line), nor for Lightning's smoke test (``trainer.fast_dev_run``), whose steps are not the schedule's."""
    warmup, steps = optim.get("warmup_steps"), optim.get("train_steps")
    if not (_whole(warmup) and _whole(steps) and warmup > steps > 0) or smoke_test(trainer):
        return None
    return (f"optim.warmup_steps={warmup:,} is more than the run's optim.train_steps={steps:,}: the learning rate rises "
            f"through every step to {steps / warmup:.0%} of Eq. 3's peak and never decays; give optim.warmup_steps="
            f"{steps} or less to reach it (a short debugging run may leave it)")


def validation(trainer: Mapping[str, Any], every_steps: int | None, train_steps: Any = None) -> str:
    """When a run of these ``trainer.*`` settings validates, as the plan says it: ``every_steps``
    (trainer.val_check_interval in optimizer steps; more than the run's ``train_steps``: none before its end), every
    epoch (null), or never (``trainer.limit_val_batches=0``)."""
    if trainer.get("limit_val_batches") == 0:
        return "never (trainer.limit_val_batches=0)"
    if every_steps and _whole(train_steps) and every_steps > train_steps:  # (before: "every 5,000 steps", unqualified)
        return f"every {every_steps:,} steps, more than the run's {train_steps:,}: none before its end"
    return f"every {every_steps:,} steps" if every_steps else "every epoch"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
