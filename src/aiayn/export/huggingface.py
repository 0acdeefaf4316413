"""Write a trained model as a Hugging Face MarianMT folder: ``config.json``, ``generation_config.json``
and the weights (:mod:`aiayn.export.marian`), the tokenizer's files (:mod:`aiayn.export.tokenizer`)
and the model card (:mod:`aiayn.export.card`). ``MarianMTModel.from_pretrained``,
``MarianTokenizer.from_pretrained`` load it as it is (and, with transformers 4, ``pipeline("translation")``).

The folder is written beside its destination and renamed into place (:mod:`aiayn.export.folder`), so
an export that stops midway leaves no half-written folder, and exporting again replaces an earlier
export (and nothing else).
"""

from __future__ import annotations

from pathlib import Path

from aiayn.checkpoints.trained import TrainedModel
from aiayn.data.task import task_module
from aiayn.decoding.declarations import HF, arguments
from aiayn.decoding.settings import Decoding
from aiayn.export.card import CardFacts, measured_scores, model_card
from aiayn.export.folder import replacing_folder
from aiayn.export.marian import model_sizes, to_marian
from aiayn.export.tokenizer import save_tokenizer


def card_facts(trained: TrainedModel, ckpt: Path, steps: list[int], decoding: Decoding | None = None) -> CardFacts:
    """What the model card says, from the checkpoint's own config, the decoding settings the export
    serves with (None: the checkpoint's own, as the Hugging Face export serves them) and the run's
    reports."""
    decoding = decoding or Decoding.of(trained.decoding, engine="hf export", where="the checkpoint's decoding.")
    task = trained.config.get("task") or {}
    datamodule = dict(task.get("datamodule") or {})
    data = {key: datamodule[key] for key in ("_target_", "src_lang", "tgt_lang", "vocab_size", "max_tokens",
                                             "test_split") if key in datamodule}
    if data.get("max_tokens") == "auto":  # the batch the plan settled on
        data["max_tokens"] = (trained.config.get("plan") or {}).get("tokens_per_batch", "auto")
    network = dict(trained.config.get("model") or {})
    network["vocab_size"] = trained.vocab.vocab_size
    kind = task_module(task)
    name = str(ckpt) if len(steps) == 1 or trained.averaged_steps else f"averaged, newest {ckpt}"
    return CardFacts(name=name, task=str(task.get("name", "translation")), src_lang=datamodule.get("src_lang"),
                     tgt_lang=datamodule.get("tgt_lang"), steps=steps, model=network,
                     decoding=decoding.settings(), data=data,
                     scores=measured_scores(ckpt, steps, datamodule.get("train_split", "train")),
                     parses=kind is not None and kind.OUTPUT_CONSTRAINT is not None,
                     init_from=trained.config.get("init_from") or None)  # the task says: its outputs are trees


def save_huggingface(trained: TrainedModel, out: Path, facts: CardFacts, where: str,
                     generation: dict | None = None) -> None:
    """Write the MarianMT folder of ``trained`` into ``out`` (an empty or new folder), ``generate``'s
    settings from ``generation`` (aiayn.decoding.declarations' arguments of the HF column)."""
    model, vocab = trained.model, trained.vocab
    marian = to_marian(model.cpu(), bos_id=vocab.bos_id, eos_id=vocab.eos_id,
                       dropout=float(model.embedding_dropout.p), where=where)
    config = marian.generation_config
    config.decoder_start_token_id, config.bos_token_id = vocab.bos_id, vocab.bos_id
    config.eos_token_id, config.pad_token_id, config.forced_eos_token_id = vocab.eos_id, vocab.pad_id, None
    for key, value in (generation or {}).items():  # the length penalty |Y|^α there: see the model card
        setattr(config, key, value)
    config.max_length = model_sizes(model)["max_positions"]
    marian.save_pretrained(str(out))
    save_tokenizer(vocab, out, src_lang=facts.src_lang, tgt_lang=facts.tgt_lang,
                   max_positions=model_sizes(model)["max_positions"])
    (out / "README.md").write_text(model_card(facts), encoding="utf-8")


def export_huggingface(trained: TrainedModel, out: Path, *, ckpt: Path, steps: list[int],
                       decoding: Decoding | None = None) -> Path:
    """Export ``trained`` (its weights as they are: averaged already, if asked) into ``out``, to
    decode with ``decoding`` (made for the ``hf export`` engine; None: the checkpoint's own
    settings, as the export serves them)."""
    decoding = decoding or Decoding.of(trained.decoding, engine="hf export", where="the checkpoint's decoding.")
    with replacing_folder(out, "hf") as scratch:
        save_huggingface(trained, scratch, card_facts(trained, ckpt, steps, decoding), str(ckpt),
                         arguments(HF, decoding))
    return out
