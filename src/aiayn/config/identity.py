"""What a run is, as the trackers show it: its name, group and tags (``logger.wandb.name`` …,
``logger.mlflow.run_name`` …), its scale, and whether it still is the paper row it names.

* **name**: ``run_name`` (``table3-A_h1``, ``multi30k_en_de-small``), the scale, then the job's
  own overrides (``seed=2``, ``model.dropout=0.2``; not ``task=``, ``model=`` where the run name
  says them): unique among the jobs of a sweep; runs of one
  command started in the same second (folders ``<date>_<time>``, ``<date>_<time>-2``) add ``#2``, ...
* **group**: ``run_group`` when set (``experiments/tables.py run`` sets the one its root recorded in
  ``<root>/group.txt`` on its first run, :func:`kept_group`: the root's last two parts and a random
  suffix, kept by every later run into that root), else the
  sweep's, the same for every job of one ``--multirun``: what the sweep wrote to
  ``<sweep dir>/group.txt`` before its first job (:func:`aiayn.cli.sweep.settle_group`: the folder's
  last two parts and a random suffix, ``multirun/<date>_<time>#1a2b3c``, so that no two sweeps share
  one; a sweep run again with ``resume=auto`` keeps the group of the one it continues); none for a
  single run.
* **tags**: the experiment's (``table3``, ``A``, ``A_h1``), ``task:<task>``, ``model:<model>``,
  ``scale:<scale>``, each override of the job (in one spelling, typed or a sweep's: ``=false``,
  ``=0.1``), and ``modified`` for a row run changed from its row.
* **scale**: ``debug`` (``debug=tiny``), else the experiment's (``multi30k``, ``multi30k_cpu``),
  else ``paper`` for a paper row; none for other runs.

A row run (``experiment=<row>``) is *modified* when its network, recipe (its batches: a smoke test,
``trainer.limit_train_batches``), task (its splits, the length and cleaning of its pairs) or scoring
(decoding, ``validation.bleu_sentences``, ``trainer.limit_val_batches``, ``trainer.limit_test_batches``,
§6.1's checkpoints averaged) differs from the row's at its scale (the row composed with the run's ``+scale=`` alone, so the
scale's own values are the row's): :func:`row_changes` says what differs. Such a run is tagged
``modified``; the tables leave it out.

Registered as ``${aiayn.run:name}`` (``group``, ``tags``, ``scale``), for conf/logger/.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# What makes a row run that row: the network, its widths, the recipe (its length too: a run that may
# stop early, by early stopping or a time limit, is not the row's, which trains optim.train_steps or
# its own time; and its step: an accumulation given outright sets the step in place of
# optim.tokens_per_step; and the batches it trains on: a smoke test, a part of each epoch), the task
# (its pairs: their length and cleaning), and how it is scored (the decoding, the dev and test splits
# and the share of them evaluated, the dev sentences BLEU reads, §6.1's checkpoints averaged): a run
# scored otherwise reports other figures under the row's name. (Where the data are is not: a path of
# the machine a run trained on.)
ROW_KEYS = ("task.name", "task.vocab_size", "task.subword_model", "model", "width_divisor", "loss", "optim",
            "callbacks.early_stopping.patience", "trainer.max_time", "trainer.accumulate_grad_batches", "init_from",
            "trainer.fast_dev_run", "trainer.overfit_batches", "trainer.limit_train_batches",
            "task.datamodule.max_length", "task.datamodule.max_words", "task.datamodule.max_ratio",
            "task.datamodule.val_split", "task.datamodule.test_split", "checkpoint.average_last",
            "checkpoint.average_every_n_steps",
            "decoding", "validation.bleu_sentences", "trainer.limit_val_batches", "trainer.limit_test_batches")
# One process's batch: a row's step where the row sets none to split (optim.tokens_per_step null: a
# scale of one's own; every scale and recipe here sets one, the smoke test's debug=tiny aside), so that row's run with
# another batch is another run; elsewhere it only splits the step.
STEP_BATCH_KEY = "task.datamodule.max_tokens"
# Speed switches compute the same numbers another way: not a change of the row (decoding.kv_cache:
# the same outputs, aiayn.config.schemas.DecodingConfig).
SPEED_KEYS = ("optim.fused", "model.attention", "loss.fused", "decoding.kv_cache")
# The length of a run: a run may resume to train for longer (resume=auto is given for it), and a
# sweep's job resumed for longer is the same job (aiayn.checkpoints.job_folders.job_dirs).
LENGTH_KEYS = ("optim.train_steps",)
# Overrides the name and tags leave out: said already (run_name, run_group, experiment, scale, debug) or not a
# value of the run.
_UNNAMED = ("run_name", "run_group", "experiment", "scale", "debug", "resume", "logger", "trainer.devices", "init_from",
            "task.subword_model")
MODIFIED = "modified"
# The folders of one run name's runs (aiayn.cli.run_folder.new_run_dir): outputs/<run name>/<date>_<time>,
# with -2, -3, ... for runs started in the same second; resume=auto looks through them.
FOLDER_STAMP = "%Y-%m-%d_%H-%M-%S"
STAMPED_FOLDER = re.compile(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d(-\d+)?")
_TAG_LIMIT = 64  # W&B refuses longer tags
# The sweep's group, in its folder (aiayn.cli.sweep.settle_group writes it before the first job starts).
GROUP_FILE = "group.txt"


def setting_differences(before: Mapping[str, Any], after: Mapping[str, Any], keys: Iterable[str],
                        ignored: Sequence[str] = ()) -> list[str]:
    """``key: before's value → after's`` for each of ``keys`` (dotted) that differs; a section
    (``model``) is compared setting by setting, leaving out ``ignored``."""
    differences = []
    for key in keys:
        a, b = setting_value(before, key), setting_value(after, key)
        if isinstance(a, Mapping) or isinstance(b, Mapping):
            a, b = a or {}, b or {}
            for name in sorted(set(a) | set(b)):
                if f"{key}.{name}" not in ignored and a.get(name) != b.get(name):
                    differences.append(f"{key}.{name}: {a.get(name)!r} → {b.get(name)!r}")
        elif a != b:
            differences.append(f"{key}: {a!r} → {b!r}")
    return differences


def row_overrides(choices: Mapping[str, Any]) -> list[str] | None:
    """The overrides that compose a run's row at its scale (``experiment=<row>``, ``+scale=<s>``);
    None for a run that is no row."""
    experiment = choices.get("experiment")
    if not experiment:
        return None
    scale = choices.get("scale")
    return [f"experiment={experiment}", *([f"+scale={scale}"] if scale else [])]


def row_changes(config: Mapping[str, Any], choices: Mapping[str, Any], conf_dir: str | Path | None = None) -> list[str]:
    """What a row run (``config``: its config, resolved; ``choices``: Hydra's runtime choices)
    changed from its row: ``model.n_heads: 1 → 4`` …; [] for the row itself or a run that is no
    row. Composes the row with ``conf_dir`` (None: inside a Hydra app, with its search path)."""
    overrides = row_overrides(choices)
    if overrides is None:
        return []
    row = _row_config(tuple(overrides), str(conf_dir) if conf_dir is not None else None)
    step_batch = (STEP_BATCH_KEY,) if setting_value(row, "optim.tokens_per_step") is None else ()
    config = step_as_set(config, setting_value(row, "optim.tokens_per_step"))
    return setting_differences(row, config, (*ROW_KEYS, *step_batch), SPEED_KEYS)


def run_folder_changes(config: Any, run_dir: str | Path, conf_dir: str | Path | None = None,
                       processes: int | None = None) -> list[str]:
    """What the run of ``run_dir`` changed from its row (:func:`row_changes`), from its ``config``
    and the choices Hydra recorded in its ``.hydra/hydra.yaml``; [] where that file is missing.
    ``processes``: those it trained on (its summary's), for :func:`trained_step` where its plan is not resolved."""
    hydra_file = Path(run_dir) / ".hydra" / "hydra.yaml"
    if not hydra_file.is_file():
        return []
    choices = OmegaConf.to_container(OmegaConf.load(hydra_file).hydra.runtime.choices)
    settings = row_settings(OmegaConf.create(config) if not OmegaConf.is_config(config) else config)
    # the run's plan as it trained (the step it took: trained_step); not one resolved here, on this machine
    plan = None if OmegaConf.is_config(config) and OmegaConf.is_interpolation(config, "plan") else config.get("plan")
    settings["plan"] = {"tokens_per_step": plan.get("tokens_per_step") if plan is not None else None,
                        "processes": processes}
    return row_changes(settings, choices, conf_dir)


@functools.lru_cache(maxsize=64)
def _row_config(overrides: tuple[str, ...], conf_dir: str | None) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if conf_dir is None or GlobalHydra.instance().is_initialized():
        cfg = compose("train", overrides=list(overrides))
    else:
        with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
            cfg = compose("train", overrides=list(overrides))
    return row_settings(cfg)


def identity(root: DictConfig, what: str) -> Any:
    """The run's ``name``, ``group``, ``tags`` or ``scale`` (see the module) from its config and
    Hydra's job; only the tags compose the run's row to compare (``modified``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    job = HydraConfig.get() if HydraConfig.initialized() else None
    choices = dict(job.runtime.choices) if job is not None else {}
    overrides = [str(o) for o in job.overrides.task] if job is not None else []
    experiment = root.get("experiment") or {}
    scale = ("debug" if choices.get("debug") else experiment.get("scale")
             or ("paper" if experiment.get("table") else None))
    own = [as_written(o.lstrip("+")) for o in overrides if override_key(o) not in _UNNAMED and not override_key(o).startswith("hydra.")]
    if what == "scale":
        return scale
    if what == "name":
        # The run name's own words are not said twice: run_name is <task.name>-<model> unless it is set.
        said = ("task", "model") if str(root.run_name) == f"{root.task.name}-{choices.get('model')}" else ()
        named = [o for o in own if override_key(o) not in said]
        name = "-".join([str(root.run_name), *([scale] if scale else []), *([",".join(named)] if named else [])])
        folder = OmegaConf.select(job, "runtime.output_dir") if job is not None and job.mode != RunMode.MULTIRUN else None
        together = STAMPED_FOLDER.fullmatch(Path(folder).name) if folder else None  # <date>_<time>-N: the Nth that second
        return name + (f"#{together.group(1)[1:]}" if together and together.group(1) else "")
    if what == "group":
        if root.get("run_group"):
            return str(root.run_group)
        return sweep_group(Path(str(job.sweep.dir))) if job is not None and job.mode == RunMode.MULTIRUN else None
    if what != "tags":
        raise ValueError(f"${{aiayn.run:{what}}}: expected name, group, tags or scale")
    tags = [str(tag) for tag in (experiment.get("tags") or [])]
    tags += [f"task:{root.task.name}", *([f"model:{choices['model']}"] if choices.get("model") else []),
             *([f"scale:{scale}"] if scale else []), *own]
    if row_changes(row_settings(root), choices):
        tags.append(MODIFIED)
    return list(dict.fromkeys(tag[:_TAG_LIMIT] for tag in tags))


def sweep_group(sweep_dir: Path) -> str:
    """The group the sweep of ``sweep_dir`` recorded there (:data:`GROUP_FILE`); before it has
    (a sweep's jobs checked before the first starts, its dry run), the folder's last two parts."""
    return recorded_group(sweep_dir) or "/".join(sweep_dir.parts[-2:])


def new_group(folder: Path) -> str:
    """A new group for the jobs of ``folder``: its last two parts and six random hex digits
    (``multirun/2026-11-30_07-24-35#1a2b3c``), so that no two sweeps share one, whatever their
    folders are called."""
    import secrets

    return f"{'/'.join(Path(folder).parts[-2:])}#{secrets.token_hex(3)}"


def kept_group(folder: Path, group: str) -> str:
    """The group ``folder`` recorded (:data:`GROUP_FILE`), recording ``group`` there first where it
    has none: the first of the sweeps given that folder settles it, every later one keeps it (two
    started at once agree: the file is created once, exclusively)."""
    import tempfile

    path = Path(folder) / GROUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=".group.", delete=False) as file:
        file.write(group + "\n")
    try:
        os.link(file.name, path)  # whole, and only where there is none: never over another's
    except FileExistsError:
        pass
    finally:
        os.unlink(file.name)
    return recorded_group(Path(folder)) or group


def recorded_group(sweep_dir: Path) -> str | None:
    """What ``<sweep_dir>/group.txt`` says; None where it says nothing."""
    try:
        return (sweep_dir / GROUP_FILE).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def trained_step(config: Mapping[str, Any]) -> int | None:
    """The tokens a step of the run of ``config`` (resolved) took: its plan's ``tokens_per_step``; for a plan
    from before that was recorded, its processes × accumulation × batch; where the plan holds its processes alone
    (a run folder's, :func:`run_folder_changes`), those × the config's accumulation × its batch (auto's 3,400 where no
    step was set); None where that cannot be told."""
    plan = config.get("plan") if isinstance(config.get("plan"), Mapping) else {}
    processes = plan.get("processes")
    if isinstance(plan.get("tokens_per_step"), int) or not isinstance(processes, int):
        return plan.get("tokens_per_step")
    if "tokens_per_batch" in plan:
        batch, accumulate = plan["tokens_per_batch"], (plan.get("trainer") or {}).get("accumulate_grad_batches")
    else:
        from aiayn.config.plan import PLAIN_BATCH_TOKENS

        batch = ((config.get("task") or {}).get("datamodule") or {}).get("max_tokens")
        batch = PLAIN_BATCH_TOKENS if batch == "auto" else batch
        accumulate = (config.get("trainer") or {}).get("accumulate_grad_batches")
    accumulate = accumulate or 1
    return processes * accumulate * batch if isinstance(batch, int) and isinstance(accumulate, int) else None


def step_as_set(config: Mapping[str, Any], step: Any) -> Mapping[str, Any]:
    """``config`` (a run's, resolved) with ``optim.tokens_per_step`` the step it trained (:func:`trained_step`) where
    it set none and that step is ``step`` (another config's optim.tokens_per_step): a run of the small recipe or a
    Multi30k scale from before those recipes set their step (2026-12-02), when one process's batch was the step —
    the same recipe, written the old way. Any other config as it is."""
    optim = config.get("optim") or {}
    if optim.get("tokens_per_step") is None and step is not None and trained_step(config) == step:
        return {**config, "optim": {**optim, "tokens_per_step": step}}
    return config


def row_settings(config: DictConfig) -> dict[str, Any]:
    """The settings of ``config`` that make a row (ROW_KEYS, and STEP_BATCH_KEY), resolved, nested as in the config."""
    settings: dict[str, Any] = {}
    for key in (*ROW_KEYS, STEP_BATCH_KEY):
        value = OmegaConf.select(config, key)
        *sections, name = key.split(".")
        node = settings
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return settings


def as_written(override: str) -> str:
    """``key=value`` in one spelling for every way of giving it: a sweep's jobs get their overrides
    from Hydra's sweeper as Python prints the values (``test_after_training=False``), a single run as
    typed (``=false``, ``=0.10``); both become ``test_after_training=false``, ``model.dropout=0.1``.
    An override Hydra cannot read, or without a value, stays as it is."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override, QuotedString

    def written(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, list):
            return "[" + ",".join(map(written, value)) + "]"
        if isinstance(value, dict):
            return "{" + ",".join(f"{written(key)}:{written(item)}" for key, item in value.items()) + "}"
        if isinstance(value, QuotedString):
            return value.with_quotes()
        return value if isinstance(value, str) else Override._get_value_element_as_str(value)  # unescaped: as typed

    try:
        parsed = OverridesParser.create().parse_override(override)
    except Exception:  # noqa: BLE001 - what Hydra cannot read is named as given
        return override
    if parsed.is_delete() or parsed.is_sweep_override() or parsed.value() is None and "=" not in override:
        return override
    return f"{parsed.get_key_element()}={written(parsed.value())}"


def left_out_of_names(hydra: DictConfig) -> list[str]:
    """The settings a sweep's job folders' names leave out (``hydra.job.config.override_dirname.exclude_keys``
    of Hydra's config ``hydra``): ``resume``, ``logger``, ``trainer.devices``."""
    return list(OmegaConf.select(hydra, "job.config.override_dirname.exclude_keys", default=None) or [])


def own_overrides(overrides: Iterable[Any], left_out: Iterable[str]) -> list[str]:
    """``overrides`` less those that set one of ``left_out`` (``+resume=auto`` sets ``resume``): a
    sweep job's own, as its folder's name says them (``hydra.job.config.override_dirname.exclude_keys``)."""
    left_out = set(left_out)
    return [str(o) for o in overrides if override_key(str(o)) not in left_out]


def override_key(override: str) -> str:
    """The setting an override sets (``+scale=x`` → ``scale``, ``~a.b`` → ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def setting_value(config: Mapping[str, Any], dotted: str) -> Any:
    """The value of the ``dotted`` setting of ``config`` (None where it holds none)."""
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _resolve_run(what: str, *, _root_: DictConfig) -> Any:
    """``${aiayn.run:name}``, ``group``, ``tags`` or ``scale`` of the config it stands in."""
    value = identity(_root_, what)
    return OmegaConf.create(value) if isinstance(value, list) else value


OmegaConf.register_new_resolver("aiayn.run", _resolve_run, replace=True)
