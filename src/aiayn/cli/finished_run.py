"""A resumed run with nothing left to do: trained to its ``optim.train_steps`` and tested as this
command would test it. ``resume=auto`` of a sweep stopped part-way (``experiments/tables.py sweep``
again, ``--multirun … resume=auto``) meets its finished jobs so; each says it is finished and gives
its test's figures back (the sweeper's result), without testing again, drawing its attention
pictures again or logging a second test at its last step. A finished run asked to test otherwise
(another decoding, test split, share of it or §6.1 window) is tested again, as asked; one stopped
after training, before its test had finished, runs the test."""

from __future__ import annotations

import logging
from typing import Any

from aiayn.checkpoints.resume import Resume
from aiayn.config.identity import SPEED_KEYS, setting_differences
from aiayn.reporting.summary import read_summary

log = logging.getLogger("train")

# What decides a run's test: whether there is one, how it decodes, what it scores, and which weights
# (§6.1's window of checkpoints to average).
TEST_KEYS = ("test_after_training", "decoding", "task.datamodule.test_split", "trainer.limit_test_batches",
             "checkpoint.average_last", "checkpoint.average_every_n_steps")


def nothing_left(config: dict[str, Any], resume: Resume | None) -> dict[str, float] | None:
    """The test's figures (``{}`` when the run is not to be tested) of a resumed run that is finished:
    its checkpoint at ``optim.train_steps``, its summary written at that step with the test this
    config asks for; None while training or the test is still to run."""
    if resume is None or resume.step != config["optim"]["train_steps"] or not resume.trained_config:
        return None
    summary = read_summary(resume.run_dir) or {}
    testing = config.get("test_after_training", True)
    results = {key: value for key, value in summary.items() if key.startswith("test/")}
    if summary.get("steps") != resume.step or (testing and not results):
        return None
    if setting_differences(resume.trained_config, config, TEST_KEYS, SPEED_KEYS):
        return None
    tested = f"tested on {config['task']['datamodule']['test_split']}" if testing else "not to be tested"
    log.info("%s is finished: trained to step %d of %d and %s; nothing left to do (evaluate.py ckpt=%s tests it "
             "otherwise)", resume.run_dir, resume.step, resume.step, tested, resume.checkpoint)
    if testing:
        print(f"test {config['task']['datamodule']['test_split']} (as tested when the run finished): "
              + "  ".join(f"{key}={value:.4g}" for key, value in results.items()))
    return results if testing else {}
