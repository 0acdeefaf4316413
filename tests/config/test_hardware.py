"""Where a run trains (aiayn.config.hardware.place): one pure function of the machine and the
``trainer.*`` settings, tested here for machines of 0, 1 and 8 GPUs, with and without bf16 units,
for every form ``trainer.devices`` takes, on one node and several, alone and in a sweep — on a
machine that has none of those GPUs."""

from __future__ import annotations

import pytest

from aiayn.config.hardware import Machine, cpu_cores, gpu_node_asked_for, gpus_per_node, place, this_machine
from aiayn.errors import ConfigError

LAPTOP = Machine(gpus=0, cpu_cores=2, cpu_name="a laptop CPU")
ONE_H100 = Machine(gpus=1, bf16=True, cpu_cores=16, gpu_name="NVIDIA H100 80GB HBM3")
NODE_8_A100 = Machine(gpus=8, bf16=True, cpu_cores=64, gpu_name="NVIDIA A100-SXM4-80GB")
NODE_8_V100 = Machine(gpus=8, bf16=False, cpu_cores=64, gpu_name="Tesla V100-SXM2-32GB")
BIG_CPU = Machine(gpus=0, cpu_cores=64)


def auto(machine: Machine, devices=None, num_nodes=1, multirun=False):
    """hardware=auto (conf/hardware/auto.yaml) with ``trainer.devices`` and ``trainer.num_nodes``."""
    return place(machine, "auto", devices, "auto", "auto", num_nodes, multirun=multirun)


def summary(placement) -> tuple:
    return (placement.accelerator, placement.devices, placement.strategy, placement.precision, placement.processes)


# -- hardware=auto, the default -----------------------------------------------------------------
def test_the_users_command_on_an_8_gpu_node_is_8_gpu_ddp_in_bf16() -> None:
    """``python src/train.py model=big task=wmt_en_fr trainer.devices=8``: no other argument."""
    assert summary(auto(NODE_8_A100, devices=8)) == ("gpu", 8, "ddp", "bf16-mixed", 8)
    assert summary(auto(NODE_8_A100, devices="8")) == ("gpu", 8, "ddp", "bf16-mixed", 8)


def test_gpus_without_bf16_units_train_in_fp16_with_loss_scaling() -> None:
    assert summary(auto(NODE_8_V100, devices=8)) == ("gpu", 8, "ddp", "16-mixed", 8)
    assert summary(auto(NODE_8_V100)) == ("gpu", 1, "auto", "16-mixed", 1)


@pytest.mark.parametrize(("devices", "expected"), [
    (None, 1), (1, 1), (2, 2), (8, 8), ("2", 2), ("auto", 8), (-1, 8), ("-1", 8),
    ([0, 1], [0, 1]), ("0,1", [0, 1]), ("3,", [3]), ([5], [5]),
])
def test_devices_on_an_8_gpu_node(devices, expected) -> None:
    """Unset: one GPU; a count; auto or -1: every GPU (Lightning's meaning); a list names them."""
    placement = auto(NODE_8_A100, devices=devices)
    count = len(expected) if isinstance(expected, list) else expected
    assert (placement.accelerator, placement.devices, placement.processes) == ("gpu", expected, count)
    assert placement.strategy == ("ddp" if count > 1 else "auto") and placement.precision == "bf16-mixed"


def test_one_gpu_box_trains_on_its_gpu_and_refuses_more() -> None:
    assert summary(auto(ONE_H100)) == ("gpu", 1, "auto", "bf16-mixed", 1)
    assert summary(auto(ONE_H100, devices="auto")) == ("gpu", 1, "auto", "bf16-mixed", 1)
    with pytest.raises(ConfigError) as refused:
        auto(ONE_H100, devices=8)
    assert str(refused.value) == ("trainer.devices=8 asks for 8 GPU training processes but this machine has 1 usable "
                                  "CUDA GPU; use trainer.devices=1 or fewer")
    with pytest.raises(ConfigError, match=r"^trainer.devices=\[0,1\] names CUDA GPU 1 but this machine has 1 usable"):
        auto(ONE_H100, devices=[0, 1])
    with pytest.raises(ConfigError, match="names a GPU twice"):
        auto(NODE_8_A100, devices=[1, 1])
    for bad in (0, "two", 1.5, True, []):
        with pytest.raises(ConfigError, match="is not a number of GPUs"):
            auto(ONE_H100, devices=bad)


def test_a_forking_strategy_on_gpus_is_refused_in_one_line_as_planning_has_started_cuda() -> None:
    """Lightning's fork launcher refuses to fork once CUDA is started, and this_machine starts it reading the GPUs:
    ddp_fork and ddp_notebook on several GPUs are refused as the run is planned (before: planned, then Lightning's
    error as the Trainer started). One GPU too: Lightning's fork launcher forks its one rank as well. On the CPU
    there is no CUDA to start."""
    for strategy in ("ddp_fork", "ddp_notebook", "ddp_fork_find_unused_parameters_true"):
        for machine, devices in ((NODE_8_A100, 8), (ONE_H100, 1)):
            with pytest.raises(ConfigError, match=rf"^trainer.strategy={strategy} forks its ranks from this process, "
                                                  r".* give trainer.strategy=ddp \(hardware=auto's\) or ddp_spawn$"):
                place(machine, "gpu", devices, strategy)
    assert place(BIG_CPU, "cpu", 2, "ddp_fork").strategy == "ddp_fork"


def test_a_laptop_trains_one_cpu_process_and_refuses_a_gpu_count_saying_no_gpu_was_found() -> None:
    for devices in (None, 1, "1", "auto", -1):
        assert summary(auto(LAPTOP, devices=devices)) == ("cpu", 1, "auto", "32-true", 1)
    for devices in (8, 2, "8", [0, 1], "0,1"):
        with pytest.raises(ConfigError) as refused:
            auto(LAPTOP, devices=devices)
        message = str(refused.value)
        assert "no usable CUDA GPU was found on this machine" in message and "\n" not in message
        assert "hardware=" not in message  # says what is wrong, not which group to add
    with pytest.raises(ConfigError) as refused:
        auto(BIG_CPU, devices=8)  # 64 cores: still no GPU, so not 8 CPU processes
    assert str(refused.value).startswith("trainer.devices=8 asks for 8 GPUs but no usable CUDA GPU was found")


@pytest.mark.parametrize("devices", ["abc", 0, "0", "[a]", 1.5, True, []])
def test_a_devices_value_that_is_none_names_what_it_takes_not_a_missing_gpu(devices) -> None:
    """Before: ``trainer.devices=abc`` on a machine without a GPU said it asked for GPUs and none was found."""
    with pytest.raises(ConfigError) as refused:
        auto(LAPTOP, devices=devices)
    assert str(refused.value) == (f"trainer.devices={devices} is not a number of GPUs (an int, e.g. 2), a list of GPU "
                                  "indices (e.g. [0,1] or \"0,1\"), auto or -1 (every GPU)")
    with pytest.raises(ConfigError, match=r"^trainer.devices=abc is not a number of CPU training processes: give "
                                          r"trainer.devices=N, a whole number of 1 or more \(auto: 1\)$"):
        place(LAPTOP, "cpu", "abc", "auto", "auto")


@pytest.mark.parametrize(("machine", "devices", "nodes", "expected"), [
    (NODE_8_A100, 8, 2, ("gpu", 8, "ddp", "bf16-mixed", 16)),
    (NODE_8_A100, None, 4, ("gpu", 1, "ddp", "bf16-mixed", 4)),
    (ONE_H100, None, 2, ("gpu", 1, "ddp", "bf16-mixed", 2)),
    (LAPTOP, None, 2, ("cpu", 1, "ddp", "32-true", 2)),  # two CPU nodes, one process each
])
def test_several_nodes_multiply_the_processes_and_need_ddp(machine, devices, nodes, expected) -> None:
    placement = auto(machine, devices=devices, num_nodes=nodes)
    assert summary(placement) == expected and placement.num_nodes == nodes
    assert placement.processes_per_node == expected[-1] // nodes


def test_a_sweep_started_here_uses_ddp_spawn_but_a_cluster_launch_keeps_ddp() -> None:
    """Lightning's ``ddp`` starts the other ranks by running the command line again: under
    --multirun that is the whole sweep. srun/torchrun start every rank themselves."""
    assert auto(NODE_8_A100, devices=8, multirun=True).strategy == "ddp_spawn"
    assert auto(NODE_8_A100, devices=1, multirun=True).strategy == "auto"
    cluster = Machine(gpus=8, bf16=True, cpu_cores=64, cluster_launched=True)
    assert auto(cluster, devices=8, multirun=True).strategy == "ddp"


@pytest.mark.parametrize(("launcher", "starts"), [("basic", True), ("submitit_local", True), ("slurm", False)])
def test_a_sweeps_job_starts_its_own_ranks_unless_a_cluster_starts_them(launcher: str, starts: bool) -> None:
    """What the plan of a sweep's job takes as ``multirun`` (ddp_spawn, ddp refused): submitit's local
    launcher runs a job as a process of its own, whose ``ddp`` would run submitit's own script again
    (before: ``_submit.py: error: unrecognized arguments``, the job not run, for trainer.devices=2);
    SLURM's starts every rank. Read from the launchers' own configs, as Hydra composes them."""
    from hydra import compose, initialize_config_dir

    from aiayn.config.resolvers import starts_its_ranks
    from tests.helpers.runs import REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        hydra = compose("train", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True).hydra
    assert starts_its_ranks(hydra) is starts


def test_ddp_given_for_a_sweep_run_here_is_refused_in_one_line() -> None:
    """hardware=gpu8_ddp (trainer.strategy=ddp) in a --multirun of Hydra's basic launcher: Lightning's ddp would start
    each other rank by running the command line again, the whole sweep again in each of 8 ranks (before: kept, as
    given). ddp_spawn, one process, a cluster that starts every rank, and a run alone keep what is given."""
    with pytest.raises(ConfigError) as refused:
        place(NODE_8_A100, "gpu", 8, "ddp", "auto", 1, multirun=True)
    assert str(refused.value) == ("trainer.strategy=ddp in a --multirun sweep run here starts each other rank by "
                                  "running the command line again, which runs the whole sweep again in it; give "
                                  "trainer.strategy=ddp_spawn (hardware=auto picks ddp_spawn), or run the sweep with "
                                  "hydra/launcher=slurm")
    with pytest.raises(ConfigError, match=r"^trainer.strategy=ddp_find_unused_parameters_true in a --multirun .* give "
                                          r"trainer.strategy=ddp_spawn_find_unused_parameters_true \("):
        place(NODE_8_A100, "gpu", 2, "ddp_find_unused_parameters_true", "auto", 1, multirun=True)
    cluster = Machine(gpus=8, bf16=True, cpu_cores=64, cluster_launched=True)
    for machine, devices, strategy, multirun in ((NODE_8_A100, 8, "ddp_spawn", True), (NODE_8_A100, 1, "ddp", True),
                                                 (cluster, 8, "ddp", True), (NODE_8_A100, 8, "ddp", False)):
        assert place(machine, "gpu", devices, strategy, "auto", 1, multirun=multirun).strategy == strategy


@pytest.mark.parametrize(("launcher", "refused"), [("basic", True), ("slurm", False)])
def test_a_sweeps_jobs_are_planned_as_run_here_only_under_the_basic_launcher(
        launcher: str, refused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan of a --multirun job (the ${aiayn.plan:} resolver): hardware=gpu8_ddp is refused where the sweep runs
    its jobs here, and kept (ddp) for the jobs SLURM runs, whose every rank the cluster starts."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from tests.helpers.runs import REPO

    monkeypatch.setattr("aiayn.config.resolvers.this_machine", lambda: NODE_8_A100)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra/launcher={launcher}", "hardware=gpu8_ddp", "hydra.mode=MULTIRUN",
                                          "model=base",  # a step 8 processes can share (small's 1,024 tokens is not)
                                          "paths.output_dir=/tmp/run"], return_hydra_config=True)
    before = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        if refused:
            with pytest.raises(Exception, match=r"trainer.strategy=ddp in a --multirun sweep run here"):
                OmegaConf.to_container(cfg.plan, resolve=True)
        else:
            assert OmegaConf.to_container(cfg.plan, resolve=True)["trainer"]["strategy"] == "ddp"
    finally:
        HydraConfig.instance().cfg = before


# -- explicit settings and the hardware groups win over auto --------------------------------------
@pytest.mark.parametrize(("group", "machine", "expected"), [
    (("cpu", 1, "auto", "32-true"), NODE_8_A100, ("cpu", 1, "auto", "32-true", 1)),  # the CPU although GPUs are there
    (("cpu", 2, "ddp_spawn", "32-true"), LAPTOP, ("cpu", 2, "ddp_spawn", "32-true", 2)),  # cpu2_ddp
    (("gpu", 1, "auto", "auto"), ONE_H100, ("gpu", 1, "auto", "bf16-mixed", 1)),  # gpu
    (("gpu", 8, "ddp", "auto"), NODE_8_A100, ("gpu", 8, "ddp", "bf16-mixed", 8)),  # gpu8_ddp
    (("gpu", 8, "ddp", "auto"), NODE_8_V100, ("gpu", 8, "ddp", "16-mixed", 8)),  # gpu8_ddp without bf16 units
    (("gpu", 8, "ddp", "bf16-mixed"), NODE_8_V100, ("gpu", 8, "ddp", "bf16-mixed", 8)),  # a precision given: as asked
])
def test_the_hardware_groups_are_kept_as_given(group, machine, expected) -> None:
    accelerator, devices, strategy, precision = group
    assert summary(place(machine, accelerator, devices, strategy, precision, 1)) == expected


@pytest.mark.parametrize(("group", "devices"), [("gpu", 1), ("gpu8_ddp", 8)])
def test_the_gpu_groups_pick_the_precision_as_auto_does_and_a_given_one_wins(group: str, devices: int) -> None:
    """hardware=gpu and hardware=gpu8_ddp on GPUs without bf16 units (V100, T4) train in 16-mixed with loss scaling,
    as hardware=auto does (before: bf16-mixed, emulated there); trainer.precision given still wins."""
    from hydra import compose, initialize_config_dir

    from aiayn.config.plan import make_plan
    from tests.helpers.runs import REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        planned = {(machine.gpu_name, given): make_plan(compose("train", overrides=[
            f"hardware={group}", *([f"trainer.precision={given}"] if given else []), "paths.output_dir=/tmp/run",
            "model=base"]),  # a step that 8 processes can share (the small model's 1,024 tokens is not)
            machine)["trainer"] for machine in (NODE_8_A100, NODE_8_V100) for given in (None, "bf16-mixed", "32-true")}
    assert {key: (trainer["precision"], trainer["devices"]) for key, trainer in planned.items()} == {
        (NODE_8_A100.gpu_name, None): ("bf16-mixed", devices), (NODE_8_V100.gpu_name, None): ("16-mixed", devices),
        (NODE_8_A100.gpu_name, "bf16-mixed"): ("bf16-mixed", devices),
        (NODE_8_V100.gpu_name, "bf16-mixed"): ("bf16-mixed", devices),
        (NODE_8_A100.gpu_name, "32-true"): ("32-true", devices), (NODE_8_V100.gpu_name, "32-true"): ("32-true", devices)}


@pytest.mark.parametrize("precision", ["16-mixed", "16", 16])
def test_fp16_mixed_precision_on_the_cpu_is_refused_in_one_line(precision) -> None:
    """Lightning trains ``16-mixed`` on the CPU as bf16-mixed (a warning), so the plan would say another precision
    than the run's (before: the plan said 16-mixed)."""
    for machine, devices in ((LAPTOP, None), (NODE_8_A100, 2)):
        with pytest.raises(ConfigError) as refused:
            place(machine, "cpu", devices, "auto", precision)
        assert str(refused.value) == (f"trainer.precision={precision}: fp16 mixed precision runs on GPUs only (on the "
                                      "CPU Lightning trains in bf16-mixed instead); give trainer.precision=bf16-mixed "
                                      "or 32-true (auto: 32-true on the CPU)")
    assert summary(place(ONE_H100, "gpu", 1, "auto", precision)) == ("gpu", 1, "auto", str(precision), 1)


def test_fp16_weights_on_the_cpu_are_refused_in_one_line() -> None:
    """``16-true`` on the CPU: the dev loss NaN at the first validation and every later step skipped
    (measured, torch 2.13); on a GPU it is planned as given."""
    with pytest.raises(ConfigError, match=r"^trainer.precision=16-true: fp16 weights train on GPUs only \(on the "
                                          r"CPU the losses turn NaN within steps and every later step is skipped\); "
                                          r"give trainer.precision=bf16-true, bf16-mixed or 32-true"):
        place(LAPTOP, "cpu", None, "auto", "16-true")
    assert summary(place(ONE_H100, "gpu", 1, "auto", "16-true")) == ("gpu", 1, "auto", "16-true", 1)
    assert summary(place(LAPTOP, "cpu", None, "auto", "bf16-true")) == ("cpu", 1, "auto", "bf16-true", 1)


def test_explicit_settings_mix_with_auto() -> None:
    assert summary(place(NODE_8_A100, "auto", 2, "auto", "32-true")) == ("gpu", 2, "ddp", "32-true", 2)
    assert summary(place(NODE_8_A100, "cuda", 4, "fsdp", "auto")) == ("gpu", 4, "fsdp", "bf16-mixed", 4)
    assert summary(place(LAPTOP, "cpu", None, "auto", "bf16-mixed")) == ("cpu", 1, "auto", "bf16-mixed", 1)
    assert summary(place(BIG_CPU, "cpu", 8, "auto", "auto")) == ("cpu", 8, "ddp", "32-true", 8)


def test_what_the_machine_cannot_run_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        place(LAPTOP, "gpu", 1, "auto", "bf16-mixed")
    assert str(refused.value) == ("trainer.accelerator=gpu asks for a GPU but no usable CUDA GPU was found on this "
                                  "machine; use hardware=auto (the default) or hardware=cpu to train on its CPU")
    with pytest.raises(ConfigError) as refused:
        place(LAPTOP, "cpu", 8, "auto", "auto")
    assert str(refused.value) == ("trainer.devices=8 asks for 8 CPU training processes but this machine has 2 CPU "
                                  "cores; use trainer.devices=2 or fewer")
    with pytest.raises(ConfigError, match="not a list of devices"):
        place(LAPTOP, "cpu", [0, 1], "auto", "auto")
    with pytest.raises(ConfigError, match="^trainer.num_nodes must be a positive whole number, got 0$"):
        place(LAPTOP, "auto", None, "auto", "auto", 0)


@pytest.mark.parametrize("accelerator, devices, gpus", [
    ("auto", 8, 8), ("auto", "8", 8), ("auto", [0, 3], 4), ("auto", "0,1", 2), ("gpu", None, 1), ("cuda", 2, 2),
    ("auto", None, None), ("auto", 1, None), ("auto", "auto", None), ("auto", -1, None), ("cpu", 8, None),
    ("auto", "eight", None),
])
def test_the_node_a_gpu_request_is_written_for(accelerator, devices, gpus) -> None:
    """For --cfg job on a machine without GPUs (a login node): the node the settings ask for, with
    bf16; none where they ask for no GPU, for every GPU of an unknown node, or on a GPU machine."""
    node = gpu_node_asked_for(LAPTOP, accelerator, devices)
    if gpus is None:
        assert node is None
        return
    assert node == Machine(gpus=gpus, bf16=True, cpu_cores=2, cpu_name="a laptop CPU")
    assert summary(place(node, accelerator, devices, "auto", "auto", 1))[0] == "gpu"
    assert gpu_node_asked_for(ONE_H100, accelerator, devices) is None


def test_a_cluster_job_asks_for_the_gpus_trainer_devices_names() -> None:
    """conf/hydra/launcher/slurm.yaml: gpus_per_node and tasks_per_node from trainer.devices."""
    assert [gpus_per_node(d) for d in (None, 8, "4", [0, 1, 2], "0,1")] == [1, 8, 4, 3, 2]
    for devices in ("auto", -1):
        with pytest.raises(ConfigError, match="give trainer.devices=N"):
            gpus_per_node(devices)


def test_this_machine_is_read_as_the_decision_needs_it() -> None:
    import torch

    machine = this_machine()
    assert machine.gpus == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert machine.cpu_cores == cpu_cores() >= 1 and machine.cpu_name
    assert (machine.gpu_name is None) == (machine.gpus == 0)
