"""The GPU check: what a lent GPU machine should measure, in one command (``make gpu-check``) and
under 9 minutes on one H100.

    .venv/bin/python benchmarks/gpu_suite.py [--device cuda|cpu] [--quick] [--out-dir DIR]
        [--parts tests,train,users_command,decode] [--cap PART=SECONDS ...] [--sentences N]

Parts, one after another, each a process of its own under its own time cap (default: tests
130 s, train 190 s, users_command 170 s, decode 50 s; seconds a part leaves unused go to the parts
after it, never the other way), so that a slow part cannot eat the others' time
(benchmarks/_gpu_parts.py):

1. ``tests``: ``python -m pytest -m gpu -ra tests/gpu``: passed/failed/skipped counts and the failures' ids.
2. ``train``: the bare training step (benchmarks/train_throughput.py) in bf16 autocast: big (32k,
   EN-FR) in one 25,000-token batch (one GPU's whole step) and at 3,125 tokens (one of 8 GPUs'
   share), base (37k, EN-DE) at 3,125, then each speed switch on and off (the fused loss, CUDA
   graphs with length buckets, plain Adam, the buckets alone): target tokens/s, step time, MFU against a bf16
   matrix-product peak measured in the same process, peak memory (max_memory_allocated).
   Each record also goes to train_throughput.jsonl in the output folder (``device`` "cuda", the
   GPU's name in ``machine["gpu"]``), where the training plan of src/train.py looks for it.
3. ``users_command``: ``src/train.py model=big task=wmt_en_fr`` itself for 100 steps on a
   miniature EN-FR tree: its plan, its target tokens/s against the bare step's of the same
   batches, and what follows the last step (validation, checkpoint, attention pictures, the test
   on newstest2014), timed (benchmarks/_users_command.py).
4. ``decode``: beam 4, α 0.6, input + 50 over newstest2014 EN-DE's source with the base model
   (random weights: every output runs to its maximum length): ours in fp32 and bf16, and
   CTranslate2 in float32, bfloat16 and float16 on the same weights; sentences/s, and how many
   outputs of each are identical to ours in fp32 (benchmarks/_gpu_decode.py). Its sentences are
   cut down to what fits the cap when the cap is short.

Every part also reports the GPU's peak memory in use while it ran (nvidia-smi, all processes).
Appends one JSON line to gpu_suite.jsonl and a dated markdown section (date, commit, GPU, driver,
CUDA, torch, CPU, then one table) to gpu_suite.md, both in ``--out-dir`` (benchmarks/results);
until then, gpu_suite.partial.json there holds the record of the parts finished so far.

--quick: a one-layer 32-wide model instead of base and big (the user's command too, for 4 steps),
2 timed steps, 16 sentences, the tests only collected, nothing appended to train_throughput.jsonl:
a check that the suite runs (about a minute on a 2-core CPU with ``--device cpu``), never figures
to keep. Without a CUDA GPU and without
``--device cpu`` the suite refuses in one line, exit status 2. Exit status 1 when a gpu-marked test
failed (or the tests part did not finish) or the user's command failed, after everything is
written; the figures are set beside their targets in the record (``targets``), never judged by the
exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from aiayn.files import atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, when imported from elsewhere
import _common
import _gpu_parts
import _time_split

RESULTS = _common.REPO / "benchmarks" / "results"
PARTS = ("tests", "train", "users_command", "decode")
PARTIAL = "gpu_suite.partial.json"  # the record of the parts finished, until the whole one is written
# tests: 10 GPU tests took 94 s on the H200 (2026-11-26), now 12; decode: 43 s, CTranslate2 not loading there
CAPS = {"tests": 130, "train": 190, "users_command": 170, "decode": 50}
QUICK_CAPS = {"tests": 60, "train": 90, "users_command": 120, "decode": 90}
# What each part reads under $AIAYN_DATA_ROOT, checked before any part runs: a GPU machine is often given the
# checkout alone, and without its data every part failed within seconds, measuring nothing.
NEEDED = {
    "tests": tuple(f"multi30k/{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de")),
    "train": ("wmt14/newstest2014-en-de.en", "wmt14/newstest2014-en-de.de", "wmt14/newstest2014-en-fr.en",
              "wmt14/newstest2014-en-fr.fr"),
    "users_command": ("wmt14/newstest2013.en", "wmt14/newstest2013.fr", "wmt14/newstest2014-en-fr.en",
                      "wmt14/newstest2014-en-fr.fr", "wmt14/sgm/newstest2014-fren-src.en.sgm",
                      "wmt14/sgm/newstest2014-fren-ref.fr.sgm"),
    "decode": ("wmt14/newstest2014-en-de.en", "wmt14/newstest2013.en", "wmt14/newstest2013.de",
               "wmt14/train_sample/src-train.txt.gz", "wmt14/train_sample/tgt-train.txt.gz"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a check that the suite runs")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help=f"where the results go (default {RESULTS})")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--cap", action="append", default=[], metavar="PART=SECONDS",
                        help=f"a part's time cap (default {CAPS}; with --quick {QUICK_CAPS})")
    parser.add_argument("--sentences", type=int, default=None, help="decode only the first N sentences")
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="FILE.tar.gz",
                        help="keep every part's whole log (pytest's, each run's, train.log) in one archive")
    args = parser.parse_args(argv)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts {','.join(args.parts)}: name some of {', '.join(PARTS)}")
    args.caps = dict(QUICK_CAPS if args.quick else CAPS)
    for item in args.cap:
        part, _, seconds = item.partition("=")
        try:
            args.caps[part] = float(seconds) if part in PARTS and float(seconds) > 0 else None
        except ValueError:
            args.caps[part] = None
        if args.caps[part] is None:
            parser.error(f"--cap {item}: expected PART=SECONDS with PART one of {', '.join(PARTS)}")
    return args


def nvidia_smi(query: str) -> str | None:
    try:
        result = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                                check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.splitlines()[0].strip() if result.returncode == 0 and result.stdout.strip() else None


def machine(device: str) -> dict:
    """benchmarks/_common.py's machine (CPU, cores, Python, OS) with torch and, on CUDA, the GPU."""
    found = {**_common.machine(), "torch": torch.__version__}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        found |= {"gpu": torch.cuda.get_device_name(0), "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                  "compute_capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
                  "driver": nvidia_smi("driver_version"), "cudnn": torch.backends.cudnn.version(),
                  "gpu_memory_used_mb_at_start": nvidia_smi("memory.used")}
    return found


def run_parts(args: argparse.Namespace, work: Path, record: dict) -> dict:
    """Each part asked for, under its cap plus what the parts before it left unused. After each,
    ``record`` with the parts so far goes to gpu_suite.partial.json in the output folder, so that a
    run killed from outside (a machine's time running out) leaves what it finished."""
    results, spare = {}, 0.0
    cuda = args.device == "cuda"
    for part in PARTS:
        if part not in args.parts:
            continue
        cap = args.caps[part] + spare
        started = time.monotonic()
        print(f"[gpu_suite] {part} (cap {cap:.0f} s)", file=sys.stderr, flush=True)
        with _gpu_parts.DeviceMemory(cuda) as memory:
            if part == "tests":
                result = _gpu_parts.tests_part(cap, work, args.quick)
            elif part == "train":
                records = None if args.quick else args.out_dir / "train_throughput.jsonl"
                result = _gpu_parts.train_part(cap, work, args.device, args.quick, records)
            elif part == "users_command":
                result = _gpu_parts.users_command_part(cap, work, args.device, args.quick)
            else:
                result = _gpu_parts.decode_part(cap, work, args.device, args.quick, args.sentences)
        used = time.monotonic() - started
        result.update(part_seconds=round(used, 1), part_cap_s=round(cap), device_peak_used_mb=memory.peak_mb)
        spare = max(cap - used, 0.0)
        results[part] = result
        print(f"[gpu_suite] {part}: {result['status']} in {used:.0f} s", file=sys.stderr, flush=True)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out_dir / PARTIAL, json.dumps({**record, **results}) + "\n")  # whole or the last one kept
    return results


def mib(value) -> str:
    return f"{value:,.0f} MiB" if value else ""


def table_rows(record: dict) -> list[list[str]]:
    """The markdown table's rows: | part | run | status | result | time | MFU | peak memory |."""
    rows = []
    tests = record.get("tests")
    if tests:
        figures = f"{tests['collected']} collected" if "collected" in tests else ", ".join(
            f"{tests[key]} {key}" for key in ("passed", "failed", "skipped", "error"))
        command = "pytest -m gpu" + (" --collect-only" if "collected" in tests else "")
        rows.append(["tests", command, tests["status"], figures,
                     f"{tests['seconds']:.0f} s", "", mib(tests["device_peak_used_mb"])])
    train = record.get("train")
    for run in train["runs"] if train else []:
        switches = ", ".join(run.get("switches") or []) or ("compiled" if run["compile"] else "eager")
        name = f"{run['model']} bf16 {switches}, vocab {run['vocab_size']:,}, {run['max_tokens']:,} tokens"
        if run["status"] != "ok":
            why = run.get("reason") or (f"stopped at its cap, {run['cap_s']} s" if run["status"] == "timed out"
                                        else "failed: see log_tail in the JSON record")
            rows.append(["train", name, run["status"], why, f"{run['seconds']:.0f} s" if "seconds" in run else "", "",
                         ""])
            continue
        first = f" (first step {run['warmup_step_seconds'][0]:.1f} s)" if run["warmup_step_seconds"] else ""
        speed = f"{run['tgt_tokens_per_s']:,.0f} target tokens/s, {1000 * run['step_seconds']['mean']:.1f} ms/step (mean)"
        rows.append(["train", name, "ok", speed, f"{run['seconds']:.0f} s{first}",
                     f"{100 * run['mfu']:.1f}% of {run['peak_tflops']:.3g} TFLOPS", mib(run["peak_memory_mb"])])
    users = record.get("users_command")
    if users:
        after = users.get("after_last_step") or {}
        speed = (f"{users['tgt_tokens_per_s']:,.0f} target tokens/s, {users.get('loop_over_bare') or '?'} of the bare "
                 "step's a padded token" if users.get("tgt_tokens_per_s") else "no progress line")
        what = f"the user's command, {users.get('steps')} steps, batches of {users.get('tokens_per_batch')}"
        rows.append(["users_command", what, users["status"], speed,
                     f"{users.get('wall_s', 0):.0f} s", "", ""])
        rows.append(["users_command", "after the last step", users["status"],
                     ", ".join(f"{key.removesuffix('_s').replace('_', ' ')} {value} s" for key, value in after.items()
                               if key.endswith("_s") and value is not None), "", "", ""])
    decode = record.get("decode")
    if decode:
        for name, engine in decode["engines"].items():
            same = engine["identical_to_ours_fp32"]
            figures = f"{engine['sentences_per_s']} sentences/s, {engine['tokens_per_s']:,.0f} tokens/s" \
                if engine["sentences"] else "no sentence within the cap"
            if name != "ours_fp32" and same is not None:
                figures += f"; identical to ours fp32: {same}/{engine['sentences']}"
            rows.append(["decode", name.replace("_", " "), decode["status"], figures, f"{engine['seconds']:.1f} s", "",
                         mib(engine.get("peak_memory_mb"))])
        rows += [["decode", name.replace("_", " "), "skipped", reason[:120], "", "", ""]
                 for name, reason in decode["skipped"].items()]
    return rows


def markdown(record: dict) -> str:
    """A dated section: date, commit, GPU, driver, CUDA, torch, CPU, the table, then notes."""
    m = record["machine"]
    gpu = m.get("gpu") or "no GPU (device cpu)"
    lines = [f"## {record['date']} · commit {record['commit']} · {gpu}{' · quick' if record['quick'] else ''}", ""]
    if "gpu" in m:
        lines.append(f"- GPU: {m['gpu']}, {m['gpu_memory_gib']} GiB, compute capability {m['compute_capability']}; "
                     f"driver {m['driver'] or '?'}; CUDA {m['cuda']}; torch {m['torch']}")
    else:
        lines.append(f"- device: cpu; torch {m['torch']}")
    caps = ", ".join(f"{part} (cap {cap:.0f} s)" for part, cap in record["caps_s"].items())
    flags = ", ".join(flag for flag, present in (m.get("cpu_flags") or {}).items() if present)
    lines += [f"- CPU: {m['cpu']}, {m['cores']} cores" + (f" ({flags})" if flags else "") + f"; Python {m['python']}",
              f"- parts: {caps}; {record['seconds']:.0f} s in all", "",
              "| part | run | status | result | time | MFU | peak memory |", "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in table_rows(record)]
    notes = [f"- failed: `{failure}`" for failure in (record.get("tests") or {}).get("failures", [])]
    for name, target in (record.get("targets") or {}).items():
        measured = target["measured"]
        shown = "not measured" if measured is None else f"{100 * measured:.1f}%" if "MFU" in name else f"{measured:.2f}"
        padded = target.get("measured_with_padding")
        if padded is not None and f"{100 * padded:.1f}" != f"{100 * measured:.1f}":
            shown += f" of real tokens ({100 * padded:.1f}% with the padded positions)"
        goal = f"{100 * target['target']:.0f}%" if "MFU" in name else f"{target['target']:.2f}"
        split = ""
        if target.get("time_split"):
            other = f" (in {target['time_split_run']})" if target["time_split_run"] != target["run"] else ""
            split = f"; {_time_split.describe(target['time_split'])}{other}"
        notes.append(f"- target {name} ≥ {goal}: {shown} ({target['run']}) — {'met' if target['met'] else 'missed'}"
                     f"{split}")
    if "gpu" in m:
        notes.append("- peak memory: torch.cuda.max_memory_allocated for training and for ours; for CTranslate2 the "
                     "device memory in use above what it was before it loaded; for the tests nvidia-smi's peak in use "
                     f"(all processes; {m.get('gpu_memory_used_mb_at_start') or '?'} MiB in use when the suite began)")
    for part in PARTS:
        if (record.get(part) or {}).get("device_peak_used_mb"):
            notes.append(f"- {part}: the GPU's peak memory in use (nvidia-smi, all processes): "
                         f"{mib(record[part]['device_peak_used_mb'])}")
    decode = record.get("decode")
    if decode and "sentences" in decode:
        same = decode.get("identical_ours_fp32_ctranslate2_float32")
        agree = (f" CTranslate2 float32 and ours fp32 give the same output for {same:,} of the "
                 f"{decode['engines']['ctranslate2_float32']['sentences']:,} sentences (each searched within its own "
                 "limit: CTranslate2 in groups of one limit, several calls a batch)"
                 if same is not None else " CTranslate2 float32 did not run, so there is no comparison with it")
        notes.append(f"- decode: {decode['sentences']:,} of {decode['sentences_total']:,} newstest2014 sentences, "
                     f"{decode['batches']} batches of at most {decode['max_tokens']:,} source tokens; random weights, "
                     f"so every output runs to input + 50.{agree}")
    return "\n".join(lines + ([""] + notes if notes else []) + ["", ""])


def keep_logs(work: Path, archive: Path) -> None:
    """Every log under the suite's work folder (the parts keep only their tails in the record), in ``archive``."""
    import tarfile

    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for log in sorted(work.rglob("*.log")):
            tar.add(log, arcname=str(log.relative_to(work)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_suite.py: no CUDA GPU here; torch {torch.__version__} sees none: run it on a GPU machine, "
              "or pass --device cpu", file=sys.stderr)
        return 2
    os.environ.setdefault("AIAYN_DATA_ROOT", str(_common.data_root()))
    root = Path(os.environ["AIAYN_DATA_ROOT"])
    missing = sorted({name for part in args.parts for name in NEEDED[part] if not (root / name).is_file()})
    if missing:
        print(f"gpu_suite.py: the data under AIAYN_DATA_ROOT={root} lack {len(missing)} of the files its parts read "
              f"({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}): set AIAYN_DATA_ROOT to a folder holding "
              "multi30k/ and wmt14/ (README's Install section)", file=sys.stderr)
        return 2
    started = time.monotonic()
    record = {"benchmark": "gpu_suite", "date": _common.now(), "commit": _common.commit(), "device": args.device,
              "quick": args.quick, "machine": machine(args.device), "peers": _common.peer_versions(),
              "parts": args.parts, "caps_s": {part: args.caps[part] for part in args.parts}}
    with tempfile.TemporaryDirectory(prefix="aiayn-gpu-suite-") as work:
        record.update(run_parts(args, Path(work), record))
        if args.keep_logs is not None:
            try:
                keep_logs(Path(work), args.keep_logs)
            except OSError as error:  # the record measured still goes where it goes
                print(f"gpu_suite.py: --keep-logs {args.keep_logs}: {error}; the logs were not kept", file=sys.stderr)
    record["seconds"] = round(time.monotonic() - started, 1)
    if not args.quick:
        record["targets"] = _gpu_parts.targets(record)
    record["peak_memory_mb"] = {part: {"device": record[part].get("device_peak_used_mb"),
                                       "torch": record[part].get("peak_memory_mb")} for part in args.parts}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / "gpu_suite.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    (args.out_dir / PARTIAL).unlink(missing_ok=True)  # the whole record is written
    table = markdown(record)
    md = args.out_dir / "gpu_suite.md"
    with open(md, "a", encoding="utf-8") as handle:
        if handle.tell() == 0:
            handle.write("# GPU suite\n\nWritten by `make gpu-check` (benchmarks/gpu_suite.py), newest last.\n\n")
        handle.write(table)
    print(table)
    failed = record.get("tests", {}).get("status") in ("failed", "error", "timed out") or \
        record.get("users_command", {}).get("status") in ("error", "timed out")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
