"""benchmarks/wmt_data.py at a very small size, so that the benchmark keeps working (its
figures come from the full run, never from here)."""

from __future__ import annotations

import importlib.util

from tests.helpers.runs import REPO


def _benchmark():
    spec = importlib.util.spec_from_file_location("wmt_data_benchmark", REPO / "benchmarks" / "wmt_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_runs_at_a_tiny_size(tmp_path):
    bench = _benchmark()
    raw = bench.make_raw_tree(tmp_path / "raw", 1500, fragments=300)
    en = (raw / "training" / "europarl-v7.de-en.en").read_text(encoding="utf-8").splitlines()
    de = (raw / "training" / "europarl-v7.de-en.de").read_text(encoding="utf-8").splitlines()
    assert len(en) == len(de) == 600 and all(en)

    prepare = bench.bench_prepare(raw, tmp_path / "cache", vocab_size=300, sample_pairs=1000, workers=2)
    assert prepare["pairs_read"] == 1500
    empty = sum(not line for stem in ("training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v9.de-en")
                for line in (raw / f"{stem}.de").read_text(encoding="utf-8").split("\n")[:-1])
    assert prepare["pairs_kept"] == 1500 - empty
    assert prepare["prepare_pairs_per_second"] > 0 and prepare["subword_tokens"]["src"] > 1500

    loader = bench.bench_loader(raw, tmp_path / "cache", 300, 1000, max_tokens=2048, seconds=0.5)
    assert 0 < loader["train_pairs"] <= prepare["pairs_kept"]
    assert loader["batches_timed"] >= 1 and loader["real_tokens_per_second"] > 0
    assert 0 <= loader["padding_fraction"] < 0.5
    assert loader["rss_mib_opened"]["VmRSS"] > 0
