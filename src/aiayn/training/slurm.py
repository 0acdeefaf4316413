"""SLURM as a preempted run meets it: the job's id, whether the job's command continues the run
when SLURM starts it again, and ``scontrol requeue`` (aiayn.training.preemption)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

log = logging.getLogger("aiayn.training.preemption")


def slurm_job() -> str | None:
    """This job's id as ``scontrol`` takes it (``<array job>_<task>`` for an array task), or None
    outside SLURM."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def continues_itself(resume: str | None) -> bool:
    """Whether the same command, run again, continues this run: ``resume=auto`` or a run directory."""
    return resume is not None and (str(resume) == "auto" or Path(str(resume)).is_dir())


def requeue(job: str) -> str | None:
    """``scontrol requeue <job>``: None when it worked, else what went wrong."""
    try:
        done = subprocess.run(["scontrol", "requeue", job], check=False, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return "no scontrol command here"
    except subprocess.TimeoutExpired:
        return "scontrol did not answer within 60 s"
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[:200]
        return f"scontrol exit status {done.returncode}{': ' + said if said else ''}"
    log.info("preemption: SLURM job %s requeued", job)
    return None
