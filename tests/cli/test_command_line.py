"""The command line as a user writes it (aiayn.cli.command_line): a sweep job's folder, whose name
holds ``=`` and commas, is one path in every tool that takes ``ckpt=`` or ``resume=``; several
checkpoints are a list; Hydra's options may come after the overrides; one-line errors are the same
whatever the working folder or ``HYDRA_FULL_ERROR`` says. In this process, on the session's tiny run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aiayn.cli.command_line import hydra_options_first, quoted_path
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun

# A --multirun job's folder, named as Hydra names it: <job number>_<its overrides>.
SWEEP_JOB = "0_debug=tiny,model.n_layers=2,seed=1234"


@pytest.fixture
def sweep_job(tiny_run: TrainedRun, tmp_path: Path) -> Path:
    """A copy of the tiny run's checkpoints in a folder named as a sweep job's."""
    job = tmp_path / "multirun" / SWEEP_JOB
    shutil.copytree(tiny_run.checkpoints, job / "checkpoints")
    return job


def _tool(tiny_run: TrainedRun, data_root: Path, script: str, *args: str, check: bool = False):
    return run_tool(script, *args, data_root=data_root, cache_dir=tiny_run.cache_dir, check=check)


@pytest.mark.parametrize("tool", ["evaluate", "translate", "average", "export", "visualize"])
def test_a_sweep_jobs_checkpoint_is_one_path_in_every_tool(tool: str, sweep_job: Path, tiny_run: TrainedRun,
                                                            data_root: Path, tmp_path: Path) -> None:
    ckpt = sweep_job / "checkpoints" / "last.ckpt"
    source = tmp_path / "in.en"
    source.write_text("A man is riding a bike.\n", encoding="utf-8")
    settings = {"evaluate": ["wandb=disabled", "split=val", "decoding.max_len_offset=2", f"out={sweep_job / 'eval'}"],
                "translate": [f"input={source}", f"out={sweep_job / 'out.de'}"],
                "average": ["average_last=2", f"out={sweep_job / 'averaged.ckpt'}"],
                "export": ["format=hf", f"out={sweep_job / 'hf'}"],
                "visualize": [f"out={sweep_job / 'attention'}", "positional_encoding=false"]}[tool]
    result = _tool(tiny_run, data_root, f"src/{tool}.py", f"ckpt={ckpt}", *settings)
    assert result.returncode == 0, result.stderr[-2000:]
    made = {"evaluate": "eval", "translate": "out.de", "average": "averaged.ckpt", "export": "hf",
            "visualize": "attention"}[tool]
    assert (sweep_job / made).exists()


@pytest.mark.slow
def test_train_resumes_a_sweep_jobs_checkpoint_named_by_its_path(sweep_job: Path, tiny_run: TrainedRun,
                                                                data_root: Path, tmp_path: Path) -> None:
    result = _tool(tiny_run, data_root, "src/train.py", *tiny_run.overrides, "optim.train_steps=5",
                   f"resume={sweep_job / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={tmp_path / 'attempt'}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (sweep_job / "checkpoints" / "step0000005.ckpt").is_file()  # the run it resumed went on


@pytest.mark.slow
def test_an_ensemble_of_sweep_jobs_is_a_list(sweep_job: Path, tiny_run: TrainedRun, data_root: Path,
                                             tmp_path: Path) -> None:
    ckpt = sweep_job / "checkpoints" / "last.ckpt"
    out = tmp_path / "eval"
    _tool(tiny_run, data_root, "src/evaluate.py", f'ckpt=["{ckpt}","{tiny_run.last}"]', "wandb=disabled",
          "split=val", "decoding.max_len_offset=2", f"out={out}", check=True)
    (report,) = out.glob("*.json")
    assert json.loads(report.read_text())["ensemble"] == [str(ckpt), str(tiny_run.last)]
    # Paths without commas: a list without quotes, or the comma-separated string; the same translations.
    source = tmp_path / "in.en"
    source.write_text("A man is riding a bike.\nTwo dogs play in the snow.\n", encoding="utf-8")
    outputs = []
    for name, given in (("list", f'["{ckpt}","{tiny_run.last}"]'), ("bare", f"[{tiny_run.last},{tiny_run.last}]"),
                        ("commas", f"{tiny_run.last},{tiny_run.last}")):
        _tool(tiny_run, data_root, "src/translate.py", f"ckpt={given}", f"input={source}", f"out={tmp_path / name}",
              "decoding.max_len_offset=5", check=True)
        outputs.append((tmp_path / name).read_text())
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].count("\n") == 2


@pytest.mark.parametrize("tool", ["average", "export", "visualize"])
@pytest.mark.parametrize("form", ["commas", "list"])
def test_several_checkpoints_to_a_tool_of_one_is_one_line(tool: str, form: str, tiny_run: TrainedRun,
                                                          data_root: Path, tmp_path: Path) -> None:
    given = f"{tiny_run.last},{tiny_run.last}" if form == "commas" else f"[{tiny_run.last},{tiny_run.last}]"
    result = _tool(tiny_run, data_root, f"src/{tool}.py", f"ckpt={given}", f"out={tmp_path / 'out'}")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"{tool}.py: ckpt=")
    assert "ensemble" in result.stderr and "evaluate and translate" in result.stderr
    assert not (tmp_path / "out").exists()


def test_hydra_options_may_follow_the_overrides(data_root: Path, subword_cache: Path) -> None:
    result = run_tool("src/train.py", "seed=3", "--cfg", "job", "model=base", data_root=data_root,
                      cache_dir=subword_cache)
    assert "seed: 3" in result.stdout.splitlines() and "  d_model: 512" in result.stdout.splitlines()
    assert hydra_options_first(["seed=1,2", "--multirun", "x=1", "--cfg", "job", "--info", "y=2", "--info",
                                "plugins", "-m"]) == [
        "--multirun", "--cfg", "job", "--info", "--info", "plugins", "-m", "seed=1,2", "x=1", "y=2"]


def test_a_setting_given_more_than_once_is_set_by_the_last_and_said(data_root: Path, subword_cache: Path) -> None:
    """An old name and its new one, or a script's command with a setting changed at its end: the last
    is used, as Hydra uses it, and each set aside is said in one notice (before: without a word, and
    the run's name and tags held both values, one of them never used)."""
    result = run_tool("src/train.py", "task.decoding.beam_size=5", "seed=2", "--cfg", "job", "decoding.beam_size=3",
                      "seed=7", "logger=wandb", data_root=data_root, cache_dir=subword_cache)
    assert [line for line in result.stderr.splitlines() if line.startswith("train.py: ")] == [
        "train.py: task.decoding.beam_size is now decoding.beam_size; the old name works until release 0.3",
        ("train.py: decoding.beam_size is given more than once; the last, decoding.beam_size=3, is used and "
         "task.decoding.beam_size=5 set aside"),
        "train.py: seed is given more than once; the last, seed=7, is used and seed=2 set aside"]
    shown = result.stdout.splitlines()
    assert "  beam_size: 3" in shown and "seed: 7" in shown
    assert "    name: multi30k_en_de-small-decoding.beam_size=3,seed=7" in shown
    assert not [line for line in shown if "beam_size=5" in line or "seed=2" in line]


@pytest.mark.slow
def test_every_part_of_the_config_is_shown_and_showing_makes_no_folder(tmp_path: Path, data_root: Path,
                                                                        subword_cache: Path) -> None:
    """--cfg hydra shows Hydra's settings as written (before: --resolve, added for --cfg job, failed
    on ${run_name}, exit 2); --cfg all shows them resolved and makes no run folder (before: an empty
    outputs/<run>/<date>/ on every call); both refuse what the run would."""
    def show(*arguments: str):
        return run_tool("src/train.py", "debug=tiny", *arguments, cwd=tmp_path, data_root=data_root,
                        cache_dir=subword_cache, check=False)

    hydra = show("--cfg", "hydra")
    assert hydra.returncode == 0 and "    dir: ${aiayn.new_run_dir:outputs/${run_name}}" in hydra.stdout.splitlines()
    refused = show("--cfg", "hydra", "--resolve")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        ("train.py: --cfg hydra cannot --resolve: Hydra's settings read the run's (hydra.run.dir reads run_name), "
        "which --cfg hydra leaves out; --cfg all --resolve shows them resolved")]
    everything = show("--cfg", "all")
    assert everything.returncode == 0, everything.stderr
    assert any(line.startswith("    dir: outputs/multi30k_en_de-small/") for line in everything.stdout.splitlines())
    assert "plan:" in everything.stdout.splitlines()
    assert show("--cfg", "all", "model.d_model=33", "model.n_heads=1").stderr.strip().splitlines() == [
        "train.py: model: d_model must be even for the sinusoidal encoding, got 33"]
    assert not (tmp_path / "outputs").exists(), "showing the config makes no run folder"


def test_a_path_is_quoted_only_where_hydra_would_read_it_otherwise(tmp_path: Path) -> None:
    there = tmp_path / "0_a=1,b=2"
    there.mkdir()
    assert quoted_path("ckpt=runs/0_a=1,b=2/last.ckpt", "average") == "ckpt='runs/0_a=1,b=2/last.ckpt'"
    assert quoted_path("resume=runs/0_a=1/last.ckpt", "train") == "resume='runs/0_a=1/last.ckpt'"
    assert quoted_path(f"resume={there}", "train") == f"resume='{there}'"
    assert quoted_path("ckpt=a.ckpt,b.ckpt", "evaluate") == "ckpt='a.ckpt,b.ckpt'"
    assert quoted_path("out=it's here", "translate") == '''out="it's here"'''
    # ~ as the shell expands it for ckpt=~/x, also where it does not: after a dotted key, in quotes.
    home = Path.home()
    assert quoted_path("task.data_dir=~/corpus", "train") == f"task.data_dir={home / 'corpus'}"
    assert quoted_path("hydra.run.dir=~/runs/a=1", "train") == f"hydra.run.dir='{home / 'runs' / 'a=1'}'"
    assert quoted_path("out=runs/~old", "evaluate") == "out='runs/~old'"  # Hydra's grammar refuses ~
    # The data root and cache, train's and every tool's (before: left to Hydra, which split a=1,b=2 at its comma).
    assert quoted_path("paths.data_root=/data/a=1,b=2", "evaluate") == "paths.data_root='/data/a=1,b=2'"
    assert quoted_path(f"paths.cache_dir={there}", "train") == f"paths.cache_dir='{there}'"
    for unchanged, tool in [("resume=a,b", "train"), ("resume=auto", "train"), ("ckpt=null", "evaluate"),
                            ("ckpt=[a,b]", "evaluate"), ("ckpt='a,b'", "evaluate"), ("out=${oc.env:X}", "evaluate"),
                            ("seed=1,2", "train"), ("out=runs/last.ckpt", "average")]:
        assert quoted_path(unchanged, tool) == unchanged


@pytest.mark.parametrize("text", ["A man, a woman and a dog.", "A man (left) rides a bike.", "It's a = b",
                                  "~ starts it", "The café said (S it expects a loss .", "a,b", "Plain words"])
def test_visualizes_text_is_one_string_whatever_it_holds(text: str) -> None:
    """``text=`` as the shell hands it over (``text='A man, a dog.'``) reaches visualize as that
    text (before: Hydra's `Ambiguous value for argument` for a comma, `mismatched input ' ('` for a
    bracket, a LexerNoViableAltException for a quote or a leading ~)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = quoted_path(f"text={text}", "visualize")
    assert OverridesParser.create().parse_override(given).value() == text


@pytest.mark.parametrize("full_error", [None, "0", "1"])
def test_one_line_errors_whatever_the_working_folder_or_hydra_full_error(full_error: str | None, tmp_path: Path,
                                                                         data_root: Path) -> None:
    from tests.helpers.runs import offline_environment

    env = {key: value for key, value in offline_environment().items() if key != "HYDRA_FULL_ERROR"}
    env.update({"AIAYN_DATA_ROOT": str(data_root)} | ({"HYDRA_FULL_ERROR": full_error} if full_error else {}))
    for cwd in (tmp_path, Path(__file__).parents[2]):
        composing = run_tool("src/train.py", "model=huge", cwd=cwd, env=env, check=False)
        assert composing.returncode == 2
        assert composing.stderr == ("train.py: In 'train': Could not find 'model/huge'. Available options in 'model': "
                                    "base, big, parsing, small\n")
        checked = run_tool("src/evaluate.py", f"ckpt={tmp_path / 'none.ckpt'}", cwd=cwd, env=env, check=False)
        assert checked.returncode == 2
        assert checked.stderr == f"evaluate.py: {tmp_path / 'none.ckpt'}: checkpoint not found\n"
        assert not (cwd / "outputs").exists() or cwd != tmp_path


@pytest.mark.slow
def test_logger_as_an_empty_list_trains_without_a_logger(tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    run = tmp_path / "run"
    run_tool("src/train.py", "debug=tiny", "logger=[]", "visualize_at_end=false", f"hydra.run.dir={run}",
             data_root=data_root, cache_dir=subword_cache)
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "summary.json").is_file()
    assert not {"wandb", "csv", "mlruns"} & {path.name for path in run.iterdir()}


@pytest.mark.cli
def test_one_line_errors_on_a_terminal(tmp_path: Path, data_root: Path) -> None:
    from tests.helpers import runs

    result = runs.run_tool("src/train.py", "model=huge", cwd=tmp_path, data_root=data_root, stdout=runs.TERMINAL,
                           check=False)
    assert result.returncode == 2
    assert result.stderr == ("train.py: In 'train': Could not find 'model/huge'. Available options in 'model': "
                             "base, big, parsing, small\n")
    assert not list(tmp_path.iterdir())
