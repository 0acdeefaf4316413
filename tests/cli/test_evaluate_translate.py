"""src/evaluate.py and src/translate.py end to end on a tiny model trained here (real data,
real sentencepiece, real sacreBLEU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_train import REPO, TINY


def run(script: str, *args: str, data_root: Path, cache_dir: Path, stdin: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(cache_dir), "WANDB_MODE": "offline",
           "WANDB_SILENT": "true"}
    result = subprocess.run([sys.executable, script, *args], cwd=REPO, env=env, input=stdin, capture_output=True,
                            text=True, timeout=600)
    if check:
        assert result.returncode == 0, f"{script} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> tuple[Path, Path]:
    """A checkpoint of a tiny model trained for a few steps, and the cache it used."""
    root = tmp_path_factory.mktemp("evaluate")
    run("src/train.py", *TINY, "logger=none", "visualize_at_end=false", f"hydra.run.dir={root / 'run'}",
        data_root=data_root, cache_dir=root / "cache")
    return root / "run" / "checkpoints" / "last.ckpt", root / "cache"


def test_evaluate_writes_hypotheses_and_reports_both_bleus(trained, data_root: Path, tmp_path: Path) -> None:
    from aiayn.metrics.bleu import sacrebleu_score, tokenized_bleu

    ckpt, cache = trained
    out = tmp_path / "eval"
    result = run("src/evaluate.py", f"ckpt={ckpt}", "split=test", f"out_dir={out}", "wandb=offline",
                 data_root=data_root, cache_dir=cache)
    for label in ("sacreBLEU", "tokenized BLEU", "perplexity", "sentences/s", "nrefs:1|case:mixed"):
        assert label in result.stdout, result.stdout
    report = json.loads(next(out.glob("test_2016_flickr.step*.json")).read_text())
    hypotheses = Path(report["hypotheses"]).read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hypotheses) == report["sentences"] == 1000
    references = [line.rstrip("\n") for line in
                  __import__("gzip").open(data_root / "multi30k" / "test_2016_flickr.de.gz", "rt", encoding="utf-8")]
    # The figures are those of the hypotheses file against the references.
    assert report["test/sacrebleu"] == pytest.approx(sacrebleu_score(hypotheses, references).score)
    assert report["test/tokenized_bleu"] == pytest.approx(tokenized_bleu(hypotheses, references, "de").score)
    assert report["test/ppl"] > 1 and report["ppl_tokens"] > 10_000
    assert report["test/sentences_per_sec"] > 0 and report["decoding"]["beam_size"] == 4
    assert list(out.glob("wandb/offline-run-*"))


def test_evaluate_with_averaging_and_bad_checkpoint(trained, data_root: Path, tmp_path: Path) -> None:
    ckpt, cache = trained
    step_ckpt = sorted(ckpt.parent.glob("step*.ckpt"))[-1]
    result = run("src/evaluate.py", f"ckpt={step_ckpt}", "split=val", "average_last=2", f"out_dir={tmp_path}",
                 "wandb=disabled", data_root=data_root, cache_dir=cache)
    assert "average of 2 checkpoints" in result.stdout
    assert len(next(tmp_path.glob("val.step*.avg2.hyp.de")).read_text().splitlines()) == 1014

    bad = tmp_path / "not_a.ckpt"
    bad.write_text("hello")
    result = run("src/evaluate.py", f"ckpt={bad}", data_root=data_root, cache_dir=cache, check=False)
    assert result.returncode == 2
    assert "not a readable checkpoint" in result.stderr and "Traceback" not in result.stderr


def test_evaluate_on_another_test_set_of_the_task(trained, data_root: Path, tmp_path: Path) -> None:
    ckpt, cache = trained
    run("src/evaluate.py", f"ckpt={ckpt}", "task=multi30k_en_de", "split=test_2017_mscoco", "decoding.beam_size=2",
        f"out_dir={tmp_path}", "wandb=disabled", data_root=data_root, cache_dir=cache)
    report = json.loads(next(tmp_path.glob("test_2017_mscoco.step*.json")).read_text())
    assert report["sentences"] == 461 and report["decoding"]["beam_size"] == 2

    result = run("src/evaluate.py", f"ckpt={ckpt}", "task=multi30k_de_en", f"out_dir={tmp_path}", "wandb=disabled",
                 data_root=data_root, cache_dir=cache, check=False)
    assert result.returncode == 2 and "translates en→de but task multi30k_de_en is de→en" in result.stderr


def test_translate_keeps_order_empty_lines_and_truncates(trained, data_root: Path, tmp_path: Path) -> None:
    ckpt, cache = trained
    lines = ["A man is riding a bike.", "", "Two dogs play in the snow.", " ".join(["word"] * 400),
             "A woman sings."]
    source = tmp_path / "in.en"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run("src/translate.py", f"ckpt={ckpt}", f"input={source}", f"output={tmp_path / 'out.de'}",
                 "beam_size=2", data_root=data_root, cache_dir=cache)
    translations = (tmp_path / "out.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(translations) == len(lines)
    assert translations[1] == ""
    assert "truncated" in result.stderr

    # Order: each line alone (through stdin) gives the line the batch gave at its position.
    for i in (0, 2, 4):
        alone = run("src/translate.py", f"ckpt={ckpt}", "beam_size=2", stdin=lines[i] + "\n", data_root=data_root,
                    cache_dir=cache)
        assert alone.stdout == translations[i] + "\n"
