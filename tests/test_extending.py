"""docs/extending.md, run as written: its modules (read out of the page) written into the test's
folder, put on the path, and trained with the suite's tiny settings by its own command lines;
the network of one's own translated with, refused by the export (naming model._target_); the metric of one's
own logged and reported. And a class or module misspelt, or a key neither aiayn's nor the class's:
one line naming the setting, exit status 2."""

from __future__ import annotations

import csv
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.trained import load_trained
from aiayn.config.schemas import check_against_schemas
from aiayn.errors import ConfigError
from aiayn.model import Transformer
from aiayn.training.schedule import check_schedule
from tests.helpers.datafiles import own_corpus
from tests.helpers.inprocess import run_tool, train
from tests.helpers.runs import REPO, TINY

PAGE = (REPO / "docs" / "extending.md").read_text()
# What the tests add to the page's commands: the tiny run, no tracker, no pictures.
QUICK = [*TINY, "logger=csv", "visualize_at_end=false"]


def page_module(name: str) -> str:
    """The code of ``name`` (``gated.py``) as the page gives it: the block after its name."""
    (code,) = re.findall(rf"`{re.escape(name)}`[^`\n]*\n\n```(?:python|yaml)\n(.*?)```", PAGE, flags=re.DOTALL)
    return code


def page_overrides(marker: str, home: Path | None = None) -> list[str]:
    """The settings of the page's ``src/train.py`` command line that holds ``marker`` (``$HOME``:
    ``home``)."""
    (line,) = [line for line in PAGE.splitlines() if "src/train.py" in line and marker in line]
    return shlex.split(line.split("src/train.py", 1)[1].replace("$HOME", str(home)))


@pytest.fixture
def own_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The page's modules in a folder on the path (as PYTHONPATH puts it), forgotten afterwards."""
    folder = tmp_path / "ablations"
    folder.mkdir()
    for name in ("gated.py", "prenorm.py", "schedules.py", "lengthscore.py"):
        (folder / name).write_text(page_module(name))
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in ("gated", "prenorm", "schedules", "lengthscore"):
        sys.modules.pop(name, None)


@pytest.mark.slow
def test_the_pages_network_and_schedule_train_translate_and_the_export_refuses_the_network(
        own_modules: Path, tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    overrides = page_overrides("model._target_=gated.GatedTransformer")
    assert overrides == ["model._target_=gated.GatedTransformer", "+model.gate_init=0.5"]
    schedule = page_overrides("optim.schedule=")  # the page's schedule too, in the same run
    run_dir = tmp_path / "run"
    train(run_dir, *QUICK, *overrides, *schedule, "test_after_training=false", data_root=data_root,
          cache_dir=subword_cache)
    from schedules import linear_decay  # the page's, as the run imported it

    last = run_dir / "checkpoints" / "last.ckpt"
    logged = {int(row["step"]) + 1: float(row["train/lr"]) for row in  # Lightning's rows count steps from 0
              csv.DictReader((run_dir / "csv" / "version_0" / "metrics.csv").open()) if row.get("train/lr")}
    # debug=tiny: d_model 32, warmup 2 of 4 steps, small's lr_factor; the last step's rate is 0
    trained = load_trained(last)
    factor = trained.config["optim"]["lr_factor"]
    assert logged == pytest.approx({step: linear_decay(step, 32, 2, factor, 4) for step in (1, 2, 3, 4)}, rel=1e-6)
    assert type(trained.model).__module__ == "gated" and type(trained.model).__name__ == "GatedTransformer"
    gates = [block.gate for layer in trained.model.encoder_layers for block in (layer.residual_1, layer.residual_2)]
    assert gates and all(gate.item() != 0.5 for gate in gates)  # trained from gate_init=0.5, and saved
    assert (run_dir / "train.log").read_text().count("gated.GatedTransformer (n_layers=1") == 1  # the plan's line

    translated = run_tool("src/translate.py", f"ckpt={last}", "decoding.max_len_offset=5", stdin="A man.\n",
                          data_root=data_root)
    assert len(translated.stdout.splitlines()) == 1

    refused = run_tool("src/export.py", f"ckpt={last}", f"out={tmp_path / 'hf'}", check=False)
    assert (refused.returncode, refused.stderr) == (2, (
        f"export.py: {last} was trained as model._target_=gated.GatedTransformer, a model class of one's own; the "
        "export maps the weights of aiayn.model.Transformer alone, and cannot know what another class computes: "
        "translate and evaluate it with translate.py and evaluate.py\n"))
    assert not (tmp_path / "hf").exists()

    # Its weights into the paper's network (init_from=): refused, naming the class to give.
    refused = run_tool("src/train.py", *TINY, "logger=none", f"init_from={last}", f"hydra.run.dir={tmp_path / 'on'}",
                       data_root=data_root, cache_dir=subword_cache, check=False)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"train.py: init_from={last}: this run's network is not the checkpoint's (model._target_ gated.GatedTransformer "
        "→ aiayn.model.Transformer); give the checkpoint's model settings: model._target_=gated.GatedTransformer")

    sys.modules.pop("gated")  # the module no longer on the path: the checkpoint names what to do
    sys.path.remove(str(own_modules))
    refused = run_tool("src/translate.py", f"ckpt={last}", stdin="A man.\n", check=False)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"translate.py: {last}: its model._target_=gated.GatedTransformer: there is no module gated on PYTHONPATH; "
        "the class it was trained as is needed to load it: put the folder of its module on PYTHONPATH")


@pytest.mark.slow
def test_the_pages_metric_of_ones_own_is_logged_on_ones_own_corpus(
        own_modules: Path, tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    own_corpus(tmp_path / "corpus", data_root)
    overrides = page_overrides("lengthscore.MyCorpus")
    train(tmp_path / "run", *QUICK, *overrides, "test_after_training=false", cwd=tmp_path, data_root=data_root,
          cache_dir=subword_cache)  # the test split: evaluate.py's below, the scorer validation calls
    assert "val/length_ratio" in next((tmp_path / "run" / "csv").rglob("metrics.csv")).read_text()

    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    run_tool("src/evaluate.py", f"ckpt={last}", f"out={tmp_path / 'eval'}", "decoding.max_len_offset=5",
             data_root=data_root, cache_dir=subword_cache)
    (report,) = (tmp_path / "eval").glob("*.json")
    figures = json.loads(report.read_text())
    assert figures["test/length_ratio"] >= 0 and "test/bleu" in figures

    sys.modules.pop("lengthscore")  # its module no longer on the path: one line saying so
    sys.path.remove(str(own_modules))
    refused = run_tool("src/evaluate.py", f"ckpt={last}", f"out={tmp_path / 'again'}", data_root=data_root,
                       cache_dir=subword_cache, check=False)
    assert (refused.returncode, refused.stderr) == (2, (
        f"evaluate.py: {last}: task.datamodule._target_=lengthscore.MyCorpus cannot be imported here as a data "
        "module: put the folder of its module on PYTHONPATH\n"))


WHAT_TO_DO = "give the dotted path of a subclass of aiayn.model.Transformer whose module is on PYTHONPATH"


@pytest.mark.parametrize("override, message", [
    ("model._target_=gated.GatedTransfomer",
     f"model._target_=gated.GatedTransfomer: module gated has no GatedTransfomer; {WHAT_TO_DO}"),
    ("model._target_=gatd.GatedTransformer",
     f"model._target_=gatd.GatedTransformer: there is no module gatd on PYTHONPATH; {WHAT_TO_DO}"),
    ("optim.schedule=schedules.linear",
     ("optim.schedule=schedules.linear: module schedules has no linear; give null (Eq. 3) or the dotted path of a "
      "function of the step whose module is on PYTHONPATH (docs/extending.md)")),
    ("task.datamodule._target_=lengthscore.MyCorpos",
     ("task.datamodule._target_=lengthscore.MyCorpos: no such class or function; give the dotted path of one whose "
      "module is on PYTHONPATH (see conf/; one of your own: docs/extending.md)")),
    ("model._target_=torch.nn.Linear",
     f"model._target_=torch.nn.Linear is not a subclass of aiayn.model.Transformer; {WHAT_TO_DO} (docs/extending.md)"),
])
def test_a_misspelt_class_or_module_is_one_line_and_exit_2(override: str, message: str, own_modules: Path,
                                                           tmp_path: Path, data_root: Path) -> None:
    result = run_tool("src/train.py", *TINY, "logger=none", override, f"hydra.run.dir={tmp_path / 'run'}",
                      data_root=data_root, check=False)
    assert (result.returncode, result.stderr) == (2, f"train.py: {message}\n")


def test_a_misspelt_data_module_is_said_in_its_line_alone(caplog: pytest.LogCaptureFixture) -> None:
    """Hydra logs the import error of a target it cannot find (three lines of its own) before it
    raises; the check's one line is all a user sees (before: Hydra's three lines above it)."""
    from aiayn.training.config_check import check_task

    with caplog.at_level("DEBUG"), pytest.raises(ConfigError, match=r"^task.datamodule._target_=lengthscore.MyCorpos: "):
        check_task({"name": "mine", "vocab_size": 8000, "datamodule": {"_target_": "lengthscore.MyCorpos"}})
    assert not [record.getMessage() for record in caplog.records if record.name.startswith("hydra")]


def test_the_pages_pre_norm_network_decodes_one_token_at_a_time_as_it_reads_a_whole_target(
        own_modules: Path) -> None:
    from prenorm import PreNormDecoderLayer, PreNormEncoderLayer, PreNormTransformer

    torch.manual_seed(0)
    model = PreNormTransformer(40, 40, n_layers=2, d_model=16, d_ff=32, n_heads=2, d_k=8, d_v=8).eval()
    assert check_against_schemas({"model": {"_target_": "prenorm.PreNormTransformer"}})  # a Transformer subclass
    assert {type(layer) for layer in model.encoder_layers} == {PreNormEncoderLayer}  # its stacks of its layers
    assert {type(layer) for layer in model.decoder_layers} == {PreNormDecoderLayer}
    src, tgt = torch.randint(4, 40, (3, 7)), torch.randint(4, 40, (3, 5))
    whole = model(src, tgt)
    memory, src_mask, _ = model.encode(src)
    state, steps = model.start_decoding(memory, src_mask), []
    for position in range(tgt.size(1)):  # beam search's way: the self-attention keys and values cached
        logits, state, _ = model.decode(tgt[:, position:position + 1], state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), whole)
    post_norm = Transformer(40, 40, n_layers=2, d_model=16, d_ff=32, n_heads=2, d_k=8, d_v=8).eval()
    post_norm.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith(("encoder_norm",
                                                                                                "decoder_norm"))})
    assert not torch.allclose(post_norm(src, tgt), whole)  # the same weights, another network


def test_the_pages_model_file_is_found_through_the_search_path_and_says_what_it_lacks(
        own_modules: Path, tmp_path: Path, data_root: Path) -> None:
    (own_modules / "conf" / "model").mkdir(parents=True)
    (own_modules / "conf" / "model" / "gated.yaml").write_text(page_module("conf/model/gated.yaml"))
    overrides = page_overrides("model=gated", home=own_modules.parent)
    assert overrides[0] == f"hydra.searchpath=[file://{own_modules / 'conf'}]"
    shown = run_tool("src/train.py", *overrides, "--cfg", "job", data_root=data_root)
    assert "\n  _target_: gated.GatedTransformer\n  n_layers: 2\n" in shown.stdout  # small's, typed
    assert "model: gated, gated.GatedTransformer (n_layers=2, d_model=256" in shown.stderr  # the plan
    without = [override for override in overrides if not override.startswith(("optim=", "checkpoint="))]
    refused = run_tool("src/train.py", *without, "--cfg", "job", data_root=data_root, check=False)
    assert (refused.returncode, refused.stderr) == (2, (
        "train.py: In 'train': Could not find 'checkpoint/gated'. Available options in 'checkpoint': base, big, "
        "parsing, small; train.yaml picks checkpoint=${model}, and model=gated has none of its name: give "
        "checkpoint=<one of those> (optim=small checkpoint=small, say), or add checkpoint/gated.yaml beside "
        "model/gated.yaml\n"))


def test_a_schedule_whose_rate_is_no_learning_rate_is_one_line(own_modules: Path) -> None:
    (own_modules / "rates.py").write_text("def constant(step):\n    return -1.0\n\ndef broken(step, d_model):\n"
                                          "    return step / 0\n")
    with pytest.raises(ConfigError, match=r"^optim.schedule=rates.constant: its rate at step 1 is -1.0; it must give "
                                          r"a finite number of at least 0 \(the learning rate\)$"):
        check_schedule("rates.constant", 512, 4000, 1.0, 100)
    with pytest.raises(ConfigError, match=r"^optim.schedule=rates.broken: rate\(1, d_model\) raised "
                                          r"ZeroDivisionError: division by zero$"):
        check_schedule("rates.broken", 512, 4000, 1.0, 100)
    sys.modules.pop("rates", None)


def test_a_classs_own_keys_are_typed_by_it_and_others_refused(own_modules: Path) -> None:
    model = {"_target_": "gated.GatedTransformer", "d_model": 8, "gate_init": 0.5}
    assert check_against_schemas({"model": model})["model"]["gate_init"] == 0.5
    # The class's own arguments are said with the paper's settings (before: the paper's settings alone).
    with pytest.raises(ConfigError, match=r"^model.gate_int is not a model setting; nor is it an argument of "
                                          r"model._target_=gated.GatedTransformer, whose own are gate_init; the "
                                          r"settings are attention, "):
        check_against_schemas({"model": {**model, "gate_int": 0.5}})
    with pytest.raises(ConfigError, match="^model.gate_init is not a model setting; the settings are"):
        check_against_schemas({"model": {"gate_init": 0.5}})  # the paper's Transformer has no gate
