"""What every benchmark records next to its figures: the machine it ran on and the commit measured.

Standard library only, so that benchmarks which run before the install (default_job.py) can use it.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """Where the data are read, as the Makefile says it: ``$AIAYN_DATA_ROOT``, else the shared data
    folder beside the checkout where there is one, else the user cache (conf/paths/default.yaml's)."""
    if os.environ.get("AIAYN_DATA_ROOT"):
        return Path(os.environ["AIAYN_DATA_ROOT"])
    shared = REPO.parent / "shared" / "data"
    return shared if shared.is_dir() else Path.home() / ".cache" / "aiayn" / "data"


# The CPU flags that decide which kernels a CPU runs (AVX2 or AVX-512, bf16 and AMX units), as
# /proc/cpuinfo names them: a record says which of them its CPU had.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")

# The fields of /proc/cpuinfo that tell one CPU generation from another where the model name does
# not ("AMD EPYC" in a VM): "AuthenticAMD family 25 model 17 stepping 1".
CPU_ID = (("vendor_id", ""), ("cpu family", "family "), ("model", "model "), ("stepping", "stepping "))

# The engines benchmarks run beside aiayn (their distributions' names).
PEERS = ("ctranslate2", "fairseq", "onnxruntime", "transformers")


def cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ("model name", "flags", ...); empty where
    there is none."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip() and fields:
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def version(package: str) -> str | None:
    """The installed version of ``package`` (a distribution's name), None where it is not
    installed; nothing is imported."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def peer_versions() -> dict[str, str | None]:
    """The versions of the peer engines (None where one is not installed)."""
    return {package: version(package) for package in PEERS}


def machine() -> dict[str, object]:
    """CPU model, core count, memory, Python and OS of this machine; the CPU's model name, family and
    model numbers and flags as /proc/cpuinfo gives them, the CPUs this process may run on, and the
    installed torch's version (None where there is none)."""
    info = cpuinfo()
    cpu = info.get("model name") or platform.processor() or platform.machine()
    flags = set(info.get("flags", "").split())
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory_gib(), "python": platform.python_version(),
            "platform": platform.platform(), "cpu_model_name": info.get("model name"),
            "cpu_id": " ".join(f"{label}{info[key]}" for key, label in CPU_ID if key in info) or None,
            "cpu_flags": {flag: flag in flags for flag in CPU_FLAGS} if flags else None,
            "cpu_affinity": affinity, "torch": version("torch")}


def commit(checkout: Path = REPO) -> str:
    """The short hash of ``checkout``'s commit (this one's by default), with "+dirty" when its
    working tree has changes; ``$AIAYN_COMMIT`` where it is set (a copy of the working tree on a
    machine without its git history, which would record none, or an older one's); "" without git."""
    if os.environ.get("AIAYN_COMMIT") and checkout == REPO:
        return os.environ["AIAYN_COMMIT"]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], check=False, cwd=checkout, capture_output=True,
                                  text=True).stdout.strip()
        except OSError:  # no git on this machine
            return ""
    head = git("rev-parse", "--short", "HEAD")
    return f"{head}+dirty" if head and git("status", "--porcelain", "--untracked-files=no") else head


def now() -> str:
    """The local date and time, to the second."""
    return datetime.datetime.now().isoformat(timespec="seconds")


def memory_gib() -> float | None:
    """The machine's memory in GiB (/proc/meminfo's MemTotal); None where it cannot be read."""
    try:
        total = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal"))
    except (OSError, StopIteration):
        return None
    return round(int(total) / 2**20, 1)


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
