"""Bad input, kind by kind: each gives a one-line error naming the file (and line) or the
setting and what to do — never a traceback from deep inside torch — or a counted skip. Here:
settings and command lines; bad data files and checkpoints: test_bad_files.py.

Kinds of other modules' inputs (treebank files, WMT sgm and archives) are tested with those
modules too; the catalogue of every kind and where it is tested is docs/guarantees/bad-input.md.
"""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stderr
from pathlib import Path
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir

from aiayn.cli.train import main as train_main
from aiayn.data.readers import read_parallel
from tests.helpers.datafiles import multi30k_copy, write_lines
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TINY, TrainedRun, offline_environment


# -- training configuration ---------------------------------------------------------------------
def _train(tmp_path: Path, *overrides: str) -> tuple[int, str]:
    """train.py's error handling in this process: (exit status, its one line). Hydra's ``main`` given a config
    runs the task function (under aiayn.cli.errors' wrapper) directly."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, "logger=none", f"paths.output_dir={tmp_path / 'run'}",
                                          "run_name=bad-input", *overrides])  # both come from Hydra's run
    stderr, argv = io.StringIO(), [str(REPO / "src" / "train.py")]  # errors name the tool as invoked
    with redirect_stderr(stderr), mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as exit_:
        train_main(cfg)
    lines = stderr.getvalue().strip().splitlines()
    assert len(lines) == 1, lines
    return exit_.value.code, lines[0]


@pytest.mark.parametrize("overrides, message", [
    (["+model.n_experts=4"], "train.py: model.n_experts is not a model setting; the settings are attention, attention_dropout,"),
    (["model.d_model=0"], "train.py: model: d_model must be a positive whole number, got 0"),
    (["model.d_model=33", "model.n_heads=1"], "train.py: model: d_model must be even for the sinusoidal encoding, got 33"),
    (["model.n_heads=3"], ("train.py: model.d_k and model.d_v are d_model / n_heads unless given (§3.2.2), and "
                           "model.n_heads=3 does not divide model.d_model=32: give model.d_k=N model.d_v=N, or another n_heads")),
    (["model.n_heads=-2"], "train.py: model: n_heads must be a positive whole number, got -2"),
    (["model.dropout=1.5"], "train.py: model: dropout must be in [0, 1), got 1.5"),
    (["loss.label_smoothing=-0.1"], "train.py: loss.label_smoothing must be in [0.0, 1.0), got -0.1"),
    (["optim.warmup_steps=0"], "train.py: optim.warmup_steps must be a positive whole number, got 0"),
    (["width_divisor=3"], "train.py: width_divisor=3 does not divide model.d_model=32"),
    (["optim.lr_factor=0"], "train.py: optim.lr_factor must be positive, got 0"),
    (["task.vocab_size=3"], "train.py: task.vocab_size must be a whole number of at least 8, got 3"),
    (["task.datamodule.max_tokens=100", "task.datamodule.max_length=128"],
     ("train.py: task.datamodule.max_tokens=100 cannot hold one pair of max_length=128 subwords plus BOS/EOS; "
     "raise max_tokens to at least 130 or lower max_length")),
    (["nonfinite.max_in_a_row=0"], "train.py: nonfinite.max_in_a_row must be at least 1, got 0"),
    (["resume=/no/such/run"], "train.py: resume=/no/such/run: no such checkpoint file or run directory"),
    # Keys nobody reads, added with `+`: at the root, in each section Hydra does not type.
    (["+n_experts=4"], "train.py: n_experts is not a setting; the settings are callbacks, checkpoint,"),
    (["+validation.bleu_sentence=10"], ("train.py: validation.bleu_sentence is not a setting in validation; "
                                       "did you mean bleu_sentences?")),
    (["+trainer.max_step=10"], ("train.py: trainer.max_step is not a Lightning Trainer argument; did you mean "
                               "max_steps")),
    (["+task.datamodule.max_token=10"], ("train.py: task.datamodule.max_token is not an argument of "
                                        "Multi30kDataModule; did you mean max_tokens")),
    (["+task.datamodule.zzz=10"], ("train.py: task.datamodule.zzz is not an argument of Multi30kDataModule; the "
                                   "arguments of Multi30kDataModule are cache_dir, data_root, ")),
    # A scale puts a translation row on Multi30k (before: "linearization is not an argument of Multi30kDataModule").
    (["experiment=table4_sample", "+scale=multi30k_cpu"], ("train.py: +scale=multi30k_cpu is for the translation rows "
                                                           "of Tables 2 and 3, and experiment=table4_sample is Table "
                                                           "4's; drop +scale (that row's config is its scale)")),
    (["+checkpoint.every=5"], ("train.py: checkpoint.every is not a checkpoint setting; the settings are "
                               "average_every_n_steps,")),
    (["+callbacks.preemption.signal=[SIGTERM]"], ("train.py: callbacks.preemption.signal is not an argument of "
                                                 "preemption_handling; did you mean signals?")),
    (["logger=csv", "+logger.csv.save_dirs=x"], ("train.py: logger.csv.save_dirs is not an argument of "
                                                "MetricsCSVLogger; did you mean save_dir?")),
    (["logger=mlflow", "+logger.mlflow.trackinguri=x"], ("train.py: logger.mlflow.trackinguri is not an argument of "
                                                        "MLflowRunLogger; did you mean tracking_uri?")),
    (["callbacks.preemption.signals=[SIGTERM,SIGFOO]"], ("train.py: callbacks.preemption.signals: 'SIGFOO' is not a "
                                                        "signal a process can handle here")),
    # Ranges that would otherwise fail at the first validation, or later.
    (["decoding.beam_size=0"], "train.py: decoding.beam_size must be a whole number of at least 1, got 0"),
    (["decoding.alpha=-0.5"], ("train.py: decoding.alpha (the length penalty's exponent) must be a finite number, 0 "
                              "or more, got -0.5")),
    (["decoding.alpha=inf"], ("train.py: decoding.alpha (the length penalty's exponent) must be a finite number, 0 "
                             "or more, got inf")),
    (["decoding.sampling=true", "decoding.temperature=inf"], "train.py: decoding.temperature must be above 0 and "),
    (["trainer.log_every_n_steps=0"], "train.py: trainer.log_every_n_steps must be a whole number of steps, 1 or more"),
    (["decoding.max_len_offset=-1"], ("train.py: decoding.max_len_offset must be a whole number of at least 0, "
                                     "got -1")),
    (["decoding.beam_size=100000"], "train.py: decoding.beam_size=100000 is wider than the model's vocabulary of "),
    (["decoding.max_len_offset=600", "decoding.min_len=600"], "train.py: decoding.min_len=600 cannot be met: the "),
    (["validation.bleu_sentences=-5"], "train.py: validation.bleu_sentences must be a whole number, 0 or more"),
    (["model.n_layers=0"], "train.py: model.n_layers must be at least 1 (N: the layers of each stack), got 0"),
    (["model.attention_window=0"], "train.py: model: attention_window must be a whole number of at least 1"),
    (["task.datamodule.max_tokens=0"], ("train.py: task.datamodule.max_tokens must be a positive whole number or "
                                        "auto (the most the machine holds of the step), got 0")),
    (["task.datamodule.eval_max_tokens=-1"], ("train.py: task.datamodule.eval_max_tokens must be a positive whole "
                                             "number, got -1")),
    (["checkpoint.save_top_k=0"], ("train.py: checkpoint.save_top_k must be how many checkpoints to keep, 1 or "
                                  "more (-1: all), got 0")),
    (["checkpoint.average_last=0"], "train.py: checkpoint.average_last must be how many checkpoints §6.1 averages"),
    (["checkpoint.average_last=5"], ("train.py: checkpoint.average_last and checkpoint.average_every_n_steps make "
                                     "§6.1's window together")),
    (["checkpoint.every_n_train_steps=0"], ("train.py: checkpoint.every_n_train_steps must be a positive whole "
                                           "number of steps, got 0")),
    (["checkpoint.average_every_n_steps=0", "model=base"], ("train.py: checkpoint.average_every_n_steps must be a "
                                                            "positive whole number of steps, got 0")),

    (["trainer.accumulate_grad_batches=0"], ("train.py: trainer.accumulate_grad_batches must be a positive whole "
                                            "number, got 0")),
    (["trainer.val_check_interval=0"], "train.py: trainer.val_check_interval must be a whole number of steps"),
    # Text where the plan reads a number (before: "ValueError raised while resolving interpolation: Unknown format
    # code 'g' for object of type 'str'.", "TypeError ... '>' not supported between instances of 'str' and 'int'.").
    (["trainer.val_check_interval=abc"], ("train.py: trainer.val_check_interval must be a whole number of steps (null: "
                                          "every epoch; a run validates across epochs, not at a fraction of one), got "
                                          "'abc'")),
    (["trainer.min_steps=abc"], "train.py: trainer.min_steps must be a whole number of steps, 0 or more"),
    # A second address of the run's length (optim.train_steps), and early stopping without validation.
    (["trainer.max_steps=3"], ("train.py: trainer.max_steps=3 differs from optim.train_steps=4, the run's steps "
                               "(trainer.max_steps follows it); give optim.train_steps=3 instead")),
    (["trainer.max_epochs=0"], ("train.py: trainer.max_epochs=0 could stop training before optim.train_steps=4 "
                                "steps; a run trains optim.train_steps steps, however many epochs they take")),
    # Through the config's plan, as a run reads it (before: the plan saw none of these, and they passed).
    (["trainer.min_steps=5000"], "train.py: trainer.min_steps=5000 is more than optim.train_steps=4, the run's steps"),
    (["trainer.min_epochs=1"], "train.py: trainer.min_epochs=1: a run's length is counted in steps"),
    (["trainer.check_val_every_n_epoch=2"], ("train.py: trainer.check_val_every_n_epoch=2: a run validates every "
                                            "trainer.val_check_interval optimizer steps")),
    (["trainer.limit_val_batches=0", "callbacks.early_stopping.patience=2"], (
        "train.py: callbacks.early_stopping.patience stops on validation's figures, which trainer.limit_val_batches=0 "
        "turns off")),
    # What Lightning refuses, refused in the config's checks, as --cfg job refuses it (tests/config/test_plan.py).
    (["trainer.precision=banana"], "train.py: trainer.precision=banana is not a precision Lightning takes; give one"),
    (["trainer.gradient_clip_algorithm=sideways"], ("train.py: trainer.gradient_clip_algorithm must be norm or value "
                                                    "(null: norm), got 'sideways'")),
    (["trainer.limit_val_batches=-1"], ("train.py: trainer.limit_val_batches must be a fraction of the batches in "
                                        "[0.0, 1.0] or a whole number of batches (null: every batch), got -1")),
    (["optim.betas=[0.9,1.5]"], "train.py: optim.betas must be two numbers in [0, 1) (Adam's β1, β2), got [0.9, 1.5]"),
    (["distributed.timeout_minutes=0"], ("train.py: distributed.timeout_minutes must be a positive number of "
                                        "minutes, got 0")),
    (["compile=yes"], "train.py: compile must be true or false, got 'yes'"),
    (["seed=-1"], "train.py: seed must be a whole number from 0 to 4294967295, got -1"),
    (["resume=true"], ("train.py: resume must be auto (the newest checkpoint of this run) or the path of a run "
                       "directory or checkpoint file (null: a fresh run), got True")),
    (["trainer.gradient_clip_val=-1"], ("train.py: trainer.gradient_clip_val must be a number, 0 or more (null: no "
                                        "clipping, as in the paper), got -1")),
    (["task.datamodule.download=maybe"], "train.py: task.datamodule.download must be true or false, got 'maybe'"),
    (["callbacks.preemption.signals=SIGTERM"], ("train.py: callbacks.preemption.signals must be a list of signal "
                                                "names, e.g. [SIGTERM] or [SIGTERM,SIGUSR1], got 'SIGTERM'")),
    (["callbacks.progress_log.every_n_steps=0"], ("train.py: callbacks.progress_log.every_n_steps must be a "
                                                  "positive whole number of steps (a progress line every that many; "
                                                  "callbacks.progress_log=null: none), got 0")),
    (["+callbacks.progress_log.every=5"], ("train.py: callbacks.progress_log.every is not an argument of "
                                           "ProgressLog; did you mean every_n_steps?")),
    # A devices value that is none: what it takes (before, without a GPU: "asks for GPUs but no usable CUDA GPU").
    (["trainer.devices=abc"], ("train.py: trainer.devices=abc is not a number of GPUs (an int, e.g. 2), a list of "
                               "GPU indices")),
    # A treebank split that is none, or whose range runs backwards (before: a ValueError's traceback, exit 1; a range
    # backwards among others left its files out in silence, alone it was "no files of split", naming the sections).
    (["task=wsj", "task.split=sample", "task.splits.sample.val=foo"], (
        "train.py: task.datamodule.val_split=foo: bad treebank split item 'foo' in 'foo'; use sections ('02-21') or "
        "files ('wsj_0001-wsj_0159')")),
    (["task=wsj", "task.split=sample", "task.splits.sample.train='wsj_0001-wsj_0150,wsj_0159-wsj_0151'"], (
        "train.py: task.datamodule.train_split=wsj_0001-wsj_0150,wsj_0159-wsj_0151: treebank split item "
        "'wsj_0159-wsj_0151' runs backwards; write it first to last, 'wsj_0151-wsj_0159'")),
    # Parsing settings the data module takes (before: a ValueError's traceback inside Hydra's InstantiationException).
    (["task=wsj_semi", "task.split=sample", "task.datamodule.wsj_fraction=0"], (
        "train.py: task.datamodule.wsj_fraction=0: the share of WSJ's trees in the semi-supervised training set must")),
    (["task=wsj", "task.split=sample", "task.datamodule.linearization=word"], (
        "train.py: task.datamodule.linearization=word: the output trees' leaves are xx or words (docs/parsing.md)")),
    (["task=wsj", "task.split=foo"], "train.py: task.split=foo: not one of task.splits (standard, sample)"),  # before:
    # "task.datamodule.treebank: Interpolation key 'task.splits.foo.treebank' not found"
    # More training processes than the machine has cores.
    ([f"trainer.devices={(os.cpu_count() or 1) + 1}", "trainer.strategy=ddp_spawn"], "train.py: trainer.devices="),
], ids=lambda value: value[0] if isinstance(value, list) else None)
def test_an_impossible_setting_is_named_in_one_line_and_exits_2(tmp_path, overrides, message):
    code, line = _train(tmp_path, *overrides)
    assert code == 2 and line.startswith(message), line


def test_a_data_root_without_the_data_names_the_missing_file_and_exits_2(tmp_path):
    code, line = _train(tmp_path, f"paths.data_root={tmp_path / 'empty'}", "task.datamodule.download=false")
    assert code == 2
    assert line.startswith("train.py: Multi30k files missing") and str(tmp_path / "empty" / "multi30k" / "train.en.gz") in line
    # What it says to set is a setting train.py has (before: task.data_root, which it refuses as none).
    assert line.endswith("or point AIAYN_DATA_ROOT / paths.data_root at a folder whose multi30k/ holds them"), line


# -- command lines, in this process (tests.helpers.inprocess); checkpoints: the session's `tiny_run` --
@pytest.mark.parametrize("override, message", [
    # An unknown key: the node's nearest settings, else all of them (before: `--cfg job` prints every setting).
    ("model.n_experts=4", ("train.py: model.n_experts is not a setting here (Key 'n_experts' not in 'ModelConfig'); "
                          "the settings of model are _target_, attention, attention_dropout, attention_window, d_ff")),
    ("model.d_modle=64", ("train.py: model.d_modle is not a setting here (Key 'd_modle' not in 'ModelConfig'); "
                         "did you mean model.d_model?")),
    ("model=big optim.warmup_step=5", ("train.py: optim.warmup_step is not a setting here (Key 'warmup_step' not in "
                                      "'OptimConfig'); did you mean optim.warmup_steps?")),
    ("validation.bleu_sentence=3", ("train.py: validation.bleu_sentence is not a setting here (Key 'bleu_sentence' is "
                                    "not in struct); did you mean validation.bleu_sentences?")),
    ("task=wmt_en_de task.datamodule.max_token=5", ("train.py: task.datamodule.max_token is not a setting here (Key "
                                                   "'max_token' is not in struct); did you mean task.datamodule.max_tokens")),
    ("nope.deeper=1", ("train.py: nope.deeper is not a setting here (Key 'nope' is not in struct); `python ")),
    ("model=huge", ("train.py: In 'train': Could not find 'model/huge'. Available options in 'model': base, big, "
                   "parsing, small")),
    ("decoding.beam=5", ("train.py: decoding.beam is not a setting here (Key 'beam' not in 'DecodingConfig'); "
                        "the settings of decoding are ")),
    ("model.d_model=abc", ("train.py: Error merging override model.d_model=abc. Value 'abc' of type 'str' could not "
                          "be converted to Integer")),
    ("trainer.devices=[", "train.py: no viable alternative at input '['"),
    # The checkpoint settings are typed (aiayn.config.schemas.CheckpointConfig).
    ("checkpoint.in_background=maybe", ("train.py: Error merging override checkpoint.in_background=maybe. Value "
                                        "'maybe' is not a valid bool")),
    # A setting that is no more says what took its place (aiayn.cli.renamed.REMOVED).
    ("checkpoint.every_n_minutes=10", ("train.py: checkpoint.every_n_minutes is no longer a setting: §6.1's "
                                       "checkpoints to average are counted in steps now")),
    ("+checkpoint.keep_timed=20", "train.py: checkpoint.keep_timed is no longer a setting: §6.1's checkpoints"),
    ("run_name=${nope}", "train.py: Interpolation key 'nope' not found"),
    ("--multirun model.dropout=0.0,0.2 --cfg job", ("train.py: Only one of --run, --multirun, --cfg, --info and "
                                                   "--shell_completion can be specified: --cfg job shows one job's "
                                                   "settings, so give them without --multirun")),
])
def test_what_hydra_cannot_compose_is_one_line_and_exit_2(override, message, tmp_path, data_root):
    """Refused while composing, before any of aiayn runs: no traceback, no Hydra report, no folder."""
    result = run_tool("src/train.py", *override.split(" "), cwd=tmp_path, data_root=data_root, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("override, message", [
    ("decoding.beam_size=0", "decoding.beam_size must be a whole number of at least 1, got 0"),
    # refused by the data module as it is built (inside hydra.utils.instantiate): its folder went unremoved
    ("task=parallel_text task.data_dir=. task.src_lang=de task.tgt_lang=de",
     "task.src_lang and task.tgt_lang are both 'de': the two sides would be one file"),
    ("task=wsj task.split=foo", "task.split=foo: not one of task.splits (standard, sample)"),  # (before: a folder kept)
])
def test_a_run_refused_before_training_leaves_no_output_folder(override, message, tmp_path, data_root):
    result = run_tool("src/train.py", *TINY, "logger=none", *override.split(), cwd=tmp_path, data_root=data_root,
                      check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"train.py: {message.format(tmp=tmp_path)}")
    assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))


@pytest.mark.parametrize("variable, setting", [("AIAYN_CACHE_DIR", "paths.cache_dir"),
                                               ("AIAYN_DATA_ROOT", "paths.data_root")])
def test_a_folder_variable_set_to_nothing_is_one_line_not_the_working_folder(variable, setting, tmp_path, data_root):
    """Before: the empty path was the working folder, where the subword cache (or Multi30k's download) landed."""
    env = {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), variable: ""}
    result = run_tool("src/train.py", *TINY, "logger=none", cwd=tmp_path, env=env, check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"train.py: {setting} is empty ({variable} is set to nothing): give it a folder, or unset {variable} for "
        "the default")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_sweep_of_a_dozen_overrides_gets_folders_the_file_system_accepts(tmp_path, subword_cache, data_root):
    """The sweep subdir is built from the overrides; past a file name's 255 bytes it is shortened
    (with a hash of the whole), so each job still gets its own folder."""
    overrides = [*TINY, "logger=none", "optim.train_steps=1", "test_after_training=false", "visualize_at_end=false",
                 "trainer.val_check_interval=1", "trainer.limit_val_batches=1",
                 "validation.bleu_sentences=4", "decoding.max_len_offset=2", "nonfinite.max_in_a_row=3",
                 "cost.gpu=K80", "seed=1,2", f"task.datamodule.cache_dir={subword_cache}",
                 "model.dropout=0.123456789", "loss.label_smoothing=0.0987654321"]
    result = run_tool("src/train.py", "--multirun", *overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                      cwd=tmp_path, data_root=data_root, cache_dir=subword_cache, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(path for path in (tmp_path / "sweep").iterdir() if path.is_dir())
    assert [job.name[:2] for job in jobs] == ["0_", "1_"]
    for job in jobs:
        assert len(job.name.encode()) <= 255 and "~" in job.name
        assert (job / "checkpoints" / "last.ckpt").exists()
        assert "seed=" in (job / ".hydra" / "overrides.yaml").read_text()


def test_evaluate_constrained_on_a_translation_model_is_refused_before_decoding(tiny_run, data_root, tmp_path):
    result = run_tool("src/evaluate.py", f"ckpt={tiny_run.last}", "decoding.constrained=true", f"out={tmp_path}",
                      "wandb=disabled", data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "evaluate.py: decoding.constrained=true decodes within the task's output constraint, and this model's task "
        "has none (constrained decoding is for parsing tasks)")
    assert list(tmp_path.iterdir()) == []


def test_evaluate_on_a_file_that_is_not_a_checkpoint_names_it_and_exits_2(subword_cache, data_root, tmp_path):
    bogus = write_lines(tmp_path / "notes.ckpt", ["notes"])
    result = run_tool("src/evaluate.py", f"ckpt={bogus}", data_root=data_root, cache_dir=subword_cache, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"evaluate.py: {bogus}: not a readable checkpoint")


def test_resume_on_data_whose_vocabulary_differs_is_refused(tiny_run: TrainedRun, data_root, tmp_path):
    en, de = read_parallel(data_root / "multi30k" / "train.en.gz", data_root / "multi30k" / "train.de.gz")
    other = multi30k_copy(tmp_path / "data", data_root, en[:6000], de[:6000])  # another subword model
    # The run's own settings, so that the subword model is the one difference.
    result = run_tool("src/train.py", *tiny_run.overrides, f"hydra.run.dir={tmp_path / 'again'}",
                      f"resume={tiny_run.run_dir}", "optim.train_steps=6", data_root=other,
                      cache_dir=tiny_run.cache_dir, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        "train.py: the checkpoint's subword model differs from the one built for this data")


@pytest.mark.parametrize("tool", ["train", "prepare", "evaluate", "translate", "average", "visualize"])
def test_every_tool_refuses_a_setting_it_does_not_have_in_one_line(tool, tmp_path, data_root):
    result = run_tool(f"src/{tool}.py", "beam_sise=4", cwd=tmp_path, data_root=data_root, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}.py: beam_sise is not a setting here"), lines


@pytest.mark.parametrize("tool, arguments, message", [
    ("average", ["average_last=0", "out={tmp}/avg.ckpt"], "average_last must be a positive number of checkpoints, not 0"),
    ("average", ["out={tmp}"], "out={tmp} is a folder; give the file to write"),
    ("visualize", ["positional_encoding_positions=0"], ("positional_encoding_positions must be a positive whole "
                                                        "number, got 0")),
    ("visualize", ["text= "], "text is empty: give the sentence to draw"),
    ("visualize", ["out={tmp}/file.txt"], "out={tmp}/file.txt is a file; give a folder for the pictures"),
    ("visualize", ["decoding.nbest=3"], "decoding.nbest=3: visualize draws the attention of one translation, the best"),
], ids=["average-last=0", "average-out-folder", "visualize-positions=0", "visualize-empty-text", "visualize-out-file",
        "visualize-nbest"])
def test_average_and_visualize_settings_are_checked_before_any_work(tool, arguments, message, tiny_run, tmp_path):
    (tmp_path / "file.txt").write_text("not a folder\n")
    where = f"ckpt={tiny_run.run_dir if tool == 'average' else tiny_run.last}"
    result = run_tool(f"src/{tool}.py", where, *(arg.format(tmp=tmp_path) for arg in arguments), cwd=tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}.py: {message.format(tmp=tmp_path)}"), lines
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file.txt"]  # nothing written
