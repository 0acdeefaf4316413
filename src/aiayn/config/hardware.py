"""Where a run trains: the one decision that turns the ``trainer.*`` hardware settings and the
machine into what Lightning is given (:func:`place`), and the reading of the machine itself
(:func:`this_machine`).

The default, ``hardware=auto`` (conf/hardware/auto.yaml), leaves ``trainer.accelerator``,
``trainer.devices``, ``trainer.strategy`` and ``trainer.precision`` at ``auto``/null, and
:func:`place` fills each in from the machine:

* accelerator: the GPUs where torch sees a CUDA GPU, else the CPU;
* devices: on GPUs, ``trainer.devices`` GPUs per node — 1 unless set; ``auto`` or ``-1`` take every
  GPU, as in Lightning; a list or ``"0,1"`` names them. On a machine without a GPU a request for
  more than one device is refused (no GPU was found): under ``auto`` a device count means GPUs.
  ``hardware=cpu trainer.devices=N`` (an explicit accelerator) runs N CPU processes;
* strategy: DDP when more than one process trains (over all nodes); ``ddp_spawn`` instead of
  ``ddp`` for the jobs of a ``--multirun`` started on this machine, because ``ddp`` starts the
  other ranks by running the command line again, and under ``--multirun`` that re-runs the sweep;
  a cluster that starts every rank itself (SLURM's ``srun``, ``torchrun``) keeps ``ddp``, and ``ddp``
  given by hand (``hardware=gpu8_ddp``) for such a sweep run here is refused;
* precision: ``bf16-mixed`` on GPUs that have bf16 units (compute capability 8.0 and up: A100,
  H100, L4, ...), else ``16-mixed``, which Lightning runs with dynamic loss scaling (V100, T4);
  ``32-true`` on the CPU, where bf16 is emulated on most CPUs and no faster (docs/performance.md).
  The paper is silent on precision; Table 2's cost counts the P100's single-precision rate and
  tensor2tensor trained in float32 then. Mixed precision on GPUs is ours, for speed (the weights,
  Adam's moments and the loss stay fp32); ``trainer.precision=32-true`` trains in fp32 as it did.

A setting given explicitly — by a hardware group (``cpu``, ``gpu``, ``gpu8_ddp``, ``cpu2_ddp``;
the GPU groups leave the precision at ``auto``) or on the command line — is kept, and checked
against the machine: no more CPU processes than cores, no more GPUs than there are, no GPU on a
machine without one, no fp16 mixed precision on the CPU (where Lightning would train in bf16-mixed
instead).

:func:`place` is a pure function of a :class:`Machine` and the settings, so that the decision for
a machine of 8 GPUs is tested on one without any.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aiayn.errors import ConfigError

AUTO = "auto"


@dataclass(frozen=True)
class Machine:
    """What :func:`place` needs to know of a machine (of one node, for several)."""

    gpus: int = 0  # usable CUDA GPUs (CUDA_VISIBLE_DEVICES counted)
    bf16: bool = False  # every one of them has bf16 units (compute capability >= 8.0)
    cpu_cores: int = 1  # the CPU cores this process may run on
    gpu_name: str | None = None  # the first GPU's name, for the plan and the benchmarks' records
    gpu_memory: int | None = None  # bytes of the smallest of them (None: not known, e.g. a node planned from elsewhere)
    cpu_name: str | None = None  # the CPU's model name, likewise
    # The ranks are started by the cluster (SLURM srun, torchrun), not by Lightning.
    cluster_launched: bool = False


@dataclass(frozen=True)
class Placement:
    """What Lightning is given: ``trainer.accelerator``, ``devices``, ``strategy``, ``precision``
    and ``num_nodes``, and how many training processes that makes over all nodes."""

    accelerator: str
    devices: int | list[int]
    strategy: str
    precision: str
    num_nodes: int
    processes: int

    @property
    def processes_per_node(self) -> int:
        return self.processes // self.num_nodes


def place(machine: Machine, accelerator: Any = AUTO, devices: Any = None, strategy: Any = AUTO,
          precision: Any = AUTO, num_nodes: Any = 1, *, multirun: bool = False) -> Placement:
    """The placement of a run on ``machine`` for these ``trainer.*`` settings (``None`` or
    ``"auto"``: decided here; anything else: kept and checked); ConfigError for a request this
    machine cannot meet. ``multirun``: the run is a job of a ``--multirun`` sweep run here (Hydra's
    basic launcher), where ``ddp`` would run the sweep again in each rank it starts."""
    nodes = _whole_number(num_nodes, "trainer.num_nodes") if num_nodes is not None else 1
    kind = _accelerator(accelerator, machine)
    if kind == "gpu":
        per_node = _gpus(devices, machine)
    elif kind == "cpu":
        per_node = _cpu_processes(devices, machine, explicit=_given(accelerator))
    else:  # mps, tpu, ...: as given; Lightning checks them
        per_node = len(devices) if isinstance(devices, (list, tuple)) else devices if _count(devices) else 1
    count = len(per_node) if isinstance(per_node, list) else per_node
    processes = count * nodes
    if _given(strategy):
        chosen = str(strategy)
        if kind == "gpu" and chosen.startswith(_FORKING):  # one GPU too: forked (before: planned, then CUDA's error)
            raise ConfigError(f"trainer.strategy={chosen} forks its ranks from this process, where planning the run has "
                              "read the GPUs (their names, memory and bf16 units) and so started CUDA, which a forked "
                              "process cannot use; give trainer.strategy=ddp (hardware=auto's) or ddp_spawn")
        if chosen in _RERUN_DDP and processes > 1 and multirun and not machine.cluster_launched:  # (before: kept)
            raise ConfigError(f"trainer.strategy={chosen} in a --multirun sweep run here starts each other rank by running "
                              "the command line again, which runs the whole sweep again in it; give trainer.strategy="
                              f"{chosen.replace('ddp', 'ddp_spawn', 1)} (hardware=auto picks ddp_spawn), or run the sweep "
                              "with hydra/launcher=slurm")
    elif processes == 1:
        chosen = AUTO
    else:
        chosen = "ddp_spawn" if multirun and not machine.cluster_launched else "ddp"
    if _given(precision):
        chosen_precision = str(precision)
        if kind == "cpu" and chosen_precision in ("16-mixed", "16"):  # Lightning would swap in bf16-mixed, unsaid
            raise ConfigError(f"trainer.precision={precision}: fp16 mixed precision runs on GPUs only (on the CPU "
                              "Lightning trains in bf16-mixed instead); give trainer.precision=bf16-mixed or 32-true "
                              "(auto: 32-true on the CPU)")
        if kind == "cpu" and chosen_precision == "16-true":  # measured, torch 2.13: NaN at the first validation
            raise ConfigError("trainer.precision=16-true: fp16 weights train on GPUs only (on the CPU the losses turn "
                              "NaN within steps and every later step is skipped); give trainer.precision=bf16-true, "
                              "bf16-mixed or 32-true (auto: 32-true on the CPU)")
    elif kind == "gpu":
        chosen_precision = "bf16-mixed" if machine.bf16 else "16-mixed"
    else:
        chosen_precision = "32-true"
    return Placement(accelerator=kind, devices=per_node, strategy=chosen, precision=chosen_precision,
                     num_nodes=nodes, processes=processes)


def emulated_bf16(placement: Placement, machine: Machine) -> str | None:
    """The warning of a bf16 precision given (``trainer.precision=bf16-mixed``: it wins) for GPUs without bf16 units,
    where torch emulates bf16, slower than fp16 (before: planned without a word); None otherwise."""
    if placement.accelerator != "gpu" or machine.bf16 or not placement.precision.startswith("bf16"):
        return None
    gpus = f" ({machine.gpu_name})" if machine.gpu_name else ""
    return (f"trainer.precision={placement.precision}: the GPUs here{gpus} have no bf16 units (compute capability "
            "below 8.0), so torch emulates bf16, slower than fp16; leave trainer.precision out for 16-mixed (fp16 with "
            "loss scaling), as hardware=auto picks there")


def gpu_node_asked_for(machine: Machine, accelerator: Any = AUTO, devices: Any = None) -> Machine | None:
    """The node a GPU request is written for, where ``machine`` has no GPU: as many GPUs as the
    settings name (``trainer.devices=8``: 8; ``[0,3]``: 4; ``hardware=gpu`` alone: 1), with bf16
    units (A100, H100: what the recipes are planned for), the rest as ``machine``. None where
    ``machine`` has GPUs, or the settings ask for none, or not for a number of them (``auto``: every
    GPU of a node unknown here). ``--cfg job`` shows the plan for this node on a machine, such as a
    cluster's login node, where the run itself would be refused."""
    name = str(accelerator if accelerator is not None else AUTO).strip().lower()
    if machine.gpus or name not in (AUTO, "gpu", "cuda"):
        return None
    request = _gpu_request(devices) if devices is not None else (1 if name != AUTO else None)
    if request is None or request == AUTO or (name == AUTO and request == 1):  # one device under auto: this CPU
        return None
    return replace(machine, gpus=max(request) + 1 if isinstance(request, list) else request, bf16=True, gpu_name=None)


@functools.lru_cache(maxsize=1)
def this_machine() -> Machine:
    """This machine, read once per process: its usable CUDA GPUs (their compute capability for
    bf16), its CPU cores and whether a cluster launcher started this process."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bf16, name, memory = False, None, None
    if gpus:
        bf16 = all(torch.cuda.get_device_capability(index) >= (8, 0) for index in range(gpus))
        name = torch.cuda.get_device_name(0)
        memory = min(torch.cuda.get_device_properties(index).total_memory for index in range(gpus))
    return Machine(gpus=gpus, bf16=bf16, cpu_cores=cpu_cores(), gpu_name=name, gpu_memory=memory,
                   cpu_name=cpu_name(), cluster_launched=_cluster_launched())


def gpus_per_node(devices: Any) -> int:
    """The GPUs per node a cluster job must ask for (conf/hydra/launcher/slurm.yaml) so that
    ``trainer.devices`` finds them there: 1 when unset (hardware=auto's one GPU), the count or
    the number of indices given; ``auto``/``-1`` cannot be counted from the submitting machine."""
    if devices is None:
        return 1
    request = _gpu_request(devices)
    if request is None or request == AUTO:
        raise ConfigError(f"trainer.devices={_shown(devices)}: a cluster job asks for a number of GPUs per node; "
                          "give trainer.devices=N")
    return len(request) if isinstance(request, list) else request


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name as the kernel reports it (``AMD EPYC 9B14``), else what Python knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Lightning's DDP strategies that start the other ranks by running the command line again (the *_spawn ones spawn them).
_RERUN_DDP = ("ddp", "ddp_find_unused_parameters_false", "ddp_find_unused_parameters_true")
# Lightning's strategies that fork the ranks (and their find_unused_parameters variants).
_FORKING = ("ddp_fork", "ddp_notebook")
# Rank variables of the launchers: DDP's own (Lightning, torchrun), SLURM's.
_RANKS = ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "SLURM_PROCID")


def first_process() -> bool:
    """Whether this is the job's first process (rank 0 of node 0), not a rank launched beside it
    (by Lightning's ddp or ddp_spawn, torchrun or srun) nor the process that starts a later node's."""
    return all(os.environ.get(name, "0") in ("", "0") for name in _RANKS)


def _cluster_launched() -> bool:
    """Lightning's own tests: torchrun's environment, or a SLURM job step of several tasks."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    return TorchElasticEnvironment.detect() or (SLURMEnvironment.detect() and int(os.environ.get("SLURM_NTASKS", "1")) > 1)


def _given(value: Any) -> bool:
    return value is not None and str(value).strip().lower() != AUTO


def _accelerator(accelerator: Any, machine: Machine) -> str:
    """``gpu`` (``gpu``, ``cuda``; ``auto`` where there is a GPU), ``cpu`` (``cpu``; ``auto``
    without a GPU), or another Lightning accelerator's name as given."""
    name = str(accelerator if accelerator is not None else AUTO).strip().lower()
    if name == AUTO:
        return "gpu" if machine.gpus else "cpu"
    if name in ("gpu", "cuda"):
        if not machine.gpus:
            raise ConfigError(f"trainer.accelerator={accelerator} asks for a GPU but no usable CUDA GPU was found on "
                              "this machine; use hardware=auto (the default) or hardware=cpu to train on its CPU")
        return "gpu"
    return name


def _gpus(devices: Any, machine: Machine) -> int | list[int]:
    """The GPUs of one node a ``devices`` setting asks for: a count, or their indices."""
    setting = f"trainer.devices={_shown(devices)}"
    if devices is None:
        return 1  # hardware=auto: one GPU unless trainer.devices says more
    request = _gpu_request(devices)
    if request is None:
        raise ConfigError(_not_devices(setting))
    if request == AUTO:
        return machine.gpus
    if isinstance(request, list):
        missing = [index for index in request if not 0 <= index < machine.gpus]
        if missing:
            raise ConfigError(f"{setting} names CUDA GPU {missing[0]} but this machine has "
                              f"{_plural(machine.gpus, 'usable CUDA GPU')} (numbered 0 to {machine.gpus - 1}); "
                              f"name only those, or use trainer.devices={machine.gpus} or fewer")
        if len(set(request)) != len(request):
            raise ConfigError(f"{setting} names a GPU twice; name each GPU once")
        return request
    if request > machine.gpus:
        raise ConfigError(f"{setting} asks for {request} GPU training processes but this machine has "
                          f"{_plural(machine.gpus, 'usable CUDA GPU')}; use trainer.devices={machine.gpus} or fewer")
    return request


def _cpu_processes(devices: Any, machine: Machine, explicit: bool) -> int:
    """CPU training processes on one node. Under ``hardware=auto`` (``explicit`` False: the CPU
    because no GPU was found) a device setting names GPUs, so anything but one is refused."""
    setting = f"trainer.devices={_shown(devices)}"
    if devices is None or str(devices).strip().lower() in (AUTO, "-1"):
        return 1
    count = _count(devices)
    if not explicit and count != 1:
        request = _gpu_request(devices)
        if request is None:  # neither GPUs nor processes: say what it takes, not that there is no GPU
            raise ConfigError(_not_devices(setting))
        what = f"{request} GPUs" if isinstance(request, int) else "GPUs"
        raise ConfigError(f"{setting} asks for {what} but no usable CUDA GPU was found on this machine; run the "
                          "command on a GPU machine, or leave trainer.devices out to train in one process on this CPU "
                          "(trainer.accelerator=cpu trainer.devices=N trains in N CPU processes)")
    if count is None and _gpu_request(devices) is None:
        raise ConfigError(f"{setting} is not a number of CPU training processes: give trainer.devices=N, a whole "
                          "number of 1 or more (auto: 1)")
    if count is None:
        raise ConfigError(f"{setting}: on the CPU trainer.devices is a number of processes, not a list of devices")
    if count > machine.cpu_cores:
        raise ConfigError(f"{setting} asks for {count} CPU training processes but this machine has "
                          f"{_plural(machine.cpu_cores, 'CPU core')}; use trainer.devices={machine.cpu_cores} or fewer")
    return count


def _not_devices(setting: str) -> str:
    return (f"{setting} is not a number of GPUs (an int, e.g. 2), a list of GPU indices (e.g. [0,1] or \"0,1\"), "
            "auto or -1 (every GPU)")


def _gpu_request(devices: Any) -> int | list[int] | str | None:
    """A GPU ``devices`` setting as Lightning reads it: a count (``2``, ``"2"``), indices
    (``[0, 1]``, ``"0,1"``, ``"3,"``), ``"auto"`` for every GPU (``"auto"``, ``-1``, ``"-1"``), or
    None for a value that is none of these."""
    if isinstance(devices, str):
        text = devices.strip().lower()
        if text in (AUTO, "-1"):
            return AUTO
        if "," in text:
            parts = [part.strip() for part in text.split(",") if part.strip()]
            return [int(part) for part in parts] if parts and all(part.isdigit() for part in parts) else None
        return int(text) if text.isdigit() and int(text) > 0 else None
    if isinstance(devices, (list, tuple)):
        ok = devices and all(isinstance(i, int) and not isinstance(i, bool) for i in devices)
        return [int(index) for index in devices] if ok else None
    if isinstance(devices, int) and not isinstance(devices, bool):
        return AUTO if devices == -1 else devices if devices > 0 else None
    return None


def _count(devices: Any) -> int | None:
    """A positive whole number of devices (``2``, ``"2"``), else None."""
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices.strip())
    return devices if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0 else None


def _whole_number(value: Any, setting: str) -> int:
    number = _count(value)
    if number is None:
        raise ConfigError(f"{setting} must be a positive whole number, got {value!r}")
    return number


def _shown(devices: Any) -> str:
    return "[" + ",".join(map(str, devices)) + "]" if isinstance(devices, (list, tuple)) else str(devices)


def _plural(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"
