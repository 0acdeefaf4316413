"""src/evaluate.py on the session's tiny trained run (`tiny_run`, tests/conftest.py): the data it
reads (``data_root`` reaching each task's data module, WMT's too), the checkpoints it averages,
the files it writes, and its bad-input errors. Real data, real sentencepiece, real sacreBLEU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from aiayn.data.readers import read_lines
from aiayn.data.wmt.sgm import read_sgm
from aiayn.errors import ConfigError
from tests.helpers.datafiles import multi30k_copy, write_lines
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TINY, TrainedRun
from tests.helpers.translating import evaluate
from tests.helpers.wandb_offline import read_run

WMT_VOCAB = 500
# A miniature WMT14 EN-DE raw tree (the upstream archives' layout): the first 3,000 lines of the
# shared training sample, 1,000 per corpus; newstest2013; the full newstest2014 in sgm.
CORPORA = (("training/europarl-v7.de-en", 0, 1000), ("commoncrawl.de-en", 1000, 2000),
           ("training/news-commentary-v9.de-en", 2000, 3000))


def report_of(out_dir: Path, pattern: str) -> dict:
    (path,) = out_dir.glob(pattern)
    return json.loads(path.read_text())


# -- data_root reaches every task's data module -----------------------------------------------
@pytest.fixture(scope="module")
def wmt_root(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root whose ``wmt14_raw/`` (conf/task/wmt_en_de.yaml's ``raw_dir``) holds a
    miniature WMT14 EN-DE tree built from the shared files."""
    root = tmp_path_factory.mktemp("wmt-data-root")
    raw, wmt = root / "wmt14_raw", data_root / "wmt14"
    en, de = read_lines(wmt / "train_sample" / "src-train.txt.gz"), read_lines(wmt / "train_sample" / "tgt-train.txt.gz")
    for stem, start, end in CORPORA:
        for lang, lines in (("en", en), ("de", de)):
            path = raw / f"{stem}.{lang}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{line}\n" for line in lines[start:end]), encoding="utf-8")
    (raw / "dev").mkdir()
    (raw / "test-full").mkdir()
    for lang in ("en", "de"):
        shutil.copyfile(wmt / f"newstest2013.{lang}", raw / "dev" / f"newstest2013.{lang}")
    for name in ("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm"):
        shutil.copyfile(wmt / "sgm" / name, raw / "test-full" / name)
    return root


@pytest.fixture
def wmt_cache(tmp_path: Path) -> Path:
    """Where the test prepares the miniature WMT data: its own, so that each test reads the raw
    files (a folder prepared before would be taken as it is, wherever raw_dir pointed)."""
    return tmp_path / "cache"


def wmt_task(cache: Path, trained_data_root: str) -> dict:
    """conf/task/wmt_en_de.yaml as a training run resolves it into its checkpoint, on a machine
    whose data root was ``trained_data_root``: a 500-subword model, no download."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, "task=wmt_en_de", f"task.vocab_size={WMT_VOCAB}",
                                          f"paths.data_root={trained_data_root}", f"paths.cache_dir={cache}",
                                          "task.datamodule.download=false", "task.datamodule.prepare_workers=1"])
    return {"task": OmegaConf.to_container(cfg.task, resolve=True),
            "paths": {"data_root": trained_data_root, "cache_dir": str(cache)}}


@pytest.mark.slow
def test_a_wmt_checkpoint_reads_newstest2014_under_the_data_root(tiny_run: TrainedRun, wmt_root: Path,
                                                                  wmt_cache: Path, tmp_path: Path) -> None:
    """A checkpoint of a WMT run, trained where the data root was another folder, evaluated with
    AIAYN_DATA_ROOT set (as the Makefile does): WMT's raw_dir follows the data root here. (The
    checkpoint is the tiny Multi30k run's with its stored training config made a WMT run's: the
    network and its subword model stay Multi30k's, the task and the data are WMT's.) Its cache, not
    there either, is this machine's (before: the data were prepared at the training machine's path)."""
    checkpoint = torch.load(tiny_run.last, map_location="cpu", weights_only=False)
    run_config = checkpoint["hyper_parameters"]["run_config"]
    run_config.update(wmt_task(Path("/training/machine/cache"), "/training/machine/data"))
    assert run_config["task"]["datamodule"]["raw_dir"] == "/training/machine/data/wmt14_raw"
    ckpt = tmp_path / "run" / "checkpoints" / "step0000004.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save(checkpoint, ckpt)

    result = evaluate(f"ckpt={ckpt}", "split=test", "decoding.beam_size=1", data_root=wmt_root,
                      cache_dir=wmt_cache, timeout=300)
    report = report_of(tmp_path / "run" / "eval", "newstest2014.step4.*.json")
    assert result.stdout.startswith("newstest2014: 3003 sentences, step 4")
    assert report["task"] == "wmt_en_de" and report["split"] == "newstest2014" and report["sentences"] == 3003
    assert len(Path(report["hypotheses"]).read_text(encoding="utf-8").splitlines()) == 3003
    # The references scored against are newstest2014's, read from the sgm under the data root.
    (prepared,) = (wmt_cache / "wmt14").glob("*/newstest2014.de")  # prepared here
    assert not Path("/training").exists()
    assert read_lines(prepared) == [" ".join(line.split()) for line in
                                    read_sgm(wmt_root / "wmt14_raw" / "test-full" / "newstest2014-deen-ref.de.sgm")]


@pytest.mark.slow
def test_another_task_on_the_command_line_reads_under_data_root(tiny_run: TrainedRun, data_root: Path, wmt_root: Path,
                                                                 wmt_cache: Path, tmp_path: Path) -> None:
    """task=wmt_en_de on a Multi30k en→de checkpoint: the task's raw_dir is resolved with
    ``paths.data_root=`` as its data root (which wins over AIAYN_DATA_ROOT, here the shared data). The
    decoding is the checkpoint's (debug=tiny's input + 5) with decoding.* over it: another task's
    test set does not change how the model decodes. Another task's data is not prepared for it
    (hours for WMT14): evaluate refuses until prepare.py has prepared it."""
    wmt = ["task=wmt_en_de", f"task.vocab_size={WMT_VOCAB}", "task.datamodule.download=false",
           "task.datamodule.prepare_workers=1"]
    refused = evaluate(f"ckpt={tiny_run.last}", *wmt, f"paths.data_root={wmt_root}", "split=val", f"out={tmp_path}",
                       data_root=data_root, cache_dir=wmt_cache, check=False)
    assert refused.returncode == 2 and "run src/prepare.py with this task first" in refused.stderr, refused.stderr
    assert not wmt_cache.joinpath("wmt14").exists() and not list(tmp_path.iterdir())
    run_tool("src/prepare.py", *wmt, f"hydra.run.dir={tmp_path / 'prepare'}", data_root=wmt_root,
             cache_dir=wmt_cache, timeout=300)
    evaluate(f"ckpt={tiny_run.last}", *wmt, f"paths.data_root={wmt_root}", "split=val", "decoding.beam_size=1",
             f"out={tmp_path / 'eval'}", data_root=data_root, cache_dir=wmt_cache, timeout=300)
    report = report_of(tmp_path / "eval", "newstest2013.step4.beam1.*.json")
    assert report["task"] == "wmt_en_de" and report["sentences"] == 3000 and report["decoding"]["max_len_offset"] == 5


@pytest.mark.parametrize(("setting", "task"), [("paths.data_root", []), ("paths.data_root", ["task=multi30k_en_de"]),
                                             ("data_root", [])], ids=["its own task", "task=", "the old name"])
def test_the_data_root_is_paths_data_root_as_in_train_and_wins_over_the_environment(
        setting: str, task: list[str], tiny_run: TrainedRun, data_root: Path, tmp_path: Path) -> None:
    """paths.data_root, the name train.py and prepare.py give it, read over AIAYN_DATA_ROOT (here
    the shared data) for the checkpoint's own task and for task= alike: its test set of two
    sentences is the one scored (before: evaluate's own data_root=, and a paths.data_root= given was
    read for task= only while AIAYN_DATA_ROOT was unset, and for the checkpoint's own task never,
    without a word). ``data_root=`` is its old name here, said in one notice."""
    test = {"test_2016_flickr.en.gz", "test_2016_flickr.de.gz"}
    root = multi30k_copy(tmp_path / "data", data_root, leave_out=test)
    write_lines(root / "multi30k" / "test_2016_flickr.en.gz", ["A dog runs.", "Two men sit."])
    write_lines(root / "multi30k" / "test_2016_flickr.de.gz", ["Ein Hund rennt.", "Zwei Männer sitzen."])
    result = run_tool("src/evaluate.py", f"ckpt={tiny_run.last}", *task, f"{setting}={root}", "decoding.max_len_offset=2",
                      "wandb=disabled", f"out={tmp_path / 'eval'}", data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert report_of(tmp_path / "eval", "test_2016_flickr.step4.*.json")["sentences"] == 2
    notices = [line for line in result.stderr.splitlines() if "old name" in line]
    assert notices == ([] if setting == "paths.data_root" else
                       ["evaluate.py: data_root is now paths.data_root; the old name works until release 0.3"])


def test_data_root_moves_every_path_of_the_checkpoints_task_under_it() -> None:
    """The checkpoint's own task, resolved where it was trained, read under another data root:
    each path under the training data root moves (Multi30k's data_root, WMT's raw_dir), the rest stays."""
    from aiayn.cli.evaluate import _task

    trained = {"task": {"name": "x", "raw_dir": "/old/root/wmt14_raw", "datamodule": {
        "data_root": "/old/root", "raw_dir": "/old/root/wmt14_raw", "treebank": "ptb_sample", "cache_dir": "/cache",
        "extra_trees": ["/old/rooted/x", "/old/root/semi/*"], "src_lang": "en"}},
        "paths": {"data_root": "/old/root/"}}
    cfg = OmegaConf.create({"paths": {"data_root": "/new"}, "task": None})
    moved = _task(cfg, trained, Path("x.ckpt"))
    assert moved["raw_dir"] == "/new/wmt14_raw"
    assert moved["datamodule"] == {"data_root": "/new", "raw_dir": "/new/wmt14_raw", "treebank": "ptb_sample",
                                   "cache_dir": "/cache", "extra_trees": ["/old/rooted/x", "/new/semi/*"],
                                   "src_lang": "en"}
    assert _task(OmegaConf.create({"paths": {"data_root": None}, "task": None}), trained, Path("x.ckpt")) == trained["task"]
    # task=<name> with no data root given (AIAYN_DATA_ROOT unset): the checkpoint's run's; with none there, refused.
    named = {"paths": {"data_root": None}, "seed": 1, "task": {"name": "y", "datamodule": {"data_root": "${paths.data_root}"}}}
    assert _task(OmegaConf.create(named), trained, Path("x.ckpt"))["datamodule"]["data_root"] == "/old/root/"
    with pytest.raises(ConfigError, match=r"^task=y: say where its data is with paths.data_root=<folder> \(or AIAYN_"):
        _task(OmegaConf.create(named), {"task": trained["task"]}, Path("x.ckpt"))


# -- averaging: the k checkpoints ending at the one given -------------------------------------
@pytest.mark.slow
def test_average_last_averages_the_checkpoints_ending_at_the_one_given(tiny_run: TrainedRun, data_root: Path,
                                                                     tmp_path: Path) -> None:
    from aiayn.checkpoints.averaging import average_checkpoints
    from aiayn.checkpoints.trained import load_trained
    from aiayn.data.readers import read_parallel
    from aiayn.decoding.translator import perplexity

    folder = tiny_run.checkpoints
    result = evaluate(f"ckpt={folder / 'step0000002.ckpt'}", "average_last=2", "split=test_2017_mscoco",
                      f"out={tmp_path}", data_root=data_root, cache_dir=tiny_run.cache_dir)
    # Steps 1 and 2, not the folder's newest (3 and 4), and said so in the name, the line and the report.
    assert result.stdout.splitlines()[0] == (
        "test_2017_mscoco: 461 sentences, steps 1–2, average of 2 checkpoints (step0000001.ckpt, step0000002.ckpt)")
    report = report_of(tmp_path, "test_2017_mscoco.step1-2.beam4.alpha0.6.len+5.avg2.json")
    assert report["averaged"] == [str(folder / "step0000001.ckpt"), str(folder / "step0000002.ckpt")]
    assert report["averaged_steps"] == [1, 2] and report["step"] == 2
    assert Path(report["hypotheses"]) == tmp_path / "test_2017_mscoco.step1-2.beam4.alpha0.6.len+5.avg2.hyp.de"
    # The perplexity reported is that of the average of steps 1 and 2.
    trained = load_trained(folder / "step0000002.ckpt", state_dict=average_checkpoints(report["averaged"])["state_dict"])
    sources, references = read_parallel(*(data_root / "multi30k" / f"test_2017_mscoco.{lang}.gz" for lang in ("en", "de")))
    assert report["test_2017_mscoco/ppl"] == pytest.approx(perplexity(trained.model, trained.vocab, sources,
                                                                      references, 4096)[0])

    # From last.ckpt (its step read from the file): step 3 and last.ckpt itself.
    result = evaluate(f"ckpt={tiny_run.last}", "average_last=2", "split=test_2017_mscoco", f"out={tmp_path}",
                      data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert result.stdout.splitlines()[0].endswith("steps 3–4, average of 2 checkpoints (step0000003.ckpt, last.ckpt)")
    assert report_of(tmp_path, "test_2017_mscoco.step3-4.*.avg2.json")["averaged_steps"] == [3, 4]

    # average.py's average of steps 3 and 4 is evaluated as it is, and said to be that average
    # (before: "step 4"); averaged again with the checkpoints before it, refused.
    averaged = tmp_path / "kept" / "averaged.ckpt"
    run_tool("src/average.py", f"ckpt={tiny_run.run_dir}", "average_last=2", f"out={averaged}")
    result = evaluate(f"ckpt={averaged}", "split=test_2017_mscoco", f"out={tmp_path / 'of-average'}",
                      data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert result.stdout.splitlines()[0].endswith("steps 3–4, average of 2 checkpoints (averaged.ckpt, average.py's)")
    refused = evaluate(f"ckpt={averaged}", "average_last=2", "split=test_2017_mscoco", f"out={tmp_path / 'again'}",
                       data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    assert refused.returncode == 2 and "an average already (average.py's, of steps 3, 4)" in refused.stderr


# -- names: a sweep of decoding settings leaves one report per setting ------------------------
@pytest.mark.slow
def test_evaluations_with_other_decoding_settings_leave_their_own_reports(tiny_run: TrainedRun, data_root: Path,
                                                                          tmp_path: Path) -> None:
    for alpha in ("0.6", "1.0"):
        evaluate(f"ckpt={tiny_run.last}", "split=test_2017_mscoco", f"decoding.alpha={alpha}", f"out={tmp_path}",
                 data_root=data_root, cache_dir=tiny_run.cache_dir)
    evaluate(f"ckpt={tiny_run.last}", "split=test_2017_mscoco", "decoding.beam_size=2", "decoding.kv_cache=false",
             "onednn=true", f"out={tmp_path}", data_root=data_root, cache_dir=tiny_run.cache_dir)
    evaluate(f"ckpt={tiny_run.last}", "split=test_2017_mscoco", "int8=true", f"out={tmp_path}",
             data_root=data_root, cache_dir=tiny_run.cache_dir)
    reports = {path.name: json.loads(path.read_text()) for path in tmp_path.glob("*.json")}
    assert sorted(reports) == ["test_2017_mscoco.step4.beam2.alpha0.6.len+5.nokv.onednn.json",
                               "test_2017_mscoco.step4.beam4.alpha0.6.len+5.int8.json",
                               "test_2017_mscoco.step4.beam4.alpha0.6.len+5.json",
                               "test_2017_mscoco.step4.beam4.alpha1.len+5.json"]
    assert [reports[name]["decoding"]["alpha"] for name in sorted(reports)] == [0.6, 0.6, 0.6, 1.0]
    assert [reports[name]["speed_switches"]["int8"] for name in sorted(reports)] == [False, True, False, False]
    assert [reports[name]["speed_switches"]["onednn"] for name in sorted(reports)] == [True, False, False, False]
    for report in reports.values():  # each names its own hypotheses, all kept
        assert len(Path(report["hypotheses"]).read_text(encoding="utf-8").splitlines()) == 461
    # aiayn.load's perplexity is evaluate.py's to the last bit: batched by the same rule (the task's
    # evaluation batch), the same sums (another batch changes it at ~1e-8).
    import aiayn

    sources, references = (read_lines(data_root / "multi30k" / f"test_2017_mscoco.{lang}.gz") for lang in ("en", "de"))
    model = aiayn.load(tiny_run.last, device="cpu")
    ppl = reports["test_2017_mscoco.step4.beam4.alpha0.6.len+5.json"]["test_2017_mscoco/ppl"]
    assert model.perplexity(sources, references) == ppl != model.perplexity(sources, references, max_tokens=128)


@pytest.mark.slow
def test_ensembles_of_other_members_keep_their_own_reports(tiny_run: TrainedRun, data_root: Path,
                                                          tmp_path: Path) -> None:
    """ckpt=A,B then ckpt=A,C: two reports (before: both were ....ens2, the second replaced the first);
    the same ensemble again writes over its own."""
    checkpoints = tiny_run.checkpoints
    for members in ([tiny_run.last, checkpoints / "step0000003.ckpt"], [tiny_run.last, checkpoints / "step0000002.ckpt"],
                    [tiny_run.last, checkpoints / "step0000003.ckpt"]):
        evaluate(f"ckpt={','.join(map(str, members))}", "split=test_2017_mscoco", "decoding.max_len_offset=2",
                 f"out={tmp_path}", data_root=data_root, cache_dir=tiny_run.cache_dir)
    reports = {path.name: json.loads(path.read_text()) for path in tmp_path.glob("*.json")}
    assert len(reports) == 2 and all(".ens2-" in name for name in reports), sorted(reports)
    assert sorted(report["ensemble"][1].rsplit("/", 1)[1] for report in reports.values()) == [
        "step0000002.ckpt", "step0000003.ckpt"]


@pytest.mark.slow
def test_a_source_cut_to_the_models_positions_is_named_once(tiny_run: TrainedRun, data_root: Path,
                                                             tmp_path: Path) -> None:
    """A source line over the model's 511 subwords (and EOS) is named once, with its line and length
    (before: twice, by the perplexity pass and again by the translation)."""
    long = " ".join(["Two men are playing guitars on a stage while people watch ."] * 60)
    root = multi30k_copy(tmp_path / "data", data_root, leave_out={"test_2017_mscoco.en.gz", "test_2017_mscoco.de.gz"})
    write_lines(root / "multi30k" / "test_2017_mscoco.en.gz", ["A dog runs .", long, "Two men ."])
    write_lines(root / "multi30k" / "test_2017_mscoco.de.gz", ["Ein Hund rennt .", "Zwei Männer .", "Zwei Männer ."])
    result = evaluate(f"ckpt={tiny_run.last}", "split=test_2017_mscoco", "decoding.beam_size=1",
                      "decoding.max_len_offset=2", f"out={tmp_path / 'eval'}", data_root=root,
                      cache_dir=tiny_run.cache_dir)
    cut = [line for line in result.stderr.splitlines() if "subword tokens" in line]
    assert len(cut) == 1 and cut[0].startswith("WARNING aiayn.decoding.translator: input line 2 has ") and cut[0].endswith(
        " subword tokens; truncated to the model's 511"), result.stderr
    assert result.stdout.startswith("test_2017_mscoco: 3 sentences")


def test_the_old_seed_is_decoding_seed_with_a_notice(tiny_run: TrainedRun, data_root: Path, tmp_path: Path) -> None:
    """evaluate's own seed= seeded nothing (decoding.seed seeds the samples): it is that setting now."""
    result = evaluate(f"ckpt={tiny_run.last}", "seed=7", "decoding.sampling=true", "split=test_2017_mscoco",
                      "decoding.max_len_offset=2", f"out={tmp_path}", data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert result.stderr.splitlines()[0] == "evaluate.py: seed is now decoding.seed; the old name works until release 0.3"
    assert report_of(tmp_path, "*.seed7.*json")["decoding"]["seed"] == 7


@pytest.mark.slow
def test_a_run_whose_row_no_longer_composes_is_evaluated_and_logged_untagged(tiny_run: TrainedRun, data_root: Path,
                                                                             tmp_path: Path) -> None:
    """evaluate.py tags its W&B run `modified` when the training run changed its paper row; a run
    of a row this checkout no longer has (an older version's) gets a warning, not a traceback
    after the evaluation."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run_dir, ignore=shutil.ignore_patterns("wandb", "eval"))
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    recorded = OmegaConf.load(hydra_file)
    recorded.hydra.runtime.choices.experiment = "table3_no_such_row"
    OmegaConf.save(recorded, hydra_file)
    result = run_tool("src/evaluate.py", f"ckpt={run_dir / 'checkpoints' / tiny_run.last.name}",
                      "split=test_2017_mscoco", "decoding.beam_size=1", "wandb=offline", f"out={tmp_path / 'eval'}",
                      data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert "could not compare" in result.stderr and "table3_no_such_row" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    evaluation = read_run(tmp_path / "eval")
    assert evaluation.job_type == "eval" and evaluation.tags == []
