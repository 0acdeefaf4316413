"""Data-parallel training settings checked and completed before the Trainer is built: how many
processes ``trainer.devices`` asks of this machine (:func:`check_processes`, :func:`training_processes`)
and the process group's timeout (:func:`strategy_with_timeout`).

A DDP rank that hangs (a stuck data read, a dead peer that no signal reported) holds every other
rank in its next collective until the process group's timeout; Lightning's default is 30 minutes,
``distributed.timeout_minutes`` makes it shorter. ``trainer.devices`` counts processes per node, as
Lightning does: CPU processes on a CPU (``trainer.accelerator=cpu``), one per GPU on a GPU.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from aiayn.errors import ConfigError


def strategy_with_timeout(strategy: Any, timeout_minutes: float | None, processes: int = 1) -> Any:
    """``strategy`` (the ``trainer.strategy`` setting: a name such as ``"ddp"``, ``"ddp_spawn"``,
    ``"ddp_find_unused_parameters_true"``, ``"auto"``, or a built Strategy) as a DDP strategy whose
    process group times out after ``timeout_minutes`` when it is one; anything else unchanged.

    A name keeps what it stands for in Lightning's registry (``ddp_spawn``: start method spawn;
    ``..._find_unused_parameters_true``: that DDP option). A built DDPStrategy gets the timeout in
    place. ``"auto"`` with ``processes`` > 1 (what :func:`training_processes` counts) becomes the
    ``ddp`` Lightning would pick for it; with one process it stays ``"auto"``. ``timeout_minutes``
    None leaves Lightning's default (30 minutes)."""
    if timeout_minutes is None:
        return strategy
    if isinstance(timeout_minutes, bool) or not isinstance(timeout_minutes, (int, float)) or not timeout_minutes > 0:
        raise ConfigError(f"distributed.timeout_minutes must be a positive number of minutes, got {timeout_minutes!r}")
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

    timeout = timedelta(minutes=timeout_minutes)
    if isinstance(strategy, DDPStrategy):
        strategy._timeout = timeout  # read when the process group is created, in the Trainer's setup
        return strategy
    if not isinstance(strategy, str):
        return strategy
    name = "ddp" if strategy == "auto" and processes > 1 else strategy
    if name not in StrategyRegistry or not issubclass(StrategyRegistry[name]["strategy"], DDPStrategy):
        return strategy
    entry = StrategyRegistry[name]
    return entry["strategy"](**entry["init_params"], timeout=timeout)


def check_processes(trainer_config: dict[str, Any]) -> None:
    """Raise ConfigError when ``trainer.devices`` asks for more training processes than this machine
    can run: more CPU processes than it has CPU cores (``trainer.accelerator=cpu``), or more GPUs
    than it has, or a GPU it lacks (``gpu``/``cuda``; ``auto`` counts as ``gpu`` where CUDA is usable,
    else as ``cpu``). Devices Lightning itself would refuse (``0``, a list on a CPU) are left to it."""
    accelerator, devices = _accelerator(trainer_config), trainer_config.get("devices", "auto")
    setting = f"trainer.devices={_shown(devices)}"
    if accelerator == "cpu":
        asked, cores = _cpu_processes(devices), cpu_cores()
        if asked is not None and asked > cores:
            gpus = "hardware=gpu8_ddp" + ("" if asked == 8 else f" trainer.devices={asked}")
            raise ConfigError(
                f"{setting} asks for {asked} CPU training processes but this machine has {_count(cores, 'CPU core')}; "
                f"use trainer.devices={cores} or fewer, or {gpus} on a machine with {asked} GPUs"
            )
        return
    if accelerator != "gpu":
        return  # mps, tpu, ...: Lightning checks them
    available = cuda_gpus()
    if available == 0:
        raise ConfigError(f"trainer.accelerator={trainer_config.get('accelerator')} asks for a GPU but this machine "
                          "has no usable CUDA GPU; use hardware=cpu")
    asked = _gpu_request(devices)
    if isinstance(asked, list):
        missing = [index for index in asked if not 0 <= index < available]
        if missing:
            raise ConfigError(
                f"{setting} names CUDA GPU {missing[0]} but this machine has {_count(available, 'usable CUDA GPU')} "
                f"(numbered 0 to {available - 1}); name only those, or use trainer.devices={available} or fewer"
            )
    elif asked is not None and asked > available:
        raise ConfigError(
            f"{setting} asks for {asked} GPU training processes but this machine has "
            f"{_count(available, 'usable CUDA GPU')}; use trainer.devices={available} or fewer"
        )


def training_processes(trainer_config: dict[str, Any]) -> int:
    """How many training processes the Trainer settings start, over all nodes (1 where the devices
    setting says nothing Lightning would accept)."""
    devices = trainer_config.get("devices", "auto")
    if _accelerator(trainer_config) == "gpu":
        asked = _gpu_request(devices)
        per_node = len(asked) if isinstance(asked, list) else cuda_gpus() if asked is None else asked
    elif _accelerator(trainer_config) == "cpu":
        per_node = _cpu_processes(devices) or 1
    else:
        per_node = 1
    num_nodes = trainer_config.get("num_nodes") or 1
    return max(per_node, 1) * (num_nodes if isinstance(num_nodes, int) and num_nodes > 0 else 1)


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cuda_gpus() -> int:
    """The CUDA GPUs torch can use here (CUDA_VISIBLE_DEVICES counted); 0 without a usable driver."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _accelerator(trainer_config: dict[str, Any]) -> str:
    """``cpu``, ``gpu`` (``gpu``, ``cuda``, and ``auto`` where CUDA is usable) or the name as given."""
    accelerator = str(trainer_config.get("accelerator", "auto")).lower()
    if accelerator == "auto":
        return "gpu" if cuda_gpus() else "cpu"
    return "gpu" if accelerator in ("gpu", "cuda") else accelerator


def _cpu_processes(devices: Any) -> int | None:
    """CPU processes of a ``devices`` setting (``auto``: 1, as Lightning counts); None for a value
    Lightning refuses on a CPU."""
    if isinstance(devices, str):
        devices = devices.strip()
        if devices == "auto":
            return 1
        devices = int(devices) if devices.isdigit() else devices
    return devices if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0 else None


def _gpu_request(devices: Any) -> int | list[int] | None:
    """A GPU ``devices`` setting as Lightning reads it: a count (``2``, ``"2"``), the GPUs' indices
    (``[0, 1]``, ``"0,1"``, ``"3,"``), or None for every GPU (``-1``, ``"-1"``, ``"auto"``) or a
    value Lightning refuses itself."""
    if isinstance(devices, str):
        text = devices.strip()
        if text in ("auto", "-1"):
            return None
        if "," in text:
            parts = [part.strip() for part in text.split(",") if part.strip()]
            return [int(part) for part in parts] if all(part.isdigit() for part in parts) else None
        return int(text) if text.isdigit() and int(text) > 0 else None
    if isinstance(devices, (list, tuple)):
        return [int(index) for index in devices] if all(isinstance(i, int) for i in devices) else None
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    return None


def _shown(devices: Any) -> str:
    return "[" + ",".join(map(str, devices)) + "]" if isinstance(devices, (list, tuple)) else str(devices)


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"
