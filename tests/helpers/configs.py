"""Training configs as the tests compose them (Hydra's compose API on conf/), and the simulated
machines the plan is made for: shared by the tests of the plan, the memory estimate, the config
check and the runs that read a resolved config."""

from __future__ import annotations

import copy
import functools
from dataclasses import replace

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from aiayn.config.hardware import Machine, this_machine
from aiayn.config.plan import make_plan
from tests.helpers.runs import REPO

NODE_8_H100 = Machine(gpus=8, bf16=True, cpu_cores=64, gpu_name="NVIDIA H100 80GB HBM3", cpu_name="Xeon")
NODE_8_V100 = Machine(gpus=8, bf16=False, cpu_cores=64, gpu_name="Tesla V100-SXM2-32GB")
LAPTOP = Machine(gpus=0, cpu_cores=2, cpu_name="AMD EPYC")


def composed(*overrides: str):
    """conf/train.yaml composed with ``overrides``, as Hydra's compose API gives it (unresolved)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("train", overrides=[*overrides, "paths.output_dir=/tmp/run"])


def with_plan(cfg, plan: dict) -> dict:
    """``cfg`` (composed) as train.py describes it: its model resolved (d_k and d_v are d_model /
    n_heads unless given), the rest as composed, with ``plan``."""
    return {**OmegaConf.to_container(cfg), "model": OmegaConf.to_container(cfg.model, resolve=True), "plan": plan}


def resolved(*overrides: str, least_cores: int = 1) -> dict:
    """The config resolved, its plan made on this machine; with ``least_cores``, as if this process
    could run on that many cores at least (``hardware=cpu2_ddp`` asks for two, and a test may run
    under ``taskset -c 0``). A copy: each config is composed once in a test process."""
    return copy.deepcopy(_resolved(overrides, least_cores))


@functools.cache
def _resolved(overrides: tuple[str, ...], least_cores: int) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, "paths.output_dir=/tmp/run", "run_name=test"])
    machine = this_machine()
    if machine.cpu_cores < least_cores:
        cfg.plan = make_plan(cfg, replace(machine, cpu_cores=least_cores))
    return OmegaConf.to_container(cfg, resolve=True)
