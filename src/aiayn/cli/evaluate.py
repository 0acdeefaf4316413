"""Evaluate a checkpoint the paper's way: `python src/evaluate.py ckpt=<file> [split=test]`.

Beam search with the task's decoding settings; writes the hypotheses beside the run; prints and
logs sacreBLEU (with its signature), the paper's tokenized BLEU, per-wordpiece perplexity and
the decoding speed. For a parsing task (its data module scores with EVALB's F1, §6.3) it
reports F1, precision, recall and exact match instead of BLEU, and writes the gold and test
trees in EVALB's format (one tree a line) beside the hypotheses.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from aiayn.checkpoints.averaging import average_checkpoints, last_checkpoints
from aiayn.checkpoints.trained import load_trained
from aiayn.cli import CONFIG_DIR
from aiayn.cli.errors import check_decoding, reports_errors
from aiayn.data.readers import read_lines, read_parallel
from aiayn.errors import ConfigError
from aiayn.inference import perplexity, translate
from aiayn.metrics.bleu import sacrebleu_score, tokenized_bleu
from aiayn.metrics.parseval import parseval
from aiayn.metrics.scorers import ParseF1
from aiayn.reporting.loggers import wandb_logger


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return evaluate(cfg)


def evaluate(cfg: DictConfig) -> dict[str, float]:
    ckpt = Path(cfg.ckpt)
    if cfg.average_last is not None and (not isinstance(cfg.average_last, int) or isinstance(cfg.average_last, bool)
                                         or cfg.average_last < 0):
        raise ConfigError(f"average_last must be a number of checkpoints (null: the one given), not {cfg.average_last!r}")
    check_decoding({**cfg.decoding, "batch_size": cfg.batch_size})
    state_dict, averaged = None, [ckpt]
    if cfg.average_last:
        averaged = last_checkpoints(ckpt.parent, cfg.average_last)
        state_dict = average_checkpoints(averaged)["state_dict"]
    trained = load_trained(ckpt, cfg.device, state_dict=state_dict)
    device = str(next(trained.model.parameters()).device)
    if cfg.get("task"):
        task = OmegaConf.to_container(cfg.task, resolve=True)
    elif "task" in trained.config:
        task = trained.config["task"]
    else:
        raise ConfigError(f"{ckpt}: the checkpoint has no training config; name the data with task=<name>")

    trained_task = trained.config.get("task", {}).get("datamodule", {})
    directions = [(t.get("src_lang"), t.get("tgt_lang")) for t in (trained_task, task["datamodule"])]
    if trained_task and directions[0] != directions[1]:
        raise ConfigError(f"{ckpt} translates {'→'.join(directions[0])} but task {task['name']} is "
                         f"{'→'.join(directions[1])}; pick a task of the same direction")
    overrides = {"data_root": cfg.data_root} if cfg.data_root else {}
    datamodule = hydra.utils.instantiate(task["datamodule"], **overrides)
    split = datamodule.splits.get(cfg.split, cfg.split)
    sources, references = read_parallel(*datamodule.split_files(split, datamodule.download))
    decoding = {**(task["decoding"] if cfg.get("task") else trained.decoding),
                **{k: v for k, v in cfg.decoding.items() if v is not None}}

    ppl, n_tokens = perplexity(trained.model, trained.vocab, sources, references, cfg.max_tokens)
    result = translate(trained.model, trained.vocab, sources, batch_size=cfg.batch_size, **decoding)

    out_dir = Path(cfg.out_dir) if cfg.out_dir else ckpt.resolve().parent.parent / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{split}.step{trained.step}" + (f".avg{len(averaged)}" if cfg.average_last else "")
    hypotheses_file = out_dir / f"{name}.hyp.{datamodule.tgt_lang}"
    hypotheses_file.write_text("".join(text + "\n" for text in result.texts), encoding="utf-8")
    scorer = datamodule.scorer()
    if isinstance(scorer, ParseF1):
        scores, extra, lines = _score_parsing(datamodule, scorer, split, result.texts, out_dir, name)
    else:
        scores, extra, lines = _score_translation(result.texts, references, datamodule.tgt_lang)
    metrics = {f"{cfg.split}/{key}": value for key, value in scores.items()}
    metrics.update({
        f"{cfg.split}/ppl": ppl,
        f"{cfg.split}/sentences_per_sec": result.sentences_per_second,
        f"{cfg.split}/tokens_per_sec": result.tokens_per_second,
    })
    report = {
        "checkpoint": str(ckpt), "averaged": [str(p) for p in averaged], "step": trained.step, "split": split,
        "sentences": len(sources), "decoding": decoding, "device": device, "hypotheses": str(hypotheses_file),
        **extra, "ppl_tokens": n_tokens, **metrics,
    }
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")

    print(f"{split}: {len(sources)} sentences, step {trained.step}"
          + (f", average of {len(averaged)} checkpoints" if cfg.average_last else ""))
    for line in lines:
        print(f"  {line}")
    print(f"  perplexity      {ppl:6.2f}  per wordpiece, {n_tokens} tokens")
    print(f"  decoding        {result.sentences_per_second:6.1f} sentences/s, {result.tokens_per_second:.0f} tokens/s "
          f"(beam {decoding['beam_size']}, α {decoding['alpha']}, +{decoding['max_len_offset']}, "
          f"{'' if decoding.get('kv_cache', True) else 'no '}kv cache, {device})")
    print(f"  hypotheses      {hypotheses_file}")
    _log_to_wandb(cfg, trained, out_dir, name, metrics,
                  {k: v for k, v in extra.items() if k == "sacrebleu_signature"})
    return metrics


def _score_translation(hypotheses: list[str], references: list[str], tgt_lang: str):
    """sacreBLEU of the detokenized output and the paper's tokenized BLEU (§6.1)."""
    detok = sacrebleu_score(hypotheses, references)
    tok = tokenized_bleu(hypotheses, references, tgt_lang)
    extra = {"sacrebleu_signature": detok.signature, "sacrebleu": detok.details, "tokenized_bleu": tok.details}
    lines = [f"sacreBLEU       {detok.score:6.2f}  ({detok.signature})",
             f"tokenized BLEU  {tok.score:6.2f}  (Moses tokenization + compound splitting, as the paper)"]
    return {"sacrebleu": detok.score, "tokenized_bleu": tok.score}, extra, lines


def _score_parsing(datamodule, scorer: ParseF1, split: str, outputs: list[str], out_dir: Path, name: str):
    """F1, precision, recall and exact match (EVALB, COLLINS.prm) of the outputs read back as
    trees; the gold and test trees are written in EVALB's format beside the hypotheses."""
    gold = read_lines(datamodule.gold_file(split))
    test = scorer.trees(gold, outputs)
    gold_file, test_file = out_dir / f"{name}.gold", out_dir / f"{name}.test"
    gold_file.write_text("".join(line + "\n" for line in gold), encoding="utf-8")
    test_file.write_text("".join(line + "\n" for line in test), encoding="utf-8")
    scores = parseval(gold, test)
    extra = {"evalb_gold": str(gold_file), "evalb_test": str(test_file), "parseval": scores.as_dict()}
    lines = [
        f"F1              {scores.f1:6.2f}  (EVALB, COLLINS.prm: labelled brackets, no root, no punctuation)",
        f"precision       {scores.precision:6.2f}  {scores.matched_brackets} of {scores.test_brackets} brackets",
        f"recall          {scores.recall:6.2f}  {scores.matched_brackets} of {scores.gold_brackets} brackets",
        f"exact match     {scores.exact_match:6.2f}  ({scores.error_sentences} error, "
        f"{scores.skipped_sentences} skipped sentences)",
        f"EVALB files     {gold_file} {test_file}",
    ]
    values = {"f1": scores.f1, "precision": scores.precision, "recall": scores.recall, "exact_match": scores.exact_match}
    return values, extra, lines


def _log_to_wandb(cfg, trained, out_dir, name, metrics, summary) -> None:
    if cfg.wandb == "disabled":
        return
    logger = wandb_logger(project="aiayn", save_dir=str(out_dir), mode=cfg.wandb, name=f"eval-{name}",
                          job_type="eval", group=trained.config.get("run_name"))
    logger.log_hyperparams({"evaluate": OmegaConf.to_container(cfg, resolve=True), "train": trained.config})
    logger.log_metrics(metrics, step=trained.step)
    logger.experiment.summary.update({**metrics, **summary})
    logger.experiment.finish()


if __name__ == "__main__":
    main()
