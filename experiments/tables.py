"""The paper's Tables 2, 3 and 4 from finished runs, and Table 3's parameter counts without training.

    python experiments/tables.py rebuild --runs multirun/<date> [--runs ...] [--out experiments/results/<name>]
    python experiments/tables.py rebuild --wandb <entity>/<project>
    python experiments/tables.py report --table table3 --entity <entity> [--project aiayn] [--runs <folder>]
    python experiments/tables.py params --vocab 37000 [--json]
    python experiments/tables.py sweep 'experiment=glob(table3_*)' +scale=multi30k   # dry run of a multirun, jobs checked
    python experiments/tables.py run --root multirun/table3_cpu [--part K/M] [--parallel P] [--dry-run] \
        'experiment=glob(table3_*)' +scale=multi30k_cpu

``rebuild`` finds every finished run of a table experiment (conf/experiment/table2_*, table3_*,
table4_*) under the --runs folders (each run folder once) or in a W&B project, writes
<out>/table2.*, table3.*, table4_runs.* ({md,csv,png}) of the tables it found runs of (--tables: those named, runs or not),
each row beside the paper's figures, and logs the tables to W&B as wandb.Table (offline without an
API key; --no-wandb to skip). A run whose network, recipe, task
or scoring was changed from its row's (W&B tag ``modified``) is left out, named in a warning, unless
--include-modified. See experiments/README.md.

``report`` builds and saves a W&B Report of one table's runs (aiayn.tables.report) and
prints its URL; it needs W&B online (an API key): offline it says so in one line, exit status 2.

``run`` trains a sweep's jobs, each in its fixed directory <root>/<name> (named by the overrides
that differ between jobs), skipping those with summary.json and resuming those started before
(resume=auto): run the same command again to go on after a stop. --part K/M takes every M-th job
from the K-th; --parallel P runs P jobs at a time, each on its own share of the CPUs. Each job's
output goes to <root>/<name>.log. Exit 0 when all its jobs finished, 1 if any failed, 130 on
interrupt. The logic is aiayn.tables.runner.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from aiayn.cli.arguments import OneLineParser
from aiayn.reporting.wandb_mode import wandb_mode
from aiayn.tables import runner
from aiayn.tables.output import file_stem, log_to_wandb, write_table
from aiayn.tables.report import REPORTED_TABLES, build_report, table_markdown
from aiayn.tables.rows import format_parameter_report, parameter_report, table_rows
from aiayn.tables.runs import TABLES, counted, local_runs, wandb_runs

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rebuild = commands.add_parser("rebuild", help="rebuild the tables from finished runs")
    rebuild.add_argument("--runs", action="append", type=Path, default=[],
                         help="a run directory or a folder of them (e.g. multirun/<date>); repeatable")
    rebuild.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs from this W&B project (online)")
    rebuild.add_argument("--out", type=Path, default=REPO / "experiments" / "results",
                         help="where table{2,3}.{md,csv,png} and table4_runs.{md,csv,png} go (default: experiments/results)")
    rebuild.add_argument("--tables", nargs="+", choices=TABLES,
                         help="the tables to write, with the paper's figures alone where no run of one is found "
                              "(default: each table of which runs are found; the others' files are left as they are)")
    rebuild.add_argument("--no-wandb", action="store_true", help="do not log the tables to W&B")
    rebuild.add_argument("--include-modified", action="store_true",
                         help="count the runs whose network, recipe, task or scoring was changed from their row's (W&B tag "
                              "`modified`) as that row; by default they are left out, each named in a warning")
    report = commands.add_parser("report", help="a W&B Report of a table's runs: the paper's table beside "
                                                "ours, curves, bars, settings (needs W&B online)")
    report.add_argument("--table", choices=REPORTED_TABLES, required=True)
    report.add_argument("--entity", required=True, help="the W&B entity (user or team) of the project")
    report.add_argument("--project", default="aiayn", help="the W&B project of the runs (default: aiayn)")
    report.add_argument("--runs", action="append", type=Path, default=[],
                        help="rebuild the table block from these run folders (default: the project's runs)")
    report.add_argument("--title", help="the report's title")
    report.add_argument("--include-modified", action="store_true",
                        help="count the runs changed from their row's (W&B tag `modified`), in the table block and "
                             "the training runs' panels; by default they are left out of both")
    params = commands.add_parser("params", help="Table 3's parameter counts for a vocabulary size, no training")
    params.add_argument("--vocab", type=int, default=37000, help="shared vocabulary size (the paper's EN-DE: 37000)")
    params.add_argument("--json", action="store_true", help="JSON instead of plain text")
    sweep = commands.add_parser("sweep", help="list the jobs of `python src/train.py --multirun <overrides>`, "
                                              "each config checked as that sweep checks it, without running them")
    sweep.add_argument("overrides", nargs="+", help="the multirun's overrides, e.g. 'experiment=glob(table3_*)'")
    run = commands.add_parser("run", help="train a sweep's jobs in fixed, resumable directories, several at once")
    run.add_argument("--root", type=Path, required=True, help="the folder of the jobs' directories and logs")
    run.add_argument("--part", metavar="K/M", help="only the jobs i (in sweep order) with i %% M == K-1")
    run.add_argument("--parallel", type=int, default=1, metavar="P", help="jobs at a time (default 1)")
    run.add_argument("--dry-run", action="store_true", help="list the jobs, their states and commands; run nothing")
    run.add_argument("overrides", nargs="+", help="the multirun's overrides, e.g. 'experiment=glob(table3_*)'")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    if args.command == "params":
        if args.vocab < 8:
            parser.error(f"--vocab must be at least 8, got {args.vocab}")
        report = parameter_report(CONF, args.vocab)
        print(json.dumps({"vocab_size": args.vocab, "rows": report}, indent=2) if args.json
              else format_parameter_report(report, args.vocab))
        return 0

    if args.command == "sweep":
        return dry_run(args.overrides)

    if args.command == "run":
        return run_sweep(parser, args)

    if args.command == "report":
        return save_report(args)

    if not args.runs and not args.wandb:
        parser.error("name the runs: --runs <folder> (repeatable) and/or --wandb <entity>/<project>")
    if args.wandb and wandb_mode() != "online":
        return _offline(f"--wandb {args.wandb} reads the runs from W&B", "or rebuild from the run folders with "
                        "--runs <folder>")
    if (problem := _not_a_folder(args.out)) is not None:
        print(f"tables.py: --out {args.out}: {problem}; give --out a folder (new or existing)", file=sys.stderr)
        return 2
    try:
        found = local_runs(args.runs, CONF) + (wandb_runs(args.wandb, args.tables or TABLES) if args.wandb else [])
    except FileNotFoundError as error:
        print(f"tables.py: {error}", file=sys.stderr)
        return 2
    found = [run for run in found if run.table in TABLES]
    runs = counted(found, args.include_modified)
    sources = ", ".join([*map(str, args.runs), *([args.wandb] if args.wandb else [])])
    if not runs and not args.tables:  # nothing to write: the folders given are likely not those of the runs
        left_out = f", only {len(found)} changed from their rows (--include-modified counts them)" if found else ""
        print(f"tables.py: no finished table runs in {sources}{left_out}; give the folders of the runs, or name the "
              f"tables to write with the paper's figures alone (--tables {' '.join(TABLES)})", file=sys.stderr)
        return 2
    written = []
    for table in args.tables or TABLES:
        if not args.tables and not any(run.table == table for run in runs):
            print(f"{table}: no runs found, {args.out / (file_stem(table) + '.md')} and its .csv, .png left as they are "
                  f"(--tables {table} writes it with the paper's figures alone)")
            continue
        header = (f"<!-- rebuilt by experiments/tables.py from {sources} on "
                  f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC -->\n")
        result = write_table(table, table_rows(CONF, table), runs, args.out, header)
        measured = len({line["run"] for line in result.lines if line["run"] is not None})  # Table 4: a line a test
        changed = sum(bool(run.modified) for run in runs if run.table == table)
        column = "changed from its row" if table == "table4" else "scale"  # the column saying what a run changed
        none = "" if measured else (  # a table named, with no runs yet: how to train them
            f": the paper's figures alone, no run of it in {sources}{_left_out(found, table, args.include_modified)}; "
            f"its runs: python src/train.py --multirun 'experiment=glob({table}_*)' (experiments/README.md), then "
            "rebuild with --runs <their folder>")
        print(f"{table}: {measured} runs of {len(result.lines)} lines -> {result.markdown}, {result.csv.name}, "
              f"{result.chart.name}" + (f" ({changed} of the runs changed from their rows, counted by "
                                        f"--include-modified: their {column} says what changed)" if changed else "")
              + none)
        written.append(result)
    if not args.no_wandb and written:
        print(f"tables logged to W&B: {log_to_wandb(written, save_dir=args.out)}")
    return 0


def _left_out(found: list, table: str, include_modified: bool) -> str:
    """What a table without runs counted left out: its runs changed from their rows, if any."""
    changed = 0 if include_modified else sum(run.table == table and bool(run.modified) for run in found)
    return f" ({changed} changed from their rows, left out: --include-modified counts them)" if changed else ""


def dry_run(overrides: list[str]) -> int:
    """``sweep``: the jobs of ``train.py --multirun <overrides>``, each config checked as that sweep
    checks it before its first job (:func:`checked_sweep`); nothing run."""
    jobs = checked_sweep(overrides)
    if jobs is None:
        return 2
    for job in jobs:
        print(f"#{job.number} : {' '.join(job.overrides)}")
    print(f"{len(jobs)} jobs, each config checked as `train.py --multirun` checks it; nothing run")
    return 0


def checked_sweep(overrides: list[str]) -> list | None:
    """The jobs of ``train.py --multirun <overrides>``, each config checked as that sweep checks it
    before its first job (aiayn.cli.sweep.dry_run); None when it would refuse any (or cannot be
    composed), each job it would refuse one line on stderr, job and reason, as there."""
    from aiayn.cli.errors import composition_message, is_composition_error
    from aiayn.cli.sweep import dry_run as checked  # torch and Lightning: these commands alone need them
    from aiayn.cli.sweep_table import shown  # a job's overrides as train.py --multirun names them

    # The reasons are train's, and so are their hints (`python src/train.py --cfg job`, the nearest
    # settings of train's config): they are found under train's command line.
    argv, sys.argv = sys.argv, ["src/train.py", "--multirun", *overrides]
    try:
        jobs, refused = checked(CONF, overrides)
    except Exception as error:  # what Hydra cannot compose: one line; a bug's traceback
        if not is_composition_error(error):
            raise
        print(f"tables.py: {composition_message(error)}", file=sys.stderr)
        return None
    finally:
        sys.argv = argv
    for job, reason in refused:
        print(f"tables.py: sweep job #{job.number} of {len(jobs)} refused ({shown(job.overrides)}): {reason}",
              file=sys.stderr)
    return None if refused else jobs


def _not_a_folder(out: Path) -> str | None:
    """Why ``out`` cannot be the folder of the tables: a file of that name, or above it, is there,
    or the folder it would be made in (or is) cannot be written in; None when it can be."""
    place = next(place for place in (out.absolute(), *out.absolute().parents) if place.exists())
    if not place.is_dir():
        return "a file of that name is there" if place == out.absolute() else f"{place}, above it, is a file"
    if not os.access(place, os.W_OK | os.X_OK):
        return f"this user cannot write in {place}"
    return None


def save_report(args: argparse.Namespace) -> int:
    """``report``: refused in one line while W&B is offline; else built, saved, its URL printed."""
    if wandb_mode() != "online":
        return _offline("a report is saved to W&B", "after uploading the runs with "
                        "`wandb sync <run dir>/wandb/offline-run-*`")
    try:
        runs = local_runs(args.runs, CONF) if args.runs else wandb_runs(f"{args.entity}/{args.project}", [args.table])
        runs = counted(runs, args.include_modified)
    except FileNotFoundError as error:
        print(f"tables.py: {error}", file=sys.stderr)
        return 2
    markdown = table_markdown(args.table, table_rows(CONF, args.table), runs)
    report = build_report(args.table, args.entity, args.project, markdown, args.title, args.include_modified)
    report.save()
    print(f"{args.table} report of {len(runs)} runs: {report.url}")
    return 0


def _offline(needs: str, instead: str) -> int:
    """One line on stderr: what needs W&B online, which it is not, and what to do; exit status 2."""
    print(f"tables.py: W&B is offline (no API key, or WANDB_MODE=offline), and {needs}: run this again with "
          f"WANDB_API_KEY set (or after `wandb login`), {instead}", file=sys.stderr)
    return 2


def run_sweep(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``run``: plan the sweep, keep the part asked for, then list it (--dry-run) or train it."""
    if args.parallel < 1:
        parser.error(f"--parallel must be at least 1, got {args.parallel}")
    try:
        everything = runner.plan(CONF, args.overrides, args.root)
        jobs = runner.select_part(everything, args.part)
    except ValueError as error:
        parser.error(str(error))
    if checked_sweep(args.overrides) is None:  # before any job starts, as `train.py --multirun` does
        return 2
    otherwise = [(job, set(theirs), set(job.overrides)) for job in jobs if (theirs := job.trained_otherwise())]
    for job, theirs, ours in otherwise:
        print(f"tables.py: {job.dir} holds a finished run of other settings ({' '.join(sorted(theirs - ours)) or '-'} "
              f"where this command has {' '.join(sorted(ours - theirs)) or '-'}), which would be taken for its job "
              f"{job.name}: give another --root, or move that folder away", file=sys.stderr)
    if otherwise:
        return 2
    states = [job.state for job in jobs]
    counts = ", ".join(f"{states.count(state)} {state}" for state in (runner.DONE, runner.PARTIAL, runner.NEW))
    part = f" (part {args.part} of {len(everything)})" if args.part else ""
    if args.dry_run:
        for job, state in zip(jobs, states):
            print(f"{job.name}  [{state}]  {shlex.join(job.command(sys.executable, REPO))}")
        print(f"{len(jobs)} jobs{part}: {counts}; dry run, nothing started")
        return 0
    print(f"{len(jobs)} jobs{part} in {args.root}: {counts}; {args.parallel} at a time", flush=True)
    try:
        failed = runner.run(jobs, parallel=args.parallel, python=sys.executable, repo=REPO)
    except KeyboardInterrupt:
        print("interrupted: the stopped jobs resume when the same command runs again", file=sys.stderr)
        return 130
    if failed:
        print(f"{len(failed)} of {len(jobs)} jobs failed:", file=sys.stderr)
        for job in failed:
            print(f"  {job.name} (exit {job.returncode}): {job.log}", file=sys.stderr)
        return 1
    print(f"all {len(jobs)} jobs finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
