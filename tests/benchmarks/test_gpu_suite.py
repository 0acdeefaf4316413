"""benchmarks/gpu_suite.py (``make gpu-check``) run for real in ``--device cpu --quick`` mode: every
part end to end (the gpu-marked tests collected, a tiny bf16 training run through
train_throughput.py, beam search by ours and by CTranslate2 on the CPU) into a scratch folder, so
that the suite works when a GPU machine is lent; its figures come from GPU runs, never from here.
And without a CUDA GPU and without ``--device cpu`` it refuses in one line. The suite itself runs
in this process (tests.helpers.inprocess); each of its parts is a process of its own, as always."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.inprocess import run_tool
from tests.helpers.preloaded import python_starts_preloaded
from tests.helpers.runs import REPO

SEARCH = {"beam_size": 4, "alpha": 0.6, "max_len_offset": 50}


# Caps no part reaches however loaded the machine is (the quick caps are sized for an idle one):
# what is tested is that every part runs and records, not how fast.
UNBOUND = [argument for part in ("tests", "train", "users_command", "decode") for argument in ("--cap", f"{part}=3600")]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory, data_root: Path):
    """One quick CPU run: (its output folder, the finished process)."""
    out = tmp_path_factory.mktemp("gpu-suite")
    with python_starts_preloaded():
        result = run_tool("benchmarks/gpu_suite.py", "--device", "cpu", "--quick", *UNBOUND, "--out-dir",
                          str(out / "results"), "--keep-logs", str(out / "results" / "logs.tar.gz"),
                          data_root=data_root, cache_dir=out / "cache")
    return out / "results", result


@pytest.mark.cli  # the suite's parts are processes of their own; -m 'not cli' skips them
@pytest.mark.slow  # the quick run: about half a minute on a 2-core CPU
def test_quick_cpu_run_writes_one_record_with_every_part(quick_run) -> None:
    results, _ = quick_run
    lines = (results / "gpu_suite.jsonl").read_text().splitlines()
    assert len(lines) == 1 and not (results / "gpu_suite.partial.json").exists()  # the whole record, not the parts'
    record = json.loads(lines[0])
    assert record["benchmark"] == "gpu_suite" and record["device"] == "cpu" and record["quick"] is True
    assert record["date"].startswith("20") and record["commit"] and record["machine"]["cores"]
    assert "gpu" not in record["machine"] and record["machine"]["torch"] == torch.__version__
    assert record["parts"] == ["tests", "train", "users_command", "decode"]
    assert set(record["caps_s"]) == set(record["parts"])
    assert record["seconds"] > 0 and record["caps_s"] == {part: 3600 for part in record["parts"]}
    assert set(record["peak_memory_mb"]) == set(record["parts"])
    assert record["peak_memory_mb"]["train"] == {"device": None, "torch": record["train"]["peak_memory_mb"]}
    for part in record["parts"]:  # every part ran within its cap and says how long it took
        assert record[part]["part_seconds"] <= record[part]["part_cap_s"]
        assert record[part]["device_peak_used_mb"] is None  # nvidia-smi's figure: GPU runs only

    tests = record["tests"]
    assert tests["status"] == "collected" and tests["collected"] > 0  # tests/gpu's tests, each gpu-marked
    assert tests["command"].startswith("python -m pytest -m gpu -ra") and "--collect-only" in tests["command"]

    train = record["train"]
    (run,) = train["runs"]  # a tiny model, eager only: compiling takes minutes on a CPU
    assert train["status"] == "ok" and any("compiled" in reason for reason in train["skipped"])
    assert run["status"] == "ok" and run["model"] == "tiny" and run["precision"] == "bf16" and not run["compile"]
    assert run["timed_steps"] == 2 and len(run["warmup_step_seconds"]) == 1
    assert run["tgt_tokens_per_s"] > 0 and 0 < run["tgt_tokens_per_step"] <= run["max_tokens"]
    assert run["mfu"] == pytest.approx(run["achieved_tflops"] / run["peak_tflops"], rel=0.02)
    assert run["peak_tflops_source"] == "measured bf16 matmul" and run["peak_memory_mb"] > 50
    assert list(run["step_seconds"]) == ["mean"] and run["step_seconds"]["mean"] > 0  # one wait: the mean alone
    split = run["time_split"]  # one more step under the profiler: where its time went
    assert split["device"] == "cpu" and split["busy_share"] is None  # no GPU to keep busy
    assert set(split["by_kind"]) == {"matmul", "attention", "loss", "optimizer", "other"}
    assert split["busy_s"] == pytest.approx(sum(split["by_kind"].values()), abs=1e-5) and split["by_kind"]["matmul"] > 0
    assert split["by_kind"]["loss"] > 0 and split["by_kind"]["optimizer"] > 0 and len(split["top"]) == 8
    # --quick keeps its tiny runs out of the records the training plan reads
    assert train["records_file"] is None and not (results / "train_throughput.jsonl").exists()

    users = record["users_command"]  # src/train.py itself on a miniature EN-FR tree (the tiny model with --quick)
    assert users["status"] == "ok" and users["returncode"] == 0 and users["steps"] == 4
    assert users["command"].startswith("python src/train.py debug=tiny") and "task=wmt_en_fr" in users["command"]
    assert users["plan"].startswith("plan: 1 CPU process") and users["tokens_per_batch"] == 1024
    assert [line["step"] for line in users["progress_lines"]] == [1, 2, 3, 4] and users["tgt_tokens_per_s"] > 0
    assert set(users["after_last_step"]) == {"validation_s", "checkpoint_s", "checkpoint_gb", "attention_pictures_s",
                                             "test_s"}
    assert all(value is not None and value >= 0 for value in users["after_last_step"].values())
    assert users["pictures"] == ["cross_layer1.png", "decoder_self_layer1.png", "encoder_self_layer1.png"]
    assert users["test_line"].startswith("test sacreBLEU on ")
    assert users["bare_step"]["tgt_tokens_per_s"] > 0 and users["loop_over_bare"] > 0
    # per padded token: the loop's real tokens over the bare step's, each over its batches' share of real tokens
    assert 0 <= users["padding"] < 1 and 0 <= users["bare_step"]["padding"] < 1
    assert users["loop_over_bare"] == pytest.approx(users["loop_over_bare_target_tokens"] * (
        1 - users["bare_step"]["padding"]) / (1 - users["padding"]), abs=2e-3)
    assert "targets" not in record  # judged on GPU records only
    import tarfile

    with tarfile.open(results / "logs.tar.gz") as logs:  # --keep-logs: every part's whole log, not its tail alone
        names = logs.getnames()
    assert {"pytest.log", "users_command.log", "decode.log"} <= set(names) and any("train" in n for n in names), names

    decode = record["decode"]
    assert decode["status"] == "ok" and decode["complete"] and decode["sentences"] == 16
    assert decode["search"] == SEARCH and decode["random_weights"] is True
    assert decode["model"]["vocab_size"] == decode["subword_vocab"] == 1000  # CTranslate2 needs them equal
    engines = decode["engines"]
    assert {"ours_fp32", "ours_bf16", "ctranslate2_float32"} <= set(engines)
    assert set(engines) | set(decode["skipped"]) == {"ours_fp32", "ours_bf16", "ctranslate2_float32",
                                                     "ctranslate2_bfloat16", "ctranslate2_float16"}
    for name, engine in engines.items():
        assert engine["sentences"] == 16 and engine["sentences_per_s"] > 0 and engine["tokens_per_s"] > 0, name
        # random weights: (nearly) every output runs to its maximum length, input + 50
        assert engine["outputs_at_max_length"] >= 14 and engine["generated_tokens"] > 16 * 50, name
    assert engines["ours_fp32"]["identical_to_ours_fp32"] == 16
    same = decode["identical_ours_fp32_ctranslate2_float32"]
    assert same == engines["ctranslate2_float32"]["identical_to_ours_fp32"] and 0 <= same <= 16


@pytest.mark.cli
@pytest.mark.slow
def test_quick_cpu_run_appends_a_dated_markdown_section(quick_run) -> None:
    results, process = quick_run
    text = (results / "gpu_suite.md").read_text()
    assert text.startswith("# GPU suite\n") and text.count("\n## ") == 1
    section = text[text.index("\n## ") + 1:]
    assert process.stdout.strip() == section.strip()  # the suite prints what it appends
    record = json.loads((results / "gpu_suite.jsonl").read_text())
    heading = section.splitlines()[0]
    assert heading == f"## {record['date']} · commit {record['commit']} · no GPU (device cpu) · quick"
    assert f"- device: cpu; torch {torch.__version__}" in section and f"{record['machine']['cores']} cores" in section
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table[0] == "| part | run | status | result | time | MFU | peak memory |"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]
    assert all(len(row) == 7 for row in rows)
    by_run = {(row[0], row[1]): row for row in rows}
    assert by_run[("tests", "pytest -m gpu --collect-only")][3] == f"{record['tests']['collected']} collected"
    train = by_run[("train", "tiny bf16 eager, vocab 1,000, 1,024 tokens")]
    assert train[2] == "ok" and re.match(r"[\d,]+ target tokens/s, [\d.]+ ms/step", train[3])
    assert re.match(r"[\d.]+% of [\d.e-]+ TFLOPS", train[5]) and train[6].endswith("MiB")
    for engine in ("ours fp32", "ours bf16", "ctranslate2 float32"):
        assert re.match(r"[\d.]+ sentences/s", by_run[("decode", engine)][3]), engine
    assert re.search(r"identical to ours fp32: \d+/16", by_run[("decode", "ctranslate2 float32")][3])
    assert "random weights, so every output runs to input + 50" in section
    assert re.search(r"CTranslate2 float32 and ours fp32 give the same output for \d+ of the 16 sentences \(each "
                     r"searched within its own limit", section)
    users = by_run[("users_command", "the user's command, 4 steps, batches of 1024")]
    assert users[2] == "ok" and re.match(r"[\d,]+ target tokens/s, [\d.]+ of the bare step's", users[3])
    assert re.match(r"validation [\d.]+ s, checkpoint [\d.]+ s, attention pictures [\d.]+ s, test [\d.]+ s",
                    by_run[("users_command", "after the last step")][3])


def test_each_target_is_set_beside_the_best_run_of_its_model_and_batch() -> None:
    """The targets of a GPU record: the best MFU of each model and batch over its switches, and the
    user's command over the bare step; a target without a run is not met and says so."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _gpu_parts
    import gpu_suite

    split = {"device": "cuda", "busy_s": 0.1, "busy_share": 0.64,
             "by_kind": {"matmul": 0.048, "attention": 0.007, "loss": 0.009, "optimizer": 0.005, "other": 0.031}}
    run = lambda label, mfu, padding=0.0, status="ok", profiled=False: {
        "run": label, "model": label.split()[0], "max_tokens": int(label.split()[1]), "mfu": mfu, "status": status,
        "mfu_real_tokens": mfu * (1 - padding), **({"time_split": split} if profiled else {})}
    record = {"train": {"runs": [run("big 25000", 0.31), run("big 3125", 0.11, profiled=True), run("big 3125 graphs", 0.27),
                                 run("base 3125", 0.03, profiled=True), run("base 3125 buckets", 0.2, padding=0.9),
                                 run("base 3125 graphs", 0.5, status="timed out")]},
              "users_command": {"loop_over_bare": 0.93}}
    found = _gpu_parts.targets(record)
    assert found["big 25000 MFU"] == {"target": 0.45, "measured": 0.31, "measured_with_padding": 0.31,
                                      "run": "big 25000", "met": False, "time_split": None, "time_split_run": None}
    # the best run was not profiled: the split is that of the run of its model and batch that was
    assert found["big 3125 MFU"] == {"target": 0.25, "measured": 0.27, "measured_with_padding": 0.27,
                                     "run": "big 3125 graphs", "met": True, "time_split": split,
                                     "time_split_run": "big 3125"}
    # a run's padded positions are not counted: 20% MFU of which 90% computed padding is 2% of real tokens
    assert found["base 3125 MFU"]["measured"] == 0.03 and found["base 3125 MFU"]["run"] == "base 3125"
    assert not found["base 3125 MFU"]["met"]
    assert found["train.py over the bare step"]["met"] is True
    assert _gpu_parts.targets({})["big 25000 MFU"] == {"target": 0.45, "measured": None, "measured_with_padding": None,
                                                       "run": None, "met": False, "time_split": None,
                                                       "time_split_run": None}
    shown = {"targets": found, "machine": {"cpu": "Xeon", "cores": 16, "python": "3.12", "torch": "2.11"},
             "date": "2026-12-01T00:00:00", "commit": "abc", "quick": False, "caps_s": {}, "seconds": 1.0}
    notes = gpu_suite.markdown(shown)
    assert "- target big 25000 MFU ≥ 45%: 31.0% (big 25000) — missed\n" in notes
    # a target's run that was profiled says where its step's time went
    assert ("- target base 3125 MFU ≥ 15%: 3.0% (base 3125) — missed; kernels busy 64% of the step; of that time: "
            "matmul 48%, attention 7%, loss 9%, optimizer 5%, other 31%\n") in notes
    assert "— met; kernels busy 64% of the step; of that time: matmul 48%, attention 7%, loss 9%, optimizer 5%, other " \
           "31% (in big 3125)\n" in notes
    assert "- target train.py over the bare step ≥ 0.90: 0.93 (users_command) — met" in notes
    padded = {**found, "base 3125 MFU": _gpu_parts.targets(
        {"train": {"runs": [run("base 3125 buckets", 0.2, padding=0.25)]}})["base 3125 MFU"]}
    assert ("- target base 3125 MFU ≥ 15%: 15.0% of real tokens (20.0% with the padded positions) (base 3125 buckets) "
            "— met\n") in gpu_suite.markdown({**shown, "targets": padded})


def test_a_steps_time_goes_to_the_innermost_operator_that_names_its_kind() -> None:
    """benchmarks/_time_split.py: an operator's own time goes to the kind of the innermost
    operator of its call chain that names one (the fused loss's copies are the loss's, a product
    in a backward node is a product, Adam's kernels the optimizer's), the rest to ``other``."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from _time_split import kind_of

    assert kind_of(["aten::copy_", "aten::_to_copy", "aten::to", "_FusedLabelSmoothedLoss"]) == "loss"
    assert kind_of(["aten::mm", "MmBackward0", "autograd::engine::evaluate_function: MmBackward0"]) == "matmul"
    assert kind_of(["aten::_efficient_attention_backward", "aten::_scaled_dot_product_efficient_attention_backward",
                    "ScaledDotProductEfficientAttentionBackward0"]) == "attention"
    assert kind_of(["aten::_fused_adam_", "Optimizer.step#Adam.step"]) == "optimizer"
    assert kind_of(["aten::mul", "aten::dropout", "aten::native_layer_norm"]) == "other"
    assert kind_of(["aten::add_", "aten::_foreach_add_"]) == "optimizer"


def test_a_gpu_record_without_ctranslate2_says_so_instead_of_a_comparison() -> None:
    """The first record kept (an H200, whose CUDA 13 image lacked the CUDA 12 cuBLAS that
    CTranslate2's wheel loads): its section names the failing engines and makes no comparison."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_suite

    record = json.loads((REPO / "benchmarks" / "results" / "gpu_suite.jsonl").read_text().splitlines()[0])
    assert record["device"] == "cuda" and record["machine"]["gpu"] == "NVIDIA H200"
    section = gpu_suite.markdown(record)
    assert section.startswith(f"## {record['date']} · commit {record['commit']} · NVIDIA H200\n")
    assert "| decode | ctranslate2 float32 | skipped | RuntimeError: Library libcublas.so.12" in section
    assert "CTranslate2 float32 did not run, so there is no comparison with it" in section and "?" not in section


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the suite runs instead of refusing")
def test_without_a_gpu_it_refuses_in_one_line(tmp_path: Path) -> None:
    result = run_tool("benchmarks/gpu_suite.py", "--out-dir", str(tmp_path / "results"), check=False, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_suite.py: no CUDA GPU here; ") and "--device cpu" in lines[0]
    assert result.stdout == "" and not (tmp_path / "results").exists()


def test_every_gpu_marked_test_is_where_the_suites_tests_part_runs_them() -> None:
    """The tests part runs ``pytest -m gpu tests/gpu`` (collecting the whole suite would take longer
    than the GPU tests run): a gpu-marked test elsewhere would never run on a GPU."""
    outside = [path for path in sorted((REPO / "tests").rglob("*.py"))
               if path.relative_to(REPO / "tests").parts[0] != "gpu" and path.resolve() != Path(__file__).resolve()]
    elsewhere = [path.relative_to(REPO) for path in outside if "mark.gpu" in path.read_text(encoding="utf-8")]
    assert elsewhere == []
    assert "mark.gpu" in (REPO / "tests" / "gpu" / "test_memory.py").read_text()  # what the scan looks for


def test_a_run_killed_after_a_part_leaves_that_parts_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_suite.partial.json holds the parts finished, rewritten after each, so that a run killed
    from outside (the machine's time spent) keeps them; a whole run leaves the full record alone."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _gpu_parts
    import gpu_suite

    def killed(*args):
        raise KeyboardInterrupt  # the train part never ends: the machine was taken back

    monkeypatch.setattr(_gpu_parts, "tests_part", lambda *args: {"status": "passed", "passed": 12})
    monkeypatch.setattr(_gpu_parts, "train_part", killed)
    args = gpu_suite.parse_args(["--device", "cpu", "--parts", "tests,train", "--out-dir", str(tmp_path / "out")])
    with pytest.raises(KeyboardInterrupt):
        gpu_suite.run_parts(args, tmp_path, {"benchmark": "gpu_suite", "commit": "abc"})
    kept = json.loads((tmp_path / "out" / "gpu_suite.partial.json").read_text())
    assert kept["benchmark"] == "gpu_suite" and kept["commit"] == "abc" and "train" not in kept
    assert kept["tests"]["status"] == "passed" and kept["tests"]["passed"] == 12 and kept["tests"]["part_seconds"] >= 0


def test_data_the_parts_read_missing_is_refused_in_one_line_before_any_part_runs(tmp_path: Path) -> None:
    """A GPU machine given the checkout alone (the data folder beside it stays behind): every part failed within
    seconds and the suite recorded nothing measured; it now says what is missing, exit 2, before any part runs."""
    (tmp_path / "wmt14").mkdir()
    result = run_tool("benchmarks/gpu_suite.py", "--device", "cpu", "--quick", "--parts", "decode", "--out-dir",
                      str(tmp_path / "results"), data_root=tmp_path, check=False)
    assert result.returncode == 2 and not (tmp_path / "results").exists()
    assert result.stderr.splitlines() == [(
        f"gpu_suite.py: the data under AIAYN_DATA_ROOT={tmp_path} lack 5 of the files its parts read (wmt14/newstest2013"
        ".de, wmt14/newstest2013.en, wmt14/newstest2014-en-de.en, …): set AIAYN_DATA_ROOT to a folder holding multi30k/ "
        "and wmt14/ (README's Install section)")]


def test_the_commit_recorded_is_aiayn_commit_where_it_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the working tree on another machine has no git history of its own (or an older one's)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import _common

    monkeypatch.setenv("AIAYN_COMMIT", "abc1234")
    assert _common.commit() == "abc1234"
    monkeypatch.delenv("AIAYN_COMMIT")
    if (REPO / ".git").exists():  # a checkout with its history (a copy without one records none: below)
        assert _common.commit() != "abc1234" and _common.commit()  # this checkout's own
    monkeypatch.setenv("PATH", "")  # no git: no commit, rather than a crash before any part runs
    assert _common.commit() == ""


@pytest.mark.cli  # make's own process
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed here")
def test_make_gpu_check_with_a_python_of_its_own_installs_nothing() -> None:
    """A GPU node without internet, aiayn installed from `make wheelhouse`'s wheels: `make gpu-check
    GPU_PYTHON=python3` runs the suite with that Python, where the target installed .venv from the index first."""
    import subprocess

    # make's own variables, as `make test` hands them to its pytest, and the Makefile's, left out: a plain `make`
    env = {key: value for key, value in os.environ.items()
           if key not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "GPU_PYTHON", "GPU_CHECK_ARGS", "VENV")}

    def planned(*variables: str) -> list[str]:
        return subprocess.run(["make", "--no-print-directory", "-n", "-B", "gpu-check", *variables], cwd=REPO, env=env,
                              capture_output=True, text=True, check=True).stdout.splitlines()

    assert planned("GPU_PYTHON=python3", "GPU_CHECK_ARGS=--quick") == ["python3 benchmarks/gpu_suite.py --quick"]
    default = planned()
    assert any("pip install" in line for line in default) and default[-1] == ".venv/bin/python benchmarks/gpu_suite.py "
