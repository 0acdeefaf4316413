"""The paper's tables as experiment configs (conf/experiment/table2_*, table3_*, table4_*): every row composes
and builds its model, the table's multirun expands to exactly its rows, the SLURM launcher config
gives submitit the job's resources, and the parameter figures the tables report (their FLOPs and cost:
tests/reporting/test_flops.py)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from aiayn.config.schemas import network_arguments
from aiayn.errors import ConfigError
from aiayn.model.positional import LearnedPositionalEmbedding
from aiayn.reporting.flops import Shapes
from aiayn.tables.rows import count_parameters, parameter_report, table_rows
from aiayn.tables.runner import expand_sweep
from aiayn.training.config_check import check_train_config
from aiayn.training.module import TranslationModule
from tests.helpers.runs import REPO
from tests.helpers.tables import tables_command

CONF = REPO / "conf"

BASE = {"n_layers": 6, "d_model": 512, "d_ff": 2048, "n_heads": 8, "d_k": 64, "d_v": 64, "dropout": 0.1, "label_smoothing": 0.1,
        "positional": "sinusoidal", "attention_window": None}
# Table 3 of the paper, row by row: what differs from the base model (unlisted values are the base's).
TABLE3 = {
    "base": {},
    "A_h1": {"n_heads": 1, "d_k": 512, "d_v": 512}, "A_h4": {"n_heads": 4, "d_k": 128, "d_v": 128},
    "A_h16": {"n_heads": 16, "d_k": 32, "d_v": 32}, "A_h32": {"n_heads": 32, "d_k": 16, "d_v": 16},
    "B_dk16": {"d_k": 16}, "B_dk32": {"d_k": 32},
    "C_N2": {"n_layers": 2}, "C_N4": {"n_layers": 4}, "C_N8": {"n_layers": 8},
    "C_dmodel256": {"d_model": 256, "d_k": 32, "d_v": 32}, "C_dmodel1024": {"d_model": 1024, "d_k": 128, "d_v": 128},
    "C_dff1024": {"d_ff": 1024}, "C_dff4096": {"d_ff": 4096},
    "D_pdrop0": {"dropout": 0.0}, "D_pdrop02": {"dropout": 0.2},
    "D_ls0": {"label_smoothing": 0.0}, "D_ls02": {"label_smoothing": 0.2},
    "E_learned": {"positional": "learned"},
    "big": {"d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3},
}
# Not rows of the paper: (F), restricted self-attention (§4's future work), r positions each side.
RESTRICTED = {"F_r1": {"attention_window": 1}, "F_r2": {"attention_window": 2}, "F_r4": {"attention_window": 4}}
ROWS = TABLE3 | RESTRICTED  # every table3_*.yaml
NETWORK = {key: value for key, value in BASE.items() if key != "label_smoothing"}  # a model config's part
TABLE2 = {  # row: (task, model, P_drop, checkpoints averaged)
    "base_en_de": ("wmt_en_de", "base", 0.1, 5), "big_en_de": ("wmt_en_de", "big", 0.3, 20),
    "base_en_fr": ("wmt_en_fr", "base", 0.1, 5), "big_en_fr": ("wmt_en_fr", "big", 0.1, 20),
}


def compose_train(*overrides: str, hydra_config: bool = False):
    """conf/train.yaml with ``overrides``: a copy of what is composed once a test process."""
    return copy.deepcopy(_composed(overrides, hydra_config))


@functools.cache
def _composed(overrides: tuple[str, ...], hydra_config: bool):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=hydra_config)


def built_structure(cfg) -> dict:
    """What the model a config builds really has (on the meta device: nothing allocated)."""
    with torch.device("meta"):
        module = TranslationModule(model=network_arguments(OmegaConf.to_container(cfg.model, resolve=True),
                                                           cfg.width_divisor),
                                   vocab_size=37000, optim=OmegaConf.to_container(cfg.optim, resolve=True),
                                   label_smoothing=cfg.loss.label_smoothing, decoding={})
    model = module.model
    layer = model.encoder_layers[0]
    assert len(model.decoder_layers) == len(model.encoder_layers)
    assert model.decoder_layers[0].cross_attention.d_k == layer.self_attention.d_k
    return {
        "n_layers": len(model.encoder_layers), "d_model": model.d_model, "d_ff": layer.feed_forward.w_1.out_features,
        "n_heads": layer.self_attention.n_heads, "d_k": layer.self_attention.w_q.out_features // layer.self_attention.n_heads,
        "d_v": layer.self_attention.w_v.out_features // layer.self_attention.n_heads,
        "dropout": layer.residual_1.dropout.p, "label_smoothing": module.label_smoothing,
        "positional": "learned" if isinstance(model.src_positions, LearnedPositionalEmbedding) else "sinusoidal",
        "attention_window": model.attention_window,
    }


def test_the_table3_configs_are_exactly_the_papers_rows_and_the_restricted_attention_rows() -> None:
    names = sorted(p.stem for p in (CONF / "experiment").glob("table3_*.yaml"))
    assert names == sorted(f"table3_{row}" for row in ROWS)


@pytest.mark.parametrize("row", list(ROWS))
def test_every_table3_row_composes_and_builds_its_model(row: str) -> None:
    cfg = compose_train(f"experiment=table3_{row}", "+scale=multi30k")  # the rows at Multi30k's scale
    assert built_structure(cfg) == {**BASE, **ROWS[row]}
    assert cfg.task.name == "multi30k_en_de" and cfg.experiment.scale == "multi30k"
    assert cfg.trainer.max_steps == 4000 and cfg.optim.warmup_steps == 800
    assert (cfg.decoding.beam_size, cfg.decoding.alpha) == (4, 0.6)  # the caption: beam 4, α 0.6
    assert cfg.validation.bleu_sentences is None  # BLEU of the whole development set
    # W&B: the name and tags say the row and its scale (the group is a sweep's: none outside one).
    assert cfg.logger.wandb.group is None and cfg.logger.wandb.name == f"table3-{row}-multi30k"
    assert cfg.experiment.row == row and {"table3", row, "scale:multi30k", "task:multi30k_en_de"} <= set(cfg.logger.wandb.tags)
    # The row asks for the WMT task, which the scale switches to Multi30k.
    file = OmegaConf.load(CONF / "experiment" / f"table3_{row}.yaml")
    assert {"override /task": "wmt_en_de"} in OmegaConf.load(CONF / "experiment" / "table3_base.yaml").defaults
    assert "table3_base" in file.defaults or {"override /task": "wmt_en_de"} in file.defaults


@pytest.mark.parametrize("row", list(ROWS))
def test_at_cpu_scale_every_row_keeps_its_shape_at_a_quarter_of_the_width(row: str) -> None:
    cfg = compose_train(f"experiment=table3_{row}", "+scale=multi30k_cpu")
    paper = {**BASE, **ROWS[row]}
    quarter = {k: v // 4 if k in ("d_model", "d_ff", "d_k", "d_v") else v for k, v in paper.items()}
    assert built_structure(cfg) == quarter
    assert cfg.task.name == "multi30k_en_de" and cfg.experiment.scale == "multi30k_cpu"
    # One recipe for every row (big included): 2,000 steps of 1,024 tokens, warmup 800, factor 0.28.
    assert (cfg.trainer.max_steps, cfg.optim.warmup_steps, cfg.optim.lr_factor) == (2000, 800, 0.28)
    assert cfg.optim.tokens_per_step == 1024 and cfg.trainer.val_check_interval == 1000
    assert cfg.test_after_training is False and cfg.validation.bleu_sentences == 300
    assert (cfg.decoding.beam_size, cfg.decoding.alpha) == (4, 0.6)


def test_the_width_divisor_must_divide_every_width() -> None:
    with pytest.raises(ConfigError, match=r"^width_divisor=3 does not divide model.d_model=512$"):
        check_train_config({"model": NETWORK, "width_divisor": 3, "task": {"vocab_size": 8000}})
    with pytest.raises(ConfigError, match="^width_divisor must be a positive whole number, got 0$"):
        check_train_config({"model": NETWORK, "width_divisor": 0, "task": {"vocab_size": 8000}})
    # What is built, counted and saved are the divided widths: one function divides them.
    halved = network_arguments(NETWORK, 2)
    assert halved == {**NETWORK, "d_model": 256, "d_ff": 1024, "d_k": 32, "d_v": 32}
    assert count_parameters(halved, 1000) < count_parameters(NETWORK, 1000)
    assert Shapes.from_config(halved, 1000) == Shapes(6, 256, 1024, 8, 32, 32, 1000)
    cfg = compose_train("experiment=table3_base", "+scale=multi30k_cpu", "paths.output_dir=/tmp/unused")
    assert cfg.width_divisor == 4 and cfg.model.d_model == 512  # the row's width; scale/ divides it


@pytest.mark.parametrize("row", ["base", "big"])
def test_at_the_papers_scale_rows_train_the_papers_steps(row: str) -> None:
    cfg = compose_train(f"experiment=table3_{row}", "task=multi30k_en_de")  # the task named: WMT data not needed
    assert built_structure(cfg) == {**BASE, **ROWS[row]}
    assert cfg.trainer.max_steps == (300000 if row == "big" else 100000) and cfg.optim.warmup_steps == 4000
    assert cfg.trainer.val_check_interval == 1000


def test_an_experiment_wins_over_train_yaml_and_the_command_line_wins_over_both() -> None:
    cfg = compose_train("experiment=table3_base", "+scale=multi30k")
    assert cfg.validation.bleu_sentences is None  # train.yaml says 300; the experiment says all
    cfg = compose_train("experiment=table3_C_N2", "+scale=multi30k", "model.n_layers=3", "validation.bleu_sentences=7")
    assert cfg.model.n_layers == 3 and cfg.validation.bleu_sentences == 7


@pytest.mark.parametrize("row", list(TABLE2))
def test_every_table2_row_composes_with_its_recipe(row: str) -> None:
    task, model, dropout, averaged = TABLE2[row]
    cfg = compose_train(f"experiment=table2_{row}")  # on its own task: big EN-FR's P_drop 0.1 comes with wmt_en_fr
    expected = {**BASE, **(TABLE3["big"] if model == "big" else {}), "dropout": dropout}
    assert built_structure(cfg) == expected
    assert cfg.trainer.max_steps == cfg.optim.train_steps == (300000 if model == "big" else 100000)
    # §6.1: the last 5 (base) or 20 (big), 10 minutes of the paper's steps apart (0.4 s or 1.0 s each)
    assert (cfg.checkpoint.average_last, cfg.checkpoint.average_every_n_steps) == (averaged, 1500 if model == "base" else 600)
    assert cfg.logger.wandb.name == f"table2-{row}-paper" and {"table2", f"task:{task}"} <= set(cfg.logger.wandb.tags)
    # The WMT task is what the row asks for (its config comes with the WMT tasks).
    defaults = OmegaConf.load(CONF / "experiment" / f"table2_{row}.yaml").defaults
    assert {"override /task": task} in defaults and {"override /model": model} in defaults


@pytest.mark.parametrize("scale", [[], ["+scale=multi30k"], ["+scale=multi30k_cpu"]])
def test_the_table3_multirun_expands_to_exactly_the_tables_rows(scale: list[str]) -> None:
    """A dry run of `python src/train.py --multirun 'experiment=glob(table3_*)' [+scale=multi30k]`:
    Hydra's own sweeper expands it into one job per row (each composes: the test above)."""
    jobs = expand_sweep(CONF, ["experiment=glob(table3_*)", *scale])
    assert sorted(jobs) == sorted([f"experiment=table3_{row}", *scale] for row in ROWS)
    assert len(jobs) == len(ROWS) == 23
    # Each job gets a directory of its own: the job number and the row (run_name).
    cfg = compose_train(*jobs[0], "task=multi30k_en_de", hydra_config=True)
    assert OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"] == "${hydra.job.num}_${run_name}"


def run_tables_command(capsys: pytest.CaptureFixture, *args: str) -> str:
    """experiments/tables.py in this process (as a user runs it, without the start-up time)."""
    assert tables_command(*args) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_the_sweep_dry_run_from_the_command_line(capsys: pytest.CaptureFixture) -> None:
    lines = run_tables_command(capsys, "sweep", "experiment=glob(table2_*)", "seed=1,2").splitlines()
    assert lines[-1] == "8 jobs, each config checked as `train.py --multirun` checks it; nothing run"
    assert sum(line.endswith("experiment=table2_big_en_fr seed=2") for line in lines) == 1


@pytest.mark.slow
def test_the_sweep_dry_run_refuses_the_jobs_the_multirun_would_refuse(capsys: pytest.CaptureFixture) -> None:
    """The dry run checks each job's config with the multirun's own check (aiayn.cli.sweep.check):
    ε_ls 1.5 is refused there before any job starts, so here too, one line a job, exit 2."""
    rows = "experiment=table3_A_h1,table3_base"
    assert tables_command("sweep", rows, "+scale=multi30k_cpu", "loss.label_smoothing=0.1,1.5") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"tables.py: sweep job #{n} of 4 refused (experiment=table3_{row} +scale=multi30k_cpu loss.label_smoothing=1.5): "
        "loss.label_smoothing must be in [0.0, 1.0), got 1.5" for n, row in ((1, "A_h1"), (3, "base"))]
    # What Hydra cannot compose is train's one line too, with train's hint.
    assert tables_command("sweep", "experiment=table3_A_h1", "+scale=multi30k_cpu", "model.d_modle=3") == 2
    assert capsys.readouterr().err == ("tables.py: model.d_modle is not a setting here (Key 'd_modle' not in "
                                       "'ModelConfig'); did you mean model.d_model?\n")



@pytest.mark.slow
def test_the_sweep_dry_run_plans_each_job_as_a_job_of_a_multirun(capsys: pytest.CaptureFixture) -> None:
    """A job of two processes run here starts its ranks with ddp_spawn: trainer.strategy=ddp is refused
    in the dry run as train.py --multirun refuses it (before: the dry run planned each job as a single
    run, passed the sweep and exited 0)."""
    assert tables_command("sweep", "debug=tiny", "logger=none", "hardware=cpu", "trainer.devices=2",
                          "trainer.strategy=ddp", "seed=1,2") == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 2, err
    assert err.startswith("tables.py: sweep job #0 of 2 refused (debug=tiny logger=none hardware=cpu trainer.devices=2 "
                          "trainer.strategy=ddp seed=1): trainer.strategy=ddp in a --multirun sweep run here starts "
                          "each other rank by running the command line again")

@pytest.mark.slow
@pytest.mark.parametrize("dry", [True, False], ids=["dry run", "run"])
def test_tables_run_refuses_the_jobs_the_multirun_would_refuse_before_any_starts(
        dry: bool, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`tables.py run` checks every job as the sweep dry run does before it starts one (before: each
    refused job failed at its own start, after the jobs before it had trained)."""
    root = tmp_path / "rows"
    args = ["run", "--root", str(root), *(["--dry-run"] if dry else []), "experiment=table3_A_h1,table3_base",
            "+scale=multi30k_cpu", "loss.label_smoothing=0.1,1.5"]
    assert tables_command(*args) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 2 and not root.exists()
    assert "refused (experiment=table3_base +scale=multi30k_cpu loss.label_smoothing=1.5)" in err


def test_the_slurm_launcher_gives_submitit_the_jobs_resources(tmp_path: Path) -> None:
    """hydra/launcher=slurm composes; the launcher hydra-submitit-launcher builds from it carries the
    partition, nodes, GPUs and tasks per node (one task per GPU: a DDP rank each) and time limit,
    and submitit turns them into the sbatch directives. No cluster needed."""
    from hydra.utils import instantiate
    from submitit.slurm.slurm import SlurmExecutor, _make_sbatch_string

    cfg = compose_train("hydra/launcher=slurm", "hardware=gpu8_ddp", "trainer.num_nodes=2",
                        "hydra.launcher.partition=gpu-long", "hydra.launcher.timeout_min=600",
                        "experiment=table3_big", "+scale=multi30k", hydra_config=True)
    # After composing: Hydra's first plugin scan (in a process that has not composed before)
    # executes the plugin's modules anew, so classes imported before it would be other objects.
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
    launcher = instantiate(cfg.hydra.launcher)
    assert isinstance(launcher, SlurmLauncher)
    params = launcher.params
    assert (params["partition"], params["nodes"], params["gpus_per_node"], params["tasks_per_node"],
            params["timeout_min"]) == ("gpu-long", 2, 8, 8, 600)
    assert cfg.trainer.num_nodes * cfg.trainer.devices == params["nodes"] * params["tasks_per_node"]  # world size

    # The plugin hands submitit the generic names (nodes, gpus_per_node, ...) and the SLURM ones
    # (partition, ...); submitit's SLURM executor maps the generic ones to sbatch's.
    generic = set(OmegaConf.structured(BaseQueueConf).keys()) - {"submitit_folder"}
    names = SlurmExecutor._equivalence_dict()
    sbatch = {names.get(k, k): v for k, v in params.items() if k in generic and v is not None and k in names}
    sbatch["partition"] = params["partition"]
    text = _make_sbatch_string(command="python src/train.py", folder=tmp_path, **sbatch)
    for directive in ("--partition=gpu-long", "--nodes=2", "--gpus-per-node=8", "--ntasks-per-node=8",
                      "--time=600", "--cpus-per-task=8"):
        assert f"#SBATCH {directive}\n" in text, text


def test_multi_node_ddp_settings_compose() -> None:
    cfg = compose_train("hardware=gpu8_ddp", "trainer.num_nodes=4", "experiment=table3_base", "+scale=multi30k")
    assert (cfg.trainer.strategy, cfg.trainer.devices, cfg.trainer.num_nodes) == ("ddp", 8, 4)


# -- cost and parameters ----------------------------------------------------------------------------
def test_a_bad_cost_gpu_is_a_config_error() -> None:
    cfg = OmegaConf.to_container(compose_train("cost.gpu=A100", "paths.output_dir=/tmp", "run_name=bad-gpu"), resolve=True)
    with pytest.raises(ConfigError, match="cost.gpu='A100'"):
        check_train_config(cfg)


def analytic_parameters(model: dict, vocab: int) -> int:
    """Parameters counted by hand from §3: shared embeddings, Q/K/V/O projections without bias,
    the FFN with biases, two (encoder) or three (decoder) layer norms, learned positions if any."""
    d, h, d_k, d_v, d_ff, n = (model[k] for k in ("d_model", "n_heads", "d_k", "d_v", "d_ff", "n_layers"))
    attention = d * h * (2 * d_k + d_v) + h * d_v * d
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    positions = 2 * model["max_positions"] * d if model["positional"] == "learned" else 0
    return vocab * d + n * (attention + ffn + 2 * norm) + n * (2 * attention + ffn + 3 * norm) + positions


@pytest.mark.slow
def test_the_parameter_report_covers_every_row_and_counts_right() -> None:
    report = {entry["row"]: entry for entry in parameter_report(CONF, 37000)}
    assert set(report) == set(ROWS)
    rows = {row.row: row for row in table_rows(CONF, "table3")}
    for name, entry in report.items():
        assert entry["parameters"] == analytic_parameters(rows[name].model, 37000) == count_parameters(
            rows[name].model, 37000)
        assert entry["paper_params_m"] == rows[name].paper.get("params_m")
    # The paper lists a count where the row changes it: (B), (C) and big.
    assert {name for name, entry in report.items() if entry["paper_params_m"] is not None} == {
        "base", "B_dk16", "B_dk32", "C_N2", "C_N4", "C_N8", "C_dmodel256", "C_dmodel1024", "C_dff1024",
        "C_dff4096", "big"}
    # (A) keeps h·d_k = d_model: the same count as base (§3.2.2's "similar total computational cost").
    assert {report[r]["parameters"] for r in ("A_h1", "A_h4", "A_h16", "A_h32")} == {report["base"]["parameters"]}


@pytest.mark.slow
def test_the_parameter_report_from_the_command_line(capsys: pytest.CaptureFixture) -> None:
    text = run_tables_command(capsys, "params", "--vocab", "37000")
    big = next(line for line in text.splitlines() if line.startswith("big"))
    assert big.split()[-1] == "213"  # the paper's figure beside ours
    report = json.loads(run_tables_command(capsys, "params", "--vocab", "32000", "--json"))
    assert report["vocab_size"] == 32000 and len(report["rows"]) == len(ROWS)
    base = next(row for row in report["rows"] if row["row"] == "base")
    assert base["parameters"] == analytic_parameters({**BASE, "max_positions": 1024}, 32000)


@pytest.mark.parametrize("table, row", [("table3", row) for row in ROWS] + [("table2", row) for row in TABLE2])
def test_every_row_composes_with_its_wmt_task_and_the_papers_dev_and_test_sets(table: str, row: str) -> None:
    cfg = compose_train(f"experiment={table}_{row}", "paths.output_dir=/tmp/unused")
    task = TABLE2[row][0] if table == "table2" else "wmt_en_de"
    data = cfg.task.datamodule
    assert cfg.task.name == task and data._target_ == "aiayn.data.wmt.datamodule.WMTDataModule"
    assert cfg.task.vocab_size == (37000 if task == "wmt_en_de" else 32000)
    assert (data.val_split, data.test_split) == ("newstest2013", "newstest2014")
    assert dict(cfg.decoding) == {"beam_size": 4, "alpha": 0.6, "max_len_offset": 50, "min_len": 0, "kv_cache": True,
                                  "constrained": False, "stop": "paper", "nbest": 1, "sampling": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    check_train_config(OmegaConf.to_container(cfg, resolve=True))
    if table == "table3":
        assert built_structure(cfg) == {**BASE, **ROWS[row]}


@pytest.mark.parametrize("row, task, vocab", [("wsj", "wsj", 16000), ("semi", "wsj_semi", 32000)])
def test_the_table4_rows_are_the_papers_parser(row: str, task: str, vocab: int) -> None:
    """§6.3: 4 layers of d_model 1024, 16K (WSJ only) and 32K (semi-supervised) vocabularies, the
    paper's linearisation (XX leaves), plain beam search of 21 with α 0.3 and outputs up to the
    input + 300 (before: constrained to well-formed trees, the task's own default and ours)."""
    cfg = compose_train(f"experiment=table4_{row}", "paths.output_dir=/tmp/unused")
    assert (cfg.task.name, cfg.task.vocab_size, cfg.task.datamodule.linearization) == (task, vocab, "xx")
    assert (cfg.model.n_layers, cfg.model.d_model) == (4, 1024)
    assert dict(cfg.decoding) == {"beam_size": 21, "alpha": 0.3, "max_len_offset": 300, "min_len": 0, "kv_cache": True,
                                  "constrained": False, "stop": "paper", "nbest": 1, "sampling": False,
                                  "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    assert compose_train(f"task={task}", "model=parsing", "paths.output_dir=/tmp/unused").decoding.constrained
