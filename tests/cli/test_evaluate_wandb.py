"""evaluate.py's W&B runs, as a person browses them after a sweep: each says which training run it
scored. A tiny two-job sweep (W&B offline, no key: a fresh machine's home), each job's checkpoint
evaluated, the offline runs read back from their ``.wandb`` files."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TINY
from tests.helpers.wandb_offline import read_run


@pytest.mark.slow
def test_the_evaluations_of_a_sweeps_jobs_name_the_training_run_each_scored(tmp_path: Path, data_root: Path,
                                                                          subword_cache: Path) -> None:
    """Before: both evaluations were W&B runs named `eval-val.step4.beam1.alpha0.6.len+2`, in the
    group `multi30k_en_de-small`, with nothing but the training config deep in theirs to tell
    which job each scored, and evaluate.py said nothing of where its run was or how to upload it."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}, "HOME": str(tmp_path),
           "WANDB_SILENT": "true"}
    sweep = tmp_path / "sweep"
    run_tool("src/train.py", "--multirun", *TINY, "model.dropout=0.0,0.2", "test_after_training=false",
             f"hydra.sweep.dir={sweep}", env=env, data_root=data_root, cache_dir=subword_cache)
    evaluations = {}
    for job in sorted(sweep.glob("[01]_*")):
        trained = read_run(job)
        # each job keeps its own record of the rows it logged offline, which a resumed attempt logs
        # again from (aiayn.reporting.wandb_history); the second job's had none: the first left
        # WANDB_MODE=dryrun set in the process (Lightning's), and dryrun was not read as offline
        assert [path.name for path in (job / "wandb").glob("rows-*.jsonl")] == [f"rows-{trained.run_id}.jsonl"]
        result = run_tool("src/evaluate.py", f"ckpt={job / 'checkpoints' / 'last.ckpt'}", "split=test_2017_mscoco",
                          "decoding.beam_size=1", "decoding.max_len_offset=2", env=env, data_root=data_root,
                          cache_dir=subword_cache)
        [folder] = (job / "eval" / "wandb").glob("offline-run-*")
        assert re.search(rf"W&B run \w+ \(offline\) in {re.escape(str(folder))}; upload it with `wandb sync "
                         rf"{re.escape(str(folder))}`", result.stdout), result.stdout
        evaluation = read_run(job / "eval")
        assert evaluation.job_type == "eval"
        assert evaluation.config["trained_wandb_run"] == trained.run_id
        assert evaluation.config["trained_run_name"] == trained.name
        # the weights scored, as the report's: what a table's row tells its tests by (aiayn.tables.runs)
        assert evaluation.config["ensemble"] == [str(job / "checkpoints" / "last.ckpt")]
        assert evaluation.config["averaged_steps"] == [4]
        assert evaluation.name.startswith(f"eval-{trained.name}-"), (evaluation.name, trained.name)
        # what it scored, as its report names it: two corpora's splits of one name are told apart
        (report,) = (job / "eval").glob("*.json")
        assert evaluation.summary["data"] == json.loads(report.read_text())["data"]
        evaluations[trained.config["model"]["dropout"]] = evaluation
    assert len({evaluation.name for evaluation in evaluations.values()}) == 2, [e.name for e in evaluations.values()]
