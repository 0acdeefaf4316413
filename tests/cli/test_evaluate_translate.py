"""src/evaluate.py and src/translate.py end to end on the session's tiny trained run (the
`tiny_run` fixture of tests/conftest.py; real data, real sentencepiece, real sacreBLEU), in this
process (tests.helpers.inprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun


@pytest.mark.slow
def test_evaluate_writes_hypotheses_and_reports_both_bleus(tiny_run: TrainedRun, data_root: Path,
                                                           tmp_path: Path) -> None:
    from aiayn.metrics.bleu import sacrebleu_score, tokenized_bleu

    ckpt, cache = tiny_run.last, tiny_run.cache_dir
    out = tmp_path / "eval"
    result = run_tool("src/evaluate.py", f"ckpt={ckpt}", "split=test", f"out={out}", "wandb=offline",
                 data_root=data_root, cache_dir=cache)
    for label in ("sacreBLEU", "tokenized BLEU", "perplexity", "sentences/s", "nrefs:1|case:mixed"):
        assert label in result.stdout, result.stdout
    report = json.loads(next(out.glob("test_2016_flickr.step*.json")).read_text())
    hypotheses = Path(report["hypotheses"]).read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hypotheses) == report["sentences"] == 1000
    references = [line.rstrip("\n") for line in
                  __import__("gzip").open(data_root / "multi30k" / "test_2016_flickr.de.gz", "rt", encoding="utf-8")]
    # The figures are those of the hypotheses file against the references.
    assert report["test/bleu"] == pytest.approx(sacrebleu_score(hypotheses, references).score)
    assert report["test/tokenized_bleu"] == pytest.approx(tokenized_bleu(hypotheses, references, "de").score)
    assert report["test/ppl"] > 1 and report["ppl_tokens"] > 10_000
    assert report["test/sentences_per_sec"] > 0 and report["decoding"]["beam_size"] == 4
    assert list(out.glob("wandb/offline-run-*"))


def test_evaluate_with_averaging_and_bad_checkpoint(tiny_run: TrainedRun, data_root: Path, tmp_path: Path) -> None:
    ckpt, cache = tiny_run.last, tiny_run.cache_dir
    step_ckpt = max(ckpt.parent.glob("step*.ckpt"))
    result = run_tool("src/evaluate.py", f"ckpt={step_ckpt}", "split=val", "average_last=2", f"out={tmp_path}",
                 "wandb=disabled", data_root=data_root, cache_dir=cache)
    assert "average of 2 checkpoints" in result.stdout
    assert len(next(tmp_path.glob("val.step*.avg2.hyp.de")).read_text().splitlines()) == 1014

    bad = tmp_path / "not_a.ckpt"
    bad.write_text("hello")
    result = run_tool("src/evaluate.py", f"ckpt={bad}", data_root=data_root, cache_dir=cache, check=False)
    assert result.returncode == 2
    assert "not a readable checkpoint" in result.stderr and "Traceback" not in result.stderr


def test_evaluate_on_another_test_set_of_the_task(tiny_run: TrainedRun, data_root: Path, tmp_path: Path) -> None:
    ckpt, cache = tiny_run.last, tiny_run.cache_dir
    run_tool("src/evaluate.py", f"ckpt={ckpt}", "task=multi30k_en_de", "split=test_2017_mscoco", "decoding.beam_size=2",
        f"out={tmp_path}", "wandb=disabled", data_root=data_root, cache_dir=cache)
    report = json.loads(next(tmp_path.glob("test_2017_mscoco.step*.json")).read_text())
    assert report["sentences"] == 461 and report["decoding"]["beam_size"] == 2

    result = run_tool("src/evaluate.py", f"ckpt={ckpt}", "task=multi30k_de_en", f"out={tmp_path}", "wandb=disabled",
                 data_root=data_root, cache_dir=cache, check=False)
    assert result.returncode == 2 and ("was trained on task multi30k_en_de, which translates en→de, but task "
                                       "multi30k_de_en translates de→en") in result.stderr


def test_translate_keeps_order_empty_lines_and_truncates(tiny_run: TrainedRun, data_root: Path, tmp_path: Path) -> None:
    ckpt, cache = tiny_run.last, tiny_run.cache_dir
    lines = ["A man is riding a bike.", "", "Two dogs play in the snow.", " ".join(["word"] * 400),
             "A woman sings."]
    source = tmp_path / "in.en"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_tool("src/translate.py", f"ckpt={ckpt}", f"input={source}", f"output={tmp_path / 'out.de'}",
                 "decoding.beam_size=2", data_root=data_root, cache_dir=cache)
    translations = (tmp_path / "out.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(translations) == len(lines)
    assert translations[1] == ""
    assert "truncated" in result.stderr

    # Order: each line alone (through stdin) gives the line the batch gave at its position.
    for i in (0, 2, 4):
        alone = run_tool("src/translate.py", f"ckpt={ckpt}", "decoding.beam_size=2", stdin=lines[i] + "\n", data_root=data_root,
                    cache_dir=cache)
        assert alone.stdout == translations[i] + "\n"

    # out=- is stdout, as Unix tools read it: no file named "-".
    dashed = run_tool("src/translate.py", f"ckpt={ckpt}", f"input={source}", "out=-", "decoding.beam_size=2",
                      cwd=tmp_path, data_root=data_root, cache_dir=cache)
    assert dashed.stdout.split("\n")[:-1] == translations and not (tmp_path / "-").exists()


@pytest.mark.slow
def test_evaluate_decodes_in_bf16_on_the_cpu_into_a_report_of_its_own(tiny_run: TrainedRun, data_root: Path,
                                                                     tmp_path: Path) -> None:
    """precision=bf16, the GPU's decoding switch, run on the CPU (torch computes bf16 there too):
    the split is decoded whole and scored, the report is kept apart from fp32's, and the outputs
    are mostly fp32's. (α 20: a length reward that makes the 4-step model write words at all.)"""
    ckpt, cache = tiny_run.last, tiny_run.cache_dir
    reports = {}
    for precision in ("fp32", "bf16"):
        run_tool("src/evaluate.py", f"ckpt={ckpt}", "split=test_2017_mscoco", f"precision={precision}",
                 "decoding.alpha=20", f"out={tmp_path / precision}", "wandb=disabled", data_root=data_root,
                 cache_dir=cache)
        (path,) = (tmp_path / precision).glob("test_2017_mscoco.*.json")
        reports[precision] = json.loads(path.read_text())
        assert path.name.endswith(".bf16.json") == (precision == "bf16")  # kept apart from fp32's report
    outputs = {key: Path(report["hypotheses"]).read_text(encoding="utf-8").splitlines()
               for key, report in reports.items()}
    assert reports["bf16"]["speed_switches"]["precision"] == "bf16" and reports["bf16"]["sentences"] == 461
    assert len(outputs["bf16"]) == 461 and all(outputs["bf16"]), "every sentence translated, none empty"
    same = sum(a == b for a, b in zip(outputs["fp32"], outputs["bf16"]))
    assert same >= 0.5 * 461, f"{same} of 461 outputs as fp32's"


def test_translate_averages_the_last_checkpoints_as_average_py_does(tiny_run: TrainedRun, data_root: Path,
                                                                   tmp_path: Path) -> None:
    """average_last=k, as evaluate.py and export.py take it: the translations of the average made
    as the checkpoint loads are those of average.py's file; with an ensemble it is refused."""
    cache, source = tiny_run.cache_dir, tmp_path / "in.en"
    source.write_text("A man is riding a bike.\nTwo dogs play in the snow.\n\nA woman sings.\n", encoding="utf-8")
    settings = ["decoding.beam_size=2", "decoding.max_len_offset=5", "device=cpu", f"input={source}"]
    averaged = tmp_path / "averaged.ckpt"
    run_tool("src/average.py", f"ckpt={tiny_run.last}", "average_last=2", f"out={averaged}", data_root=data_root,
             cache_dir=cache)
    made = [run_tool("src/translate.py", *ckpt, *settings, f"out={tmp_path / name}", data_root=data_root,
                     cache_dir=cache) and (tmp_path / name).read_text(encoding="utf-8")
            for name, ckpt in (("loaded.de", [f"ckpt={tiny_run.last}", "average_last=2"]),
                               ("file.de", [f"ckpt={averaged}"]))]
    assert made[0] == made[1] and made[0].count("\n") == 4
    refused = run_tool("src/translate.py", f"ckpt={tiny_run.last},{tiny_run.last}", "average_last=2", *settings,
                       data_root=data_root, cache_dir=cache, check=False)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "translate.py: average_last=2 averages one checkpoint with those before it; give one checkpoint, or average "
        "each first (src/average.py) and give the averages as ckpt=a.ckpt,b.ckpt")  # as evaluate.py and aiayn.load
