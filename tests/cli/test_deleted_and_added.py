"""Settings deleted with ``~`` or added with ``+`` on a tool's command line (aiayn.cli.command_line):
one line naming the override and what to give instead, exit 2, before anything is read or
written; in this process, on the session's tiny run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun

# (tool, override, the line it gets). Before: `~batch_size` (translate, and any root setting of the
# tools) a traceback and exit 1; `+bach_size=8` translated, the setting ignored; `~seed` Hydra's
# "Interpolation key 'seed' not found."; `~decoding` trained with the schema's decoding instead of
# the task's (a parser's constrained decoding dropped); `~logger` trained without a logger.
CASES = [
    ("translate", "~batch_size", ("translate.py: ~batch_size: a setting cannot be deleted, translate.py reads each "
                                 "of its settings; give batch_size=<value> instead")),
    ("translate", "+bach_size=8", ("translate.py: bach_size is not a setting of translate.py, so +bach_size would be "
                                  "ignored; did you mean batch_size or buffer_size?")),
    ("translate", "++beam=8", "translate.py: beam is not a setting of translate.py, so ++beam would be ignored;"),
    ("visualize", "~text", "visualize.py: ~text: a setting cannot be deleted"),
    ("average", "+average_lats=3", ("average.py: average_lats is not a setting of average.py, so +average_lats would "
                                   "be ignored; did you mean average_last?")),
    ("evaluate", "~task", ("evaluate.py: ~task: a config group cannot be deleted; choose one of its options instead, "
                          "task=<name>, one of multi30k_de_en, multi30k_en_de,")),
    ("train", "~seed", ("train.py: ~seed: a setting cannot be deleted, train.py reads each of its settings; give "
                       "seed=<value> instead")),
    ("train", "~decoding", "train.py: ~decoding: a setting cannot be deleted"),
    ("train", "~optim.warmup_steps", "train.py: ~optim.warmup_steps: a setting cannot be deleted"),
    ("train", "~logger", ("train.py: ~logger: a config group cannot be deleted; choose one of its options instead, "
                         "logger=<name>, one of csv, mlflow, none, wandb")),
]


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "override", "line"), CASES, ids=[f"{tool} {override}" for tool, override, _ in CASES])
def test_a_setting_deleted_or_one_the_tool_lacks_added_is_one_line(tool: str, override: str, line: str,
                                                                   tiny_run: TrainedRun, data_root: Path,
                                                                   tmp_path: Path) -> None:
    source = tmp_path / "in.en"
    source.write_text("A man is riding a bike.\n", encoding="utf-8")
    out = tmp_path / "out"
    settings = {"translate": [f"ckpt={tiny_run.last}", f"input={source}", f"out={out}"],
                "visualize": [f"ckpt={tiny_run.last}", f"out={out}"],
                "average": [f"ckpt={tiny_run.checkpoints}", "average_last=2", f"out={out}"],
                "evaluate": [f"ckpt={tiny_run.last}", "wandb=disabled", f"out={out}"],
                "train": ["debug=tiny", "logger=none", f"hydra.run.dir={out}"]}[tool]
    result = run_tool(f"src/{tool}.py", *settings, override, data_root=data_root, cache_dir=tiny_run.cache_dir,
                      check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(line) and result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert not out.exists()  # refused before anything is written
