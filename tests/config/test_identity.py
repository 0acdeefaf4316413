"""Runs told apart in the trackers (aiayn.config.identity): the W&B logger's init arguments for jobs
composed from conf/ as Hydra's run gives them (its job config set, the logger instantiated in this
process, no run started), and a paper row's run changed from its row."""

from __future__ import annotations

from pathlib import Path

import hydra
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict, read_write

from aiayn.config.identity import MODIFIED, row_changes, row_settings
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO

CONF = REPO / "conf"
SWEEP = "multirun/2026-11-26_10-00-00"


def wandb_init(tmp_path: Path, *overrides: str, multirun: bool = False, run_dir: Path | None = None,
               sweep_dir: Path | str = SWEEP) -> dict:
    """What WandbRunLogger would give wandb.init for this job (the job as Hydra's launcher sets it)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["logger=wandb", *overrides], return_hydra_config=True)
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.mode = RunMode.MULTIRUN if multirun else RunMode.RUN
            cfg.hydra.sweep.dir = str(sweep_dir)
            cfg.hydra.runtime.output_dir = str(run_dir or tmp_path)
        before = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(cfg)
        try:
            return dict(hydra.utils.instantiate(cfg.logger.wandb, mode="offline")._wandb_init)
        finally:
            HydraConfig.instance().cfg = before


def test_the_name_does_not_say_the_task_and_model_twice(tmp_path):
    """``model=big task=wmt_en_fr``: the run name says both already; the tags keep every override."""
    paper = wandb_init(tmp_path, "model=big", "task=wmt_en_fr", "seed=2")
    assert paper["name"] == "wmt_en_fr-big-seed=2"
    assert {"model=big", "task=wmt_en_fr", "seed=2"} <= set(paper["tags"])
    own = wandb_init(tmp_path, "task=parallel_text", "task.data_dir=/data/corpus", "task.src_lang=de",
                     "task.tgt_lang=en")
    assert own["name"] == "parallel_text_de_en-small-task.data_dir=/data/corpus,task.src_lang=de,task.tgt_lang=en"
    named = wandb_init(tmp_path, "model=base", "run_name=mine")  # a name of one's own does not say the model
    assert named["name"] == "mine-model=base"
    row = wandb_init(tmp_path, "experiment=table3_A_h1", "model=big")  # nor does a row's
    assert row["name"] == "table3-A_h1-paper-model=big"


def test_the_jobs_of_a_sweep_share_it_as_group_and_their_names_and_tags_carry_the_swept_values(tmp_path):
    jobs = [wandb_init(tmp_path, "debug=tiny", f"seed={seed}", "model.dropout=0.2", multirun=True) for seed in (1, 2)]
    assert [job["name"] for job in jobs] == ["multi30k_en_de-small-debug-seed=1,model.dropout=0.2",
                                             "multi30k_en_de-small-debug-seed=2,model.dropout=0.2"]
    assert {job["group"] for job in jobs} == {SWEEP}
    for seed, job in zip((1, 2), jobs):
        assert job["tags"] == ["task:multi30k_en_de", "model:small", "scale:debug", f"seed={seed}", "model.dropout=0.2"]
    single = wandb_init(tmp_path, "seed=1")
    assert (single["name"], single["group"], single["tags"]) == (
        "multi30k_en_de-small-seed=1", None, ["task:multi30k_en_de", "model:small", "seed=1"])


@pytest.mark.slow
def test_each_sweep_is_a_group_of_its_own_which_the_same_command_given_resume_auto_keeps(tmp_path, subword_cache):
    """Real sweeps (their first job stops at its start: no data) and their jobs' W&B groups. Two
    sweeps whose folders end alike (two checkouts, or hydra.sweep.dir named alike) are two groups;
    before, both were `multirun/S`, the folder's last two parts, and W&B showed them as one sweep.
    The same command given resume=auto beside it keeps the group; one with a value changed is
    another sweep."""
    summaries = []

    def sweep(folder: Path, *overrides: str) -> str:
        """The group the sweep's first job gives W&B."""
        result = run_tool("src/train.py", "--multirun", "debug=tiny", "logger=csv", *overrides,
                          f"paths.data_root={tmp_path / 'empty'}", "task.datamodule.download=false",
                          f"hydra.sweep.dir={folder}", cwd=tmp_path, cache_dir=subword_cache, check=False)
        assert result.returncode == 2 and "Multi30k files missing" in result.stderr, result.stderr[-2000:]
        summaries.append(result.stdout)
        return wandb_init(tmp_path, "debug=tiny", "seed=1", multirun=True, sweep_dir=folder)["group"]

    first, second = (sweep(tmp_path / place / "multirun" / "S", "seed=1,2") for place in ("a", "b"))
    assert first != second and first.startswith("multirun/S#") and second.startswith("multirun/S#")
    assert sweep(tmp_path / "b" / "multirun" / "T", "seed=1,2", "resume=auto") == second
    changed = sweep(tmp_path / "b" / "multirun" / "U", "seed=1,3", "resume=auto")
    assert changed not in (first, second) and changed.startswith("multirun/U#")
    for group, summary in zip((first, second, second, changed), summaries):  # the sweep's own summary says it
        assert f"its group in W&B and MLflow: {group})" in summary


def test_runs_of_one_command_started_in_the_same_second_are_told_apart(tmp_path):
    """Their folders are <date>_<time> and <date>_<time>-2 (aiayn.cli.run_folder); before, the
    trackers showed both under one name."""
    first, second = (wandb_init(tmp_path, "seed=1", run_dir=tmp_path / "outputs" / "x" / folder)
                     for folder in ("2026-11-28_10-00-00", "2026-11-28_10-00-00-2"))
    assert (first["name"], second["name"]) == ("multi30k_en_de-small-seed=1", "multi30k_en_de-small-seed=1#2")
    named = wandb_init(tmp_path, "seed=1", run_dir=tmp_path / "table" / "row-2")  # a folder named by hand
    assert named["name"] == "multi30k_en_de-small-seed=1"


def test_run_group_sets_the_group_and_nothing_else(tmp_path):
    """``run_group`` (what experiments/tables.py run gives its jobs) is the group, in a single run or
    a --multirun alike; the name and tags stay the job's own."""
    for multirun in (False, True):
        job = wandb_init(tmp_path, "run_group=tables/table3", "seed=1", multirun=multirun)
        assert (job["name"], job["group"], job["tags"]) == (
            "multi30k_en_de-small-seed=1", "tables/table3", ["task:multi30k_en_de", "model:small", "seed=1"])


@pytest.mark.slow
def test_a_table3_row_at_cpu_or_debug_scale_never_looks_like_the_wmt_run(tmp_path):
    paper, cpu, debug = (wandb_init(tmp_path, "experiment=table3_C_N2", *scale, multirun=True)
                         for scale in ([], ["+scale=multi30k_cpu"], ["+scale=multi30k", "debug=tiny"]))
    assert (paper["name"], cpu["name"], debug["name"]) == ("table3-C_N2-paper", "table3-C_N2-multi30k_cpu",
                                                           "table3-C_N2-debug")
    assert paper["tags"] == ["table3", "C", "C_N2", "task:wmt_en_de", "model:base", "scale:paper"]
    assert cpu["tags"] == ["table3", "C", "C_N2", "task:multi30k_en_de", "model:base", "scale:multi30k_cpu"]
    # debug=tiny replaces the row's network (N=1, d_model=32): it is not row (C) N=2 any more.
    assert debug["tags"] == ["table3", "C", "C_N2", "task:multi30k_en_de", "model:base", "scale:debug", MODIFIED]


def changes(*overrides: str, conf: Path = CONF) -> list[str]:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    return row_changes(row_settings(cfg), choices, conf)


@pytest.mark.slow
def test_a_row_run_with_its_model_or_recipe_changed_is_no_longer_that_row():
    # The heads' widths follow h (d_model / h, which row (A) leaves to the default): the run's
    # network differs from the row's in all three.
    assert changes("experiment=table3_A_h1", "model.n_heads=4") == [
        "model.d_k: 512 → 128", "model.d_v: 512 → 128", "model.n_heads: 1 → 4"]
    assert changes("experiment=table3_A_h1", "model.n_heads=4", "model.d_k=512", "model.d_v=512") == [
        "model.n_heads: 1 → 4"]
    big = changes("experiment=table3_A_h1", "model=big")
    assert {"model.d_model: 512 → 1024", "model.dropout: 0.1 → 0.3", "optim.train_steps: 100000 → 300000"} <= set(big)
    assert changes("experiment=table3_D_ls0", "loss.label_smoothing=0.1") == ["loss.label_smoothing: 0.0 → 0.1"]
    assert changes("experiment=table3_A_h1", "+scale=multi30k", "task=multi30k_de_en") == [
        "task.name: 'multi30k_en_de' → 'multi30k_de_en'"]
    # A run that may stop before optim.train_steps trains another length than the row's.
    assert changes("experiment=table3_A_h1", "callbacks.early_stopping.patience=5") == [
        "callbacks.early_stopping.patience: None → 5"]
    # So does one cut by a time limit, and one whose step an accumulation given outright sets (before: still
    # the row, and a run stopped at step 10 of 2,000 was counted as base in Table 3).
    assert changes("experiment=table3_base", "+scale=multi30k_cpu", "trainer.max_time=00:00:00:20",
                   "trainer.accumulate_grad_batches=4") == [
        "trainer.max_time: None → '00:00:00:20'", "trainer.accumulate_grad_batches: None → 4"]
    assert changes("experiment=table4_sample") == []  # its own time limit is the row's
    # A batch only splits the step, at every scale (each sets its optim.tokens_per_step); another step is another
    # recipe. Where a row sets no step (the smoke test's scale), one process's batch is the step.
    assert changes("experiment=table3_base", "+scale=multi30k_cpu", "task.datamodule.max_tokens=512") == []
    assert changes("experiment=table3_base", "+scale=multi30k_cpu", "optim.tokens_per_step=2048") == [
        "optim.tokens_per_step: 1024 → 2048"]
    assert changes("experiment=table3_base", "task.datamodule.max_tokens=4096") == []
    # The row at a scale (its own bleu_sentences, 300), a speed switch, a seed or the logging: still the row.
    assert changes("experiment=table3_A_h1", "+scale=multi30k_cpu", "model.attention=explicit", "seed=7",
                   "decoding.kv_cache=false", "logger=csv") == []
    assert changes("model.n_heads=2") == []  # no row to be


def test_where_a_scale_of_ones_own_sets_no_step_one_processs_batch_is_the_rows_step(tmp_path: Path) -> None:
    """Every scale this checkout has sets optim.tokens_per_step; one that sets none (null: one batch a process) makes
    the batch part of the row, so that a run with another batch is another run."""
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "scale" / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - multi30k\n  - _self_\n"
                                              "experiment:\n  scale: mine\noptim:\n  tokens_per_step: null\n")
    assert changes("experiment=table3_base", "+scale=mine", "task.datamodule.max_tokens=512", conf=conf) == [
        "task.datamodule.max_tokens: 'auto' → 512"]
    assert changes("experiment=table3_base", "+scale=mine", conf=conf) == []


def test_train_warns_once_that_a_changed_row_run_is_no_longer_that_row(tmp_path, subword_cache):
    """Refused on its data after the warning: the warning comes before anything is built."""
    result = run_tool("src/train.py", "experiment=table3_C_N2", "+scale=multi30k", "model.n_heads=4", "logger=csv",
                      f"paths.data_root={tmp_path / 'empty'}", "task.datamodule.download=false",
                      f"hydra.run.dir={tmp_path / 'run'}", cache_dir=subword_cache, check=False)
    assert result.returncode == 2
    output = (result.stdout + result.stderr).splitlines()
    warnings = [line for line in output if "is no longer that row" in line]
    assert len(warnings) == 1, output
    # d_k and d_v are d_model / n_heads unless given: 4 heads of 128, the row's width kept.
    assert warnings[0].endswith("experiment=table3_C_N2: this run is no longer that row (model.d_k: 64 → 128; "
                                "model.d_v: 64 → 128; model.n_heads: 8 → 4); its W&B and MLflow runs are tagged "
                                "`modified` and the tables leave it out")


@pytest.mark.parametrize("overrides", [["experiment=table3_C_N2", "+scale=multi30k"], ["debug=tiny"]])
def test_no_warning_for_a_row_as_it_is_or_a_run_that_is_no_row(tmp_path, overrides, subword_cache):
    result = run_tool("src/train.py", *overrides, "logger=csv", f"paths.data_root={tmp_path / 'empty'}",
                      "task.datamodule.download=false", f"hydra.run.dir={tmp_path / 'run'}", cache_dir=subword_cache,
                      check=False)
    assert result.returncode == 2 and "Multi30k files missing" in result.stderr
    assert "is no longer that row" not in result.stdout + result.stderr


@pytest.mark.slow
def test_a_row_run_scored_otherwise_is_no_longer_that_row():
    """Greedy decoding, 5 dev sentences, 1% of the dev split: other figures under the row's name
    (before: still the row, and the tables counted it); the scale's own values are the row's."""
    assert changes("experiment=table3_base", "+scale=multi30k_cpu", "decoding.beam_size=1", "decoding.alpha=0",
                   "validation.bleu_sentences=5", "trainer.limit_val_batches=0.01") == [
        "decoding.alpha: 0.6 → 0.0", "decoding.beam_size: 4 → 1", "validation.bleu_sentences: 300 → 5",
        "trainer.limit_val_batches: None → 0.01"]
    # Table 2 scored on a part of newstest2014, or cut shorter: not the row's BLEU (test).
    assert changes("experiment=table2_base_en_de", "trainer.limit_test_batches=1", "decoding.max_len_offset=5") == [
        "decoding.max_len_offset: 50 → 5", "trainer.limit_test_batches: None → 1"]
    assert changes("experiment=table2_base_en_de", "+scale=multi30k") == []


@pytest.mark.slow
def test_a_row_run_on_other_batches_pairs_splits_or_averaging_is_no_longer_that_row():
    """A smoke test, a part of each epoch, shorter or cleaner pairs, another dev or test split, another
    §6.1 window: other figures under the row's name (before: still the row, and Table 3 counted a 2-step
    fast_dev_run as base, and a run validated on test2016 as (D) beside it)."""
    assert changes("experiment=table3_base", "+scale=multi30k_cpu", "trainer.fast_dev_run=2",
                   "task.datamodule.val_split=test_2016_flickr") == [
        "trainer.fast_dev_run: False → 2", "task.datamodule.val_split: 'val' → 'test_2016_flickr'"]
    assert changes("experiment=table3_base", "+scale=multi30k_cpu", "trainer.limit_train_batches=4",
                   "trainer.overfit_batches=2") == [
        "trainer.overfit_batches: 0.0 → 2", "trainer.limit_train_batches: None → 4"]
    assert changes("experiment=table2_base_en_de", "task.datamodule.max_length=20", "task.datamodule.max_ratio=1.1",
                   "task.datamodule.test_split=newstest2013", "checkpoint.average_last=1") == [
        "task.datamodule.max_length: 256 → 20", "task.datamodule.max_ratio: 2.5 → 1.1",
        "task.datamodule.test_split: 'newstest2014' → 'newstest2013'", "checkpoint.average_last: 5 → 1"]


@pytest.mark.slow
def test_a_sweeps_jobs_are_named_and_tagged_as_single_runs_of_the_same_settings(tmp_path):
    """The jobs' overrides as the sweep runs them (aiayn.cli.sweep, Hydra's sweeper: values as Python
    prints them) against the same settings typed for single runs. Before: the jobs' tags and names
    said `test_after_training=False`, `model.dropout=0.1`, `trainer.max_time=00\\:00\\:30\\:00`, the
    single runs' `=false`, `=0.10`, `=00:00:30:00`: a W&B filter on a tag missed the other kind."""
    from aiayn.cli.sweep import dry_run

    typed = ["debug=tiny", "test_after_training=false", "model.dropout=0.10", "trainer.max_time=00:00:30:00"]
    jobs, refused = dry_run(CONF, [*typed, "seed=1,2"])
    assert not refused and [job.overrides[-1] for job in jobs] == ["seed=1", "seed=2"]
    assert "test_after_training=False" in jobs[0].overrides  # as Hydra's sweeper gives it
    for seed, job in zip((1, 2), jobs):
        swept = wandb_init(tmp_path, *job.overrides, multirun=True)
        single = wandb_init(tmp_path, *typed, f"seed={seed}")
        assert swept["tags"] == single["tags"] == [
            "task:multi30k_en_de", "model:small", "scale:debug", "test_after_training=false", "model.dropout=0.1",
            "trainer.max_time=00:00:30:00", f"seed={seed}"]
        assert swept["name"] == single["name"]


def test_a_row_run_from_before_its_scale_set_its_step_is_the_row_where_it_took_that_step(tmp_path: Path) -> None:
    """A Multi30k-scale run trained before the scales set optim.tokens_per_step (null: one 1,024-token batch a
    process) is its row where it took the row's 1,024 tokens (one process), and a changed row where it took more
    (8 processes: 8,192): from its checkpoint's resolved plan (evaluate's W&B tags), or from its run folder's
    .hydra/config.yaml, whose plan is unresolved, and its summary's processes (the tables)."""
    from omegaconf import OmegaConf

    from aiayn.config.identity import run_folder_changes

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=table3_base", "+scale=multi30k_cpu"], return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    old = row_settings(cfg)
    old["optim"]["tokens_per_step"], old["task"]["datamodule"]["max_tokens"] = None, 1024  # as the scale was
    assert row_changes({**old, "plan": {"tokens_per_step": 1024}}, choices, CONF) == []
    assert row_changes({**old, "plan": {"tokens_per_step": 8192}}, choices, CONF) == ["optim.tokens_per_step: 1024 → None"]
    (tmp_path / ".hydra").mkdir()
    saved = OmegaConf.to_container(cfg, resolve=False)
    hydra = saved.pop("hydra")
    saved["optim"]["tokens_per_step"], saved["task"]["datamodule"]["max_tokens"] = None, 1024
    OmegaConf.save(OmegaConf.create(saved), tmp_path / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra}), tmp_path / ".hydra" / "hydra.yaml")
    loaded = OmegaConf.load(tmp_path / ".hydra" / "config.yaml")
    assert OmegaConf.is_interpolation(loaded, "plan")  # as Hydra saves it
    assert run_folder_changes(loaded, tmp_path, CONF, processes=1) == []
    assert run_folder_changes(loaded, tmp_path, CONF, processes=8) == ["optim.tokens_per_step: 1024 → None"]
