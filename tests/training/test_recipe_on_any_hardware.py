"""The GPU path as far as a CPU can exercise it, through src/train.py: bf16 mixed precision trains
and resumes exactly; four DDP processes on two nodes (gloo, ddp_spawn) train, validate, checkpoint
and resume exactly (to the summation order of the all-reduce); and the same recipe step trained as
1 process × 2 accumulated batches or as 2 processes × 1 batch (plain ddp, as an 8-GPU node trains)
ends with the same weights — the recipe does not change with the hardware, only the time. Both
DDP runs test §6.1's average after training.

Each run is a real process (DDP needs them), tiny and short: the tiny model, 4 steps of ≤1,024
tokens, one validation batch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.logged import logged_losses, progress_losses
from tests.helpers.runs import REPO, TINY, TWO_CORES, offline_environment, popen, train

pytestmark = pytest.mark.cli  # end-to-end runs of src/train.py; -m 'not cli' skips them

RUN = [*TINY, "logger=none", "visualize_at_end=false", "test_after_training=false",
       "trainer.limit_val_batches=1", "validation.bleu_sentences=8", "trainer.enable_progress_bar=false"]


# A window of §6.1 over the last 2 of the 4 steps, and the test after training that averages it.
AVERAGED_TEST = ["checkpoint.average_last=2", "checkpoint.average_every_n_steps=2", "test_after_training=true",
                 "trainer.limit_test_batches=1"]


def _environment(data_root: Path, cache: Path) -> dict[str, str]:
    return {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(cache),
            "OMP_NUM_THREADS": "1"}


def _state(checkpoint: Path) -> dict:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)


def _assert_same_training_state(a: Path, b: Path, atol: float = 0.0) -> None:
    """The weights and Adam's moments of two checkpoints, bit for bit (``atol`` 0) or within ``atol``."""
    first, second = _state(a), _state(b)
    assert first["global_step"] == second["global_step"]
    same = (lambda x, y: torch.equal(x, y)) if atol == 0 else (lambda x, y: torch.allclose(x, y, rtol=0, atol=atol))
    for name, tensor in first["state_dict"].items():
        assert same(tensor, second["state_dict"][name]), name
    moments_a, moments_b = first["optimizer_states"][0]["state"], second["optimizer_states"][0]["state"]
    assert moments_a.keys() == moments_b.keys()
    for index, moments in moments_a.items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert same(moments[key], moments_b[index][key]), (index, key)


@pytest.mark.slow
def test_bf16_mixed_precision_on_the_cpu_trains_and_resumes_exactly(tmp_path: Path, data_root: Path,
                                                                   subword_cache: Path) -> None:
    env = _environment(data_root, subword_cache)
    bf16 = [*RUN, "trainer.precision=bf16-mixed"]
    train(tmp_path / "whole", *bf16, env=env, timeout=300)
    train(tmp_path / "cut", *bf16, "optim.train_steps=2", env=env, timeout=300)  # stops after step 2
    resumed = train(tmp_path / "cut", *bf16, "resume=auto", env=env, timeout=300)
    assert "resuming from" in resumed.stdout + resumed.stderr
    saved = _state(tmp_path / "whole" / "checkpoints" / "last.ckpt")
    assert saved["hyper_parameters"]["run_config"]["plan"]["trainer"]["precision"] == "bf16-mixed"
    assert saved["global_step"] == 4
    _assert_same_training_state(tmp_path / "whole" / "checkpoints" / "step0000004.ckpt",
                                tmp_path / "cut" / "checkpoints" / "step0000004.ckpt")
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["dev/step"] == 4 and summary["dev/ppl"] > 1  # validated at the end, after the resume


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _two_nodes(run_dir: Path, env: dict[str, str], *overrides: str) -> list[str]:
    """One job of 2 nodes × 2 CPU processes (gloo), its two nodes started on this machine as a
    cluster starts them: the same command with NODE_RANK 0 and 1 and the master's address."""
    port = str(_free_port())
    command = [sys.executable, "src/train.py", *RUN, "trainer.accelerator=cpu", "trainer.devices=2",
               "trainer.num_nodes=2", "trainer.strategy=ddp_spawn", f"hydra.run.dir={run_dir}", *overrides]
    nodes = [popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                   env={**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(rank)})
             for rank in (0, 1)]
    outputs = [node.communicate(timeout=420)[0] for node in nodes]
    for rank, (node, output) in enumerate(zip(nodes, outputs)):
        assert node.returncode == 0, f"node {rank} exited with {node.returncode}:\n{output[-4000:]}"
    assert "GLOBAL_RANK: 3, MEMBER: 4/4" in outputs[1], outputs[1][-3000:]
    return outputs


@pytest.mark.slow
@TWO_CORES  # two processes a node
def test_four_ddp_processes_on_two_nodes_train_validate_checkpoint_and_resume_exactly(
        tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    env = _environment(data_root, subword_cache)
    # §6.1's last 2 checkpoints, steps 2 and 4 (saved either way), averaged for the test: rank 0
    # reads them and the 4 ranks test the average (aiayn.cli.weights_tested)
    outputs = _two_nodes(tmp_path / "whole", env, *AVERAGED_TEST)
    assert "(§6.1: the average of the last 2 checkpoints, steps 2–4): " in outputs[0], outputs[0][-3000:]
    _two_nodes(tmp_path / "cut", env, "optim.train_steps=2")
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").glob("step*.ckpt")) == ["step0000002.ckpt"]
    _assert_same_training_state(tmp_path / "whole" / "checkpoints" / "step0000002.ckpt",
                                tmp_path / "cut" / "checkpoints" / "step0000002.ckpt")  # the state resumed from
    _two_nodes(tmp_path / "cut", env, "resume=auto")
    plan = _state(tmp_path / "whole" / "checkpoints" / "last.ckpt")["hyper_parameters"]["run_config"]["plan"]
    assert plan["processes"] == 4 and plan["trainer"]["num_nodes"] == 2
    # Four ranks' gradients are summed in an order that depends on DDP's gradient buckets, which
    # each process regroups after its first step (a resumed one too): the last bits may differ
    # (1.2e-7 measured; bit for bit with trainer.strategy=ddp_find_unused_parameters_true, which
    # never regroups). A wrong batch, step or state would differ by orders of magnitude more.
    _assert_same_training_state(tmp_path / "whole" / "checkpoints" / "step0000004.ckpt",
                                tmp_path / "cut" / "checkpoints" / "step0000004.ckpt", atol=1e-6)
    summaries = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("whole", "cut")]
    for summary in summaries:
        assert summary["processes"] == 4 and summary["dev/step"] == 4, summary
    assert summaries[0]["test_averaged"] == 2 and "test_averaged" not in summaries[1]  # the cut run: no test
    for key in ("tokens_seen", "src_tokens_seen", "train_flops"):  # the counts go on across the resume
        assert summaries[0][key] == summaries[1][key], key


@pytest.mark.slow
@TWO_CORES
def test_one_process_accumulating_two_batches_trains_what_two_processes_train(tmp_path: Path, data_root: Path,
                                                                            subword_cache: Path) -> None:
    """optim.tokens_per_step=2048 over batches of at most 1,024 tokens: one process accumulates 2
    batches a step, two DDP processes take 1 each; the token-batch sampler gives step k the same
    2 batches either way. Without dropout the two runs differ only in the order of float sums."""
    env = _environment(data_root, subword_cache)
    recipe = [*(each for each in RUN if each != "logger=none"), "logger=csv", "optim.tokens_per_step=2048",
              "task.datamodule.max_tokens=1024", "model.dropout=0.0"]
    train(tmp_path / "one", *recipe, env=env, timeout=300)
    # Plain ddp, as an 8-GPU node trains (ddp_spawn, on the two nodes above): rank 0 started rank 1
    # by running the command again, and both load the average as the test starts.
    launched = train(tmp_path / "two", *recipe, "hardware=cpu2_ddp", "trainer.strategy=ddp", *AVERAGED_TEST, env=env,
                     timeout=300)
    assert "(§6.1: the average of the last 2 checkpoints, steps 2–4): " in launched.stdout, launched.stdout[-3000:]
    one, two = (_state(tmp_path / run / "checkpoints" / "last.ckpt") for run in ("one", "two"))
    plans = [state["hyper_parameters"]["run_config"]["plan"] for state in (one, two)]
    assert [(p["processes"], p["trainer"]["accumulate_grad_batches"], p["tokens_per_batch"]) for p in plans] == [
        (1, 2, 1024), (2, 1, 1024)]
    assert plans[1]["trainer"]["strategy"] == "ddp"
    assert [path.name for path in (tmp_path / "two" / "csv").iterdir()] == ["version_0"]  # (before: rank 1's empty _1)
    assert one["global_step"] == two["global_step"] == 4
    start = _state(tmp_path / "one" / "checkpoints" / "step0000002.ckpt")["state_dict"]
    moved = 0.0
    for name, weight in one["state_dict"].items():
        torch.testing.assert_close(weight, two["state_dict"][name], rtol=1e-4, atol=1e-6, msg=name)
        moved = max(moved, (weight - start[name]).abs().max().item())
    assert moved > 1e-4, "the weights changed between steps 2 and 4: the comparison is not of untrained weights"
    # The same batches: the same tokens and FLOPs counted, each rank's batches once (summed over the ranks).
    counts = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("one", "two")]
    assert counts[1]["test_averaged"] == 2 and "test_averaged" not in counts[0]
    for key in ("tokens_seen", "src_tokens_seen", "train_flops"):
        assert counts[0][key] == counts[1][key], (key, counts[0][key], counts[1][key])
    # Each step's logged loss is the step's, over both batches (both ranks'): the same figure,
    # and the progress line's (before, each logged the last batch's, or rank 0's).
    losses = [logged_losses(tmp_path / run) for run in ("one", "two")]
    assert sorted(losses[0]) == sorted(losses[1]) == [0, 1, 2, 3]
    for step, loss in losses[0].items():
        assert loss == pytest.approx(losses[1][step], rel=1e-5), (step, loss, losses[1][step])
    for run, logged in zip(("one", "two"), losses):  # the line after step k says step k + 1; 3 decimals
        shown = progress_losses(tmp_path / run)
        assert shown == {step + 1: pytest.approx(loss, abs=5.01e-4) for step, loss in logged.items()}, run
