"""Starting from a trained model (``init_from``, aiayn.checkpoints.init_from): the session's tiny
Multi30k run fine-tuned on a corpus of one's own (the WMT14 slice as ``task=parallel_text``). The
new run starts with the checkpoint's weights and encodes its corpus with the checkpoint's subword
model, learning none; a checkpoint of another network, size or subword model is refused in one line
before anything is built. Real checkpoints, real sentencepiece."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import hydra
import pytest
import torch

from aiayn.checkpoints.averaging import average_checkpoints
from aiayn.checkpoints.init_from import initial_weights, start_from
from aiayn.checkpoints.io import list_checkpoints, save_checkpoint_atomically
from aiayn.checkpoints.resume import find_resume
from aiayn.checkpoints.trained import load_trained, model_weights
from aiayn.config.plan import describe
from aiayn.config.schemas import network_arguments
from aiayn.data.readers import read_lines
from aiayn.errors import ConfigError
from aiayn.model import Transformer
from tests.helpers.configs import resolved
from tests.helpers.datafiles import own_corpus, write_lines
from tests.helpers.inprocess import run_tool, train
from tests.helpers.runs import TrainedRun

# The tiny run's network (tests.helpers.runs.TINY_RUN) on a corpus of one's own.
FINE_TUNING = ["debug=tiny", "model.n_layers=2", "task=parallel_text", "task.src_lang=en", "task.tgt_lang=de"]


def test_the_run_starts_from_the_checkpoints_weights_and_encodes_with_its_subwords(
        tiny_run: TrainedRun, data_root: Path, tmp_path: Path) -> None:
    corpus = own_corpus(tmp_path / "corpus", data_root)
    config = resolved(*FINE_TUNING, f"task.data_dir={corpus}", f"init_from={tiny_run.last}")
    config["paths"]["cache_dir"] = str(tmp_path / "cache")
    start_from(config)
    trained = torch.load(tiny_run.last, map_location="cpu", weights_only=False)
    copy = Path(config["task"]["datamodule"]["subword_model"])
    assert copy.parent == tmp_path / "cache" / "sentencepiece" and copy.read_bytes() == trained["subwords"]
    assert config["task"]["subword_model"] == str(copy) and config["init_from"] == str(tiny_run.last)

    model = Transformer(**network_arguments(config["model"]), src_vocab_size=500, tgt_vocab_size=500, pad_id=0)
    initial_weights(model, config["init_from"])
    expected = model_weights(trained["state_dict"])
    assert all(torch.equal(value, expected[name]) for name, value in model.state_dict().items())


@pytest.mark.slow  # a real tiny run, in this process
def test_a_fine_tuning_run_learns_no_subwords_and_keeps_the_checkpoints(tiny_run: TrainedRun, data_root: Path,
                                                                        tmp_path: Path) -> None:
    corpus, cache, run_dir = own_corpus(tmp_path / "corpus", data_root), tmp_path / "cache", tmp_path / "run"
    train(run_dir, *FINE_TUNING, f"task.data_dir={corpus}", f"init_from={tiny_run.last}", "logger=csv",
          "optim.train_steps=2", "test_after_training=false", "visualize_at_end=false", data_root=data_root,
          cache_dir=cache)
    log = (run_dir / "train.log").read_text()
    assert f"starting from the model of {tiny_run.last} (step 4): its weights and subword model" in log
    # The plan and the summary say what the run started from (before: neither did).
    assert f"  weights: at step 0, the model of {tiny_run.last} (init_from), with Adam and the schedule started afresh there\n" in log
    assert json.loads((run_dir / "summary.json").read_text())["init_from"] == str(tiny_run.last)
    subwords = torch.load(tiny_run.last, map_location="cpu", weights_only=False)["subwords"]
    models = [path.name for path in (cache / "sentencepiece").glob("*.model")]
    assert len(models) == 1 and models[0].startswith("given-")  # the checkpoint's copy alone: none learnt
    (prepared,) = (cache / "parallel_text").iterdir()
    assert (prepared / "sentencepiece.model").read_bytes() == subwords
    fine_tuned = load_trained(run_dir / "checkpoints" / "last.ckpt")
    assert fine_tuned.vocab.serialized() == subwords and fine_tuned.step == 2
    assert fine_tuned.config["init_from"] == str(tiny_run.last)


@pytest.mark.parametrize(("overrides", "message"), [
    (["init_from={tmp}/none.ckpt"], "init_from={tmp}/none.ckpt: no such checkpoint file; give a checkpoint"),
    (["init_from={tmp}/notes.ckpt"], ("init_from={tmp}/notes.ckpt: not an aiayn training checkpoint; give one a "
                                      r"training run wrote \(<run>/checkpoints/\*\.ckpt, or average\.py's file\)")),
    (["init_from={run}"], "^init_from={run}: {run} is a directory; give one checkpoint file, e.g. init_from={last}$"),
    (["init_from={last}", "model.n_layers=1", "model.d_ff=128"],
     (r"init_from={last}: this run's network is not the checkpoint's \(model.n_layers 2 → 1; model.d_ff 64 → 128\); "
      "give the checkpoint's model settings: model.n_layers=2 model.d_ff=64$")),  # before: none named
    (["init_from={last}", "model.n_layers=2", "task.vocab_size=600"],
     r"\(task.vocab_size 500 → 600\); give the checkpoint's model settings: task.vocab_size=500$"),
    (["init_from={last}", "model.n_layers=2", "model.d_model=64", "model.d_ff=128", "model.d_k=16", "model.d_v=16",
      "width_divisor=2"],  # widths halved (d_k and d_v given: d_model/h would have made them the checkpoint's)
     (r"\(model.d_k 16 → 8; model.d_v 16 → 8\); give the checkpoint's model settings: width_divisor=1 "
      r"model.d_model=32 model.d_ff=64 model.d_k=16 model.d_v=16$")),
    (["init_from={last}", "model.n_layers=2", "task.subword_model={tmp}/other.model"],
     "task.subword_model={tmp}/other.model is not the checkpoint's subword model"),
    (["init_from={last}", "model.n_layers=2", "task.subword_model={tmp}/none.model"],
     "task.subword_model={tmp}/none.model is not the checkpoint's subword model"),
    (["init_from={tmp}/damaged.ckpt"],  # before: "not an aiayn training checkpoint"
     ("^init_from={tmp}/damaged.ckpt: {tmp}/damaged.ckpt: damaged: its bytes are not those written .*; use another "
      "checkpoint of the run$")),
])
def test_a_checkpoint_the_run_cannot_start_from_is_refused_before_anything_is_built(
        overrides: list[str], message: str, tiny_run: TrainedRun, tmp_path: Path) -> None:
    (tmp_path / "notes.ckpt").write_text("notes\n")
    shutil.copyfile(tiny_run.checkpoints / "step0000004.ckpt", tmp_path / "damaged.ckpt")
    shutil.copyfile(tiny_run.checkpoints / "step0000004.ckpt.blake2b", tmp_path / "damaged.ckpt.blake2b")
    with (tmp_path / "damaged.ckpt").open("r+b") as damaged:  # a byte flipped after it was written
        damaged.seek(1000)
        byte = damaged.read(1)
        damaged.seek(1000)
        damaged.write(bytes([byte[0] ^ 0xFF]))
    (tmp_path / "other.model").write_bytes(b"another model")
    names = {"tmp": tmp_path, "last": tiny_run.last, "run": tiny_run.run_dir}  # a run folder: before, "no such checkpoint file"
    config = resolved("debug=tiny", *(o.format(**names) for o in overrides))
    with pytest.raises(ConfigError, match=message.format(**names)):
        start_from(config)


def test_a_run_started_from_another_model_is_not_resumed_in_its_place(tiny_run: TrainedRun, tmp_path: Path) -> None:
    """``init_from=B resume=auto`` beside an earlier run of the same name started from A (or from no
    model): that run is another's, not resumed; ``resume=<it>`` is refused naming init_from (before:
    resumed, its weights trained on in place of B's, B named in the new checkpoints' config)."""
    config = torch.load(tiny_run.last, map_location="cpu", weights_only=False)["hyper_parameters"]["run_config"]
    assert config["init_from"] is None  # the tiny run started from no model
    earlier = tmp_path / "outputs" / "run" / "2026-01-01_00-00-00"
    shutil.copytree(tiny_run.checkpoints, earlier / "checkpoints")
    fine_tuning = {**config, "init_from": str(tiny_run.last)}
    assert find_resume("auto", tmp_path / "outputs" / "run" / "2026-01-02_09-30-00", fine_tuning, multirun=False) is None
    with pytest.raises(ConfigError, match=f"was trained with other settings than this run: init_from: None → "
                                          f"'{tiny_run.last}'; resume with the checkpoint's settings"):
        find_resume(str(earlier), tmp_path / "attempt", fine_tuning, multirun=False)
    found = find_resume("auto", tmp_path / "outputs" / "run" / "2026-01-02_09-30-00", config, multirun=False)
    assert found is not None and found.run_dir == earlier  # the same command goes on from it


def test_sinusoidal_positions_may_cover_longer_sentences_than_the_checkpoints(tiny_run: TrainedRun,
                                                                               tmp_path: Path) -> None:
    """The sinusoids are computed, not weights (§3.5): a run may raise model.max_positions for longer
    sentences (before: refused, "model.max_positions 512 → 2048; give the checkpoint's model settings");
    learned positions are weights, and their number stays the checkpoint's."""
    config = resolved(*FINE_TUNING[:2], "model.max_positions=2048", f"init_from={tiny_run.last}")
    config["paths"]["cache_dir"] = str(tmp_path / "cache")
    start_from(config)
    model = Transformer(**network_arguments(config["model"]), src_vocab_size=500, tgt_vocab_size=500, pad_id=0)
    initial_weights(model, config["init_from"])
    assert model.max_positions == 2048
    learned = resolved(*FINE_TUNING[:2], "model.positional=learned", "model.max_positions=2048",
                       f"init_from={tiny_run.last}")
    with pytest.raises(ConfigError, match=r"\(model.positional 'sinusoidal' → 'learned'; model.max_positions 512 → 2048\)"):
        start_from(learned)


def test_the_plan_names_the_model_a_run_starts_from(tiny_run: TrainedRun, tmp_path: Path) -> None:
    """The plan (the run's and --cfg job's) names the checkpoint of init_from; a run from scratch none."""
    config = resolved(*FINE_TUNING[:2], f"init_from={tiny_run.last}")
    config["paths"]["cache_dir"] = str(tmp_path / "cache")
    start_from(config)
    assert (f"\n  weights: at step 0, the model of {tiny_run.last} (init_from), with Adam and the schedule started afresh there"
            in describe(config["plan"], config))
    assert "weights:" not in describe(config["plan"], resolved(*FINE_TUNING[:2]))


def test_a_corpus_the_checkpoints_subwords_do_not_cover_is_warned_of(tiny_run: TrainedRun, data_root: Path,
                                                                     tmp_path: Path, caplog) -> None:
    """An en-de Multi30k model fine-tuned on en→fr news: French accents are <unk> to its subword
    model, and the run says so, naming them (before: it trained on the <unk>s without a word); the
    en-de corpus it was learnt for has no such line."""
    french = tmp_path / "fr"
    french.mkdir()
    wmt = data_root / "wmt14"
    for lang in ("en", "fr"):
        write_lines(french / f"train.{lang}", read_lines(wmt / f"newstest2014-en-fr.{lang}")[:200])
        write_lines(french / f"valid.{lang}", read_lines(wmt / f"newstest2013.{lang}")[:200])
    for corpus, tgt_lang in ((french, "fr"), (own_corpus(tmp_path / "de", data_root), "de")):
        config = resolved(*FINE_TUNING[:3], "task.src_lang=en", f"task.tgt_lang={tgt_lang}", f"task.data_dir={corpus}",
                          f"init_from={tiny_run.last}")
        config["paths"]["cache_dir"] = str(tmp_path / "cache")
        start_from(config)
        datamodule = hydra.utils.instantiate(config["task"]["datamodule"], max_tokens=1024)
        model = Transformer(**network_arguments(config["model"]), src_vocab_size=500, tgt_vocab_size=500, pad_id=0)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aiayn.checkpoints.init_from"):
            initial_weights(model, config["init_from"], datamodule)
        warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
        if tgt_lang == "de":
            assert warnings == []
            continue
        assert len(warnings) == 1 and re.fullmatch(
            rf"init_from={re.escape(str(tiny_run.last))}: its subword model does not know \d\.\d% of the fr side's "
            r"subwords in the valid split \(the characters [^)]*â[^)]*\): they train and decode as <unk>; .*", warnings[0])


def test_an_averaged_checkpoint_is_started_from_and_named_as_the_average(tiny_run: TrainedRun, tmp_path: Path,
                                                                         caplog) -> None:
    """average.py's file (§6.1) as init_from: the averaged weights, and the log names the steps
    averaged (before: "starting from the model of … (step 4)", its newest member's step)."""
    averaged = tmp_path / "avg.ckpt"
    average = average_checkpoints(path for _, path in list_checkpoints(tiny_run.run_dir)[-2:])
    torch.save(average, averaged)
    config = resolved(*FINE_TUNING[:2], f"init_from={averaged}")
    config["paths"]["cache_dir"] = str(tmp_path / "cache")
    start_from(config)
    model = Transformer(**network_arguments(config["model"]), src_vocab_size=500, tgt_vocab_size=500, pad_id=0)
    with caplog.at_level(logging.INFO, logger="aiayn.checkpoints.init_from"):
        initial_weights(model, config["init_from"])
    expected = model_weights(average["state_dict"])
    assert all(torch.equal(value, expected[name]) for name, value in model.state_dict().items())
    assert f"starting from the model of {averaged} (the average of steps 3–4): its weights" in caplog.text


def test_a_fine_tuning_run_resumes_after_the_checkpoint_it_started_from_is_gone(tiny_run: TrainedRun,
                                                                               tmp_path: Path) -> None:
    """The checkpoint of init_from removed (a scratch disk cleaned) before the killed fine-tuning run
    is resumed with the same command: it goes on from its own checkpoint, with the subword model that
    checkpoint holds (before: "no such checkpoint file", and without init_from "trained with other
    settings": no way to resume it); a run that resumes nothing still needs the file."""
    gone, run_dir = tmp_path / "pre.ckpt", tmp_path / "run"
    checkpoint = torch.load(tiny_run.checkpoints / "step0000004.ckpt", map_location="cpu", weights_only=False)
    checkpoint["hyper_parameters"]["run_config"]["init_from"] = str(gone)  # the fine-tuning run's, at step 4
    save_checkpoint_atomically(checkpoint, run_dir / "checkpoints" / "step0000004.ckpt")
    for resume in ("auto", str(run_dir)):
        config = resolved(*FINE_TUNING[:2], f"init_from={gone}", f"resume={resume}")
        config["paths"].update(cache_dir=str(tmp_path / "cache"), output_dir=str(run_dir))
        start_from(config)
        assert Path(config["task"]["datamodule"]["subword_model"]).read_bytes() == checkpoint["subwords"]
        assert config["init_from"] == str(gone)
        assert find_resume(resume, run_dir, config, multirun=False).checkpoint == run_dir / "checkpoints" / "step0000004.ckpt"
    with pytest.raises(ConfigError, match=f"init_from={gone}: no such checkpoint file"):
        start_from(resolved(*FINE_TUNING[:2], f"init_from={gone}"))


def test_evaluate_reads_a_fine_tuned_checkpoint_whose_subword_copy_is_gone(tiny_run: TrainedRun, data_root: Path,
                                                                            tmp_path: Path) -> None:
    """A fine-tuned checkpoint's task.subword_model names the copy in the training machine's cache;
    evaluated where that file is not (the cache cleaned, another machine), evaluate.py uses the
    subword model the checkpoint holds (before: exit 2, `task.subword_model=…: no such file; give a
    sentencepiece model file (.model), or null to learn one`, where a learnt one is another model)."""
    checkpoint = torch.load(tiny_run.checkpoints / "step0000004.ckpt", map_location="cpu", weights_only=False)
    task = checkpoint["hyper_parameters"]["run_config"]["task"]
    gone = str(tmp_path / "training-machine" / "sentencepiece" / "given-0123456789abcdef0123.model")
    task["subword_model"] = task["datamodule"]["subword_model"] = gone
    fine_tuned = save_checkpoint_atomically(checkpoint, tmp_path / "run" / "checkpoints" / "step0000004.ckpt")
    cache = tmp_path / "cache"
    run_tool("src/evaluate.py", f"ckpt={fine_tuned}", "split=val", "decoding.beam_size=1", "wandb=disabled",
             f"out={tmp_path / 'eval'}", data_root=data_root, cache_dir=cache)
    (copy,) = (cache / "sentencepiece").glob("given-*.model")
    assert copy.read_bytes() == checkpoint["subwords"]
    assert (tmp_path / "eval" / "val.step4.beam1.alpha0.6.len+5.hyp.de").is_file()
