"""What every benchmark records next to its figures: the machine it ran on and the commit measured.

Standard library only, so that benchmarks which run before the install (default_job.py) can use it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, object]:
    """CPU model, core count, Python and OS of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def commit(checkout: Path = REPO) -> str:
    """The short hash of ``checkout``'s commit (this one's by default), with "+dirty" when its
    working tree has changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], check=False, cwd=checkout, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    return f"{head}+dirty" if head and git("status", "--porcelain", "--untracked-files=no") else head


def now() -> str:
    """The local date and time, to the second."""
    return datetime.datetime.now().isoformat(timespec="seconds")


def memory_mib(*keys: str) -> dict[str, float]:
    """This process's memory from /proc/self/status, in MiB: by default resident (``VmRSS``),
    private (``RssAnon``) and file-backed (``RssFile``, mapped files); ``VmHWM`` is the peak."""
    keys = keys or ("VmRSS", "RssAnon", "RssFile")
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in keys:
            fields[key] = round(int(line.split()[1]) / 1024, 1)
    return fields


def append_record(path: Path, record: dict) -> None:
    """``record`` as one JSON line at the end of the results file ``path`` (made with its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
