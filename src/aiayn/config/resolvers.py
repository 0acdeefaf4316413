"""The resolvers composing conf/ needs: ``${aiayn.plan:}``, the plan of the config it stands in on
this machine (aiayn.config.plan), and ``${aiayn.gpus_per_node:}`` (conf/hydra/launcher/slurm.yaml);
and :func:`showing_only`, how the plan resolves while ``train.py --cfg job`` only shows the config.
The other resolvers are registered beside what they resolve: ``aiayn.folder`` (config.schemas),
``aiayn.run`` (config.identity), ``aiayn.new_run_dir`` (cli.run_folder) and the tool's names
(``aiayn.dirname``, ``aiayn.tool``, ``aiayn.command``, ``aiayn.config_options``: cli)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from aiayn.config.hardware import gpu_node_asked_for, gpus_per_node, this_machine
from aiayn.config.plan import PLANNED_TRAINER_SETTINGS, count, make_plan
from aiayn.errors import ConfigError

ShownCheck = Callable[[DictConfig, dict], None]

_showing = False  # set by showing_only(): the config is printed (--cfg), not run
_check: ShownCheck | None = None  # and what checks it there


@contextlib.contextmanager
def showing_only(check: ShownCheck | None = None) -> Iterator[None]:
    """While the config is only shown (``train.py --cfg job``), a plan this machine cannot run —
    GPUs asked for where there are none — is the plan for the node asked for
    (:func:`aiayn.config.hardware.gpu_node_asked_for`), saying so under ``shown_for``, instead of
    the refusal a run gets. ``check(root, plan)``, once the plan is made: the checks the run would
    make of the whole config (``root``, its ``plan`` to be read as ``plan``), so that what the run
    refuses is refused where it is shown."""
    global _showing, _check
    before = _showing, _check
    _showing, _check = True, check
    try:
        yield
    finally:
        _showing, _check = before


def only_shown() -> bool:
    """Whether the config is only shown (``--cfg``), not run: what a resolver would make for a run
    (its folder) is named, not made."""
    return _showing


def runs_here(hydra: Any) -> bool:
    """Whether a sweep of this Hydra config (its ``hydra`` node) runs its jobs here, one after another
    (Hydra's basic launcher), not where another launcher (SLURM's) starts them. Read from the
    launcher's ``_target_``, not its class: Hydra's plugin scan may load the launcher's module again
    (``experiments/tables.py sweep`` imports the sweep's code before that scan), and its class is
    then not one imported here."""
    return str(OmegaConf.select(hydra, "launcher._target_", default="")).endswith(".BasicLauncher")


# hydra/launcher=submitit_local's
LOCAL_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"


def runs_as_processes(hydra: Any) -> bool:
    """Whether a sweep of this Hydra config (its ``hydra`` node) runs its jobs here as processes of
    their own (submitit's local launcher), read from the launcher's ``_target_`` as :func:`runs_here`."""
    return OmegaConf.select(hydra, "launcher._target_", default=None) == LOCAL_LAUNCHER


def starts_its_ranks(hydra: Any) -> bool:
    """Whether a job of a sweep of this Hydra config starts its own other ranks, as a run alone
    does: run here by Hydra's basic launcher, or as a process of its own by submitit's local one;
    not where a cluster starts every rank (SLURM's launcher). Lightning's ``ddp`` would start them
    by running the job's command line again: the whole sweep's, or submitit's own script's."""
    return runs_here(hydra) or runs_as_processes(hydra)


def _resolve_plan(*, _root_: DictConfig) -> DictConfig:
    """``${aiayn.plan:}``: the plan of the config it stands in, on this machine."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    # A sweep's job that starts its own ranks: SLURM's launcher runs it where the cluster starts every rank.
    hydra = HydraConfig.get() if HydraConfig.initialized() else None
    multirun = hydra is not None and hydra.mode == RunMode.MULTIRUN and starts_its_ranks(hydra)

    def settings(node: Any, keys: tuple[str, ...]) -> dict[str, Any]:
        values = {key: node.get(key) for key in keys}
        return {key: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for key, v in values.items()}

    config = {"trainer": settings(_root_.trainer, PLANNED_TRAINER_SETTINGS),
              "optim": settings(_root_.optim, ("tokens_per_step", "train_steps", "warmup_steps")),
              "task": {"datamodule": settings(_root_.task.datamodule, ("max_tokens", "max_length")),
                       "vocab_size": _root_.task.get("vocab_size")},
              # what max_tokens=auto sizes a GPU's batch for (aiayn.config.memory)
              "model": OmegaConf.to_container(_root_.model, resolve=True), "width_divisor": _root_.get("width_divisor", 1),
              "loss": settings(_root_.loss, ("fused",))}
    machine = this_machine()
    try:
        plan = make_plan(config, machine, multirun=multirun)
    except ConfigError:
        node = gpu_node_asked_for(machine, config["trainer"]["accelerator"], config["trainer"]["devices"])
        if not _showing or node is None:
            raise
        plan = make_plan(config, node, multirun=multirun)
        plan["shown_for"] = (f"a node of {count(node.gpus, 'GPU')} with bf16 (A100, H100); this machine has no usable "
                             "CUDA GPU, so the run itself is refused here")
    if _showing and _check is not None:
        _check(_root_, plan)
    return OmegaConf.create(plan)  # a node: OmegaConf.resolve takes it


OmegaConf.register_new_resolver("aiayn.plan", _resolve_plan, replace=True)
# conf/hydra/launcher/slurm.yaml: the GPUs (and tasks) per node a SLURM job asks for.
OmegaConf.register_new_resolver("aiayn.gpus_per_node", gpus_per_node, replace=True)
