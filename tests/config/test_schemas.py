"""The training config's layout (conf/train.yaml): the network apart from its recipe. conf/model/
holds the Transformer's arguments only, conf/optim/ the recipe of each model, `loss` the label
smoothing; typed schemas reject unknown keys and wrong types; debug=tiny is the tests' tiny run."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path

import hydra
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from aiayn.config.schemas import ModelConfig, check_against_schemas, network_arguments
from aiayn.errors import ConfigError
from aiayn.model import Transformer
from aiayn.training.callbacks import AttentionPicturesCallback, RunSummaryCallback, build_callbacks, run_settings
from aiayn.training.config_check import check_train_config
from aiayn.training.preemption import PreemptionCallback
from aiayn.training.progress import ProgressLog, StepRichProgressBar, StepTQDMProgressBar
from aiayn.training.saving import StepCheckpoint, ValidateLastStep

REPO = Path(__file__).resolve().parents[2]


def compose_train(*overrides: str, run_name: str = "test"):
    """conf/train.yaml as Hydra composes it; what only a Hydra run knows (its directory, the
    model chosen for run_name) is given."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("train", overrides=[*overrides, "paths.output_dir=/tmp/run", f"run_name={run_name}"])


def run_name(*overrides: str) -> str:
    """run_name as a Hydra run resolves it (from the model chosen: ${hydra:runtime.choices.model})."""
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        return cfg.run_name
    finally:
        HydraConfig.instance().cfg = None


@pytest.mark.parametrize("model, steps, warmup, factor", [
    ("small", 2000, 300, 0.5), ("base", 100000, 4000, 1.0), ("parsing", 100000, 4000, 1.0), ("big", 300000, 4000, 1.0),
])
def test_each_model_brings_its_recipe(model: str, steps: int, warmup: int, factor: float) -> None:
    cfg = compose_train(f"model={model}")
    assert (cfg.optim.train_steps, cfg.optim.warmup_steps, cfg.optim.lr_factor) == (steps, warmup, factor)
    assert cfg.trainer.max_steps == steps and cfg.trainer.val_check_interval == 1000
    assert list(cfg.optim.betas) == [0.9, 0.98] and cfg.optim.eps == 1e-9 and cfg.loss.label_smoothing == 0.1
    assert run_name(f"model={model}") == f"multi30k_en_de-{model}"


def test_the_recipe_and_its_parts_are_overridden_on_their_own() -> None:
    cfg = compose_train("model=base", "optim=small")  # another model's recipe
    assert (cfg.model.d_model, cfg.optim.train_steps, cfg.optim.warmup_steps) == (512, 2000, 300)
    cfg = compose_train("optim.train_steps=50", "optim.warmup_steps=7", "loss.label_smoothing=0.0")
    assert (cfg.trainer.max_steps, cfg.optim.warmup_steps, cfg.loss.label_smoothing) == (50, 7, 0.0)
    cfg = compose_train("experiment=table3_big", "optim=base", "task=multi30k_en_de")  # an experiment's model too
    assert cfg.model.d_model == 1024 and cfg.trainer.max_steps == 100000


@pytest.mark.parametrize("model", ["small", "base", "big", "parsing"])
def test_a_model_config_instantiates_the_transformer_as_it_is(model: str) -> None:
    cfg = compose_train(f"model={model}")
    # The schema is the Transformer's signature, less what the task gives (vocabulary sizes, pad id).
    arguments = set(inspect.signature(Transformer).parameters) - {"src_vocab_size", "tgt_vocab_size", "pad_id"}
    assert set(cfg.model) == {f.name for f in fields(ModelConfig)} == {"_target_", *arguments}
    with torch.device("meta"):
        built = hydra.utils.instantiate(cfg.model, src_vocab_size=100, tgt_vocab_size=100, pad_id=0)
        again = Transformer(100, 100, pad_id=0, **network_arguments(OmegaConf.to_container(cfg.model, resolve=True)))
    assert isinstance(built, Transformer)
    assert [(n, p.shape) for n, p in built.named_parameters()] == [(n, p.shape) for n, p in again.named_parameters()]


def test_each_heads_width_is_d_model_over_h_unless_given() -> None:
    """§3.2.2's d_k = d_v = d_model/h for any h and width, so that a sweep of ``model.n_heads`` is
    Table 3's rows (A) (before: 64 whatever h, so 16 heads were twice base's attention width)."""
    def widths(*overrides: str) -> tuple[int, int]:
        model = OmegaConf.to_container(compose_train(*overrides).model, resolve=True)
        return model["d_k"], model["d_v"]

    assert widths("model=base") == widths("model=big") == widths("model=small") == (64, 64)
    assert widths("model=parsing") == (128, 128)
    for row, heads in (("A_h1", 1), ("A_h4", 4), ("A_h16", 16), ("A_h32", 32)):
        assert widths("model=base", f"model.n_heads={heads}") == widths(f"experiment=table3_{row}")
    assert widths("model=base", "model.n_heads=16") == (32, 32)
    assert widths("experiment=table3_C_dmodel256") == widths("model=base", "model.d_model=256") == (32, 32)
    # A row's own h or width changed keeps the rule (before: rows (A) and (C) set d_k and d_v, so
    # table3_C_dmodel256 with 4 heads kept 32, half its width).
    assert widths("experiment=table3_C_dmodel256", "model.n_heads=4") == (64, 64)
    assert widths("experiment=table3_A_h16", "model.d_model=1024") == (64, 64)
    assert widths("model=base", "model.d_k=16") == (16, 64)  # row (B): d_k alone
    with pytest.raises(Exception, match=r"model.n_heads=3 does not divide model.d_model=512: give model.d_k=N"):
        widths("model=base", "model.n_heads=3")
    assert widths("model=base", "model.n_heads=3", "model.d_k=64", "model.d_v=64") == (64, 64)
    # The network's own default, for a Transformer built in Python, is the same rule.
    network = Transformer(50, 50, n_layers=1, d_model=32, d_ff=16, n_heads=4)
    assert network.encoder_layers[0].self_attention.d_k == 8  # 4 heads of 8
    with pytest.raises(ValueError, match="n_heads=3 does not divide d_model=32: give d_k and d_v"):
        Transformer(50, 50, n_layers=1, d_model=32, d_ff=16, n_heads=3)


@pytest.mark.parametrize("override, error", [
    ("model.n_experts=4", "Key 'n_experts' not in 'ModelConfig'"),
    ("model.d_model=wide", "could not be converted to Integer"),
    ("optim.warmup_steps=1.5", "could not be converted to Integer"),
    ("optim.label_smoothing=0.1", "Key 'label_smoothing' not in 'OptimConfig'"),
    ("loss.epsilon=0.1", "Key 'epsilon' not in 'LossConfig'"),
    ("loss.label_smoothing=some", "could not be converted to Float"),
])
def test_the_schemas_reject_unknown_keys_and_wrong_types(override: str, error: str) -> None:
    with pytest.raises(ConfigCompositionException) as raised:
        compose_train(override)
    assert error in str(raised.value.__cause__)


def test_keys_added_with_plus_or_in_code_are_checked_against_the_schemas() -> None:
    config = OmegaConf.to_container(compose_train("+model.n_experts=4"), resolve=True)
    with pytest.raises(ConfigError, match="^model.n_experts is not a model setting; the settings are attention, "):
        check_train_config(config)
    with pytest.raises(ConfigError, match="^optim.warmup_steps: Value 'many' of type 'str' could not be converted"):
        check_against_schemas({"optim": {"warmup_steps": "many"}})
    with pytest.raises(ConfigError, match="^loss.smoothing is not a loss setting"):
        check_against_schemas({"loss": {"smoothing": 0.1}})
    # Typed and resolved: d_k and d_v are d_model / n_heads (8 / 8) unless given, for a config written in
    # code as for one composed (before: the interpolation's text, which the network check refused).
    assert check_against_schemas({"model": {"d_model": 8}})["model"] == {
        **OmegaConf.to_container(OmegaConf.structured(ModelConfig)), "d_model": 8, "d_k": 1, "d_v": 1}
    with pytest.raises(ConfigError, match=r"^model.d_k and model.d_v are d_model / n_heads unless given \(§3.2.2\), "
                                          r"and model.n_heads=3 does not divide model.d_model=512: give"):
        check_against_schemas({"model": {"n_heads": 3}})
    code = {**OmegaConf.to_container(compose_train("debug=tiny"), resolve=True)}
    code["model"] = {key: value for key, value in code["model"].items() if key not in ("d_k", "d_v")}
    check_train_config(code)  # (before: "d_k must be a positive whole number, got '${aiayn.per_head:…}'")



def test_a_rows_experiment_section_is_typed_so_a_misnamed_paper_figure_is_refused() -> None:
    """experiment.paper's names are those the tables read (before: any key taken, and a row of
    one's own with paper.blue had its paper BLEU column left blank, unsaid)."""
    row = OmegaConf.to_container(compose_train("experiment=table3_C_N2", "+scale=multi30k"), resolve=True)
    typed = check_against_schemas(row)["experiment"]
    assert typed == {"table": "table3", "row": "C_N2", "label": "(C) N=2", "tags": ["table3", "C", "C_N2"],
                     "paper": {"ppl": 6.11, "bleu": 23.7, "params_m": 36.0, "flops": None, "f1": None},
                     "scale": "multi30k"}
    assert check_against_schemas({})["experiment"]["paper"]["bleu"] is None  # no row: every field null
    config = OmegaConf.to_container(compose_train("experiment=table3_C_N2", "+experiment.paper.blue=25.8"),
                                    resolve=True)
    with pytest.raises(ConfigError, match=r"^experiment.paper.blue: experiment.paper's settings are bleu, f1, flops, "
                                          r"params_m, ppl$"):
        check_train_config(config)
    with pytest.raises(ConfigError, match=r"^experiment.paper='25.8': experiment.paper's settings are bleu, "):
        check_against_schemas({"experiment": {"paper": "25.8"}})
    with pytest.raises(ConfigError, match=r"^experiment.paper.bleu: Value 'n/a' of type 'str' could not be "
                                          r"converted to Float$"):  # one line
        check_against_schemas({"experiment": {"paper": {"bleu": "n/a"}}})
    with pytest.raises(ConfigError, match="^experiment.rows is not an experiment setting; the settings are label, "
                                          "paper, row, scale, table, tags"):
        check_against_schemas({"experiment": {"rows": "A"}})


def test_the_width_divisor_is_set_apart_and_applied_once() -> None:
    cfg = compose_train("experiment=table3_C_N2", "+scale=multi30k_cpu")
    assert cfg.width_divisor == 4 and (cfg.model.d_model, cfg.model.d_ff) == (512, 2048)  # the row's widths
    network = network_arguments(OmegaConf.to_container(cfg.model, resolve=True), cfg.width_divisor)
    assert {k: network[k] for k in ("n_layers", "d_model", "d_ff", "n_heads", "d_k", "d_v")} == {
        "n_layers": 2, "d_model": 128, "d_ff": 512, "n_heads": 8, "d_k": 16, "d_v": 16}
    assert "_target_" not in network and network_arguments(network) == network


def test_debug_tiny_is_the_tests_tiny_run() -> None:
    """`debug=tiny` composes to what tests/cli/test_train.py spelled out key by key before it."""
    spelled_out = [
        "model.n_layers=1", "model.d_model=32", "model.d_ff=64", "model.n_heads=2", "model.d_k=16", "model.d_v=16",
        "task.vocab_size=500", "task.datamodule.max_tokens=1024", "decoding.max_len_offset=5",
        "optim.train_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2", "trainer.num_sanity_val_steps=0", "checkpoint.every_n_train_steps=2",
        "optim.warmup_steps=2", "optim.tokens_per_step=null", "callbacks.progress_log.every_n_steps=1",
    ]
    for extra in ([], ["task=wsj", "task.split=sample", "model=parsing"], ["experiment=table3_C_N2", "task=multi30k_en_de"]):
        tiny = OmegaConf.to_container(compose_train(*extra, "debug=tiny"), resolve=True)
        spelled = OmegaConf.to_container(compose_train(*extra, *spelled_out), resolve=True)
        assert tiny == spelled


def test_the_callbacks_are_built_from_their_config_and_the_runs_settings(tmp_path: Path) -> None:
    """Each callback reads the run's settings (checkpoint.*, cost.gpu, ...) where they are set,
    once: conf/callbacks/ names what to build, not the settings again."""
    cfg = compose_train("cost.gpu=K80")
    cfg.paths.output_dir = str(tmp_path)
    assert "every_n_train_steps" not in cfg.callbacks.step_checkpoints and "gpu" not in cfg.callbacks.run_summary
    built = build_callbacks(cfg.callbacks, run_settings(cfg))
    last_step, steps, pictures, summary, bar, preemption, progress = built
    assert isinstance(last_step, ValidateLastStep)
    assert isinstance(steps, StepCheckpoint)
    assert (steps.dirpath, steps.filename, steps._every_n_train_steps, steps.save_top_k, steps.save_last) == (
        str(tmp_path / "checkpoints"), "step{step:07d}", 1000, 5, "link")  # bounded: big's 300 would be ~750 GB
    assert (steps.average_last, steps.average_every_n_steps) == (None, None)  # the small model: no §6.1 window
    for model, window in (("base", (5, 1500)), ("big", (20, 600))):  # §6.1's last 5 or 20, 10 minutes of P100 steps apart
        big = compose_train(f"model={model}")
        big.paths.output_dir = str(tmp_path)
        steps = build_callbacks(big.callbacks, run_settings(big))[1]
        assert (steps.average_last, steps.average_every_n_steps, steps.save_top_k) == (*window, window[0])
    assert isinstance(pictures, AttentionPicturesCallback) and isinstance(summary, RunSummaryCallback)
    assert summary.gpu == "K80"
    assert isinstance(bar, (StepRichProgressBar, StepTQDMProgressBar)) and isinstance(preemption, PreemptionCallback)
    assert preemption.dirpath == tmp_path / "checkpoints"
    assert bar.is_disabled  # stdout is no terminal here: the progress lines instead, every 100 steps by default
    assert isinstance(progress, ProgressLog) and progress.every_n_steps == 100
    # Switched off: no pictures, no bar, no progress lines.
    cfg = compose_train("visualize_at_end=false", "trainer.enable_progress_bar=false",
                        "callbacks.progress_log=null")
    cfg.paths.output_dir = str(tmp_path)
    kinds = [type(callback) for callback in build_callbacks(cfg.callbacks, run_settings(cfg))]
    assert kinds == [ValidateLastStep, StepCheckpoint, RunSummaryCallback, PreemptionCallback]
