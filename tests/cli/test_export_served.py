"""What an export tells the people who serve it: the model card of an averaged checkpoint
(average.py's file) and of a CTranslate2 export, each as the folder it is in is used; a model
with separate embeddings exported and served as aiayn serves it. On the session's tiny trained
run; the tools run in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.digest import digest_path
from aiayn.checkpoints.io import read_checkpoint
from aiayn.checkpoints.trained import load_trained, module_arguments
from aiayn.data.corpus import TranslationCollator
from aiayn.training.module import TranslationModule
from tests.helpers.inprocess import run_tool, train
from tests.helpers.runs import TINY, TrainedRun

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'aiayn[serve]')")


def _tool(tiny_run: TrainedRun, data_root: Path, script: str, *arguments: str):
    return run_tool(script, *arguments, data_root=data_root, cache_dir=tiny_run.cache_dir)


def test_an_averaged_checkpoint_is_exported_as_the_average_with_no_score_of_its_newest_step(tiny_run, data_root,
                                                                                             tmp_path):
    """average.py's file, exported, is said to be the average of its steps, and the dev score the run
    measured for its newest step alone is not put on its card (before: "4 steps" and that score)."""
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for name in ("step0000003.ckpt", "step0000004.ckpt"):
        shutil.copy(tiny_run.checkpoints / name, checkpoints / name)
        shutil.copy(digest_path(tiny_run.checkpoints / name), digest_path(checkpoints / name))
    shutil.copy(tiny_run.run_dir / "summary.json", tmp_path / "run" / "summary.json")
    newest = _tool(tiny_run, data_root, "src/export.py", f"ckpt={checkpoints / 'step0000004.ckpt'}",
                   f"out={tmp_path / 'newest'}")
    assert "(step 4) as hf" in newest.stdout
    assert "dev set during training" in (tmp_path / "newest" / "README.md").read_text(encoding="utf-8")

    average = checkpoints / "average.ckpt"
    _tool(tiny_run, data_root, "src/average.py", f"ckpt={checkpoints / 'step0000004.ckpt'}", "average_last=2",
          f"out={average}")
    # evaluate.py keeps the average's report apart from step 4's (before: the same name, one overwrote the other)
    for ckpt in (checkpoints / "step0000004.ckpt", average):
        _tool(tiny_run, data_root, "src/evaluate.py", f"ckpt={ckpt}", "split=test_2017_mscoco",
              "decoding.max_len_offset=2", "wandb=disabled")
    reports = {path.name: json.loads(path.read_text()) for path in (tmp_path / "run" / "eval").glob("*.json")}
    assert sorted(reports) == ["test_2017_mscoco.step3-4.beam4.alpha0.6.len+2.avg2.json",
                               "test_2017_mscoco.step4.beam4.alpha0.6.len+2.json"]
    exported = _tool(tiny_run, data_root, "src/export.py", f"ckpt={average}", f"out={tmp_path / 'hf'}")
    assert "(step 4, averaged over steps 3, 4) as hf" in exported.stdout, exported.stdout
    card = (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    assert f"the average of 2 checkpoints at steps 3, 4 ({average})" in card
    assert "4 steps" not in card and "dev set during training" not in card
    ours = reports["test_2017_mscoco.step3-4.beam4.alpha0.6.len+2.avg2.json"]  # the average's score, and no other
    assert card.count("test_2017_mscoco (461 sentences") == 1
    assert f"chrF2 {ours['test_2017_mscoco/chrf']:.2f} (`{ours['chrf_signature']}`)" in card


def _python_block(card: str, holding: str) -> str:
    """The card's ```python block that holds ``holding``."""
    blocks = [block.split("```", 1)[0] for block in card.split("```python\n")[1:]]
    return next(block for block in blocks if holding in block)


@pytest.mark.slow
def test_each_cards_code_runs_on_its_own_folder_and_decodes_as_aiayn_serves_it(tiny_run, data_root, tmp_path):
    """The card of a CTranslate2 export says how to call CTranslate2 on that folder with the decoding
    settings of its aiayn.json, and that code writes what translate.py engine=ctranslate2 writes; an
    int8 export's card claims no exactness; the Hugging Face card's code cuts a line over the model's
    positions, as aiayn does (before: the CTranslate2 folder's card was the Hugging Face card, loading
    it with MarianMTModel, its CTranslate2 code decoding with CTranslate2's defaults, and the Hugging
    Face code ended in an IndexError on a long line)."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'aiayn[serve]')")
    ct2, int8, hf = tmp_path / "ct2", tmp_path / "int8", tmp_path / "hf"
    _tool(tiny_run, data_root, "src/export.py", f"ckpt={tiny_run.last}", "format=ctranslate2", f"out={ct2}")
    _tool(tiny_run, data_root, "src/export.py", f"ckpt={tiny_run.last}", "format=ctranslate2", "quantization=int8",
          f"out={int8}")
    _tool(tiny_run, data_root, "src/export.py", f"ckpt={tiny_run.last}", f"out={hf}")
    card = (ct2 / "README.md").read_text(encoding="utf-8")
    assert "exported as a CTranslate2 model" in card and "from_pretrained" not in card
    code = _python_block(card, "ctranslate2.Translator")
    lines = ["A man is riding a bike.", "Two dogs play in the snow.", "A woman sings on a stage."]
    source = tmp_path / "source.en"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    served = _tool(tiny_run, data_root, "src/translate.py", "engine=ctranslate2", f"model_dir={ct2}", f"input={source}")
    printed = []
    for line in lines:
        example = code.replace("<this folder>", str(ct2)).replace("A man is riding a bike.", line)
        exec(example, {"print": printed.append})  # noqa: S102  the card's code, as a user runs it
    assert printed == served.stdout.splitlines()

    quantized = (int8 / "README.md").read_text(encoding="utf-8")
    assert "stored as int8" in quantized and "The weights are\nexactly" not in quantized
    assert "Measured for the fp32 weights this int8 model was made from" in quantized

    long_line = " ".join(["A man is riding a bike."] * 200)  # over the model's positions
    printed = []
    exec(_python_block((hf / "README.md").read_text(encoding="utf-8"), "MarianMTModel").replace(  # noqa: S102
        "<this folder>", str(hf)).replace("A man is riding a bike.", long_line), {"print": printed.append})
    assert len(printed) == 1 and len(printed[0]) == 1


@pytest.mark.slow
def test_a_model_with_separate_embeddings_is_exported_with_its_function_and_served_as_aiayn_serves_it(
        tiny_run, data_root, tmp_path):
    """model.share_embeddings=false (separate source and target embeddings, the target's the output
    projection) is MarianMT's share_encoder_decoder_embeddings and tie_word_embeddings false: the export's logits are
    aiayn's, and its CTranslate2 conversion writes aiayn's greedy output (before: refused, saying
    "MarianMT ties one embedding to both stacks and the output")."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'aiayn[serve]')")
    checkpoint = read_checkpoint(tiny_run.last)
    hyper_parameters = dict(checkpoint["hyper_parameters"])
    hyper_parameters["model"] = {**hyper_parameters["model"], "share_embeddings": False}
    torch.manual_seed(0)  # its own weights: two embeddings, each different
    module = TranslationModule(**module_arguments(hyper_parameters))
    ckpt = tmp_path / "separate.ckpt"
    torch.save({**checkpoint, "hyper_parameters": hyper_parameters, "state_dict": module.state_dict()}, ckpt)
    hf, ct2 = tmp_path / "hf", tmp_path / "ct2"
    _tool(tiny_run, data_root, "src/export.py", f"ckpt={ckpt}", f"out={hf}")
    _tool(tiny_run, data_root, "src/export.py", f"ckpt={ckpt}", "format=ctranslate2", f"out={ct2}")

    trained = load_trained(ckpt)
    assert trained.model.src_embedding is not trained.model.tgt_embedding
    vocab, lines = trained.vocab, ["A man is riding a bike.", "Two dogs play in the snow."]
    batch = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)(
        list(zip(range(2), vocab.encode(lines), vocab.encode(["Ein Mann fährt Rad.", "Zwei Hunde spielen."]))))
    marian = transformers.MarianMTModel.from_pretrained(str(hf)).eval()
    assert not marian.config.tie_word_embeddings and not marian.config.share_encoder_decoder_embeddings
    with torch.no_grad():
        ours = trained.model(batch["src"], batch["tgt_in"])
        theirs = marian(input_ids=batch["src"], attention_mask=batch["src"] != vocab.pad_id,
                        decoder_input_ids=batch["tgt_in"]).logits
    real = batch["tgt_in"] != vocab.pad_id
    torch.testing.assert_close(theirs[real], ours[real], rtol=1e-5, atol=5e-5)

    source = tmp_path / "source.en"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    greedy = ["decoding.beam_size=1", "decoding.alpha=0.0", "decoding.max_len_offset=5", f"input={source}"]
    aiayn = _tool(tiny_run, data_root, "src/translate.py", f"ckpt={ckpt}", *greedy)
    served = _tool(tiny_run, data_root, "src/translate.py", "engine=ctranslate2", f"model_dir={ct2}", *greedy)
    assert served.stdout == aiayn.stdout and all(aiayn.stdout.splitlines())


def test_every_exported_file_is_readable_as_the_users_other_files(tiny_run, data_root, tmp_path):
    """Each file of an export has the mode the user's umask gives a new file, the weights too, so a
    server running as another user reads them (before: model.safetensors was 0600, as transformers
    writes it, beside 0644 files)."""
    umask = os.umask(0o022)
    try:
        _tool(tiny_run, data_root, "src/export.py", f"ckpt={tiny_run.last}", f"out={tmp_path / 'hf'}")
    finally:
        os.umask(umask)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "hf").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


@pytest.mark.slow
def test_a_fine_tuned_models_card_says_what_it_was_fine_tuned_from(tiny_run, data_root, tmp_path):
    """A checkpoint of a run started with init_from= is said to be fine-tuned from that model, its
    steps those of the fine-tuning (before: "4 steps", as if the model had been trained for 4 steps alone)."""
    run = tmp_path / "fine-tuned"
    train(run, *TINY, "model.n_layers=2", "logger=none", "trainer.limit_test_batches=1", f"init_from={tiny_run.last}",
          data_root=data_root, cache_dir=tiny_run.cache_dir)
    _tool(tiny_run, data_root, "src/export.py", f"ckpt={run / 'checkpoints' / 'last.ckpt'}", f"out={tmp_path / 'hf'}")
    card = (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    assert (f"- **Training**: 4 steps ({run / 'checkpoints' / 'last.ckpt'}); fine-tuned from the model of "
            f"`{tiny_run.last}` (train.py `init_from=`), whose own steps are not counted here\n") in card
