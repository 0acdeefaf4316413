"""benchmarks/decode_speed.py and benchmarks/side_by_side.py at tiny sizes, so that they keep
working (their figures come from full runs, never from here); run as ``__main__`` in this process
(tests.helpers.inprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool

TINY = ["--model", "small", *(f"--set=model.{setting}" for setting in ("n_layers=1", "d_model=32", "d_ff=64",
                                                                          "n_heads=2", "d_k=16", "d_v=16")),
        "--vocab-size", "1200", "--subword-vocab", "1000", "--threads", "1"]


def run(script: str, *args: str, data_root: Path, cache: Path) -> str:
    return run_tool(f"benchmarks/{script}", *args, data_root=data_root, cache_dir=cache).stdout


@pytest.mark.slow
def test_decode_speed_with_and_without_cache(tmp_path, data_root):
    out = tmp_path / "decode.jsonl"
    stdout = run("decode_speed.py", *TINY, "--sentences", "12", "--max-tokens", "150", "--max-len-offset", "4",
                 "--out", str(out), data_root=data_root, cache=tmp_path / "cache")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kv_cache"] for r in records] == [True, False]
    for record in records:
        assert record["sentences"] == 12 and record["sentences_per_second"] > 0 and record["tokens_per_second"] > 0
        assert record["same_outputs_with_and_without_cache"] is True
        assert record["settings"]["batches"] > 1 and record["settings"]["d_model"] == 32
        assert record["machine"]["cores"] and record["commit"]
        # random weights: nearly every output runs to input length + 4
        assert record["outputs_at_max_length"] >= 10
        assert record["mean_output_length"] > 4
    assert "cache speed-up" in stdout


@pytest.mark.slow
def test_side_by_side_measures_both_parts_against_both_peers(tmp_path, data_root):
    out = tmp_path / "side.jsonl"
    run("side_by_side.py", *TINY, "--train-steps", "2", "--train-max-tokens", "200", "--sentences", "6",
        "--max-tokens", "120", "--max-len-offset", "3", "--out", str(out), data_root=data_root, cache=tmp_path / "cache")
    records = {record["part"]: record for record in map(json.loads, out.read_text().splitlines())}
    training, decoding = records["training_step"], records["beam_search"]
    assert training["part"] == "training_step" and training["steps"] == 2 and training["target_tokens"] > 0
    # fairseq joins where it is installed (benchmarks/fairseq_peer.py), never as a dependency
    assert {"ours", "torch_nn_transformer"} <= set(training["tokens_per_second"]) <= {
        "ours", "torch_nn_transformer", "fairseq"}
    assert decoding["part"] == "beam_search" and decoding["sentences"] == 6
    assert set(decoding["sentences_per_second"]) == {"ours", "marian_mt"}
    assert decoding["ratio_ours_over_peer"] > 0 and 0 <= decoding["identical_outputs"] <= 6
    # Untrained weights: both searches generate (none ends every sentence at once).
    assert decoding["generated_tokens"]["ours"] > 6 and decoding["generated_tokens"]["marian_mt"] > 6


@pytest.mark.slow
def test_side_by_side_decodes_a_trained_model_with_every_engine(tiny_run, tmp_path, data_root):
    """Part (c) on the session's tiny Multi30k checkpoint: every engine, beam 4 and greedy, the
    same sentences, BLEU and speed per engine."""
    out = tmp_path / "trained.jsonl"
    run("side_by_side.py", "--part", "trained", "--checkpoint", str(tiny_run.last), "--sentences", "6",
        # α 20: the 4-step model's translations are otherwise all empty (see tests/decoding/test_translator.py)
        "--batch-size", "4", "--max-len-offset", "3", "--alpha", "20", "--threads", "1", "--out", str(out),
        data_root=data_root,
        cache=tiny_run.cache_dir)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    engines = {"ours", "ours_onednn", "ours_int8", "ours_onnxruntime", "ctranslate2_float32", "ctranslate2_int8"}
    for beam in (4, 1):
        runs = {r["engine"]: r for r in records if r["beam_size"] == beam}
        # greedy: one rule
        like_for_like = ({"ours_first_k", "ours_onednn_first_k", "ours_int8_first_k", "ours_onnxruntime_first_k"}
                         if beam > 1 else set())
        assert engines | like_for_like <= set(runs) <= engines | like_for_like | {"fairseq"}
        if beam > 1:
            assert runs["ours_first_k"]["identical_to_ours_first_k"] == 6 and runs["ours_first_k"]["stop"] == "first_k"
            assert runs["ours_onednn_first_k"]["stop"] == "first_k" and runs["ours_onednn"]["stop"] == "paper"
            assert runs["ours_onnxruntime_first_k"]["stop"] == "first_k" and runs["ours_onnxruntime"]["stop"] == "paper"
        for record in runs.values():
            assert record["sentences"] == 6 and record["sentences_per_second"] > 0 and record["step"] == 4
            assert 0 <= record["sacrebleu"] <= 100 and record["machine"]["cores"] and record["commit"]
            b = record["batch_sentences_per_second"]
            assert 0 < b["min"] <= b["median"] <= b["max"]
        assert runs["ours"]["identical_to_ours"] == 6 and runs["ours"]["generated_tokens"] > 0


@pytest.mark.slow
def test_stopping_rule_compares_both_rules_on_the_same_batches(tiny_run, tmp_path, data_root):
    out = tmp_path / "stop.jsonl"
    stdout = run("stopping_rule.py", "--checkpoint", str(tiny_run.last), "--sentences", "6", "--batch-size", "4",
                 "--out", str(out), data_root=data_root, cache=tiny_run.cache_dir)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["stop"] for r in records] == ["paper", "first_k"]
    for record in records:
        assert record["sentences"] == 6 and record["sentences_per_second"] > 0 and record["threads"] == 1
        assert record["hypothesis_steps_per_sentence"] >= 4  # one step at least, of a beam of 4
        assert 0 <= record["chrf"] <= 100 and record["machine"]["cpu"]
    assert records[0]["identical_to_paper"] == 6
    assert "stop=first_k" in stdout
