"""Browsing runs, as a person would: a tiny two-run Table 3 sweep through src/train.py with
``logger=[wandb,mlflow]`` (real Multi30k, Lightning, W&B offline, MLflow's SQLite store), then

- the real ``mlflow server`` on 127.0.0.1 over that store, its runs, params, metrics and
  attention pictures read back through its REST API, and its compare view of the two runs as
  headless Chromium renders it (where ``chromium`` is installed: CI installs it);
- the W&B Report of Table 3 built over the same runs: every key a panel names is one the runs
  logged (a key no run has would be a silent empty chart);
- ``experiments/tables.py report`` refused in one line while W&B is offline.

The tools run in this process (tests.helpers.inprocess); the server is a process of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from aiayn.tables.report import CURVE_X, EVAL, REPORTED_TABLES, SECTIONS, TRAIN, build_report, named_keys
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TINY_ROW
from tests.helpers.wandb_offline import read_run

# Seconds on a CPU: the rows keep what they vary (N, ε_ls); the width is cut.
TINY = [*TINY_ROW, "trainer.val_check_interval=1"]
ROWS = {"table3-C_N2": "C_N2", "table3-D_ls0": "D_ls0"}


def offline_env(home: Path, data_root: Path, cache_dir: Path, store: str) -> dict[str, str]:
    """No W&B key and no ~/.netrc (W&B offline, as on a fresh machine); MLflow's store in the test's folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    return {**env, "HOME": str(home), "WANDB_SILENT": "true", "AIAYN_DATA_ROOT": str(data_root),
            "AIAYN_CACHE_DIR": str(cache_dir), "MLFLOW_TRACKING_URI": store}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, data_root: Path, subword_cache: Path) -> tuple[Path, str, dict]:
    """Two Table 3 rows at Multi30k scale, each a W&B offline run and an MLflow run; the attention
    pictures drawn at the end."""
    root = tmp_path_factory.mktemp("browse")
    store = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    env = offline_env(root, data_root, subword_cache, store)
    run_tool("src/train.py", "--multirun", "experiment=table3_C_N2,table3_D_ls0", "+scale=multi30k",
             "logger=[wandb,mlflow]", "test_after_training=false", "visualize_at_end=true", *TINY,
             f"hydra.sweep.dir={root / 'multirun'}", env=env)
    return root / "multirun", store, env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(sweep) -> str:
    """``mlflow server`` over the sweep's store, as README says to open it; its URL."""
    _, store, env = sweep
    port = _free_port()
    command = [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", store,
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"mlflow server did not start: {server.stderr.read()[-3000:]}")
        time.sleep(0.5)
    yield url
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def _get(url: str, endpoint: str, **query: str) -> dict:
    with urllib.request.urlopen(f"{url}{endpoint}?{urllib.parse.urlencode(query)}", timeout=30) as answer:
        return json.loads(answer.read())


def _search(url: str, experiment_id: str) -> list[dict]:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/runs/search", method="POST",
                                     data=json.dumps({"experiment_ids": [experiment_id]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())["runs"]


@pytest.mark.slow
def test_mlflow_server_shows_the_sweep(sweep, mlflow_server: str) -> None:
    runs_dir, _, _ = sweep
    url = mlflow_server
    experiment = _get(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="table3")["experiment"]
    found = _search(url, experiment["experiment_id"])  # a sweep's runs in one experiment, named after the table
    runs = {name: run for name in ROWS for run in found if run["info"]["run_name"].startswith(f"{name}-multi30k-")}
    assert set(runs) == set(ROWS) and len(found) == len(ROWS)
    for name, row in ROWS.items():
        run, run_dir = runs[name], next(runs_dir.glob(f"*_{name}"))
        assert run["info"]["status"] == "FINISHED"
        tags = {tag["key"]: tag["value"] for tag in run["data"]["tags"]}
        assert (tags["table"], tags["row"], tags["scale"]) == ("table3", row, "multi30k")
        assert tags["sweep"] == (runs_dir / "group.txt").read_text().strip()  # the W&B group, the sweep's
        # The W&B tags: the row's, task, model, scale, the job's overrides, `modified` (TINY cuts the network).
        labels = tags["labels"].split(",")
        assert labels[:6] == ["table3", row[0], row, "task:multi30k_en_de", "model:base", "scale:multi30k"]
        assert "model.d_model=32" in labels and labels[-1] == "modified"
        # The config, as W&B gets it, flattened as the overrides name it; the parameter count.
        params = {param["key"]: param["value"] for param in run["data"]["params"]}
        summary = json.loads((run_dir / "summary.json").read_text())
        assert params["model.n_layers"] == ("2" if row == "C_N2" else "6")
        assert params["loss.label_smoothing"] == ("0.0" if row == "D_ls0" else "0.1")
        assert params["experiment.row"] == row and params["parameters"] == str(summary["parameters"])
        # Per-step metrics, each validation's (with the FLOPs counted up to it) and the summary.
        run_id = run["info"]["run_id"]
        history = lambda key, run_id=run_id: _get(url, "/api/2.0/mlflow/metrics/get-history", run_id=run_id,
                                                  metric_key=key)["metrics"]
        assert len(history("train/loss")) == 2 and all(point["value"] > 0 for point in history("train/loss"))
        validations = history("val/ppl")
        assert len(validations) == 2 and validations[-1]["value"] == pytest.approx(summary["dev/ppl"])
        flops = [point["value"] for point in history("val/train_flops")]
        assert len(flops) == 2 and 0 < flops[0] < flops[1] == pytest.approx(summary["train_flops"], rel=1e-6)
        latest = {metric["key"]: metric["value"] for metric in run["data"]["metrics"]}
        for key in ("dev/bleu", "parameters", "train_flops", "train_flops_paper_estimate", "tokens_seen"):
            assert latest[key] == pytest.approx(summary[key], rel=1e-6), key
        assert tags["summary.device_name"] == summary["device_name"]
        # The attention pictures, and the config and summary whole, as artifacts the UI shows.
        pictures = _get(url, "/api/2.0/mlflow/artifacts/list", run_id=run_id, path="attention")["files"]
        drawn = sorted(path.name for path in (run_dir / "attention").glob("*.png"))
        assert sorted(Path(file["path"]).name for file in pictures) == drawn and drawn
        with urllib.request.urlopen(f"{url}/get-artifact?" + urllib.parse.urlencode(
                {"path": pictures[0]["path"], "run_uuid": run_id}), timeout=30) as answer:
            assert answer.read() == (run_dir / "attention" / Path(pictures[0]["path"]).name).read_bytes()
        with urllib.request.urlopen(f"{url}/get-artifact?" + urllib.parse.urlencode(
                {"path": "config.json", "run_uuid": run_id}), timeout=30) as answer:
            assert json.loads(answer.read())["experiment"]["row"] == row


@pytest.mark.slow
def test_an_evaluation_is_an_mlflow_run_under_the_training_run_it_scored(sweep, tmp_path: Path) -> None:
    """Before: its ``trained_run`` tag named the row (``table3-C_N2``), not the run."""
    from mlflow import MlflowClient

    runs_dir, store, env = sweep
    copy = tmp_path / "mlflow.db"  # the sweep's store as it is, for the other tests
    shutil.copy(store.removeprefix("sqlite:///"), copy)
    run_dir = next(runs_dir.glob("*_table3-C_N2"))
    run_tool("src/evaluate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "split=val", "wandb=disabled",
             f"mlflow=sqlite:///{copy}", f"out={tmp_path / 'eval'}", env=env)
    client = MlflowClient(f"sqlite:///{copy}")
    runs = client.search_runs([client.get_experiment_by_name("table3").experiment_id])
    (evaluation,) = [run for run in runs if run.data.tags.get("job_type") == "eval"]
    (trained,) = [run for run in runs if run.info.run_id == evaluation.data.tags["trained_run"]]
    assert trained.info.run_name.startswith("table3-C_N2-multi30k-")
    assert evaluation.data.tags["trained_run_name"] == trained.info.run_name
    # Named as its W&B run is, after the run it scored (before: eval-val.step4…, alike for every run of the table).
    assert evaluation.info.run_name.startswith(f"eval-{trained.info.run_name}-val.step"), evaluation.info.run_name
    assert evaluation.data.tags["mlflow.parentRunId"] == trained.info.run_id  # nested under it in the UI
    assert evaluation.data.tags["row"] == "C_N2" and evaluation.data.tags["trained_wandb_run"]


class _VisibleText(HTMLParser):
    """The text a page shows, a piece a line: what is between tags, less scripts and styles."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._hidden and data.strip():
            self.pieces.append(data.strip())


def _rendered_text(page: str, profile: Path) -> list[str]:
    """What headless Chromium shows of ``page`` once its scripts have run: the DOM it rendered,
    as visible text. The flags keep it off the network it would reach at start (updates, sync)."""
    dom = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          "--disable-quic", f"--user-data-dir={profile}", "--window-size=1400,1000",
                          "--virtual-time-budget=60000", "--dump-dom", page],
                         check=True, capture_output=True, text=True, timeout=300).stdout
    reader = _VisibleText()
    reader.feed(dom)
    return reader.pieces


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (Debian: apt-get install chromium)")
def test_the_mlflow_ui_shows_the_runs_side_by_side(sweep, mlflow_server: str, tmp_path: Path) -> None:
    """What a person sees: MLflow's compare view of the sweep's two runs, rendered by headless
    Chromium from the real server — both runs by name, what their rows change (N, ε_ls) with each
    run's value, and the dev metrics."""
    url = mlflow_server
    experiment = _get(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="table3")["experiment"]
    runs = _search(url, experiment["experiment_id"])
    ids = [run["info"]["run_id"] for run in runs]
    page = f"{url}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([experiment['experiment_id']])}"
    shown = _rendered_text(page, tmp_path / "profile")
    assert "Comparing 2 Runs from 1 Experiment" in shown
    for run in runs:
        assert any(piece.startswith(run["info"]["run_name"]) for piece in shown), run["info"]["run_name"]
    params = [{param["key"]: param["value"] for param in run["data"]["params"]} for run in runs]
    for key in ("model.n_layers", "loss.label_smoothing"):  # a column a run, in the page's order of runs
        values = [each[key] for each in params]
        assert len(set(values)) == 2, values  # the rows differ in it
        at = shown.index(key)
        assert shown[at + 1:at + 3] == values, (key, shown[at:at + 3])
    assert {"dev/bleu", "dev/ppl", "train/loss"} <= set(shown[shown.index("Metrics"):])


def _flat(config: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in config.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _flat(value, f"{prefix}{key}.")
    return keys


def logged_keys(run_dirs: list[Path]) -> dict[str, set[str]]:
    """What W&B offline runs logged, as a report's panels name it: history, summary and config keys."""
    import wandb

    wandb.teardown()  # the run files are whole once wandb's service has closed them (tests/helpers/wandb_offline)
    runs = [read_run(run_dir) for run_dir in run_dirs]
    return {"history": set().union(*({key for row in run.history for key in row} for run in runs)),
            "summary": set().union(*(set(run.summary) for run in runs)),
            "config": set().union(*(_flat(run.config) for run in runs))}


def assert_panels_name_logged_keys(report, train_dirs: list[Path], eval_dirs: list[Path]) -> None:
    named = named_keys(report)
    for runs, dirs in ((TRAIN, train_dirs), (EVAL, eval_dirs)):
        if not any(named[runs].values()):
            continue
        logged = logged_keys(dirs)
        for where in ("history", "summary", "config"):
            missing = named[runs][where] - logged[where]
            assert not missing, f"{runs} panels name {where} keys no run logged: {sorted(missing)}"


@pytest.mark.slow
def test_table3_report_names_only_keys_the_runs_log(sweep) -> None:
    runs_dir, _, _ = sweep
    report = build_report("table3", "an-entity", "aiayn", "| the table |")
    named = named_keys(report)
    assert set(CURVE_X) <= named[TRAIN]["history"] and {"dev/tokenized_bleu", "dev/ppl", "parameters"} <= named[TRAIN]["summary"]
    assert {"model.n_heads", "model.d_k", "model.n_layers", "loss.label_smoothing"} <= named[TRAIN]["config"]
    assert_panels_name_logged_keys(report, sorted(runs_dir.glob("*_table3-*")), [])
    # A key no run has is caught: the check is not vacuous.
    with pytest.raises(AssertionError, match="val/no_such_metric"):
        broken = build_report("table3", "an-entity", "aiayn", "")
        broken.blocks[3].panels[0].y = ["val/no_such_metric"]
        assert_panels_name_logged_keys(broken, sorted(runs_dir.glob("*_table3-*")), [])


def test_every_table_has_its_panels() -> None:
    assert set(SECTIONS) == set(REPORTED_TABLES) == {"table2", "table3", "table4"}
    assert {"test/tokenized_bleu", "test/bleu"} <= named_keys(build_report("table2", "e", "p", ""))[EVAL]["summary"]
    table4 = named_keys(build_report("table4", "e", "p", ""))[EVAL]
    assert {"test/f1", "test/precision", "test/recall", "test/exact_match"} <= table4["summary"]
    assert {"decoding.constrained", "train.experiment.row"} <= table4["config"]


def test_report_leaves_out_the_runs_tagged_modified_unless_asked() -> None:
    """As the table block does (experiments.runs.counted): every run set filters on W&B's run tags,
    which a row run changed from its row carries (aiayn.config.identity), and so do evaluate.py's
    runs of it."""
    from wandb_workspaces import expr

    def filters(report: Any) -> list[Any]:
        runsets = [runset for block in report.blocks for runset in getattr(block, "runsets", [])]
        assert {"train.experiment.table" in runset.filters for runset in runsets} == {True, False}  # both kinds
        return [expr.expr_to_filters(runset.filters) for runset in runsets]

    for parsed in filters(build_report("table2", "e", "p", "")):
        leaves = {(leaf.key.section, leaf.key.name): (leaf.op, leaf.value) for leaf in parsed.filters}
        table = leaves.pop(("config", "experiment.table"), None) or leaves.pop(("config", "train.experiment.table"))
        assert table == ("=", "table2") and leaves == {("run", "tags"): ("NIN", ["modified"])}
    for parsed in filters(build_report("table2", "e", "p", "", include_modified=True)):
        assert (parsed.key.section, parsed.op, parsed.value) == ("config", "=", "table2")


def _offline_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An empty home (no W&B key) and the environment of a fresh shell there; matplotlib's own
    settings and cache, which its first import in a process writes, kept apart from it."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return home, {**env, "HOME": str(home), "MPLCONFIGDIR": str(tmp_path / "matplotlib")}


@pytest.mark.parametrize("table", REPORTED_TABLES)
def test_report_refused_in_one_line_while_wandb_is_offline(table: str, tmp_path: Path) -> None:
    home, env = _offline_home(tmp_path)
    result = run_tool("experiments/tables.py", "report", "--table", table, "--entity", "someone", env=env, cwd=home,
                      check=False)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tables.py: W&B is offline") and "wandb sync" in lines[0]
    assert list(home.iterdir()) == []  # nothing else happened


def test_rebuild_from_wandb_refused_in_one_line_while_wandb_is_offline(tmp_path: Path) -> None:
    """Before: wandb's UsageError traceback."""
    home, env = _offline_home(tmp_path)
    result = run_tool("experiments/tables.py", "rebuild", "--wandb", "someone/aiayn", "--out", str(home / "out"),
                      env=env, cwd=home, check=False)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tables.py: W&B is offline") and "--runs <folder>" in lines[0]
    assert list(home.iterdir()) == []


def test_mlflow_ui_command_in_readme() -> None:
    assert "mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db" in (REPO / "README.md").read_text()
