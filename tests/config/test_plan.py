"""The plan of a run (aiayn.config.plan): the paper's step on any hardware (§5.1's ~25,000
tokens a side from optim.tokens_per_step, whatever the processes), the shipped configs planned on
machines this one is not, the block printed before the first step with its projected wall time,
and ``--cfg job`` showing the plan resolved."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from aiayn.config.plan import describe, make_plan, step_size
from aiayn.errors import ConfigError
from tests.helpers.configs import LAPTOP, NODE_8_H100, NODE_8_V100, composed, resolved, with_plan
from tests.helpers.inprocess import run_tool
from tests.helpers.throughput import throughput_record


# -- the step -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("processes", "accumulate", "batch"), [(1, 8, 3125), (2, 4, 3125), (4, 2, 3125), (8, 1, 3125),
                                                              (3, 3, 2777), (16, 1, 1562)])
def test_the_papers_step_is_the_same_on_1_2_4_or_8_gpus(processes: int, accumulate: int, batch: int) -> None:
    """25,000 tokens a side, batches of at most 3,400 (task wmt_en_de): only the split changes."""
    step = step_size(processes, max_tokens=3400, max_length=256, tokens_per_step=25_000)
    assert (step.accumulate, step.tokens_per_batch, step.derived) == (accumulate, batch, True)
    assert step.tokens_per_step == processes * accumulate * batch
    assert 25_000 - processes * accumulate <= step.tokens_per_step <= 25_000 and batch <= 3400


def test_an_explicit_accumulation_wins_and_no_recipe_step_means_one_batch_a_process() -> None:
    explicit = step_size(1, max_tokens=3400, tokens_per_step=25_000, accumulate=8)
    assert (explicit.accumulate, explicit.tokens_per_batch, explicit.tokens_per_step, explicit.derived) == (
        8, 3400, 27_200, False)
    unset = step_size(2, max_tokens=1024, tokens_per_step=None)
    assert (unset.accumulate, unset.tokens_per_batch, unset.tokens_per_step) == (1, 1024, 2048)


def test_a_step_too_small_for_the_processes_or_a_bad_number_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^optim.tokens_per_step=25000 shared by 128 training processes gives "
                                          r"batches of 195 tokens, too few for one pair of "
                                          r"task.datamodule.max_length=256"):
        step_size(128, max_tokens=3400, max_length=256, tokens_per_step=25_000)
    for kwargs, setting in (({"tokens_per_step": 0}, "optim.tokens_per_step"),
                            ({"accumulate": -2}, "trainer.accumulate_grad_batches"),
                            ({"max_tokens": "many"}, "task.datamodule.max_tokens")):
        with pytest.raises(ConfigError, match=f"^{setting} must be a positive whole number"):
            step_size(1, **{"max_tokens": 1024, **kwargs})


# -- the shipped configs on other machines --------------------------------------------------------
def test_the_users_command_plans_8_gpus_of_ddp_bf16_and_the_papers_step_on_an_8_gpu_node() -> None:
    cfg = composed("model=big", "task=wmt_en_fr", "trainer.devices=8")
    plan = make_plan(cfg, NODE_8_H100)
    # Logged every 100 steps on GPUs, where each read-back of the logged values waits for them (every step on a CPU)
    assert plan["trainer"] == {"accelerator": "gpu", "devices": 8, "num_nodes": 1, "strategy": "ddp",
                               "precision": "bf16-mixed", "accumulate_grad_batches": 1, "val_check_interval": 1000,
                               "log_every_n_steps": 100}
    assert make_plan(composed("model=big", "task=wmt_en_fr", "trainer.devices=8", "trainer.log_every_n_steps=1"),
                     NODE_8_H100)["trainer"]["log_every_n_steps"] == 1  # given: as given
    assert make_plan(composed("model=big", "task=wmt_en_fr"), LAPTOP)["trainer"]["log_every_n_steps"] == 1
    assert (plan["processes"], plan["tokens_per_batch"], plan["tokens_per_step"]) == (8, 3125, 25_000)
    assert plan["device"] == "NVIDIA H100 80GB HBM3"
    assert cfg.model.dropout == 0.1  # §6.1: the big EN-FR model's P_drop (conf/task_model/wmt_en_fr_big.yaml)
    assert make_plan(cfg, NODE_8_V100)["trainer"]["precision"] == "16-mixed"


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_the_base_recipe_trains_the_same_step_on_any_number_of_gpus(gpus: int) -> None:
    """An 80 GB GPU holds base's whole share of the step: one batch a process, however many."""
    cfg = composed("model=base", "task=wmt_en_de", f"trainer.devices={gpus}")
    plan = make_plan(cfg, NODE_8_H100)
    assert (plan["tokens_per_step"], plan["tokens_per_batch"]) == (25_000, 25_000 // gpus)
    assert plan["trainer"]["accumulate_grad_batches"] == 1
    # The same step with the batch fixed: accumulation takes up the rest.
    fixed = make_plan(composed("model=base", "task=wmt_en_de", f"trainer.devices={gpus}",
                               "task.datamodule.max_tokens=3400"), NODE_8_H100)
    accumulate = fixed["trainer"]["accumulate_grad_batches"]
    assert (fixed["tokens_per_step"], fixed["tokens_per_batch"], accumulate) == (25_000, 3125, 8 // gpus)
    # Validation every 1,000 optimizer steps: Lightning counts batches, so the plan gives it 1,000 × accumulation,
    # and says the steps beside it (before: --cfg job showed val_check_interval: 8000 alone).
    assert fixed["trainer"]["val_check_interval"] == 1000 * accumulate and fixed["validate_every_steps"] == 1000


def test_an_epoch_cut_inside_a_step_of_accumulated_batches_is_refused_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer.limit_train_batches=10 under 8 accumulated batches: Lightning would step on batches 8 and 10, a step of
    2 batches every other one, and validate every 8,000 batches, 1,600 steps (before: planned as 25,000 tokens a
    step, validation every 1,000 steps)."""
    monkeypatch.setattr("aiayn.config.resolvers.this_machine", lambda: LAPTOP)  # the plan as the run resolves it
    with pytest.raises(Exception, match="trainer.limit_train_batches=10 ends an epoch inside a step of 8"):
        OmegaConf.to_container(composed("model=base", "task=wmt_en_de", "trainer.limit_train_batches=10").plan,
                               resolve=True)
    for limit in ("10", "0.5", "1"):
        with pytest.raises(ConfigError) as refused:
            make_plan(composed("model=base", "task=wmt_en_de", f"trainer.limit_train_batches={limit}"), LAPTOP)
        assert str(refused.value) == (f"trainer.limit_train_batches={limit} ends an epoch inside a step of 8 "
                                      "accumulated batches, which Lightning would take short (fewer tokens than the "
                                      "plan's step, validation off its steps); give a whole number of batches, a "
                                      "multiple of 8 (null: every batch)")
    for limit in ("16", "1.0", "null"):  # whole steps
        assert make_plan(composed("model=base", "task=wmt_en_de", f"trainer.limit_train_batches={limit}"), LAPTOP)
    # On 8 GPUs the 8 batches of a step are one a GPU: the limit counts every GPU's (before: each GPU's, so that
    # limit_train_batches=10 was 80 batches there and 10 on one GPU)
    with pytest.raises(ConfigError, match=r"^trainer.limit_train_batches=10 ends an epoch inside a step of 8 batches "
                                          r"\(8 processes × 1\), which Lightning would take short"):
        make_plan(composed("model=base", "task=wmt_en_de", "trainer.devices=8", "trainer.limit_train_batches=10"),
                  NODE_8_H100)


def test_whole_numbers_of_batches_count_every_process_s_so_the_run_is_the_same_on_any_number() -> None:
    """Each process is given its share of trainer.limit_*_batches (Lightning counts a process's): the first 16 batches
    of the epoch's order on one GPU or eight, and the first 3 of the dev set (each GPU's share rounded up, so rank r
    scores batch r). Before: each GPU's, so that the epoch, and the dev and test figures, changed with the GPUs."""
    limits = ("trainer.limit_train_batches=16", "trainer.limit_val_batches=3", "trainer.limit_test_batches=8")
    eight = make_plan(composed("model=base", "task=wmt_en_de", "trainer.devices=8", *limits), NODE_8_H100)["trainer"]
    assert (eight["accumulate_grad_batches"], eight["limit_train_batches"], eight["limit_val_batches"],
            eight["limit_test_batches"]) == (1, 2, 1, 1)
    one = make_plan(composed("model=base", "task=wmt_en_de", *limits), LAPTOP)["trainer"]
    assert one["accumulate_grad_batches"] == 8 and not {"limit_train_batches", "limit_val_batches"} & set(one)
    fractions = make_plan(composed("model=base", "task=wmt_en_de", "trainer.devices=8", "trainer.limit_val_batches=0.5",
                                   "trainer.limit_test_batches=0", "trainer.limit_train_batches=0.5"), NODE_8_H100)
    # a fraction is every process's already (of equal counts: whole steps where each process takes a batch a step)
    assert not {"limit_train_batches", "limit_val_batches", "limit_test_batches"} & set(fractions["trainer"])
    # as a run resolves its plan (its resolver reads the settings the plan takes): debug=tiny's 2 of each evaluation
    tiny = resolved("debug=tiny", "hardware=cpu", "trainer.devices=2", least_cores=2)["plan"]["trainer"]
    assert (tiny["limit_val_batches"], tiny["limit_test_batches"]) == (1, 1)


def test_the_big_model_is_p_drop_03_except_on_en_fr_and_the_command_line_still_wins() -> None:
    assert composed("model=big", "task=wmt_en_de").model.dropout == 0.3
    assert composed("model=big", "task=wmt_en_fr", "model.dropout=0.3").model.dropout == 0.3
    assert composed("experiment=table2_big_en_fr").model.dropout == 0.1
    assert composed("experiment=table3_big", "+scale=multi30k").model.dropout == 0.3


def test_the_composed_config_resolves_the_plan_on_this_machine() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a machine without a GPU")
    plan = OmegaConf.to_container(composed().plan, resolve=True)
    assert plan["trainer"]["accelerator"] == "cpu" and plan["trainer"]["precision"] == "32-true"
    with pytest.raises(Exception) as refused:
        OmegaConf.to_container(composed("trainer.devices=8").plan, resolve=True)
    assert "no usable CUDA GPU was found" in str(refused.value)


def test_the_plan_says_whether_and_when_validation_runs() -> None:
    tiny = make_plan(composed("debug=tiny"), LAPTOP)
    assert (tiny["validation"], tiny["validate_every_steps"]) == ("every 2 steps", 2)
    off = make_plan(composed("debug=tiny", "trainer.limit_val_batches=0"), LAPTOP)
    assert (off["validation"], off["validate_every_steps"]) == ("never (trainer.limit_val_batches=0)", None)
    config = with_plan(composed("debug=tiny", "trainer.limit_val_batches=0"), off)
    assert "  4 steps, warmup 2, validation never (trainer.limit_val_batches=0)" in describe(off, config).splitlines()
    assert make_plan(composed("debug=tiny", "trainer.val_check_interval=null"), LAPTOP)["validation"] == "every epoch"
    timed = composed("debug=tiny", "trainer.max_time=00:01:00:00")  # the one setting that may end training sooner
    lines = describe(plan := make_plan(timed, LAPTOP), with_plan(timed, plan)).splitlines()
    assert "  4 steps (or trainer.max_time=00:01:00:00, whichever comes first), warmup 2, validation every 2 steps" in lines
    smoke = composed("debug=tiny", "trainer.fast_dev_run=true")  # Lightning's: it trains 1 step, whatever the plan
    lines = describe(plan := make_plan(smoke, LAPTOP), with_plan(smoke, plan)).splitlines()
    assert ("  4 steps (trainer.fast_dev_run=True: Lightning's smoke test instead, 1 step and as many batches of "
            "validation and test, no checkpoint, no logger), warmup 2, validation every 2 steps") in lines
    assert not [line for line in lines if line.startswith("  checkpoints:")]  # it saves none
    # A lower bound the run meets is let be.
    assert make_plan(composed("debug=tiny", "trainer.min_steps=3"), LAPTOP)["validation"] == "every 2 steps"


@pytest.mark.parametrize("interval", ["2", "null", "0.5", "1.0"])
def test_lightning_takes_every_validation_interval_the_plan_accepts(interval: str, tmp_path: Path) -> None:
    """What the plan accepts, Lightning's Trainer builds with; a fraction of an epoch is refused by the plan, naming
    the setting (before: planned as "every 0.5 of an epoch", then refused by Lightning's Trainer for its
    check_val_every_n_epoch=None, which the plan keeps)."""
    import lightning as L

    cfg = composed("debug=tiny", f"trainer.val_check_interval={interval}")
    try:
        plan = make_plan(cfg, LAPTOP)
    except ConfigError as refused:
        assert interval in ("0.5", "1.0")
        assert str(refused) == ("trainer.val_check_interval must be a whole number of steps (null: every epoch; a run "
                                f"validates across epochs, not at a fraction of one), got {interval}")
        return
    L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              default_root_dir=tmp_path, check_val_every_n_epoch=cfg.trainer.check_val_every_n_epoch,
              val_check_interval=plan["trainer"]["val_check_interval"])


@pytest.mark.parametrize("override, message", [
    ("trainer.max_steps=3", ("trainer.max_steps=3 differs from optim.train_steps=4, the run's steps (trainer.max_steps "
                             "follows it); give optim.train_steps=3 instead")),
    ("trainer.max_steps=-1", "trainer.max_steps=-1 differs from optim.train_steps=4"),
    # (before: planned as 4 steps, and the run refused as Lightning's Trainer was built: "'<' not supported ...")
    ("trainer.max_steps=null", ("trainer.max_steps=null differs from optim.train_steps=4, the run's steps "
                                "(trainer.max_steps follows it); give optim.train_steps instead")),
    ("trainer.max_epochs=0", ("trainer.max_epochs=0 could stop training before optim.train_steps=4 steps; a run trains "
                              "optim.train_steps steps, however many epochs they take: leave trainer.max_epochs at -1 "
                              "and give optim.train_steps")),
    ("trainer.max_epochs=3", "trainer.max_epochs=3 could stop training before optim.train_steps=4 steps"),
    # Lightning's lower bounds and per-epoch validation, which the plan's steps would not show.
    ("trainer.min_steps=10", ("trainer.min_steps=10 is more than optim.train_steps=4, the run's steps, so it cannot "
                              "be met; give optim.train_steps=10 to train that long")),
    ("trainer.min_epochs=1", "trainer.min_epochs=1: a run's length is counted in steps (optim.train_steps)"),
    ("trainer.check_val_every_n_epoch=2", ("trainer.check_val_every_n_epoch=2: a run validates every "
                                           "trainer.val_check_interval optimizer steps, whatever the epoch; leave "
                                           "trainer.check_val_every_n_epoch at null and set trainer.val_check_interval")),
])
def test_a_trainer_setting_that_would_train_other_steps_than_the_plan_says_is_refused(override: str,
                                                                                       message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        make_plan(composed("debug=tiny", override), LAPTOP)
    assert str(refused.value).startswith(message)
    # The steps where they live: trainer.max_steps follows them.
    cfg = composed("debug=tiny", "optim.train_steps=3")
    assert cfg.trainer.max_steps == 3 and make_plan(cfg, LAPTOP)["validation"] == "every 2 steps"


@pytest.mark.parametrize("override, line", [
    ("trainer.max_steps=3", ("train.py: trainer.max_steps=3 differs from optim.train_steps=4, the run's steps "
                             "(trainer.max_steps follows it); give optim.train_steps=3 instead")),
    # What the run's own checks refuse, not the plan's (before: shown, exit 0).
    ("model.d_model=33 model.n_heads=1", "train.py: model: d_model must be even for the sinusoidal encoding, got 33"),
    ("model.n_heads=3", ("train.py: model.d_k and model.d_v are d_model / n_heads unless given (§3.2.2), and "
                         "model.n_heads=3 does not divide model.d_model=32: give model.d_k=N model.d_v=N, or another n_heads")),
    # What Lightning's Trainer refuses as the run builds it (before: shown, exit 0; the run's line was Lightning's).
    ("trainer.precision=abc", ("train.py: trainer.precision=abc is not a precision Lightning takes; give one of "
                               "transformer-engine, transformer-engine-float16, 16-true, 16-mixed, bf16-true, bf16-mixed, "
                               "32-true, 64-true, 64, 32, 16, bf16 (null: bf16-mixed or 16-mixed on a GPU, 32-true on "
                               "the CPU)")),
    ("trainer.limit_val_batches=-1", ("train.py: trainer.limit_val_batches must be a fraction of the batches in [0.0, "
                                      "1.0] or a whole number of batches (null: every batch), got -1")),
    ("trainer.overfit_batches=1.5", ("train.py: trainer.overfit_batches must be a fraction of the batches in [0.0, "
                                     "1.0] or a whole number of batches (0: off), got 1.5")),
    ("trainer.fast_dev_run=-1", ("train.py: trainer.fast_dev_run must be true, false or a whole number of steps, 0 or "
                                 "more (Lightning's smoke test), got -1")),
    ("trainer.gradient_clip_algorithm=sideways", ("train.py: trainer.gradient_clip_algorithm must be norm or value "
                                                  "(null: norm), got 'sideways'")),
    # A fraction of an epoch, which Lightning takes only with check_val_every_n_epoch set, which the plan keeps null
    # (before: shown as "validation every 0.5 of an epoch", exit 0; the run: Lightning's refusal of that null).
    ("trainer.val_check_interval=0.5", ("train.py: trainer.val_check_interval must be a whole number of steps (null: "
                                        "every epoch; a run validates across epochs, not at a fraction of one), got 0.5")),
    # What only a task's data module knows (its check_settings), and a choice its table has no entry for
    # (before: shown, exit 0; and Hydra's "Interpolation key 'task.splits.foo.vocab_size' not found").
    ("task=wsj_semi task.split=sample task.datamodule.wsj_fraction=0", (
        "train.py: task.datamodule.wsj_fraction=0: the share of WSJ's trees in the semi-supervised training set must "
        "be above 0 and at most 1 (the default: 0.1)")),
    ("task=wsj task.datamodule.linearization=word", ("train.py: task.datamodule.linearization=word: the output trees' "
                                                     "leaves are xx or words (docs/parsing.md)")),
    ("task=wsj task.split=foo", "train.py: task.split=foo: not one of task.splits (standard, sample)"),
])
def test_cfg_job_refuses_what_the_run_would_in_one_line(override: str, line: str, tmp_path: Path) -> None:
    result = run_tool("src/train.py", "debug=tiny", *override.split(" "), "--cfg", "job", cwd=tmp_path, check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [line], result.stderr[-3000:]
    assert "plan:" not in result.stdout


# -- what is printed ------------------------------------------------------------------------------
def test_the_plan_block_says_what_the_run_will_do_and_projects_its_time(tmp_path: Path) -> None:
    records = tmp_path / "train_throughput.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in (
        throughput_record(tgt_tokens_per_s=10_000.0, date="2026-11-20T10:00:00"),  # older: not used
        throughput_record(), throughput_record(model="base"), throughput_record(compile=True, tgt_tokens_per_s=9e9),
    )) + "\nnot json\n")
    cfg = composed("model=big", "task=wmt_en_fr", "trainer.devices=8")
    config = with_plan(cfg, make_plan(cfg, NODE_8_H100))  # as planned on that node
    text = describe(config["plan"], config, model="big", records=records)
    lines = text.splitlines()
    assert lines[0] == "plan: 8 GPUs (NVIDIA H100 80GB HBM3), bf16-mixed, ddp"
    assert lines[1].startswith("  step: 8 processes × 1 batch of 3,125 tokens = 25,000 tokens a side "
                               "(accumulation derived from optim.tokens_per_step=25,000")
    assert lines[2] == ("  batch: task.datamodule.max_tokens=auto: the process's share of the step fits one batch, "
                        "~6.8 GiB of the GPU's 80 GiB (assumed: its memory is not known here)")
    assert lines[3] == "  300,000 steps, warmup 4,000, validation every 1,000 steps"
    # 300,000 steps × 1 batch × 62.5 ms a batch of 3,125 tokens (the record's mean) = 18,750 s
    # Table 3's big row with EN-FR's 32,000 shared wordpieces: 209,051,648 (tests/model/test_parameter_count.py
    # counts it by hand for 37,000)
    # §6.1's last 20 checkpoints, 600 steps apart, end at step 300,000: the first at 300,000 - 19 × 600
    assert lines[4] == ("  checkpoints: every 1,000 steps, the newest 20 kept; §6.1's last 20, every 600 steps from "
                        "step 288,600, to average")
    assert lines[5] == "  model: big (n_layers=6, d_model=1024, d_ff=4096, n_heads=16, d_k=64, d_v=64), 209.1M parameters"
    assert lines[6].startswith("  projected: 5.2 h of training steps at 62 ms a batch, 50,000 target tokens/s a "
                               "device (measured 2026-11-25")
    assert lines[6].endswith(", if the devices scale linearly; validations add to it")
    assert len(lines) == 7
    other_gpu = make_plan(cfg, NODE_8_V100)
    assert "projected" not in describe(other_gpu, {**config, "plan": other_gpu}, model="big", records=records)


# -- the tool ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cfg_job_shows_the_plan_resolved(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                         tmp_path: Path) -> None:
    import torch

    from aiayn.cli.train import main

    if torch.cuda.is_available():
        pytest.skip("on a machine without a GPU")
    monkeypatch.setattr(sys, "argv", ["train.py", "model=base", "task=wmt_en_de", "--cfg", "job"])
    main()
    shown = OmegaConf.create(capsys.readouterr().out)
    assert shown.plan.trainer.accelerator == "cpu" and shown.plan.trainer.accumulate_grad_batches == 8
    assert (shown.plan.trainer.val_check_interval, shown.plan.validate_every_steps) == (8000, 1000)
    assert (shown.plan.tokens_per_step, shown.plan.tokens_per_batch) == (25_000, 3125)
    # The user's command: shown as planned for the 8-GPU node it is written for, and said so; run
    # here, refused in one line.
    monkeypatch.setattr(sys, "argv", ["train.py", "model=big", "task=wmt_en_fr", "trainer.devices=8", "--cfg", "job"])
    main()
    captured = capsys.readouterr()
    shown, shown_plan = OmegaConf.create(captured.out), captured.err.splitlines()
    assert OmegaConf.to_container(shown.plan.trainer) == {
        "accelerator": "gpu", "devices": 8, "num_nodes": 1, "strategy": "ddp", "precision": "bf16-mixed",
        "accumulate_grad_batches": 1, "val_check_interval": 1000, "log_every_n_steps": 100}
    assert (shown.plan.processes, shown.plan.tokens_per_batch, shown.plan.tokens_per_step) == (8, 3125, 25_000)
    assert shown.plan.shown_for == ("a node of 8 GPUs with bf16 (A100, H100); this machine has no usable CUDA GPU, so "
                                    "the run itself is refused here")
    assert shown.model.dropout == 0.1  # §6.1: the big EN-FR model's P_drop
    # And the plan as the run prints it before its first step, on stderr (stdout: the YAML alone).
    printed = shown_plan
    assert printed[:2] == ["plan: 8 GPUs, bf16-mixed, ddp", "  shown for " + shown.plan.shown_for]
    assert "  300,000 steps, warmup 4,000, validation every 1,000 steps" in printed
    assert any(line.startswith("  model: big (n_layers=6, d_model=1024") for line in printed)
    refused = run_tool("src/train.py", "model=big", "task=wmt_en_fr", "trainer.devices=8", "logger=none",
                       f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert refused.returncode == 2
    err = refused.stderr.strip().splitlines()
    assert err == [("train.py: trainer.devices=8 asks for 8 GPUs but no usable CUDA GPU was found on this machine; run "
                    "the command on a GPU machine, or leave trainer.devices out to train in one process on this CPU "
                    "(trainer.accelerator=cpu trainer.devices=N trains in N CPU processes)")]
    assert not (tmp_path / "run").exists()
