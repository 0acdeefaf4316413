"""Which of a run's evaluations is a test of its row: of its task's test split (asked for by its
role or its name), decoded as the run's config says, of its fp32 model alone. :mod:`aiayn.tables.runs`
(Table 2's test BLEU) and :mod:`aiayn.tables.table4` (each test's F1) take only these."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

log = logging.getLogger(__name__)


def test_split(config: Mapping[str, Any]) -> str | None:
    """The name of a run's test split, as its task's data module was given it
    (``task.datamodule.test_split``: ``newstest2014``, ``test_2016_flickr``, a treebank's ``23``),
    its interpolations resolved; None where the config cannot tell."""
    try:
        split = OmegaConf.select(OmegaConf.create(dict(config)), "task.datamodule.test_split",
                                 throw_on_resolution_failure=False)
    except OmegaConfBaseException:  # a config OmegaConf cannot read back: its reports of split=test still count
        return None
    return None if split is None else str(split)


def as_test(figures: Mapping[str, Any], split: str | None, key: str, task: str | None,
            evaluated: Any = None) -> dict[str, Any] | None:
    """An evaluate.py report (or its W&B run's summary) with its figures under ``test/``, where it
    scored the run's test split: asked for by its role (``split=test``: keys ``test/<figure>``) or by
    its name, ``split`` (:func:`test_split`; ``split=newstest2014``: keys ``newstest2014/<figure>``,
    evaluate.py naming its figures after the split given). None where it holds no ``key`` figure of
    either (an evaluation of another split), or where it scored another task than the run's, ``task``
    (:func:`of_another_task`; ``evaluated``: the task a W&B evaluation was given, else the report's own)."""
    if of_another_task(evaluated if evaluated is not None else figures.get("task"), task):
        return None
    if f"test/{key}" in figures:
        return dict(figures)
    if not split or f"{split}/{key}" not in figures:
        return None
    named = f"{split}/"
    return {**figures, **{f"test/{name[len(named):]}": value for name, value in figures.items()
                          if name.startswith(named)}}


def of_another_task(evaluated: Any, task: str | None) -> bool:
    """Whether an evaluation of ``evaluated`` (a report's task name, or the task a W&B evaluation was
    given: a config with its name; None: the checkpoint's own) scored another task than its run's,
    ``task`` (``evaluate.py task=<name>``): its test split is that task's, no test of the run's row."""
    name = evaluated.get("name") if isinstance(evaluated, Mapping) else evaluated
    return name is not None and task is not None and name != task


def task_name(config: Mapping[str, Any]) -> str | None:
    """The name of a run's task (``task.name``), None where its config has none."""
    return (config.get("task") or {}).get("name")


# The decoding settings that change a test's translations (beam search's; sampling is another search):
# an evaluate.py report decoded otherwise than its run's config says is not that row's test.
SCORED_DECODING = ("beam_size", "alpha", "max_len_offset", "min_len", "constrained", "stop", "sampling")


def decoded_otherwise(evaluation: object, used: Mapping[str, Any] | None, decoding: Mapping[str, Any]) -> bool:
    """Whether an evaluation (a report file, a W&B run: ``evaluation``, named in the warning) decoded
    with ``used`` otherwise than its run's ``decoding`` says, in a setting of :data:`SCORED_DECODING`;
    such a test is not the row's, and a warning names what differs."""
    used = used or {}
    differs = [f"decoding.{key}={used.get(key)!r} (the run's: {decoding.get(key)!r})" for key in SCORED_DECODING
               if key in used and key in decoding and used[key] != decoding[key]]
    if differs:
        log.warning("%s: decoded otherwise than its run (%s); left out of the tables", evaluation, ", ".join(differs))
    return bool(differs)


def not_the_rows_model(evaluation: object, switches: Mapping[str, Any] | None, members: int) -> bool:
    """Whether an evaluation (named in the warning) scored other arithmetic than the row's fp32
    model (``switches``: ``precision`` other than fp32, ``int8``) or an ensemble of ``members``
    checkpoints: not the row's test (a warning says why)."""
    switches = switches or {}
    lowered = [f"{key}={switches[key]}" for key in ("precision", "int8")
               if switches.get(key) not in (None, False, "fp32")]
    if lowered or members > 1:
        why = f"an ensemble of {members} checkpoints" if members > 1 else f"decoded with {', '.join(lowered)}"
        log.warning("%s: %s, not the row's model; left out of the tables", evaluation, why)
    return bool(lowered) or members > 1
