"""Evaluate a checkpoint the paper's way: `python src/evaluate.py ckpt=<file> [split=test]`.

Beam search with the task's decoding settings; writes the hypotheses beside the run; prints and
logs sacreBLEU (with its signature), the paper's tokenized BLEU, per-wordpiece perplexity and
the decoding speed. For a parsing task (its data module scores with EVALB's F1, §6.3) it
reports F1, precision, recall and exact match instead of BLEU, and writes the gold and test
trees in EVALB's format (one tree a line) beside the hypotheses.

``average_last=k`` averages the checkpoint given and the k - 1 before it by step (§6.1);
``ckpt=a.ckpt,b.ckpt`` evaluates the ensemble of several (aiayn.model.Ensemble). With
``decoding.nbest=k`` each input's k hypotheses and their scores are also written, in the n-best
format (aiayn.decoding.translator.nbest_lines), as ``<name>.nbest.<lang>``; the best of each is scored. The task's
files are read under ``paths.data_root``, whatever its data module calls that folder. Every file is
named after the split, the step(s), the averaging and the decoding object's tag (every setting
that changes an output, the speed switches and an ensemble's members: :func:`file_stem`), so the
evaluations of a sweep never overwrite one another.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from aiayn.checkpoints.given import averaged_count, checkpoint_list
from aiayn.checkpoints.layout import run_dir_of
from aiayn.cli.command_line import read_by_hydra
from aiayn.cli.errors import reports_composition_errors, reports_errors
from aiayn.cli.evaluation_runs import given_trackers, log_to_mlflow, log_to_wandb, trackers
from aiayn.cli.naming import CONFIG_DIR
from aiayn.cli.outputs import output_folder
from aiayn.config.identity import override_key
from aiayn.data.task import task_module
from aiayn.decoding.settings import Decoding, asked
from aiayn.decoding.switches import check_device, switches_of
from aiayn.errors import ConfigError
from aiayn.files import atomic_write_text
from aiayn.reporting.evaluations import check_same_data, data_digest, write_report

log = logging.getLogger(__name__)


@read_by_hydra("evaluate")  # paths as one value, old names, Hydra's options anywhere (aiayn.cli.command_line)
@reports_composition_errors  # an override Hydra cannot apply: one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return evaluate(cfg)


def evaluate(cfg: DictConfig) -> dict[str, float]:
    ensemble = checkpoint_list(cfg.ckpt)  # one checkpoint, or several decoding together
    ckpt = Path(ensemble[0])
    k = averaged_count(cfg.average_last, len(ensemble))
    wanted = asked(cfg.decoding)  # checked before anything is loaded
    for setting in ("batch_size", "max_tokens"):
        if cfg[setting] is not None and cfg[setting] < 1:
            raise ConfigError(f"{setting} must be a whole number of at least 1, got {cfg[setting]!r}")
    given_trackers(cfg)  # W&B's refusal (no API key, say) came after the whole split was decoded
    switches = switches_of(cfg)  # precision, int8, compile, onednn and onnxruntime
    check_device(cfg.device)
    for path in ensemble:
        _check_checkpoint_file(Path(path))
    out_dir = Path(cfg.out) if cfg.out else default_out(ckpt)
    _check_out_dir(out_dir, "out" if cfg.out else "the default out")  # before any decoding
    # torch, Lightning (the task's data module) and W&B: imported once every setting is checked, so
    # that --help and a refusal take a second, not five
    from aiayn.checkpoints.averaging import average_into, window_ending_at
    from aiayn.checkpoints.trained import load_ensemble
    from aiayn.decoding.speed import for_decoding
    from aiayn.decoding.translator import Translator, nbest_lines, perplexity

    averaged = window_ending_at(ckpt, k)  # DataError: too few, before anything is loaded
    trained = load_ensemble(cfg.ckpt, cfg.device)
    device = str(next(trained.model.parameters()).device)
    task = _task(cfg, trained.config, ckpt)
    logged = trackers(cfg, trained.config, trained.logger_runs)  # where given, else where its training run logged
    if not cfg.get("task"):  # the checkpoint's own: its subword model is the one it holds, its cache this machine's
        given = HydraConfig.initialized() and any(  # (evaluate() called from Python: none given on a command line)
            override_key(str(o)) == "paths.cache_dir" for o in HydraConfig.get().overrides.task)
        task = _its_cache(task, cfg.paths.cache_dir, given)
        task = _its_subwords(task, trained.vocab.serialized(), cfg.paths.cache_dir)

    trained_task = trained.config.get("task", {})
    did, does = _does(trained_task), _does(task)  # each task's data module says what its models do
    if did and does and did != does:
        raise ConfigError(f"{ckpt} was trained on task {trained_task.get('name')}, which {did}, but task "
                          f"{task['name']} {does}; pick a task of the same kind and direction")
    if task_module(task) is None:  # a data module of one's own (docs/extending.md) whose module is not on the path here
        raise ConfigError(f"{ckpt}: task.datamodule._target_={task['datamodule'].get('_target_')} cannot be imported "
                          "here as a data module: put the folder of its module on PYTHONPATH")
    datamodule = hydra.utils.instantiate(task["datamodule"])
    datamodule.DATA_ROOT_SETTING = "paths.data_root"  # evaluate's, whatever the task calls its folder
    split = datamodule.check_split(cfg.split, task["name"])  # the task says which splits it can score
    needed = datamodule.preparation_needed() if trained_task.get("name", task["name"]) != task["name"] else None
    if needed is not None:  # a task the checkpoint was not trained on: its data is not prepared for it
        raise ConfigError(f"task={task['name']}: {ckpt} was trained on task {trained_task['name']}, and {needed}")
    steps = average_into(trained, averaged)  # §6.1: the weights averaged over the k checkpoints ending at ckpt
    sources, targets, references = datamodule.evaluation_data(split, trained.vocab)  # references: what its scorer compares with
    scorer = datamodule.scorer()  # the Scorer validation uses; one it cannot build is refused before decoding
    decoding = Decoding.of(trained.decoding, wanted, switches=switches, members=trained.members,
                           where="the checkpoint's decoding.")
    # The task hands over its output constraint; the search refuses constrained decoding without one.
    # A parser's outputs are written as its linearisation, read with the same constraint (one word a leaf).
    constraint = datamodule.output_constraint(trained.vocab)
    translator = Translator(for_decoding(trained.model, **decoding.switches), trained.vocab, decoding, constraint,
                            batch_size=cfg.batch_size, decoder=datamodule.raw_text(trained.vocab, constraint))
    name, data = file_stem(split, steps, decoding), data_digest(sources, references)
    # Another corpus's split of the same name (task.data_dir), or its files changed: refused before
    # decoding rather than its files replaced (before: overwritten unsaid).
    check_same_data(out_dir, name, data)

    # Each source cut to the model's positions is named once, by the translation below.
    batch = cfg.max_tokens or datamodule.eval_max_tokens  # null: the task's evaluation batch, as it validated
    ppl, n_tokens = perplexity(trained.model, trained.vocab, sources, targets, batch, name_cut_sources=False,
                               setting="max_tokens" if cfg.max_tokens else "task.datamodule.eval_max_tokens")
    result = translator.translations(sources)

    out_dir.mkdir(parents=True, exist_ok=True)
    hypotheses_file = out_dir / f"{name}.hyp.{datamodule.tgt_lang}"
    # Whole or not at all (a full disk, a kill): a later step or tool trusts what is there.
    atomic_write_text(hypotheses_file, "".join(text + "\n" for text in result.texts))
    files = {"hypotheses": str(hypotheses_file)}
    if decoding.nbest > 1:  # every hypothesis, with its index and scores
        files["nbest"] = str(out_dir / f"{name}.nbest.{datamodule.tgt_lang}")
        atomic_write_text(files["nbest"], "".join(line + "\n" for line in nbest_lines(result.nbest)))
    scored = scorer.report(result.texts, references, out_dir, name)
    metrics = {f"{cfg.split}/{key}": value for key, value in scored.figures.items()}
    metrics.update({
        f"{cfg.split}/ppl": ppl,
        f"{cfg.split}/sentences_per_sec": result.sentences_per_second,
        f"{cfg.split}/tokens_per_sec": result.tokens_per_second,
    })
    report = {
        "checkpoint": str(ckpt), "ensemble": ensemble, "averaged": [str(p) for p in averaged], "averaged_steps": steps,
        "step": trained.step, "task": task["name"], "split": split, "data": data, "sentences": len(sources),
        "decoding": decoding.settings(), "speed_switches": dict(decoding.switches), "device": device, **files, **scored.details,
        "ppl_tokens": n_tokens, **metrics,
    }
    write_report(out_dir, name, report)

    if len(ensemble) > 1:
        which = f"ensemble of {len(ensemble)} checkpoints ({', '.join(ensemble)})"
    elif len(steps) > 1:  # averaged here, or by average.py into the one file given
        files = ", ".join(path.name for path in averaged) if len(averaged) > 1 else f"{ckpt.name}, average.py's"
        which = f"steps {steps[0]}–{steps[-1]}, average of {len(steps)} checkpoints ({files})"
    else:
        which = f"step {trained.step}"
    print(f"{split}: {len(sources)} sentences, {which}")
    for line in scored.lines:
        print(f"  {line}")
    print(f"  perplexity      {ppl:6.2f}  per wordpiece, {n_tokens} tokens")
    print(f"  decoding        {result.sentences_per_second:6.1f} sentences/s, {result.tokens_per_second:.0f} tokens/s "
          f"({decoding.describe()}, {device})")
    print(f"  hypotheses      {hypotheses_file}")
    if "nbest" in files:
        print(f"  n-best          {files['nbest']}  ({decoding.nbest} an input: index, score, log-prob, text)")
    if logged.wandb != "disabled":
        log_to_wandb(logged.wandb, cfg, trained, ckpt, out_dir, name, metrics, decoding.settings(),
                     {"data": data, **{key: value for key, value in scored.details.items()
                                       if key == "sacrebleu_signature"}},  # data: two corpora's splits told apart
                     {"ensemble": ensemble, "averaged_steps": steps})
    if logged.mlflow:
        log_to_mlflow(logged.mlflow, cfg, trained, name, metrics, decoding.settings(), out_dir / f"{name}.json")
    return metrics


def file_stem(split: str, steps: list[int], decoding: Decoding) -> str:
    """The stem of an evaluation's files (hypotheses, JSON report, EVALB trees): the split, the
    step (the first and last when averaged), the decoding's tag and the number averaged, e.g.
    ``test_2016_flickr.step1500-2000.beam4.alpha0.6.len+50.avg2``: evaluations that differ in any
    of them never overwrite one another."""
    step = f"step{steps[0]}" if len(steps) == 1 else f"step{steps[0]}-{steps[-1]}"
    averaged = f".avg{len(steps)}" if len(steps) > 1 else ""
    return f"{split.replace('/', '_')}.{step}.{decoding.tag()}{averaged}"


def default_out(ckpt: Path) -> Path:
    """Where an evaluation's files go without ``out=``: ``<run>/eval`` for a checkpoint of a run
    (``<run>/checkpoints/<file>``, a link followed to its file), else ``eval/`` beside the file (never
    the folder above a checkpoint kept elsewhere: ``/eval`` for ``/tmp/model.ckpt``)."""
    return run_dir_of(ckpt.resolve()) / "eval"


def _check_checkpoint_file(ckpt: Path) -> None:
    """``ckpt`` must be one checkpoint file; a folder is refused with a file in it to give instead."""
    if ckpt.is_dir():
        from aiayn.checkpoints.io import folder_given

        raise ConfigError(f"ckpt={folder_given(ckpt, ' (average_last=<k> averages the k checkpoints ending at it)')}")


def _does(task: dict) -> str | None:
    """What a model of ``task`` does, as its data module says (None: no data module of ours)."""
    kind = task_module(task)
    return kind.does(task["datamodule"]) if kind is not None else None


def _task(cfg: DictConfig, trained_config: dict, ckpt: Path) -> dict:
    """The task to evaluate on, resolved, its data read under ``paths.data_root``.

    ``task=<name>`` is resolved against ``paths``, its data root the one given or else the
    checkpoint's run's; the checkpoint's own task (resolved when it was trained) has every path
    under the training run's data root moved under ``paths.data_root`` when one is given: whatever a
    data module calls its folder (``data_root``, WMT's ``raw_dir``), it follows, and a path given
    apart from the data root stays."""
    data_root = cfg.paths.data_root
    trained_root = (trained_config.get("paths") or {}).get("data_root")
    if cfg.get("task"):
        if not data_root and not trained_root:
            raise ConfigError(f"task={cfg.task.name}: say where its data is with paths.data_root=<folder> (or "
                              "AIAYN_DATA_ROOT); the checkpoint names no data root of its run")
        with open_dict(cfg):  # ${seed}: the order of training batches, the checkpoint's run's (evaluation reads none)
            cfg.paths.data_root = data_root or trained_root
            cfg.seed = trained_config.get("seed", 0)
        return OmegaConf.to_container(cfg.task, resolve=True)
    if "task" not in trained_config:
        raise ConfigError(f"{ckpt}: the checkpoint has no training config; name the data with task=<name>")
    task = trained_config["task"]
    if not data_root:
        return task
    if trained_root:
        return _moved(task, str(trained_root).rstrip("/") or "/", str(data_root).rstrip("/") or "/")
    if "data_root" in task["datamodule"]:  # a run config without paths: the data module's own setting
        return {**task, "datamodule": {**task["datamodule"], "data_root": str(data_root)}}
    return task


def _its_cache(task: dict, cache_dir: str, given: bool) -> dict:
    """The checkpoint's ``task`` with its data module's cache (a path of the machine it trained on)
    this machine's ``paths.cache_dir`` where that one is ``given`` on the command line, or where the
    trained one is no folder here (trained on another machine, or the cache cleaned); kept where it
    is there, so that a run trained under another ``AIAYN_CACHE_DIR`` reads what it prepared."""
    trained = task["datamodule"].get("cache_dir")
    if trained is None or trained == cache_dir or (Path(trained).is_dir() and not given):
        return task
    return {**task, "datamodule": {**task["datamodule"], "cache_dir": cache_dir}}


def _its_subwords(task: dict, subwords: bytes, cache_dir: str) -> dict:
    """The checkpoint's ``task`` with its ``task.subword_model`` (a run started from a trained model,
    or given one) no longer there — the cache it was copied into cleaned, the run evaluated on
    another machine — named again as a copy of the one the checkpoint holds (before: refused,
    ``task.subword_model=…: no such file; …, or null to learn one``, which learns another)."""
    named = task["datamodule"].get("subword_model")
    if named is None or Path(named).is_file():
        return task
    from aiayn.checkpoints.init_from import subword_copy

    copy = str(subword_copy(subwords, cache_dir))
    return {**task, "subword_model": copy, "datamodule": {**task["datamodule"], "subword_model": copy}}


def _moved(value, old_root: str, new_root: str):
    """``value`` (a resolved config) with every path under ``old_root`` moved under ``new_root``."""
    if isinstance(value, dict):
        return {key: _moved(item, old_root, new_root) for key, item in value.items()}
    if isinstance(value, list):
        return [_moved(item, old_root, new_root) for item in value]
    if isinstance(value, str) and (value == old_root or value.startswith(old_root.rstrip("/") + "/")):
        return new_root + value[len(old_root):]
    return value


def _check_out_dir(out_dir: Path, what: str) -> None:
    """ConfigError unless ``out_dir`` is a folder, or one that can be made, that can be written in
    (aiayn.cli.outputs)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{what}={out_dir} is a file; give a folder to write the hypotheses and report into")
    output_folder(out_dir, what, fix="give out=<a folder you can write in>")


if __name__ == "__main__":
    main()
