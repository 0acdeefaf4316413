"""The finished runs of the paper's tables: where each is, its config and what it measured.

A run belongs to a row through its resolved config (``experiment.table`` and ``experiment.row``),
unless it changed the row's network, recipe, task or scoring (``experiment=table3_A_h1 model=big``,
``decoding.beam_size=1``):
such a run is *modified* (:func:`aiayn.config.identity.row_changes`; W&B: the tag ``modified``),
and :func:`counted` leaves it out of the tables.
What it measured comes from its summary (:mod:`aiayn.reporting.summary`): ``summary.json`` in the
run directory, which every run writes (or the W&B run's summary, read from the W&B project).
Table 2's test BLEU comes from ``src/evaluate.py``'s report in ``<run dir>/eval/`` where there is
one of its task's test split (``split=test``, or the split by its name: ``split=newstest2014``: aiayn.tables.row_tests)
decoded as the run's config says, of its fp32 model alone, that averaged the recipe's checkpoints (§6.1), else from
train.py's own test, which scores that average where the recipe has one (its summary's ``test_averaged``):
:func:`row_test`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from aiayn.config.identity import MODIFIED, run_folder_changes
from aiayn.reporting.evaluations import read_reports
from aiayn.reporting.summary import continued_run, read_summary
from aiayn.tables.row_tests import as_test, decoded_otherwise, not_the_rows_model, task_name, test_split

log = logging.getLogger(__name__)

TABLES = ("table3", "table2", "table4")


@dataclass
class Run:
    """One finished run of a row: where it is, its config and what it measured."""

    source: str  # run directory or W&B run path
    config: dict[str, Any]
    summary: dict[str, Any]
    test: dict[str, Any] = field(default_factory=dict)  # Table 2: test BLEU, sacreBLEU, checkpoints averaged
    modified: list[str] = field(default_factory=list)  # what it changed from its row (row_changes); []: the row

    @property
    def table(self) -> str | None:
        return (self.config.get("experiment") or {}).get("table")

    @property
    def row(self) -> str | None:
        return (self.config.get("experiment") or {}).get("row")

    @property
    def scale(self) -> str:
        """The scale the run was trained at (``experiment.scale``; "paper" without one), and for a
        run changed from its row (counted by ``--include-modified``) what it changed, as
        ``multi30k, changed: width_divisor=2``: the tables compare a run only with runs of its
        scale changed alike (their base runs, their noise band), never a changed run with the row's own."""
        scale = (self.config.get("experiment") or {}).get("scale") or "paper"
        return f"{scale}, changed: {', '.join(map(_changed_to, self.modified))}" if self.modified else scale


def _changed_to(change: str) -> str:
    """``key=value``, what a change from the row (``model.d_model: 512 → 32``, as
    :func:`aiayn.config.identity.row_changes` words it) set; a change said otherwise as it is."""
    key, _, values = change.partition(": ")
    return f"{key}={values.rsplit(' → ', 1)[1].strip(chr(39))}" if " → " in values else change


def seed_order(run: Run) -> tuple:
    """The order of a row's runs: by seed (0 without one), then by where they are."""
    return run.config.get("seed", 0), run.source


def counted(runs: Iterable[Run], include_modified: bool = False) -> list[Run]:
    """The runs a table counts as its rows': each modified run is left out, with a warning naming
    what it changed (all of them with ``include_modified``); a Table 2 run without a test BLEU is
    counted, named in a warning (its line has no BLEU). Runs of one row, seed and scale in
    different places are all counted, named in one warning (:func:`warn_of_repeated_seeds`)."""
    kept = []
    for run in runs:
        if run.modified and not include_modified:
            log.warning("%s: left out, it is no longer row %s (%s); --include-modified counts it", run.source,
                        run.row, "; ".join(run.modified[:4]) + (" ..." if len(run.modified) > 4 else ""))
            continue
        if run.table == "table2" and not run.test:
            log.warning("%s: no test BLEU, its Table 2 line has none: its test after training did not run or did not "
                        "finish (the same command with resume=auto runs it), and no src/evaluate.py report of the "
                        "test split decoded as the run is in its eval/", run.source)
        kept.append(run)
    warn_of_repeated_seeds(kept)
    return kept


def warn_of_repeated_seeds(runs: Iterable[Run]) -> None:
    """One warning naming the runs that share their table, row, seed and scale (a run folder
    copied, a row trained again with its seed): each is a line of the table, but together they are
    one seed, not several, and base's noise band is meant to be the spread of seeds."""
    together: dict[tuple, list[Run]] = {}
    for run in runs:
        together.setdefault((run.table, run.row, run.config.get("seed"), run.scale), []).append(run)
    repeated = [(key, group) for key, group in together.items() if len(group) > 1]
    if repeated:
        log.warning("runs of the same row, seed and scale, each counted but not independent seeds (base's noise "
                    "band takes them as several): %s", "; ".join(
                        f"{table} {row} seed {seed} at scale {scale}: {', '.join(run.source for run in group)}"
                        for (table, row, seed, scale), group in repeated))


def local_runs(roots: Iterable[Path | str], conf_dir: Path | str | None = None) -> list[Run]:
    """Every finished run under ``roots`` (run directories or folders of them, e.g. a multirun
    date folder): a directory with ``.hydra/config.yaml`` and a summary, each once however many of
    ``roots`` hold it (``--runs X --runs X/<run>``: by its resolved path). An attempt that continued
    a run in another folder (``resume=auto``; :func:`aiayn.reporting.summary.continued_run`) stands
    for that run, wherever it is. Runs without a summary (still training, or stopped) are listed in
    the log and left out. With ``conf_dir`` each run's
    changes from its row are found (``Run.modified``), its row composed from there."""
    runs = []
    seen: set[Path] = set()
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"--runs {root}: no such directory")
        for config_file in sorted(root.glob("**/.hydra/config.yaml")):
            run_dir = config_file.parent.parent
            if (continued := continued_run(run_dir)) is not None:  # an attempt that trained in an earlier run's folder
                if not (continued / ".hydra" / "config.yaml").is_file():
                    log.warning("%s: an attempt that continued the run in %s, which is not there (moved apart from "
                                "it?); left out: give that run's folder to --runs", run_dir, continued)
                    continue
                run_dir, config_file = continued, continued / ".hydra" / "config.yaml"
            if run_dir.resolve() in seen:
                continue
            seen.add(run_dir.resolve())
            loaded = OmegaConf.load(config_file)
            config = OmegaConf.to_container(loaded, resolve=False)
            if "model" in loaded:  # its widths as trained (d_k and d_v: d_model / n_heads unless given)
                config["model"] = OmegaConf.to_container(loaded.model, resolve=True)
            if not (config.get("experiment") or {}).get("table"):
                continue  # not a table experiment
            summary = read_summary(run_dir)
            if summary is None:
                log.warning("%s: no summary (unfinished run?); left out", run_dir)
                continue
            try:
                modified = run_folder_changes(loaded, run_dir, conf_dir, summary.get("processes")) if conf_dir else []
            except MissingConfigException:  # its row's config is not in conf_dir: no row of the table here
                log.warning("%s: its row, %s of %s, has no config in %s (renamed, or made in another checkout); "
                            "left out: rebuild with the checkout that has it", run_dir, config["experiment"].get("row"),
                            config["experiment"]["table"], Path(conf_dir) / "experiment")
                continue
            decoding = OmegaConf.to_container(loaded.decoding, resolve=True) if "decoding" in loaded else {}
            test = row_test(_test_reports(run_dir, decoding, config), _tested_in_training(summary), config, str(run_dir))
            runs.append(Run(source=str(run_dir), config=config, summary=summary, test=test, modified=modified))
    return runs


def row_test(reports: list[tuple[int, Any, dict[str, Any]]], own: dict[str, Any], config: Mapping[str, Any],
             source: str) -> dict[str, Any]:
    """A Table 2 row's test: of §6.1's average, the recipe's ``checkpoint.average_last`` checkpoints
    (1 where it has none) — the newest evaluate.py report (``reports``: (checkpoints averaged, its
    time, figures)) that averaged that many, else train.py's own test (``own``). Where neither did,
    the one averaging most, named in a warning (before: the evaluate.py report averaging most,
    whatever train.py's own had, so ``evaluate.py ckpt=last.ckpt split=test`` put one checkpoint's
    BLEU in place of the row's 5-checkpoint average)."""
    window = (config.get("checkpoint") or {}).get("average_last")
    recipe = window if isinstance(window, int) and window > 0 else 1
    candidates = [(averaged, True, when, _test_figures(figures, averaged)) for averaged, when, figures in reports]
    if own:
        candidates.append((own["averaged"], False, 0, own))
    if not candidates:
        return {}
    exact = [found for found in candidates if found[0] == recipe]
    if exact:
        return max(exact, key=lambda found: found[1:3])[3]
    chosen = max(candidates, key=lambda found: found[:3])
    log.warning("%s: no test of §6.1's average of its recipe's %d checkpoints; its row shows the test of %d (evaluate "
                "it with average_last=%d for the row's)", source, recipe, chosen[0], recipe)
    return chosen[3]


def _test_reports(run_dir: Path, decoding: dict[str, Any], config: Mapping[str, Any]) -> list[tuple[int, float, dict]]:
    """The evaluate.py reports on the run's task's test split (``split=test``, or by its name:
    :func:`as_test`) decoded as the run's ``decoding`` says, of its fp32 model alone, each as
    (checkpoints averaged, its time, figures); a report decoded otherwise (``decoding.beam_size=1``),
    in bf16 or int8, or of an ensemble is left out, with a warning naming why."""
    reports, split, task = [], test_split(config), task_name(config)
    for path, report in read_reports(run_dir / "eval"):
        report = as_test(report, split, "tokenized_bleu", task)
        if report is None:  # an evaluation of another split, or another task's
            continue
        if decoded_otherwise(path, report.get("decoding"), decoding) or not_the_rows_model(
                path, report.get("speed_switches"), len(report.get("ensemble") or [])):
            continue
        # the steps averaged: an average.py file given alone averaged its own (before: counted as one)
        reports.append((len(report.get("averaged_steps") or report.get("averaged") or [None]), path.stat().st_mtime,
                        report))
    return reports


def _tested_in_training(summary: dict[str, Any]) -> dict[str, Any]:
    """train.py's own test, from its summary: of the §6.1 average where the recipe has one
    (``test_averaged`` checkpoints, aiayn.cli.weights_tested); {} for a run tested otherwise."""
    if "test/tokenized_bleu" not in summary:
        return {}
    return _test_figures(summary, int(summary.get("test_averaged") or 1))


def _test_figures(metrics: dict[str, Any], averaged: int) -> dict[str, Any]:
    # sacreBLEU is test/bleu (the scorer's headline, as val/bleu); reports before it was named so: test/sacrebleu.
    sacrebleu = metrics.get("test/bleu", metrics.get("test/sacrebleu"))
    # The sentences scored: train's test/sentences, evaluate's report's sentences; none in runs older than both.
    sentences = metrics.get("test/sentences", metrics.get("sentences"))
    return {"bleu": metrics["test/tokenized_bleu"], "sacrebleu": sacrebleu, "averaged": averaged,
            **({"sentences": int(sentences)} if sentences is not None else {})}


def _averaged(evaluate_run_config: dict[str, Any]) -> int:
    """How many checkpoints an evaluate.py W&B run averaged: the steps its config records
    (``averaged_steps``, an average.py file's too), else, in runs logged before, its evaluate.average_last."""
    if evaluate_run_config.get("averaged_steps"):
        return len(evaluate_run_config["averaged_steps"])
    return int((evaluate_run_config.get("evaluate") or {}).get("average_last") or 1)


def _members(evaluate_run_config: dict[str, Any]) -> int:
    """How many checkpoints an evaluate.py W&B run decoded together: its config's ``ensemble``, else,
    in runs logged before it was recorded, its evaluate.ckpt where a list (``ckpt=a.ckpt,b.ckpt``, one
    string, cannot be told there from one path holding a comma, as a sweep job's folder does)."""
    if evaluate_run_config.get("ensemble"):
        return len(evaluate_run_config["ensemble"])
    ckpt = (evaluate_run_config.get("evaluate") or {}).get("ckpt")
    return len(ckpt) if isinstance(ckpt, (list, tuple)) else 1


def wandb_runs(project: str, tables: Iterable[str] = TABLES) -> list[Run]:
    """The finished runs of ``project`` ("entity/project") tagged with the tables' names, online. A
    training run's tests are src/evaluate.py's W&B runs of it (:func:`_evaluations`: job type "eval",
    its W&B id as their ``trained_wandb_run``) of its test split (:func:`as_test`). For Table 2 the
    test BLEU is :func:`row_test`'s, of the recipe's average, as for a run folder's reports: an
    evaluation decoded otherwise than the run's config says, in bf16 or int8 or of an ensemble is no
    Table 2 test (left out, with a warning: :func:`decoded_otherwise`, :func:`not_the_rows_model`). Table 4 keeps
    every one with a test F1, oldest first, each with its decoding (``test["evaluations"]``)."""
    import wandb

    api = wandb.Api()
    trained = [(table, run) for table in tables
               for run in api.runs(project, filters={"tags": {"$in": [table]}, "state": "finished"})]
    names = Counter(run.config.get("run_name") for _, run in trained)
    runs = []
    for table, run in trained:
        config = dict(run.config)
        summary = {k: v for k, v in run.summary_metrics.items() if not k.startswith("_")}
        split, test = test_split(config), {}
        if table in ("table2", "table4"):
            figure = "tokenized_bleu" if table == "table2" else "f1"
            tested = [(e, figures) for e in _evaluations(api, project, run, names[config.get("run_name")] == 1)
                      if (figures := as_test(dict(e.summary_metrics), split, figure, task_name(config),
                                             (e.config.get("evaluate") or {}).get("task"))) is not None]
            if table == "table2":  # its row's test: decoded as the run says (Table 4 shows each decoding)
                tested = [(_averaged(e.config), e.created_at, figures) for e, figures in tested
                          if not decoded_otherwise("/".join(e.path), e.config.get("decoding"), config.get("decoding") or {})
                          and not not_the_rows_model("/".join(e.path), e.config.get("evaluate"), _members(e.config))]
                test = row_test(tested, _tested_in_training(summary), config, "/".join(run.path))
            else:  # each evaluate.py test, as a run folder's eval/ reports (aiayn.tables.table4)
                test = {"evaluations": [(e.name, figures, dict(e.config.get("decoding") or {}), _averaged(e.config))
                                        for e, figures in sorted(tested, key=lambda found: found[0].created_at)]}
        modified = ["tagged modified"] if MODIFIED in (run.tags or []) else []
        runs.append(Run(source="/".join(run.path), config=config, summary=summary, test=test, modified=modified))
    return runs


def _evaluations(api: Any, project: str, run: Any, alone: bool) -> list[Any]:
    """The evaluate.py W&B runs of the training run ``run``: those of job type "eval" in the group of
    its run name (where evaluate.py puts them) that hold its W&B id as their ``trained_wandb_run``,
    so that the seeds of one setting, which share their run name, each have their own. An evaluation
    logged before evaluate.py recorded that id is taken for the run only where the run is ``alone``
    under its run name; else it is left out, named in a warning."""
    group = run.config.get("run_name")
    found = api.runs(project, filters={"group": group, "jobType": "eval"})
    unnamed = [e for e in found if not e.config.get("trained_wandb_run")]
    if unnamed and not alone:
        log.warning("%s: the evaluate.py runs %s of run name %s do not say which of its training runs they scored "
                    "(logged before evaluations recorded trained_wandb_run), and several training runs have that name; "
                    "left out: evaluate the run's checkpoint again", "/".join(run.path),
                    ", ".join(e.name for e in unnamed), group)
    return [e for e in found if e.config.get("trained_wandb_run") == run.id or (alone and e in unnamed)]
