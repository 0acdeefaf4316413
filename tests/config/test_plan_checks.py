"""What the plan of a run (aiayn.config.plan) refuses beside tests/config/test_plan.py's, and the warning lines it
prints last, on machines this one is not: a step of no tokens beside an explicit accumulation, an epoch cut inside a
step by trainer.overfit_batches, a warmup longer than the run, bf16 given for GPUs without bf16 units, and the recipe's
step an explicit accumulation sets aside; the small recipes' step on any hardware, a device of Lightning's own."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from aiayn.config.plan import describe, make_plan
from aiayn.errors import ConfigError
from tests.helpers.configs import LAPTOP, NODE_8_H100, NODE_8_V100, composed, with_plan


@pytest.mark.parametrize("tokens_per_step", ["0", "-5"])
def test_a_step_of_no_tokens_is_refused_where_the_accumulation_is_given_too(tokens_per_step: str) -> None:
    """optim.tokens_per_step=0 beside trainer.accumulate_grad_batches=2 (before: planned, the setting unused)."""
    for machine in (LAPTOP, NODE_8_H100):
        with pytest.raises(ConfigError) as refused:
            make_plan(composed(f"optim.tokens_per_step={tokens_per_step}", "trainer.accumulate_grad_batches=2"), machine)
        assert str(refused.value) == f"optim.tokens_per_step must be a positive whole number, got {tokens_per_step}"


def test_a_warmup_longer_than_the_run_is_one_warning_line_of_the_plan() -> None:
    """model=base task=wmt_en_de optim.train_steps=3000 keeps base's warmup of 4,000: the rate never reaches Eq. 3's
    peak (before: planned without a word). Said, not refused: a short debugging run may keep its warmup."""
    cfg = composed("model=base", "task=wmt_en_de", "optim.train_steps=3000")
    plan = make_plan(cfg, LAPTOP)
    line = ("optim.warmup_steps=4,000 is more than the run's optim.train_steps=3,000: the learning rate rises through "
            "every step to 75% of Eq. 3's peak and never decays; give optim.warmup_steps=3000 or less to reach it (a "
            "short debugging run may leave it)")
    assert plan["warnings"] == [line]
    assert describe(plan, with_plan(cfg, plan)).splitlines()[-1] == f"  warning: {line}"
    # Where the rate reaches its peak (at the last step: the tests' debug=tiny optim.train_steps=2), the default job,
    # the tiny run, and Lightning's smoke test, whose steps are not the schedule's: no warning.
    for overrides in ([], ["debug=tiny"], ["debug=tiny", "optim.train_steps=2"],
                      ["model=base", "task=wmt_en_de", "optim.train_steps=3000", "trainer.fast_dev_run=true"]):
        assert "warnings" not in make_plan(composed(*overrides), LAPTOP), overrides


def test_bf16_given_for_gpus_without_bf16_units_is_one_warning_line_of_the_plan() -> None:
    """trainer.precision=bf16-mixed on V100s: kept, as given, and said to be emulated there (before: not a word)."""
    for precision in ("bf16-mixed", "bf16-true"):
        plan = make_plan(composed("model=base", "task=wmt_en_de", f"trainer.precision={precision}"), NODE_8_V100)
        assert (plan["trainer"]["precision"], plan["warnings"]) == (precision, [
            (f"trainer.precision={precision}: the GPUs here (Tesla V100-SXM2-32GB) have no bf16 units (compute "
            "capability below 8.0), so torch emulates bf16, slower than fp16; leave trainer.precision out for 16-mixed "
            "(fp16 with loss scaling), as hardware=auto picks there")])
    for machine, precision in ((NODE_8_H100, "bf16-mixed"), (NODE_8_V100, "16-mixed"), (NODE_8_V100, "auto"),
                               (LAPTOP, "bf16-mixed")):
        plan = make_plan(composed("model=base", "task=wmt_en_de", f"trainer.precision={precision}"), machine)
        assert "warnings" not in plan, (machine, precision)


def test_overfit_batches_cutting_a_step_is_refused_as_an_epoch_limit_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning makes trainer.overfit_batches the epoch's limit in place of trainer.limit_train_batches: 10 under 8
    accumulated batches is the same short step (before: planned as 25,000 tokens a step, unchecked)."""
    monkeypatch.setattr("aiayn.config.resolvers.this_machine", lambda: LAPTOP)  # the plan as the run resolves it
    with pytest.raises(Exception, match="trainer.overfit_batches=10 ends an epoch inside a step of 8"):
        OmegaConf.to_container(composed("model=base", "task=wmt_en_de", "trainer.overfit_batches=10").plan, resolve=True)
    for value in ("10", "0.5"):
        with pytest.raises(ConfigError) as refused:
            make_plan(composed("model=base", "task=wmt_en_de", f"trainer.overfit_batches={value}",
                               "trainer.limit_train_batches=16"), LAPTOP)
        assert str(refused.value) == (f"trainer.overfit_batches={value} ends an epoch inside a step of 8 accumulated "
                                      "batches, which Lightning would take short (fewer tokens than the plan's step, "
                                      "validation off its steps); give a whole number of batches, a multiple of 8 (0: off)")
    for value in ("16", "0", "0.0", "1.0"):  # whole steps, or off (then trainer.limit_train_batches is the limit)
        assert make_plan(composed("model=base", "task=wmt_en_de", f"trainer.overfit_batches={value}"), LAPTOP)
    with pytest.raises(ConfigError, match=r"^trainer.limit_train_batches=10 ends an epoch inside a step of 8"):
        make_plan(composed("model=base", "task=wmt_en_de", "trainer.overfit_batches=0", "trainer.limit_train_batches=10"),
                  LAPTOP)


def test_an_accumulation_given_says_it_sets_the_recipes_step_aside() -> None:
    """model=base trainer.accumulate_grad_batches=2 trains steps of 6,800 tokens, not base's 25,000: the step line
    says the recipe's step is not the one trained (before: "(trainer.accumulate_grad_batches=2; ...)" alone)."""
    cfg = composed("model=base", "task=wmt_en_de", "trainer.accumulate_grad_batches=2")
    plan = make_plan(cfg, LAPTOP)
    assert describe(plan, with_plan(cfg, plan)).splitlines()[1] == (
        "  step: 1 process × 2 accumulated batches of 3,400 tokens = 6,800 tokens a side (trainer.accumulate_grad_batches"
        "=2 given, not the recipe's optim.tokens_per_step=25,000; the paper's: ~25,000, §5.1)")
    cfg = composed("debug=tiny", "trainer.accumulate_grad_batches=2")  # a recipe without a step: nothing set aside
    plan = make_plan(cfg, LAPTOP)
    assert describe(plan, with_plan(cfg, plan)).splitlines()[1].endswith(
        "(trainer.accumulate_grad_batches=2; the paper's: ~25,000, §5.1)")


def test_an_interval_longer_than_the_run_is_said_to_validate_nothing_before_its_end() -> None:
    """(before: "validation every 5,000 steps" of a 4-step run, unqualified, and a run of one step was "1 steps")."""
    assert make_plan(composed("debug=tiny", "trainer.val_check_interval=5000"), LAPTOP)["validation"] == (
        "every 5,000 steps, more than the run's 4: none before its end")
    assert make_plan(composed("debug=tiny", "trainer.val_check_interval=4"), LAPTOP)["validation"] == "every 4 steps"
    one = composed("debug=tiny", "optim.train_steps=1", "optim.warmup_steps=1")
    lines = describe(plan := make_plan(one, LAPTOP), with_plan(one, plan)).splitlines()
    assert "  1 step, warmup 1, validation every 2 steps, more than the run's 1: none before its end" in lines


def test_the_cpu_default_and_the_small_scales_train_a_step_of_1024_tokens_on_any_hardware() -> None:
    """The default job and the Multi30k scales' rows: 1,024 tokens a step, which processes share as they share the
    paper's (before: one 1,024-token batch a process, so 8 GPUs trained steps of 8,192 that the tables took for the
    row's). Only the smoke test, debug=tiny, keeps one batch a process."""
    scales = ([], ["experiment=table3_base", "+scale=multi30k_cpu"], ["experiment=table3_A_h4", "+scale=multi30k"])
    for overrides in scales:
        plan = make_plan(composed(*overrides), LAPTOP)
        assert (plan["trainer"]["accelerator"], plan["trainer"]["accumulate_grad_batches"]) == ("cpu", 1)
        assert plan["tokens_per_step"] == plan["tokens_per_batch"] == 1024
        two = make_plan(composed(*overrides, "hardware=cpu2_ddp"), LAPTOP)
        assert (two["tokens_per_step"], two["tokens_per_batch"], two["trainer"]["devices"]) == (1024, 512, 2)
        four = make_plan(composed(*overrides, "hardware=gpu", "trainer.devices=4"), NODE_8_H100)
        assert (four["tokens_per_step"], four["tokens_per_batch"], four["trainer"]["accumulate_grad_batches"]) == (
            1024, 256, 1)
        with pytest.raises(ConfigError, match="optim.tokens_per_step=1024 shared by 8 training processes gives "
                                              "batches of 128 tokens, too few .* train on fewer processes"):
            make_plan(composed(*overrides, "hardware=gpu8_ddp"), NODE_8_H100)
    debug = make_plan(composed("debug=tiny", "model=base", "hardware=cpu2_ddp"), LAPTOP)
    assert (debug["tokens_per_step"], debug["tokens_per_batch"]) == (2048, 1024)
    # The small recipe elsewhere, and Table 4's sample row: the step one process took before, now on any hardware.
    for overrides, step in ((["task=wmt_en_de"], 3400), (["task=parallel_text"], 3400), (["experiment=table4_sample"], 1024)):
        one, two = (make_plan(composed(*overrides, *more), LAPTOP) for more in ([], ["hardware=cpu2_ddp"]))
        assert (one["tokens_per_step"], one["tokens_per_batch"]) == (step, step), overrides
        assert (two["tokens_per_step"], two["tokens_per_batch"]) == (step, step // 2), overrides


def test_an_accelerator_of_lightnings_own_is_named_in_the_plan_as_given() -> None:
    """trainer.accelerator=mps (a Mac's GPU), which Lightning checks: the plan says that device (before: "1 CPU
    process" and "on the CPU", while Lightning was given mps)."""
    cfg = composed("trainer.accelerator=mps")
    plan = make_plan(cfg, LAPTOP)
    assert plan["trainer"]["accelerator"] == "mps"
    lines = describe(plan, with_plan(cfg, plan)).splitlines()
    assert lines[0].startswith("plan: 1 mps device (")
    assert lines[2] == ("  batch: task.datamodule.max_tokens=auto: the process's share of the step fits one batch (on "
                        "the mps device, batches of at most 3,400 tokens)")
