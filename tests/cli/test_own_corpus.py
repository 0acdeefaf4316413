"""``task=parallel_text``: a corpus of one's own through the tools, as a user runs them — train on
a folder of real files in fairseq's layout (tests.helpers.datafiles.own_corpus), evaluate another
split of it, translate; and a mandatory setting left out, refused in one line before a run folder
stays behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from aiayn.checkpoints.resume import find_resume
from aiayn.data.readers import read_lines
from tests.helpers.datafiles import own_corpus
from tests.helpers.inprocess import run_tool, train
from tests.helpers.runs import REPO, TINY

OWN = ["task=parallel_text", "task.src_lang=en", "task.tgt_lang=de"]


@pytest.mark.slow
def test_a_corpus_of_ones_own_trains_tests_and_is_evaluated_and_translated(tmp_path: Path, data_root: Path,
                                                                             subword_cache: Path) -> None:
    corpus = own_corpus(tmp_path / "corpus", data_root)
    run_dir = tmp_path / "run"
    # The folder as a relative path, from where the command runs; the tools below run elsewhere.
    result = train(run_dir, *TINY, *OWN, "task.data_dir=corpus", "logger=csv", cwd=tmp_path, data_root=data_root,
                   cache_dir=subword_cache)
    (tested,) = [line for line in result.stdout.splitlines() if line.startswith("test test:")]
    assert "test/bleu=" in tested and "test/ppl=" in tested
    log = (run_dir / "train.log").read_text()
    assert f"training pairs of {corpus / 'train.en.gz'} / {corpus / 'train.de.gz'}" in log
    assert "val sacreBLEU on " in log  # validation scores valid.{en,de}
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["datamodule_hyper_parameters"]["data_dir"] == str(corpus)
    assert checkpoint["hyper_parameters"]["run_config"]["task"]["datamodule"]["data_dir"] == str(corpus)

    # The folder is the corpus: resume=auto goes on from an earlier run of the same run name on the
    # same folder, never from one on another corpus of the same languages.
    earlier = tmp_path / "outputs" / "parallel_text_en_de-small" / "2026-01-01_00-00-00"
    shutil.copytree(run_dir / "checkpoints", earlier / "checkpoints")
    later = earlier.parent / "2026-01-02_00-00-00"
    config = checkpoint["hyper_parameters"]["run_config"]
    assert find_resume("auto", later, config, multirun=False).run_dir == earlier
    other = {**config, "task": {**config["task"], "datamodule": {**config["task"]["datamodule"], "data_dir": "/other"}}}
    assert find_resume("auto", later, other, multirun=False) is None

    # Another split of the corpus, named by its files: evaluate.py split=<name>.
    wmt = data_root / "wmt14"
    for lang in ("en", "de"):
        (corpus / f"newstest2014.{lang}").write_text("".join(
            f"{line}\n" for line in read_lines(wmt / f"newstest2014-en-de.{lang}")[30:45]))
    out = tmp_path / "eval"
    run_tool("src/evaluate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "split=newstest2014", f"out={out}",
             "decoding.max_len_offset=5", data_root=data_root, cache_dir=subword_cache)
    (report,) = out.glob("*.json")
    assert json.loads(report.read_text())["sentences"] == 15
    (hypotheses,) = out.glob("newstest2014.*.hyp.de")
    assert len(read_lines(hypotheses)) == 15
    # A split of no lines is refused as training refuses it (before: a ZeroDivisionError traceback
    # from the perplexity, exit 1).
    for lang in ("en", "de"):
        (corpus / f"empty.{lang}").write_text("")
    refused = run_tool("src/evaluate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "split=empty",
                       f"out={tmp_path / 'empty'}", check=False, data_root=data_root, cache_dir=subword_cache)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        f"evaluate.py: {corpus / 'empty.en'} / {corpus / 'empty.de'}: no lines; a split needs one sentence pair per "
        "line"), refused.stderr[-3000:]
    # The corpus moved since: the line names the settings that give its folder to evaluate.py, which
    # take it (before: "give the folder", with no setting evaluate.py takes for it).
    moved = corpus.rename(tmp_path / "moved")
    refused = run_tool("src/evaluate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "split=newstest2014",
                       f"out={out}", check=False, data_root=data_root, cache_dir=subword_cache)
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        f"task.data_dir={corpus}: no such folder; give the folder that holds the corpus's files (evaluate.py, for a "
        "checkpoint trained on a folder since moved: task=parallel_text task.data_dir=<folder> task.src_lang=en "
        "task.tgt_lang=de)"), refused.stderr
    moved_corpus = ["task=parallel_text", "task.src_lang=en", "task.tgt_lang=de", "decoding.max_len_offset=5"]
    run_tool("src/evaluate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "split=newstest2014", f"out={out}",
             f"task.data_dir={moved}", *moved_corpus, data_root=data_root, cache_dir=subword_cache)
    # The same data moved overwrote its own evaluation; another corpus's newstest2014 into the same
    # folder is refused before decoding (before: its files replaced the first's unsaid).
    (report,) = out.glob("*.json")
    assert len(json.loads(report.read_text())["data"]) == 16
    other = tmp_path / "other"
    other.mkdir()
    for lang in ("en", "de"):
        lines = read_lines(wmt / f"newstest2014-en-de.{lang}")[60:70]
        (other / f"newstest2014.{lang}").write_text("".join(f"{line}\n" for line in lines))
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    refused = run_tool("src/evaluate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "split=newstest2014",
                       f"out={out}", f"task.data_dir={other}", *moved_corpus, check=False, data_root=data_root,
                       cache_dir=subword_cache)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        f"evaluate.py: {report} is an evaluation of other newstest2014 data than this one's (its sources or "
        "references differ): give out=<another folder> to keep both, or remove its files to score this data in "
        "their place"), refused.stderr[-3000:]
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    run_tool("src/evaluate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "split=newstest2014",
             f"out={tmp_path / 'eval_other'}", f"task.data_dir={other}", *moved_corpus, data_root=data_root,
             cache_dir=subword_cache)
    (other_report,) = (tmp_path / "eval_other").glob("*.json")
    assert other_report.name == report.name and json.loads(other_report.read_text())["sentences"] == 10

    translated = run_tool("src/translate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}",
                          "decoding.max_len_offset=5", stdin="Good morning.\nThank you.\n", data_root=data_root,
                          cache_dir=subword_cache)
    assert len(translated.stdout.splitlines()) == 2


@pytest.mark.parametrize("given, missing", [
    (["task.src_lang=en", "task.tgt_lang=de"], ["task.data_dir"]),  # read by task.datamodule.data_dir
    (["task.data_dir=/data/corpus", "task.src_lang=en"], ["task.tgt_lang"]),  # by task.name: the run folder's name
    # All three: each named in one try (before: the first alone, then the next at each try).
    ([], ["task.src_lang", "task.data_dir", "task.tgt_lang"]),
])
@pytest.mark.parametrize("folder_given", [True, False], ids=["hydra.run.dir given", "outputs/"])
def test_a_setting_of_the_task_left_out_is_named_in_one_line(tmp_path: Path, given: list[str], missing: list[str],
                                                             folder_given: bool) -> None:
    run_dir = tmp_path / "run"
    folder = [f"hydra.run.dir={run_dir}"] if folder_given else []  # else Hydra names it, from task.name
    result = run_tool("src/train.py", *TINY, "logger=none", "task=parallel_text", *given, *folder, cwd=tmp_path,
                      check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    named = f"{', '.join(missing[:-1])} and {missing[-1]} are" if len(missing) > 1 else f"{missing[0]} is"
    assert result.stderr.strip() == (f"train.py: {named} missing: give {' '.join(f'{key}=<value>' for key in missing)} "
                                     f"(see python {REPO / 'src' / 'train.py'} --help)")
    assert sorted(tmp_path.iterdir()) == []  # no run folder, here or under outputs/


@pytest.mark.parametrize("given, missing", [
    # The run's name (task.name, read by the W&B tags) reads src_lang and tgt_lang: --cfg job resolves the
    # config in place, which made it `???` itself (before: `MissingMandatoryValue raised while resolving
    # interpolation: … task.name`, a setting no one gives).
    ([], ["task.src_lang", "task.data_dir", "task.tgt_lang"]),
    # Only task.datamodule.data_dir reads it: resolved in place to `???` without a word (before: the plan, exit 0).
    (["task.src_lang=en", "task.tgt_lang=de"], ["task.data_dir"]),
])
def test_cfg_job_names_the_settings_left_out_as_the_run_does(tmp_path: Path, given: list[str],
                                                             missing: list[str]) -> None:
    result = run_tool("src/train.py", "task=parallel_text", *given, "--cfg", "job", cwd=tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    named = f"{', '.join(missing[:-1])} and {missing[-1]} are" if len(missing) > 1 else f"{missing[0]} is"
    assert result.stderr.strip() == (f"train.py: {named} missing: give {' '.join(f'{key}=<value>' for key in missing)} "
                                     f"(see python {REPO / 'src' / 'train.py'} --help)")
    assert sorted(tmp_path.iterdir()) == []


def test_the_folder_is_read_as_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for given, read in (("corpus", tmp_path / "corpus"), ("'~/corpus'", tmp_path / "home" / "corpus"),
                        ("/data/corpus", Path("/data/corpus"))):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=[*OWN, f"task.data_dir={given}", "run_name=own"])
        assert cfg.task.datamodule.data_dir == str(read)
