"""The whole training config checked before anything runs (aiayn.training.config_check): every
config the project ships passes, and the lists of known keys are those the configs have. The
one-line refusals of bad settings, one kind each, are in tests/cli/test_bad_input.py."""

from __future__ import annotations

from dataclasses import fields

import pytest
from omegaconf.errors import InterpolationResolutionError

from aiayn.cli.naming import dirname
from aiayn.cli.unresolved import raised_by_resolver
from aiayn.config.plan import make_plan
from aiayn.config.schemas import DecodingConfig
from aiayn.errors import ConfigError
from aiayn.training.config_check import ROOT_SETTINGS, TASK_SETTINGS, check_train_config
from tests.helpers.configs import LAPTOP, NODE_8_H100, composed, resolved
from tests.helpers.runs import REPO

EXPERIMENTS = sorted(path.stem for path in (REPO / "conf" / "experiment").glob("*.yaml"))
SHIPPED = [
    [], ["debug=tiny"], ["model=base"], ["model=big", "task=wmt_en_fr"], ["task=wmt_en_de"], ["task=multi30k_de_en"],
    ["task=wsj", "model=parsing"], ["task=wsj_semi", "model=parsing"], ["logger=csv"], ["logger=none"],
    ["hardware=cpu2_ddp"], ["experiment=table3_base", "+scale=multi30k_cpu"],
    ["experiment=table3_base", "+scale=multi30k"], *[[f"experiment={name}"] for name in EXPERIMENTS],
    ["task=parallel_text", "task.data_dir=/data/iwslt14", "task.src_lang=de", "task.tgt_lang=en"],
]


@pytest.mark.parametrize("overrides", SHIPPED, ids=lambda overrides: " ".join(overrides) or "default")
def test_every_shipped_config_passes_the_check(overrides: list[str]) -> None:
    config = resolved(*overrides, least_cores=2)
    check_train_config(config)
    assert set(config) <= set(ROOT_SETTINGS)
    assert set(config["task"]) <= set(TASK_SETTINGS)
    assert set(config["decoding"]) == {field.name for field in fields(DecodingConfig)}


def test_every_known_root_setting_is_in_some_shipped_config() -> None:
    seen = set().union(*(resolved(*overrides, least_cores=2) for overrides in SHIPPED))
    assert seen == set(ROOT_SETTINGS)


def test_a_gpu_config_on_a_machine_without_one_is_refused_up_front() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(InterpolationResolutionError) as refused:  # the plan refuses it while resolving
        resolved("hardware=gpu")
    assert str(raised_by_resolver(refused.value)).startswith("trainer.accelerator=gpu asks for a GPU but no usable")


def test_a_long_sweep_folder_name_is_shortened_with_a_hash_of_the_whole() -> None:
    assert dirname("seed=1,model.d_model=64") == "seed=1,model.d_model=64"  # short names stay as they were
    long_a = ",".join(f"key{i}=/some/path/value{i}" for i in range(40))
    long_b = long_a.replace("value39", "value40")  # differs only at the end
    a, b = dirname(long_a), dirname(long_b)
    assert len(a.encode()) <= 120 and "/" not in a and a != b and a.startswith("key0=_some_path")
    assert dirname("é" * 200).encode().decode()  # a multi-byte character is not cut in half


@pytest.mark.parametrize(("overrides", "message"), [
    (["decoding.constrained=true"], "decoding.constrained=true decodes linearised trees, for parsing tasks"),
])
def test_constrained_decoding_is_for_parsing_tasks_and_a_boolean(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_train_config(resolved(*overrides))
    with pytest.raises(Exception, match="decoding.constrained=maybe"):  # the schema's type refuses it while composing
        resolved("task=wsj", "decoding.constrained=maybe")


def test_parsing_tasks_decode_constrained_and_translation_tasks_do_not() -> None:
    assert resolved("task=wsj")["decoding"]["constrained"] is True
    assert resolved("task=wsj_semi")["decoding"]["constrained"] is True
    assert resolved()["decoding"]["constrained"] is False


@pytest.mark.parametrize(("overrides", "message"), [
    (["decoding.stop=early"], "decoding.stop must be paper .* or first_k"),
    (["decoding.nbest=5"], "decoding.nbest=5 asks for more hypotheses than the beam holds"),
    (["decoding.top_p=0.9"], r"beam search cannot serve decoding.top_p=0.9 \(it applies to sampling only\)"),
    (["decoding.sampling=true", "decoding.top_p=1.5"], "decoding.top_p must be above 0 and at most 1"),
    # what sampling has no use for is refused, not ignored (it was, without a word)
    (["decoding.sampling=true", "decoding.stop=first_k"], "sampling cannot serve decoding.stop=first_k"),
    (["decoding.sampling=true", "decoding.beam_size=8"], "sampling cannot serve decoding.beam_size=8"),
])
def test_train_checks_the_stopping_rule_nbest_and_sampling_as_the_tools_do(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_train_config(resolved(*overrides))
    check_train_config(resolved("decoding.stop=first_k", "decoding.nbest=4"))
    check_train_config(resolved("decoding.sampling=true", "decoding.top_p=0.9", "decoding.nbest=8"))  # 8 samples


@pytest.mark.parametrize(("overrides", "message"), [
    (["task.datamodule.length_buckets=[64,32]"], r"^task.datamodule.length_buckets must be ascending positive lengths"),
    (["task.datamodule.length_buckets=[16,32]"],
     r"^task.datamodule.length_buckets ends at 32, below the longest training sequence \(max_length=128"),
    (["compile_mode=fastest"], r"^compile_mode must be one of default, reduce-overhead, max-autotune"),
])
def test_the_batch_shape_and_compile_settings_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_train_config(resolved(*overrides))
    check_train_config(resolved("task.datamodule.length_buckets=[16,32,64,129]", "compile=true",
                                "compile_mode=cudagraphs"))


@pytest.mark.parametrize("mode", ["reduce-overhead", "cudagraphs"])
def test_cuda_graphs_of_a_step_of_accumulated_batches_are_refused_on_gpus(mode: str) -> None:
    """The graphs' replays overwrite gradients accumulated over a step's batches (torch's CUDA graph
    trees): refused where the plan accumulates on GPUs, kept where a batch is the step's share of
    its GPU, where the step is eager, or on a CPU (no graphs there)."""
    settings = ("compile=true", f"compile_mode={mode}", "optim.tokens_per_step=25000")
    config = resolved(*settings)
    cases = [  # (task.datamodule.max_tokens, machine, further settings, the plan's accumulation, refused)
        (1024, NODE_8_H100, ["trainer.devices=8"], 4, True),
        (3125, NODE_8_H100, ["trainer.devices=8"], 1, False),
        (1024, NODE_8_H100, ["trainer.devices=8", "compile=false"], 4, False),
        (1024, LAPTOP, [], 25, False),
    ]
    for max_tokens, machine, further, accumulate, refused in cases:
        overrides = (*settings, f"task.datamodule.max_tokens={max_tokens}", *further)
        config["plan"] = make_plan(composed(*overrides), machine)
        config["compile"] = "compile=false" not in further
        assert config["plan"]["trainer"]["accumulate_grad_batches"] == accumulate
        if refused:
            with pytest.raises(ConfigError, match=rf"^compile_mode={mode} replays CUDA graphs, which overwrite "
                                                  "gradients accumulated over a step's 4 batches: give a batch"):
                check_train_config(config)
        else:
            check_train_config(config)


@pytest.mark.parametrize(("overrides", "message"), [
    (["distributed.timeout_minutes=0"], r"^distributed.timeout_minutes must be a positive number of minutes, got 0$"),
    (["callbacks.attention_pictures.layers=foo"], r"^callbacks.attention_pictures.layers must be paper or all, got 'foo'$"),
    (["+callbacks.attention_pictures.index=-1"], r"^callbacks.attention_pictures.index must be a whole number, 0 or more"),
    (["task.datamodule.subword_sample_pairs=0"], r"^task.datamodule.subword_sample_pairs must be a positive whole number"),
    # Before: 0 and -2 alike made one encoding process per CPU.
    (["+task.datamodule.prepare_workers=0"], r"^task.datamodule.prepare_workers must be a positive whole number, or null "),
    (["+task.datamodule.prepare_workers=-2"], r"^task.datamodule.prepare_workers must be a positive whole number, or null "),
    # Before: taken by --cfg job and a sweep's check; the first three then unread, the last two a traceback as the run
    # built its callback or its W&B run, after the plan was printed.
    (["+nonfinite.max_in_arow=3"],
     r"^nonfinite.max_in_arow is not a setting in nonfinite; did you mean max_in_a_row\?$"),
    (["+cost.gppu=K80"], r"^cost.gppu is not a setting in cost; did you mean gpu\?$"),
    (["+paths.dataroot=/x"], r"^paths.dataroot is not a setting in paths; did you mean data_root\?$"),
    (["+callbacks.attention_pictures.layer=all"],
     r"^callbacks.attention_pictures.layer is not an argument of attention_pictures; did you mean layers\?$"),
    (["+logger.wandb.mod=offline"], r"^logger.wandb.mod is not an argument of WandbRunLogger; did you mean mode\?$"),
])
def test_settings_read_only_as_the_run_builds_its_parts_are_checked_before_any_job_starts(overrides: list[str],
                                                                                          message: str) -> None:
    """What a sweep checks of every job before the first starts, and ``--cfg job`` says (before:
    refused as the Trainer, the callback or the subword model was built, so a sweep's later job
    failed after the earlier ones had trained; the callback's with a traceback)."""
    task = ["task=wmt_en_de"] if overrides[0].lstrip("+").startswith("task.") else []
    with pytest.raises(ConfigError, match=message):
        check_train_config(resolved(*task, *overrides))


def test_ones_own_paths_and_wandb_init_settings_are_taken() -> None:
    """A key of one's own under paths (for one's own configs to name) and whatever wandb.init takes."""
    check_train_config(resolved("+paths.my_corpus=/data/mine", "+logger.wandb.entity=lab", "+logger.wandb.notes=x",
                                "+callbacks.attention_pictures.index=3"))


def test_fp16_weights_with_plain_adam_are_refused_as_its_first_step_makes_them_nan() -> None:
    import torch

    def on_a_gpu(*overrides: str) -> dict:  # (on the CPU the plan refuses 16-true: tests/config/test_hardware.py)
        config = resolved("debug=tiny", *overrides)
        config["trainer"]["precision"] = "16-true"
        config["plan"] = make_plan(composed("debug=tiny", "trainer.precision=16-true", *overrides), NODE_8_H100)
        return config

    config = on_a_gpu("optim.fused=false")
    with pytest.raises(ConfigError, match=r"^trainer.precision=16-true with optim.fused=false: torch's plain Adam updates "
                                          r"fp16 weights in fp16, where optim.eps=1e-09 and small squared gradients are "
                                          r"0, and its first step makes NaN weights; give optim.fused=true"):
        check_train_config(config)
    check_train_config(on_a_gpu())  # fused, the default: taken
    # Why: the paper's Adam on fp16 weights, one step with a zero and a small gradient, plain and fused.
    for fused, finite in ((False, False), (True, True)):
        weight = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
        weight.grad = torch.tensor([0.0, 1e-3, 1.0], dtype=torch.float16)
        torch.optim.Adam([weight], lr=1e-3, betas=(0.9, 0.98), eps=config["optim"]["eps"], fused=fused).step()
        assert bool(torch.isfinite(weight).all()) is finite, (fused, weight)
