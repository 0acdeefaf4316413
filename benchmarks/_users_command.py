"""The user's command as a user runs it, measured: ``python src/train.py model=big task=wmt_en_fr``
on a miniature WMT14 EN-FR raw tree (:func:`build_en_fr_tree`), for ``--steps`` steps, then what
follows the last step — validation, the checkpoint, the attention pictures, the test on
newstest2014 — each timed from train.log; and beside it the bare step
(benchmarks/train_throughput.py) of the same model, vocabulary, batch and sentence lengths, so that
the loop's own cost shows. Run by benchmarks/gpu_suite.py (the ``users_command`` part).
``loop_over_bare`` compares them per padded token, the work a step does: the loop's batches, cut
from the tree's 6,003 pairs, pad more than the bare step's, cut from a million (about 25% against
1% at 25,000 tokens), so that its real target tokens a second would fall short of the bare step's
with no cost of its own (``loop_over_bare_target_tokens``, the plain ratio, beside it).

    python benchmarks/_users_command.py --json OUT [--device cuda|cpu] [--quick] [--steps 100]

The tree: newstest2013 and newstest2014's 6,003 EN-FR pairs split over the five EN-FR training
corpora as WMT's archives lay them out, newstest2013 as the dev set and newstest2014's sgm as the
test set (the model is trained on its test set: this measures time, not BLEU). The subword model is
8,000 pieces (the tree cannot hold the paper's 32,000); the network is the big model's.
``--quick``: the tiny model for 4 steps on the CPU, a check that the part runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import _common

from aiayn.files import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CORPORA = ("training/europarl-v7.fr-en", "commoncrawl.fr-en", "training/news-commentary-v9.fr-en",
           "un/undoc.2000.fr-en", "giga-fren.release2.fixed")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[([^\]]+)\]\[\w+\] - (.*)$")


def build_en_fr_tree(data_root: Path, root: Path) -> Path:
    """A miniature WMT14 EN-FR raw tree in the layout of WMT's archives, from the shared files."""
    wmt = data_root / "wmt14"
    pairs = {lang: (wmt / f"newstest2013.{lang}").read_text(encoding="utf-8").splitlines()
             + (wmt / f"newstest2014-en-fr.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "fr")}
    share = -(-len(pairs["en"]) // len(CORPORA))
    for number, stem in enumerate(CORPORA):
        for lang, lines in pairs.items():
            path = root / f"{stem}.{lang}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{line}\n" for line in lines[number * share:(number + 1) * share]), encoding="utf-8")
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for lang in ("en", "fr"):
        shutil.copyfile(wmt / f"newstest2013.{lang}", root / "dev" / f"newstest2013.{lang}")
    (root / "test-full").mkdir(parents=True, exist_ok=True)
    for name in ("newstest2014-fren-src.en.sgm", "newstest2014-fren-ref.fr.sgm"):
        shutil.copyfile(wmt / "sgm" / name, root / "test-full" / name)
    return root


def log_lines(path: Path) -> list[tuple[float, str, str]]:
    """(time, logger, message) of each line of a train.log; a message's continuation lines joined."""
    found: list[tuple[float, str, str]] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = STAMP.match(line)
        if match:
            when = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append((when, match[2], match[3]))
        elif found:
            found[-1] = (found[-1][0], found[-1][1], found[-1][2] + "\n" + line)
    return found


def first(lines: list[tuple[float, str, str]], pattern: str) -> tuple[float, re.Match] | None:
    for when, _, message in lines:
        match = re.search(pattern, message)
        if match:
            return when, match
    return None


def what_the_log_says(run: Path, steps: int) -> dict:
    """The plan, the loop's target tokens/s (its progress lines after the first tenth of the steps),
    and how long each thing after the last step took."""
    lines = log_lines(run / "train.log")
    plan = first(lines, r"^plan: ")
    batch = first(lines, r"× (\d+) (?:accumulated batches|batch) of ([\d,]+) tokens")
    padding = first(lines, r"([\d.]+)% of their tokens are padding")
    progress = [(when, int(m[1]), float(m[2].replace(",", ""))) for when, _, message in lines
                for m in [re.match(r"step (\d+)/\d+ \|.*\| ([\d,.]+) tok/s", message)] if m]
    settled = [rate for _, step, rate in progress if step > max(1, steps // 10)]
    last_step = next((when for when, step, _ in progress if step == steps), None)
    validation = first(lines, rf"^validation at step {steps}\b")
    pictures = first(lines, r"^attention pictures of ")
    summary = first(lines, r"^run summary in ")
    test = first(lines, r"^test (?:sacreBLEU|F1|\S+ on)")
    checkpoint = run / "checkpoints" / "last.ckpt"
    saved = checkpoint.stat().st_mtime if checkpoint.is_file() else None
    after = {"validation_s": validation[0] - last_step if validation and last_step else None,
             "checkpoint_s": saved - validation[0] if saved and validation else None,
             "checkpoint_gb": round(checkpoint.stat().st_size / 1e9, 2) if saved else None,
             "attention_pictures_s": pictures[0] - saved if pictures and saved else None,
             "test_s": test[0] - (summary or pictures)[0] if test and (summary or pictures) else None}
    return {"plan": plan[1].string if plan else None,
            "accumulate": int(batch[1][1]) if batch else None,
            "tokens_per_batch": int(batch[1][2].replace(",", "")) if batch else None,
            "padding": float(padding[1][1]) / 100 if padding else None,  # of the training batches' tokens
            "tgt_tokens_per_s": statistics.median(settled) if settled else None,
            "progress_lines": [{"step": step, "tok_s": rate} for _, step, rate in progress],
            "after_last_step": {key: round(value, 1) if isinstance(value, float) else value for key, value in after.items()},
            "pictures": sorted(path.name for path in (run / "attention").glob("*.png")),
            "test_line": test[1].string if test else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--work", type=Path, default=None, help="a folder for the tree, the cache and the run")
    args = parser.parse_args(argv)
    steps = args.steps or (4 if args.quick else 100)
    data_root = _common.data_root()
    work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"aiayn-users-command-{os.getpid()}"
    tree, run, cache = build_en_fr_tree(data_root, work / "raw"), work / "run", work / "cache"
    env = {**os.environ, "AIAYN_CACHE_DIR": str(cache), "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    model = ["debug=tiny", "task.vocab_size=500"] if args.quick else ["model=big", "task.vocab_size=8000"]
    hardware = ["hardware=cpu"] if args.device == "cpu" else []
    command = [PYTHON, "src/train.py", *model, "task=wmt_en_fr", *hardware, f"task.raw_dir={tree}",
               "task.datamodule.download=false", "logger=csv", f"optim.train_steps={steps}",
               f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=2", "validation.bleu_sentences=32",
               f"checkpoint.every_n_train_steps={steps}",
               f"callbacks.progress_log.every_n_steps={max(1, steps // 10)}", f"hydra.run.dir={run}"]
    started = time.monotonic()
    with open(work / "train.out", "w", encoding="utf-8") as out:
        returncode = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    record = {"command": " ".join(["python", *command[1:]]).replace(str(work), "<work>"), "returncode": returncode,
              "wall_s": round(time.monotonic() - started, 1), "steps": steps}
    if (run / "train.log").is_file():
        record.update(what_the_log_says(run, steps))
    if returncode != 0:
        record["log_tail"] = (work / "train.out").read_text(errors="replace")[-1500:]
    atomic_write_text(args.json, json.dumps(record, indent=2))  # kept if the suite's cap ends the bare step below
    subwords = sorted(cache.rglob("*.model"))
    if returncode == 0 and record.get("tokens_per_batch") and subwords:  # the bare step of the same batches
        bare_out = work / "bare.jsonl"
        bare = [PYTHON, "benchmarks/train_throughput.py", "--model", "small" if args.quick else "big",
                *([] if args.quick else ["--set", "model.dropout=0.1"]), "--device", args.device,
                "--precision", "fp32" if args.device == "cpu" else "bf16", "--vocab-size", "500" if args.quick else "8000",
                "--max-tokens", str(record["tokens_per_batch"]), "--subwords", str(subwords[0]), "--pair", "en-fr",
                "--warmup-steps", "1" if args.quick else "3", "--steps", "2" if args.quick else "15",
                "--out", str(bare_out)]
        if args.quick:
            bare += ["--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.d_ff=64",
                     "--set", "model.n_heads=2", "--set", "model.d_k=16", "--set", "model.d_v=16", "--threads", "1"]
        done = subprocess.run(bare, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if done.returncode == 0 and bare_out.is_file():
            measured = json.loads(bare_out.read_text().splitlines()[-1])
            record["bare_step"] = {"tgt_tokens_per_s": measured["tgt_tokens_per_s"], "mfu": measured["mfu"],
                                   "step_seconds": measured["step_seconds"]["mean"],
                                   "peak_memory_mb": measured["peak_memory_mb"],
                                   "padding": measured["padding"]["sampler"]}
            if record.get("tgt_tokens_per_s"):
                raw = record["tgt_tokens_per_s"] / measured["tgt_tokens_per_s"]
                record["loop_over_bare_target_tokens"] = round(raw, 3)
                if record.get("padding") is not None:  # per padded token: the same work a token on both sides
                    record["loop_over_bare"] = round(raw * (1 - measured["padding"]["sampler"]) / (1 - record["padding"]), 3)
        else:
            record["bare_step"] = {"error": (done.stderr or done.stdout)[-800:]}
    atomic_write_text(args.json, json.dumps(record, indent=2))  # whole or not at all: the cap may end this process
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
