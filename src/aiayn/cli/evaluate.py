"""Evaluate a checkpoint the paper's way: `python src/evaluate.py ckpt=<file> [split=test]`.

Beam search with the task's decoding settings; writes the hypotheses beside the run; prints and
logs sacreBLEU (with its signature), the paper's tokenized BLEU, per-wordpiece perplexity and
the decoding speed. For a parsing task (its data module scores with EVALB's F1, §6.3) it
reports F1, precision, recall and exact match instead of BLEU, and writes the gold and test
trees in EVALB's format (one tree a line) beside the hypotheses.

``average_last=k`` averages the checkpoint given and the k - 1 before it by step (§6.1). The task's
files are read under ``data_root``, whatever its data module calls that folder. Every file is
named after the split, the step(s), the decoding settings and the averaging (:func:`report_name`),
so the evaluations of a sweep never overwrite one another.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from aiayn.checkpoints.averaging import average_checkpoints, last_checkpoints
from aiayn.checkpoints.io import checkpoints_dir, list_checkpoints
from aiayn.checkpoints.trained import load_trained
from aiayn.cli import CONFIG_DIR
from aiayn.cli.errors import reports_composition_errors, reports_errors
from aiayn.cli.renamed import accepts_old_names
from aiayn.config.schemas import decoding_settings
from aiayn.data.multi30k import SPLITS, Multi30kDataModule
from aiayn.data.parsing.datamodule import ParsingDataModule
from aiayn.data.parsing.treebank import parse_split
from aiayn.data.readers import read_lines, read_parallel
from aiayn.data.wmt.datamodule import WMTDataModule
from aiayn.data.wmt.preparation import TEST_SPLIT, VAL_SPLIT
from aiayn.decoding_speed import for_decoding, switches_of
from aiayn.errors import ConfigError
from aiayn.inference import perplexity, translate, tree_constraint
from aiayn.metrics.bleu import sacrebleu_score, tokenized_bleu
from aiayn.metrics.parseval import parseval
from aiayn.metrics.scorers import ParseF1
from aiayn.reporting.loggers import wandb_logger


@accepts_old_names("evaluate")  # out_dir= (before out=)
@reports_composition_errors  # an override Hydra cannot apply: one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return evaluate(cfg)


def evaluate(cfg: DictConfig) -> dict[str, float]:
    ckpt = Path(cfg.ckpt)
    k = _averaged_count(cfg.average_last)
    overrides = {key: value for key, value in cfg.decoding.items() if value is not None}
    decoding_settings(overrides)  # checked before anything is loaded
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size must be a whole number of at least 1, got {cfg.batch_size!r}")
    switches = switches_of(cfg)  # precision, int8 and compile
    _check_checkpoint_file(ckpt)
    averaged = last_checkpoints(ckpt.parent, k, ending_at=ckpt) if k > 1 else [ckpt]  # DataError: too few
    trained = load_trained(ckpt, cfg.device)
    device = str(next(trained.model.parameters()).device)
    task = _task(cfg, trained.config, ckpt)

    trained_task = trained.config.get("task", {}).get("datamodule", {})
    directions = [(t.get("src_lang"), t.get("tgt_lang")) for t in (trained_task, task["datamodule"])]
    if trained_task and directions[0] != directions[1]:
        raise ConfigError(f"{ckpt} translates {'→'.join(directions[0])} but task {task['name']} is "
                         f"{'→'.join(directions[1])}; pick a task of the same direction")
    datamodule = hydra.utils.instantiate(task["datamodule"])
    split = datamodule.splits.get(cfg.split, cfg.split)
    _check_split(datamodule, split, cfg.split, task["name"])
    steps = [trained.step]
    if k > 1:  # §6.1: the weights averaged over the k checkpoints ending at the one given
        average = average_checkpoints(averaged)
        trained.load_weights(average["state_dict"])
        steps = average["averaged_steps"]
    sources, references = read_parallel(*datamodule.split_files(split, datamodule.download))
    decoding = decoding_settings(trained.decoding, overrides)
    if decoding["constrained"]:
        tree_constraint(trained.vocab)  # a model without tree symbols is refused before any decoding

    ppl, n_tokens = perplexity(trained.model, trained.vocab, sources, references, cfg.max_tokens)
    model = for_decoding(trained.model, **switches)
    result = translate(model, trained.vocab, sources, decoding, batch_size=cfg.batch_size)

    out_dir = Path(cfg.out) if cfg.out else ckpt.resolve().parent.parent / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = report_name(split, steps, {**decoding, **switches})
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
        "checkpoint": str(ckpt), "averaged": [str(p) for p in averaged], "averaged_steps": steps,
        "step": trained.step, "task": task["name"], "split": split, "sentences": len(sources), "decoding": decoding,
        "speed_switches": switches, "device": device, "hypotheses": str(hypotheses_file), **extra,
        "ppl_tokens": n_tokens, **metrics,
    }
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")

    which = (f"steps {steps[0]}–{steps[-1]}, average of {len(averaged)} checkpoints "
             f"({', '.join(path.name for path in averaged)})" if len(averaged) > 1 else f"step {trained.step}")
    print(f"{split}: {len(sources)} sentences, {which}")
    for line in lines:
        print(f"  {line}")
    print(f"  perplexity      {ppl:6.2f}  per wordpiece, {n_tokens} tokens")
    print(f"  decoding        {result.sentences_per_second:6.1f} sentences/s, {result.tokens_per_second:.0f} tokens/s "
          f"(beam {decoding['beam_size']}, α {decoding['alpha']}, +{decoding['max_len_offset']}, "
          f"{'' if decoding.get('kv_cache', True) else 'no '}kv cache, "
          f"{'constrained to trees, ' if decoding.get('constrained') else ''}{device})")
    print(f"  hypotheses      {hypotheses_file}")
    _log_to_wandb(cfg, trained, out_dir, name, metrics,
                  {key: value for key, value in extra.items() if key == "sacrebleu_signature"})
    return metrics


def report_name(split: str, steps: list[int], decoding: dict) -> str:
    """The stem of an evaluation's files (hypotheses, JSON report, EVALB trees): the split, the
    step (the first and last step when averaged), the decoding settings and the number averaged,
    e.g. ``test_2016_flickr.step1500-2000.beam4.alpha0.6.len+50.avg2``; so evaluations of one
    checkpoint that differ in any of them (a sweep of α or beam size) never overwrite one another."""
    step = f"step{steps[0]}" if len(steps) == 1 else f"step{steps[0]}-{steps[-1]}"
    settings = f"beam{decoding['beam_size']}.alpha{float(decoding['alpha']):g}.len+{decoding['max_len_offset']}"
    if not decoding.get("kv_cache", True):
        settings += ".nokv"
    if decoding.get("constrained"):
        settings += ".constrained"
    if decoding.get("precision", "fp32") != "fp32":  # the outputs of other arithmetic keep apart
        settings += f".{decoding['precision']}"
    if decoding.get("int8"):
        settings += ".int8"
    averaged = f".avg{len(steps)}" if len(steps) > 1 else ""
    return f"{split.replace('/', '_')}.{step}.{settings}{averaged}"


def _averaged_count(average_last) -> int:
    """How many checkpoints to average: ``average_last``, or 1 (the checkpoint alone) for null."""
    if average_last is None:
        return 1
    if isinstance(average_last, bool) or not isinstance(average_last, int) or average_last < 1:
        raise ConfigError(f"average_last must be a whole number of checkpoints, 1 or more (null: the checkpoint "
                          f"alone), got {average_last!r}")
    return average_last


def _check_checkpoint_file(ckpt: Path) -> None:
    """``ckpt`` must be one checkpoint file; a folder is refused with a file in it to give instead."""
    if not ckpt.is_dir():
        return
    found = list_checkpoints(ckpt)
    last = checkpoints_dir(ckpt) / "last.ckpt"
    if last.is_file() or found:
        example = last if last.is_file() else found[-1][1]
        raise ConfigError(f"ckpt={ckpt} is a directory; give one checkpoint file, e.g. ckpt={example} "
                          "(average_last=<k> averages the k checkpoints ending at it)")
    raise ConfigError(f"ckpt={ckpt} is a directory and holds no checkpoint files; give one checkpoint file")


def _task(cfg: DictConfig, trained_config: dict, ckpt: Path) -> dict:
    """The task to evaluate on, resolved, its data read under ``cfg.data_root`` (when given).

    ``task=<name>`` is resolved against ``paths`` with ``paths.data_root`` set to ``data_root``;
    the checkpoint's own task (resolved when it was trained) has every path under the training
    run's data root moved under ``data_root``: whatever a data module calls its folder
    (``data_root``, WMT's ``raw_dir``), it follows, and a path given apart from the data root stays."""
    data_root = cfg.data_root
    if cfg.get("task"):
        if data_root:
            cfg.paths.data_root = data_root
        return OmegaConf.to_container(cfg.task, resolve=True)
    if "task" not in trained_config:
        raise ConfigError(f"{ckpt}: the checkpoint has no training config; name the data with task=<name>")
    task = trained_config["task"]
    if not data_root:
        return task
    trained_root = (trained_config.get("paths") or {}).get("data_root")
    if trained_root:
        return _moved(task, str(trained_root).rstrip("/") or "/", str(data_root).rstrip("/") or "/")
    if "data_root" in task["datamodule"]:  # a run config without paths: the data module's own setting
        return {**task, "datamodule": {**task["datamodule"], "data_root": str(data_root)}}
    return task


def _moved(value, old_root: str, new_root: str):
    """``value`` (a resolved config) with every path under ``old_root`` moved under ``new_root``."""
    if isinstance(value, dict):
        return {key: _moved(item, old_root, new_root) for key, item in value.items()}
    if isinstance(value, list):
        return [_moved(item, old_root, new_root) for item in value]
    if isinstance(value, str) and (value == old_root or value.startswith(old_root.rstrip("/") + "/")):
        return new_root + value[len(old_root):]
    return value


def _check_split(datamodule, split: str, asked: str, task_name: str) -> None:
    """A split the task's data cannot be scored on is a ConfigError naming the splits it has."""
    roles = [role if name == role else f"{role} ({name})" for role, name in datamodule.splits.items() if role != "train"]
    if isinstance(datamodule, ParsingDataModule):  # any sections or files of the treebank
        try:
            parse_split(split)
        except ValueError as error:
            raise ConfigError(f"split={asked}: {error}; task {task_name}'s splits are {', '.join(roles)}") from None
        return
    known = next((names for kind, names in ((Multi30kDataModule, SPLITS), (WMTDataModule, (VAL_SPLIT, TEST_SPLIT)))
                  if isinstance(datamodule, kind)), None)  # None: the data module's own files say
    if known is not None and split not in known:
        shown = [name for role, name in datamodule.splits.items() if role != "train"]
        names = [*roles, *(name for name in known if name not in shown)]
        raise ConfigError(f"split={asked}: task {task_name} has no such split; its splits are {', '.join(names)}")


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
        (f"exact match     {scores.exact_match:6.2f}  ({scores.error_sentences} error, "
         f"{scores.skipped_sentences} skipped sentences)"),
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
