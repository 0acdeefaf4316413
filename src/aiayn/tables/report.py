"""A W&B Report per paper table (``experiments/tables.py report``), built with wandb-workspaces.

A report holds the paper's table beside ours (the rebuilt table, as markdown), then panel grids
over the table's runs, one colour per row (the runs grouped by ``experiment.row``):

- line panels of the validation curves (``val/ppl``, ``val/bleu``) against the step and against
  the training FLOPs counted so far (``val/train_flops``, logged with every validation);
- bar panels of the figures the table reports, one bar per row, the mean over its seeds with
  their min-max range: the base row's range is Table 3's noise band;
- Table 3: a parallel-coordinates panel over the model settings the table varies, to dev PPL and BLEU;
- Tables 2 and 4: bars of src/evaluate.py's runs of the table's checkpoints (Table 2's BLEU both
  ways; Table 4's F1, precision, recall and exact match, per recipe and decoding).

Every key a panel names is listed in :data:`SECTIONS`; :func:`named_keys` reads them back from a
built report, so a test can hold them against what real runs log (a panel naming a key no run
has draws an empty chart, silently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiayn.config.identity import MODIFIED

REPORTED_TABLES = ("table3", "table2", "table4")
# Where a curve is drawn against: the optimizer step (Lightning's W&B logger logs it with every
# row) and the training FLOPs counted up to each validation (aiayn.training.callbacks.RunSummaryCallback).
CURVE_X = ("trainer/global_step", "val/train_flops")
TRAIN, EVAL = "train", "eval"


@dataclass(frozen=True)
class Section:
    """One panel grid: which runs (the table's training runs, or evaluate.py's runs of them), what
    groups them (config keys: one colour per group), and what is drawn, by key: ``curves`` are
    history keys, each drawn against every key of :data:`CURVE_X`; ``bars`` and
    ``parallel_metrics`` are summary keys; ``parallel`` are config keys."""

    title: str
    runs: str
    group_by: tuple[str, ...]
    curves: tuple[str, ...] = ()
    bars: tuple[str, ...] = ()
    parallel: tuple[str, ...] = ()
    parallel_metrics: tuple[str, ...] = ()


# Table 3 varies these model settings (and ε_ls); the parallel coordinates run from them to dev PPL and BLEU.
TABLE3_SETTINGS = ("model.n_layers", "model.d_model", "model.d_ff", "model.n_heads", "model.d_k", "model.d_v",
                   "model.dropout", "loss.label_smoothing", "model.positional", "model.attention_window")

SECTIONS: dict[str, tuple[Section, ...]] = {
    "table3": (
        Section("Learning curves, one colour per row", TRAIN, ("experiment.row",),
                curves=("val/ppl", "val/tokenized_bleu")),
        Section("Dev PPL and BLEU per row (bars: mean over seeds, range: min to max; base's range is the noise "
                "band), and the parameter counts", TRAIN, ("experiment.row",),
                bars=("dev/tokenized_bleu", "dev/ppl", "parameters")),
        Section("What each setting does", TRAIN, ("experiment.row",), parallel=TABLE3_SETTINGS,
                parallel_metrics=("dev/ppl", "dev/tokenized_bleu")),
    ),
    "table2": (
        Section("Learning curves, one colour per row", TRAIN, ("experiment.row",), curves=("val/ppl", "val/bleu")),
        Section("Training cost per row: FLOPs counted and the paper's estimate, hours, parameters", TRAIN,
                ("experiment.row",), bars=("train_flops", "train_flops_paper_estimate", "training_time_s",
                                           "parameters")),
        Section("newstest2014 BLEU both ways (evaluate.py on the averaged checkpoints)", EVAL,
                ("train.experiment.row",), bars=("test/tokenized_bleu", "test/bleu")),
    ),
    "table4": (
        Section("Learning curves, one colour per recipe", TRAIN, ("experiment.row",), curves=("val/ppl", "val/loss")),
        Section("Test F1, precision, recall and exact match per recipe and decoding (evaluate.py)", EVAL,
                ("train.experiment.row", "decoding.constrained", "decoding.beam_size"),
                bars=("test/f1", "test/precision", "test/recall", "test/exact_match")),
        Section("Training cost per recipe", TRAIN, ("experiment.row",),
                bars=("parameters", "training_time_s", "train_flops")),
    ),
}


def run_filter(table: str, runs: str, include_modified: bool = False) -> str:
    """The runs of a section: a training run's config names its table (``experiment.table``); an
    evaluate.py run's holds its training run's config under ``train``. Runs tagged ``modified`` (a
    row's run changed from its row, aiayn.config.identity, and the evaluations of such a run) are
    left out, as from the table block, unless ``include_modified``."""
    key = "experiment.table" if runs == TRAIN else "train.experiment.table"
    return f"Config('{key}') = '{table}'" + ("" if include_modified else f" and Tags() not in ['{MODIFIED}']")


def build_report(table: str, entity: str, project: str, table_markdown: str, title: str | None = None,
                 include_modified: bool = False) -> Any:
    """The report of ``table`` over ``entity/project``, not saved (``report.save()`` needs W&B online);
    ``include_modified``: as :func:`run_filter`."""
    import wandb_workspaces.reports.v2 as wr

    blocks: list[Any] = [
        wr.H1(title or f"{table.capitalize()} of “Attention Is All You Need”, rebuilt"),
        wr.MarkdownBlock(text=table_markdown),
    ]
    for number, section in enumerate(SECTIONS[table]):
        runset = wr.Runset(entity=entity, project=project, name=f"{table} {section.runs} runs",
                           filters=run_filter(table, section.runs, include_modified),
                           groupby=[f"config.{key}" for key in section.group_by])
        blocks += [wr.H2(section.title), wr.PanelGrid(runsets=[runset], panels=_panels(wr, section))]
    return wr.Report(entity=entity, project=project, title=(title or f"aiayn {table}")[:128],
                     description=f"The paper's {table} beside the runs of {entity}/{project}", blocks=blocks,
                     width="fluid")


def _panels(wr: Any, section: Section) -> list[Any]:
    group = wr.Config(section.group_by[0])
    panels: list[Any] = []
    for key in section.curves:
        for x in CURVE_X:
            panels.append(wr.LinePlot(title=f"{key} against {x}", x=x, y=[key], groupby=group,
                                      groupby_aggfunc="mean", groupby_rangefunc="minmax"))
    for key in section.bars:
        panels.append(wr.BarPlot(title=key, metrics=[wr.SummaryMetric(key)], orientation="v", groupby=group,
                                 groupby_aggfunc="mean", groupby_rangefunc="minmax"))
    if section.parallel:
        columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(key)) for key in section.parallel]
        columns += [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(key))
                    for key in section.parallel_metrics]
        panels.append(wr.ParallelCoordinatesPlot(title="settings → dev figures", columns=columns))
    return panels


def named_keys(report: Any) -> dict[str, set[str]]:
    """Every key a report's panels and run sets name, by where a run must have it: ``history``
    (line panels: x and y), ``summary`` (bars, parallel coordinates' metrics) and ``config``
    (parallel coordinates' settings, groupings, filters), each further split by the runs it is
    drawn from: ``{"train": {"history": ..., ...}, "eval": {...}}``."""
    import wandb_workspaces.reports.v2 as wr

    found = {runs: {"history": set(), "summary": set(), "config": set()} for runs in (TRAIN, EVAL)}
    grids = [block for block in report.blocks if isinstance(block, wr.PanelGrid)]
    for grid in grids:
        runs = EVAL if any("train.experiment.table" in runset.filters for runset in grid.runsets) else TRAIN
        keys = found[runs]
        for runset in grid.runsets:
            keys["config"].update(key.removeprefix("config.") for key in runset.groupby)
            keys["config"].update(_filter_keys(runset.filters))
        for panel in grid.panels:
            if isinstance(panel, wr.LinePlot):
                keys["history"].update(_name(metric) for metric in [panel.x, *panel.y])
            elif isinstance(panel, wr.BarPlot):
                keys["summary"].update(_name(metric) for metric in panel.metrics)
            elif isinstance(panel, wr.ParallelCoordinatesPlot):
                for column in panel.columns:
                    where = "config" if isinstance(column.metric, wr.Config) else "summary"
                    keys[where].add(_name(column.metric))
            else:
                raise TypeError(f"a panel of a kind named_keys does not read: {type(panel).__name__}")
            if getattr(panel, "groupby", None) is not None:
                keys["config"].add(_name(panel.groupby))
    return found


def _name(metric: Any) -> str:
    return metric if isinstance(metric, str) else metric.name


def _filter_keys(filters: str) -> set[str]:
    from wandb_workspaces import expr

    parsed = expr.expr_to_filters(filters)
    leaves = [parsed] if getattr(parsed, "key", None) else list(getattr(parsed, "filters", None) or [])
    return {leaf.key.name for leaf in leaves if leaf.key is not None and leaf.key.section == "config"}


# -- the table block ------------------------------------------------------------------------------
def table_markdown(table: str, rows: list[Any], runs: list[Any]) -> str:
    """The rebuilt table as markdown, each row beside the paper's figures: Tables 2 and 3 as
    ``experiments/tables.py rebuild`` writes them (Table 3 with its noise band; Table 4 a line per
    test of a run, :func:`aiayn.tables.table4.table4_lines`, beside the paper's F1)."""
    from aiayn.tables.build import build_table
    from aiayn.tables.noise import base_spread
    from aiayn.tables.output import MARKDOWN_COLUMNS, noise_markdown, to_markdown
    from aiayn.tables.rows import base_paper_figures
    from aiayn.tables.table4 import COLUMNS as TABLE4_COLUMNS
    from aiayn.tables.table4 import table4_lines

    runs = [run for run in runs if run.table == table]
    if table == "table4":
        return to_markdown(table4_lines(rows, runs), TABLE4_COLUMNS)
    lines = build_table(rows, runs)
    text = to_markdown(lines, MARKDOWN_COLUMNS[table])
    if table == "table3":
        text += noise_markdown(lines, base_spread(runs), base_paper_figures(rows))
    return text
