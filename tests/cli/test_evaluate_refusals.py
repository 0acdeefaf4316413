"""src/evaluate.py's refusals: one line on stderr, exit status 2, before the split is decoded or
anything is written (on the session's tiny trained run)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from aiayn.cli.evaluate import default_out
from aiayn.cli.evaluate import main as evaluate_main
from tests.helpers.runs import REPO, TrainedRun, run_command
from tests.helpers.translating import evaluate


# -- bad input: one line on stderr, exit status 2 ---------------------------------------------
def _evaluate_in_process(tmp_path: Path, *overrides: str) -> tuple[int, str]:
    """evaluate.py's own error handling, in this process: (exit status, its one line). Called with
    a config, Hydra's ``main`` runs the task function (under aiayn.cli.errors' wrapper) directly."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("evaluate", overrides=["wandb=disabled", f"out={tmp_path / 'eval'}", *overrides])
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as handle, pytest.raises(SystemExit) as exit_:
        real, sys.stderr = sys.stderr, handle
        argv, sys.argv = sys.argv, [str(REPO / "src" / "evaluate.py")]  # errors name the tool as invoked
        try:
            evaluate_main(cfg)
        finally:
            sys.stderr, sys.argv = real, argv
    lines = stderr.read_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert not (tmp_path / "eval").exists()  # refused before anything is written
    return exit_.value.code, lines[0]


BAD_INPUT = [
    (["average_last=0"], ("average_last must be a whole number of checkpoints, 1 or more (null: the checkpoint alone), "
                         "got 0")),
    (["average_last=-2"], "average_last must be a whole number of checkpoints, 1 or more"),
    (["ckpt={folder}/step0000003.ckpt", "average_last=4"],
     ("{folder}: asked for the 4 checkpoints ending at step0000003.ckpt (step 3) but there are only 3 up to it "
      "(steps 1, 2, 3)")),
    (["split=test2016"], ("split=test2016: task multi30k_en_de has no such split; its splits are val, "
                         "test (test_2016_flickr), train, test_2017_flickr, test_2017_mscoco, test_2018_flickr")),
    (["task=wmt_en_de", "split=train", "task.datamodule.download=false"],
     "split=train: task wmt_en_de has no such split; its splits are val (newstest2013), test (newstest2014)"),
    (["ckpt={run}"], "ckpt={run} is a directory; give one checkpoint file, e.g. ckpt={folder}/last.ckpt"),
    (["decoding.beam_size=0"], "decoding.beam_size must be a whole number of at least 1, got 0"),
    (["decoding.alpha=-1"], ("decoding.alpha (the length penalty's exponent) must be a finite number, 0 or more, "
                             "got -1")),
    (["batch_size=0"], "batch_size must be a whole number of at least 1, got 0"),
    (["max_tokens=0"], "max_tokens must be a whole number of at least 1, got 0"),
    # Before: the batch sampler's ValueError, a traceback (perplexity is computed before decoding).
    (["max_tokens=5"], "max_tokens=5 is less than the longest sentence pair of the split ("),
    # Without max_tokens, the task's evaluation batch (before: evaluate's own 4096, this setting taken and unused).
    (["task=multi30k_en_de", "task.vocab_size=500", "task.datamodule.eval_max_tokens=10"],
     "task.datamodule.eval_max_tokens=10 is less than the longest sentence pair of the split ("),
    (["wandb=maybe"], "wandb must be auto, online, offline or disabled (online with an API key), got 'maybe'"),
    (["precision=fp8"], "precision must be one of fp32, bf16, fp16, got 'fp8'"),
    (["int8=true", "precision=bf16"], "int8 quantises fp32 weights; it cannot be combined with precision=bf16"),
    (["onednn=true", "int8=true"], "onednn runs the fp32 products; it cannot be combined with int8=true"),
    (["onednn=true", "compile=true"], "onednn runs the fp32 products; it cannot be combined with compile=true"),
    (["onnxruntime=true", "int8=true"],
     "onnxruntime runs the fp32 decoder step itself; it cannot be combined with int8=true"),
    # ONNX Runtime's step is the cached one: without the cache it was torch's, in a report named .onnxruntime
    (["onnxruntime=true", "decoding.kv_cache=false"],
     "ONNX Runtime cannot serve decoding.kv_cache=false (its decoder step is the cached one)"),
    (["decoding.seed=3"], "beam search cannot serve decoding.seed=3 (it applies to sampling only)"),
    # Checked before the checkpoint is loaded and the split translated (it died after the work).
    (["out={folder}/last.ckpt"], ("out={folder}/last.ckpt is a file; give a folder to write the hypotheses and report "
                                 "into")),
    # A path as the split: files outside task.data_dir, read before under the name "/data/mine".
    (["task=parallel_text", "task.data_dir={run}", "task.src_lang=en", "task.tgt_lang=de", "split=/data/mine"],
     ("split=/data/mine: a split is named by its files in task.data_dir ({run}), <split>.en and <split>.de, not by a "
      "path; for /data/mine.en and .de give task=parallel_text task.data_dir=/data task.src_lang=en task.tgt_lang=de "
      "split=mine")),
    # A task of another kind than the checkpoint's (another direction: test_evaluate_translate.py).
    (["task=wsj"], ("{folder}/last.ckpt was trained on task multi30k_en_de, which translates en→de, but task wsj "
                    "parses sentences into trees; pick a task of the same kind and direction")),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUT, ids=[" ".join(overrides) for overrides, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_status_2(tiny_run: TrainedRun, tmp_path: Path, overrides: list[str],
                                                 message: str) -> None:
    where = {"run": tiny_run.run_dir, "folder": tiny_run.checkpoints}
    overrides = [override.format(**where) for override in overrides]
    ckpt = [] if any(override.startswith("ckpt=") for override in overrides) else [f"ckpt={tiny_run.last}"]
    code, line = _evaluate_in_process(tmp_path, *ckpt, *overrides)
    assert code == 2 and line.startswith(f"evaluate.py: {message.format(**where)}"), line



def test_missing_data_names_the_data_roots_setting_paths_data_root(tiny_run: TrainedRun, tmp_path: Path) -> None:
    """Files missing under the data root: the line names ``paths.data_root``, the setting's name in
    evaluate.py as in train.py and prepare.py (before: evaluate's own ``data_root``)."""
    (tmp_path / "empty").mkdir()
    code, line = _evaluate_in_process(tmp_path, f"ckpt={tiny_run.last}", f"paths.data_root={tmp_path / 'empty'}",
                                      "task=multi30k_en_de", "task.datamodule.download=false")
    assert code == 2 and line.startswith("evaluate.py: Multi30k files missing (download=False): "), line
    assert line.endswith("or point AIAYN_DATA_ROOT / paths.data_root at a folder whose multi30k/ holds them"), line


@pytest.mark.parametrize("override, message", [
    ("average_last=five", "Value 'five' of type 'str' could not be converted to Integer"),
    ("average_last=2.5", "Value '2.5' of type 'float' could not be converted to Integer"),
    ("batch_size=true", "Value 'True' of type 'bool' could not be converted to Integer"),
    ("beam_size=4", "Key 'beam_size' not in 'EvaluateConfig'"),
])
def test_a_setting_of_the_wrong_type_or_none_of_evaluates_is_refused_while_composing(override: str,
                                                                                   message: str) -> None:
    """evaluate.py's settings are typed (aiayn.config.tools.EvaluateConfig): Hydra refuses these
    before the tool runs; the tool reports Hydra's refusal in one line (tests/cli/test_bad_input.py)."""
    with (initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"),
          pytest.raises(ConfigCompositionException) as refused):
        compose("evaluate", overrides=["ckpt=x", override])
    assert message in str(refused.value) + str(refused.value.__cause__)


def test_a_directory_as_ckpt_on_the_command_line_is_one_line(tiny_run: TrainedRun, tmp_path: Path) -> None:
    result = evaluate(f"ckpt={tiny_run.checkpoints}", check=False, cwd=tmp_path, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        (f"evaluate.py: ckpt={tiny_run.checkpoints} is a directory; give one checkpoint file, e.g. "
         f"ckpt={tiny_run.last} (average_last=<k> averages the k checkpoints ending at it)")]
    assert not list(tmp_path.iterdir())


def test_a_treebank_split_that_is_no_sections_or_files_is_refused(data_root: Path, tmp_path: Path) -> None:
    """Parsing tasks take any sections or files of the treebank as a split, nothing else: the
    data module answers (evaluate.py asks it)."""
    from aiayn.data.parsing.datamodule import ParsingDataModule
    from aiayn.errors import ConfigError

    datamodule = ParsingDataModule(str(data_root), "ptb_sample", "wsj_0001-wsj_0159", "wsj_0160-wsj_0179",
                                   "wsj_0180-wsj_0199", 2000, 2048, 250, cache_dir=str(tmp_path))
    assert datamodule.check_split("wsj_0190-wsj_0199", "wsj") == "wsj_0190-wsj_0199"  # another file range: fine
    assert datamodule.check_split("test", "wsj") == "wsj_0180-wsj_0199"
    with pytest.raises(ConfigError, match=r"^split=section23: bad treebank split item 'section23' .*; task wsj's "
                                          r"splits are val \(wsj_0160-wsj_0179\), test \(wsj_0180-wsj_0199\)$"):
        datamodule.check_split("section23", "wsj")


def test_treebank_sections_or_files_not_there_are_refused_with_the_tasks_splits(data_root: Path,
                                                                                 tmp_path: Path) -> None:
    """evaluate.py split=23 on a parser of the 10% sample (sections 00-01 only): one line naming
    the sections there and the task's splits, the split= evaluate takes (before: the hint was
    train's, `e.g. task.split=sample`, which the checkpoint's task already has)."""
    from aiayn.data.parsing.datamodule import ParsingDataModule
    from aiayn.errors import ConfigError

    datamodule = ParsingDataModule(str(data_root), "ptb_sample", "wsj_0001-wsj_0159", "wsj_0160-wsj_0179",
                                   "wsj_0180-wsj_0199", 2000, 2048, 250, cache_dir=str(tmp_path))
    for split in ("23", "wsj_0300-wsj_0310"):
        with pytest.raises(ConfigError) as refused:
            datamodule.check_split(split, "wsj")
        assert str(refused.value) == (
            f"split={split}: {data_root / 'ptb_sample/parsed/mrg/wsj'}: no files of split '{split}'; the sections "
            "there are 00, 01; task wsj's splits are val (wsj_0160-wsj_0179), test (wsj_0180-wsj_0199), or sections "
            "or files of the sections there")


def test_wandb_online_without_an_api_key_is_refused_before_decoding(tiny_run: TrainedRun, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the whole split decoded and scored, then wandb's UsageError (exit 1)."""
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    code, line = _evaluate_in_process(tmp_path, f"ckpt={tiny_run.last}", "wandb=online")
    assert code == 2 and line.startswith("evaluate.py: wandb=online needs a W&B API key and none is configured here")
    assert line.endswith("use wandb=auto: offline without a key, uploaded later with `wandb sync`")


@pytest.mark.cli  # the modules a tool imports: a process of its own
def test_a_refused_setting_is_refused_before_lightning_is_imported(tiny_run: TrainedRun, tmp_path: Path) -> None:
    """evaluate.py checks its settings, a W&B mode given (wandb=) and an MLflow store among
    them, without Lightning (2 to 3 s of imports; its data module brings it once they are checked).
    Before: both checks imported the loggers, Lightning's, so that every refusal took those seconds.
    Python's -X importtime lists every module the process imported."""
    missing, out = tmp_path / "missing.ckpt", tmp_path / "eval"
    for arguments, line in [
        ([f"ckpt={missing}"], f"evaluate.py: {missing}: checkpoint not found"),
        ([f"ckpt={tiny_run.last}", f"mlflow=file://{tmp_path}"],
         (f"evaluate.py: mlflow=file://{tmp_path} is a folder, MLflow's file store, which MLflow 3 no longer writes "
          f"runs to; give a SQLite file there instead, e.g. sqlite:///{tmp_path}/mlflow.db (mlflow migrate-filestore "
          "moves the runs of an existing one)")),
    ]:
        result = run_command([sys.executable, "-X", "importtime", "src/evaluate.py", *arguments, f"out={out}"],
                             cache_dir=tiny_run.cache_dir, check=False)
        imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", result.stderr, re.MULTILINE)
        refusal = [text for text in result.stderr.splitlines() if not text.startswith("import time:")]
        assert (result.returncode, refusal) == (2, [line])
        assert "omegaconf" in imported and not out.exists()  # what importtime lists; nothing written
        assert not [name for name in imported if name.split(".")[0] in ("lightning", "pytorch_lightning")]


def test_the_default_out_is_the_runs_eval_folder_or_one_beside_a_checkpoint_kept_elsewhere(tmp_path: Path) -> None:
    """Before: always the folder above the checkpoint's, /eval for /tmp/model.ckpt."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step0000004.ckpt").touch()
    (run / "checkpoints" / "last.ckpt").symlink_to("step0000004.ckpt")
    (tmp_path / "model.ckpt").touch()
    assert default_out(run / "checkpoints" / "last.ckpt") == run / "eval"
    assert default_out(tmp_path / "model.ckpt") == tmp_path / "eval"
