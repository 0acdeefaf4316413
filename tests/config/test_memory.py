"""The batch that fits a GPU (aiayn.config.memory, ``task.datamodule.max_tokens=auto`` in
aiayn.config.plan): the estimate against every GPU training record in benchmarks/results, and the
plans of the paper's models on simulated GPUs of 16, 40, 80 and 141 GB, one or eight of them."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from aiayn.config.hardware import Machine
from aiayn.config.memory import parameters, tokens_that_fit, training_memory, usable
from aiayn.config.plan import describe, make_plan
from aiayn.config.schemas import network_arguments
from aiayn.errors import ConfigError
from aiayn.model import Transformer
from aiayn.training.compiling import CUDA_GRAPH_MODES
from tests.helpers.configs import composed, with_plan
from tests.helpers.runs import REPO

GB = 10**9
V100_GB = 16.945512448  # what torch reads of a 16 GB V100 (15.8 GiB)
RESULTS = REPO / "benchmarks" / "results"
MODELS = {name: network_arguments(OmegaConf.to_container(composed(f"model={name}").model, resolve=True))
          for name in ("base", "big")}


def gpu(memory_gb: float, gpus: int = 1, bf16: bool = True, name: str = "a GPU") -> Machine:
    return Machine(gpus=gpus, bf16=bf16, cpu_cores=16, gpu_name=name, gpu_memory=int(memory_gb * GB))


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    {}, {"d_model": 1024, "d_ff": 4096, "n_heads": 16}, {"positional": "learned", "n_layers": 2},
    {"share_embeddings": False, "n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 24}])
def test_the_parameters_counted_from_the_shapes_are_the_models(model: dict) -> None:
    built = Transformer(1000, 1000, **model)
    assert parameters(model, 1000) == sum(p.numel() for p in built.parameters())


def gpu_training_records() -> list[tuple[str, dict, int, int, bool, float]]:
    """(where, network, vocabulary, max_tokens, fused loss, peak MiB) of every CUDA training record
    kept but those of a step in CUDA graphs, which keep a memory pool of their own that the estimate
    does not count (compile_mode=reduce-overhead or cudagraphs)."""
    found = []
    for name in ("train_throughput.jsonl", "gpu_batch_size.jsonl"):
        for line in (RESULTS / name).read_text().splitlines():
            record = json.loads(line)
            settings = record.get("settings") or {}
            graphs = settings.get("compile") and settings.get("compile_mode") in CUDA_GRAPH_MODES
            if record.get("device") == "cuda" and settings["precision"] == "bf16" and not graphs:
                network = {**MODELS["base"], **record["model"]}
                found.append((f"{name} {record['date']}", network, settings["vocab_size"], settings["max_tokens"],
                              bool(settings.get("fused_loss")), record["peak_memory_mb"]))
    for line in (RESULTS / "gpu_suite.jsonl").read_text().splitlines():
        record = json.loads(line)
        for run in (record.get("train") or {}).get("runs", []) if record.get("device") == "cuda" else []:
            graphs = any(switch in (f"compile-mode {mode}" for mode in CUDA_GRAPH_MODES) for switch in run.get("switches", ()))
            if run["status"] == "ok" and run["config"] in MODELS and not graphs:
                found.append((f"gpu_suite.jsonl {record['date']} {run['run']}", MODELS[run["config"]],
                              run["vocab_size"], run["max_tokens"], "fused-loss" in run.get("switches", ()),
                              run["peak_memory_mb"]))
    return found


def test_the_estimate_covers_every_measured_gpu_peak_within_20_percent() -> None:
    records = gpu_training_records()
    assert {network["d_model"] for _, network, *_ in records} >= {512, 1024}, "base and big were both measured"
    for where, network, vocab, tokens, fused, peak_mib in records:
        estimate = training_memory(network, vocab, "bf16-mixed", fused_loss=fused).at(tokens) / 2**20
        assert peak_mib <= estimate <= 1.2 * peak_mib, (where, tokens, fused, peak_mib, round(estimate))


@pytest.mark.parametrize(("model", "task", "machine", "accumulate", "batch"), [
    ("big", "wmt_en_fr", gpu(16.9, bf16=False, name="Tesla V100-SXM2-16GB"), 3, 8333),
    ("big", "wmt_en_fr", gpu(42.4, name="NVIDIA A100-SXM4-40GB"), 1, 25_000),
    ("big", "wmt_en_fr", gpu(85.0, name="NVIDIA H100 80GB HBM3"), 1, 25_000),
    ("big", "wmt_en_fr", gpu(150.1, name="NVIDIA H200"), 1, 25_000),
    ("base", "wmt_en_de", gpu(16.9, bf16=False, name="Tesla V100-SXM2-16GB"), 2, 12_500),
    ("base", "wmt_en_de", gpu(42.4, name="NVIDIA A100-SXM4-40GB"), 1, 25_000),
])
def test_one_gpu_takes_the_whole_step_in_one_batch_where_it_fits_and_accumulates_the_rest(
        model: str, task: str, machine: Machine, accumulate: int, batch: int) -> None:
    cfg = composed(f"model={model}", f"task={task}")
    plan = make_plan(cfg, machine)
    assert (plan["processes"], plan["trainer"]["accumulate_grad_batches"], plan["tokens_per_batch"]) == (
        1, accumulate, batch)
    assert plan["tokens_per_step"] <= 25_000 and plan["tokens_per_step"] >= 25_000 - accumulate
    network = network_arguments(OmegaConf.to_container(cfg.model, resolve=True))
    needed = training_memory(network, cfg.task.vocab_size, plan["trainer"]["precision"]).at(batch)
    assert needed <= usable(machine.gpu_memory)
    if accumulate > 1:  # the fewest batches that fit: one fewer would not
        bigger = -(-25_000 // (accumulate - 1))
        assert training_memory(network, cfg.task.vocab_size, "16-mixed").at(bigger) > usable(machine.gpu_memory)
    text = describe(plan, with_plan(cfg, plan), model=model)
    assert f"GiB of the GPU's {machine.gpu_memory / 2**30:.0f} GiB" in text.splitlines()[2]


def test_eight_gpus_each_take_their_share_of_3125_tokens_in_one_batch() -> None:
    for memory in (16.9, 85.0):
        plan = make_plan(composed("model=big", "task=wmt_en_fr", "trainer.devices=8"), gpu(memory, gpus=8))
        assert (plan["processes"], plan["trainer"]["accumulate_grad_batches"], plan["tokens_per_batch"]) == (
            8, 1, 3125)


def test_an_explicit_batch_wins_and_the_cpu_keeps_its_batches() -> None:
    fixed = make_plan(composed("model=big", "task=wmt_en_fr", "task.datamodule.max_tokens=3400"), gpu(85.0))
    assert (fixed["trainer"]["accumulate_grad_batches"], fixed["tokens_per_batch"], fixed["batch_limit"]) == (
        8, 3125, None)
    laptop = Machine(gpus=0, cpu_cores=2, cpu_name="a CPU")
    cpu = make_plan(composed("model=big", "task=wmt_en_fr"), laptop)
    assert (cpu["trainer"]["accumulate_grad_batches"], cpu["tokens_per_batch"]) == (8, 3125)
    # hardware=cpu on a GPU node: the CPU's batches, said as the CPU's (before: "without a GPU to size it").
    on_cpu = make_plan(composed("model=big", "task=wmt_en_fr", "hardware=cpu"), gpu(85.0, gpus=8))
    assert on_cpu["batch_limit"] == "task.datamodule.max_tokens=auto: on the CPU, batches of at most 3,400 tokens"
    # No step to split (a recipe of one's own that sets none): batches of 3,400, on any hardware.
    for machine in (laptop, gpu(85.0)):
        plain = make_plan(composed("task=wmt_en_de", "optim.tokens_per_step=null"), machine)
        assert (plain["trainer"]["accumulate_grad_batches"], plain["tokens_per_batch"]) == (1, 3400)


def test_a_given_batch_the_gpu_cannot_hold_is_one_warning_line_of_the_plan() -> None:
    """model=big task=wmt_en_fr task.datamodule.max_tokens=25000 on a 16 GB V100: ~23.8 GiB by the estimate (before:
    planned without a word, out of memory at the first step). The value given still trains."""
    v100 = gpu(V100_GB, bf16=False, name="Tesla V100-SXM2-16GB")
    plan = make_plan(composed("model=big", "task=wmt_en_fr", "task.datamodule.max_tokens=25000"), v100)
    # In GiB, as the GPUs' names and nvidia-smi count (before: decimal GB, "the GPU's 17 GB" for this V100).
    line = ("task.datamodule.max_tokens=25000: a batch of 25,000 tokens takes ~23.8 GiB by the memory estimate, more "
            "than the 13.2 GiB usable of the GPU's 16 GiB, so the run may run out of GPU memory at its first step; give "
            "task.datamodule.max_tokens=11952 or less (auto: the most that fits, the rest of the step accumulated)")
    assert (plan["tokens_per_batch"], plan["warnings"]) == (25_000, [line])
    # auto's plain batch where the step is not split (the accumulation given) is checked too, with no auto to suggest.
    plain = make_plan(composed("model=big", "task=wmt_en_fr", "trainer.accumulate_grad_batches=8"), gpu(8.0))
    assert plain["warnings"] == [(
        "task.datamodule.max_tokens=auto: a batch of 3,400 tokens takes ~6.3 GiB by the memory estimate, more than the "
        "5.7 GiB usable of the GPU's 7 GiB, so the run may run out of GPU memory at its first step; give "
        "task.datamodule.max_tokens=2712 or less")]
    # A batch that fits, auto's batch sized to the GPU, a GPU whose memory is not known here, the CPU: nothing said.
    for overrides, machine in ((["task.datamodule.max_tokens=8000"], v100), ([], v100),
                               (["task.datamodule.max_tokens=25000"], Machine(gpus=1, bf16=True, cpu_cores=16)),
                               (["task.datamodule.max_tokens=25000"], Machine(gpus=0, cpu_cores=2))):
        assert "warnings" not in make_plan(composed("model=big", "task=wmt_en_fr", *overrides), machine), overrides


@pytest.mark.slow
def test_cfg_job_prints_the_plans_warnings_last_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a simulated 16 GB V100, a batch it cannot hold and a warmup longer than the run: the plan's last two lines,
    on stderr, exit 0 (the run prints the same block before its first step)."""
    from tests.helpers.inprocess import run_tool

    v100 = gpu(V100_GB, bf16=False, name="Tesla V100-SXM2-16GB")
    monkeypatch.setattr("aiayn.config.resolvers.this_machine", lambda: v100)
    shown = run_tool("src/train.py", "model=big", "task=wmt_en_fr", "task.datamodule.max_tokens=25000",
                     "optim.train_steps=3000", "--cfg", "job")
    assert shown.returncode == 0 and shown.stderr.splitlines()[0] == "plan: 1 GPU (Tesla V100-SXM2-16GB), 16-mixed"
    warmup, memory = shown.stderr.splitlines()[-2:]
    assert warmup.startswith("  warning: optim.warmup_steps=4,000 is more than the run's optim.train_steps=3,000")
    assert memory.startswith("  warning: task.datamodule.max_tokens=25000: a batch of 25,000 tokens takes ~23.8 GiB")
    assert OmegaConf.create(shown.stdout).plan.warnings[1].endswith("the rest of the step accumulated)")


@pytest.mark.parametrize(("overrides", "why"), [
    (("model=base", "task=wmt_en_de", "trainer.accumulate_grad_batches=3"),
     ("as trainer.accumulate_grad_batches=3 is given (auto sizes a batch to the step only where the accumulation is "
      "derived from optim.tokens_per_step)")),
    (("task=wmt_en_de", "optim.tokens_per_step=null"), "as the recipe sets no optim.tokens_per_step to split"),
])
def test_the_batch_line_says_why_a_gpu_gets_the_plain_batch(overrides: tuple[str, ...], why: str) -> None:
    """On a GPU, auto's 3,400-token batch where no step is split says why (before: "without a GPU to size it")."""
    cfg = composed(*overrides)
    plan = make_plan(cfg, gpu(85.0))
    line = f"task.datamodule.max_tokens=auto: at most 3,400 tokens a batch, {why}"
    assert (plan["trainer"]["accelerator"], plan["tokens_per_batch"], plan["batch_limit"]) == ("gpu", 3400, line)
    assert f"  batch: {line}" in describe(plan, with_plan(cfg, plan)).splitlines()
    laptop = make_plan(composed("model=base", "task=wmt_en_de"), Machine(gpus=0, cpu_cores=2))  # a step to split
    assert laptop["batch_limit"] == "task.datamodule.max_tokens=auto: on the CPU, batches of at most 3,400 tokens"


def test_a_batch_that_is_neither_a_number_nor_auto_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^task.datamodule.max_tokens must be a positive whole number or auto"):
        make_plan(composed("task=wmt_en_de", "task.datamodule.max_tokens=many"), gpu(85.0))


@pytest.mark.parametrize("machine", [gpu(85.0), gpu(85.0, gpus=8), Machine(gpus=0, cpu_cores=2)])
def test_a_batch_too_small_for_one_pair_is_refused_naming_the_batch_not_the_step(machine: Machine) -> None:
    """task.datamodule.max_tokens=100 under a recipe of 25,000 tokens a step: the batch is what holds no pair of 256
    subwords, as the run's checks say (before: "optim.tokens_per_step=25000 shared by 1 training processes gives
    batches of 100 tokens ...; train on fewer processes, raise optim.tokens_per_step ...")."""
    devices = [f"trainer.devices={machine.gpus}"] if machine.gpus > 1 else []
    with pytest.raises(ConfigError) as refused:
        make_plan(composed("model=base", "task=wmt_en_de", "task.datamodule.max_tokens=100", *devices), machine)
    assert str(refused.value) == ("task.datamodule.max_tokens=100 cannot hold one pair of max_length=256 subwords plus "
                                  "BOS/EOS; raise max_tokens to at least 258 or lower max_length")
    # A step too small for its processes names the step, and fewer processes only where there are several.
    with pytest.raises(ConfigError) as refused:
        make_plan(composed("model=base", "task=wmt_en_de", "optim.tokens_per_step=200"), machine)
    assert str(refused.value).startswith("optim.tokens_per_step=200 shared by 1 training process gives batches of 200 "
                                         "tokens, too few for one pair of task.datamodule.max_length=256 subwords plus "
                                         "BOS/EOS; raise optim.tokens_per_step")


def test_a_gpu_too_small_for_the_weights_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^task.datamodule.max_tokens=auto: the model's weights and optimizer "
                                          r"state \(~3.5 GiB\) leave room for 0 tokens a batch on a GPU of 4 GiB"):
        make_plan(composed("model=big", "task=wmt_en_fr"), gpu(4.0))


def test_the_fused_loss_takes_less_memory_a_token_and_its_block_is_the_losss() -> None:
    from aiayn.config.memory import FUSED_LOSS_ROWS
    from aiayn.model.loss import FUSED_ROWS

    assert FUSED_LOSS_ROWS == FUSED_ROWS
    plain, fused = (training_memory(MODELS["big"], 32000, "bf16-mixed", fused_loss=f) for f in (False, True))
    assert plain.per_token - fused.per_token == 8 * 32000 and fused.fixed > plain.fixed
    assert tokens_that_fit(fused, 16.9 * GB) > 1.25 * tokens_that_fit(plain, 16.9 * GB)  # big on a 16 GB V100


def test_fp32_takes_more_memory_a_token_than_mixed_precision() -> None:
    mixed, full = (training_memory(MODELS["base"], 37000, precision) for precision in ("bf16-mixed", "32-true"))
    assert full.per_token > mixed.per_token and tokens_that_fit(full, 80 * GB) < tokens_that_fit(mixed, 80 * GB)
    assert tokens_that_fit(full, 80 * GB) % 8 == 0


def test_the_weights_state_takes_the_bytes_of_the_weights_dtype() -> None:
    """fp32 weights, gradients and Adam's moments: 16 bytes a parameter (18 with mixed precision's half copies);
    fp64 (64-true) 32, bf16-true 8; DDP's buckets a gradient's bytes more (before: 16 + 2 whatever the dtype, half of
    what 64-true takes)."""
    n = parameters(MODELS["base"], 37000)
    fixed = {precision: training_memory(MODELS["base"], 37000, precision).fixed
             for precision in ("32-true", "bf16-mixed", "64-true", "bf16-true")}
    assert fixed == {"32-true": 16 * n, "bf16-mixed": 18 * n, "64-true": 32 * n, "bf16-true": 8 * n}
    assert training_memory(MODELS["base"], 37000, "64-true", processes=2).fixed == 40 * n
