"""SLURM as a test meets it on a machine without SLURM: the variables of a one-task job, and a
``scontrol`` first on PATH that records what it was asked (``scontrol requeue <job>``)."""

from __future__ import annotations

from pathlib import Path

FAKE_SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
exit {status}
"""

# A one-task job, as srun starts it.
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0",
         "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "127.0.0.1"}


def fake_scontrol(folder: Path, status: int = 0, said: str = "") -> Path:
    """A ``scontrol`` in ``folder`` (put it first on PATH) that records its arguments, one call a line,
    in the file returned, and fails with ``status`` (and ``said`` on stderr)."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "calls"
    script = folder / "scontrol"
    script.write_text(FAKE_SCONTROL.format(log=log, status=status).replace("exit", f"echo '{said}' >&2\nexit")
                      if said else FAKE_SCONTROL.format(log=log, status=status))
    script.chmod(0o755)
    return log
