"""Shared test fixtures."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import aiayn.config  # noqa: F401  registers the schemas and resolvers that conf/ composes with
from tests.helpers.inprocess import put_back_signals, signal_state, train
from tests.helpers.runs import REPO, TINY_RUN, TrainedRun, snapshot


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test``) each worker gets its share of the cores, for torch in this
    process and, through OMP_NUM_THREADS, for the processes its tests start: workers that each
    took every core would only contend."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` are skipped, with the reason shown in the summary, where torch sees no
    usable CUDA GPU: never passed without running."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU; torch {torch.__version__} sees none on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not the keyword (tests/gpu/ is one)
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def hydra_left_as_found() -> Iterator[None]:
    """A test that calls a tool's ``main`` itself (``--cfg job``, say) leaves Hydra's global state —
    the job's config, with its overrides — as tests.helpers.inprocess's runs do not: put back after
    every test, so that no later test's config reads another's job (the run names did)."""
    from hydra.core.hydra_config import HydraConfig

    before = HydraConfig.instance().cfg
    yield
    if HydraConfig.instance().cfg is not before:
        from hydra.core.global_hydra import GlobalHydra

        HydraConfig.instance().cfg = before
        GlobalHydra.instance().clear()


@pytest.fixture(autouse=True)
def signals_left_as_found() -> Iterator[None]:
    """A test that builds a run's callbacks in this process (the preemption handling takes SIGTERM,
    SIGUSR1, … over to pass them on to spawned ranks, once per process) leaves the handlers as it
    found them, as tests.helpers.inprocess's runs do: put back after every test, so that no later
    test in the worker starts with another's handler (a forked child of a later test ignored
    SIGTERM, Lightning's SLURM requeue found SIGUSR1 taken)."""
    state = signal_state()
    yield
    put_back_signals(state)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real data folder: $AIAYN_DATA_ROOT, else ``<repo>/../shared/data``; fails if absent."""
    root = Path(os.environ.get("AIAYN_DATA_ROOT") or REPO.parent / "shared" / "data")
    if not (root / "multi30k" / "train.en.gz").is_file():
        pytest.fail(
            f"real data not found: {root / 'multi30k' / 'train.en.gz'} is missing; "
            "set AIAYN_DATA_ROOT to the folder holding multi30k/",
            pytrace=False,
        )
    return root


@pytest.fixture(scope="session")
def subword_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One AIAYN_CACHE_DIR for the session's tiny runs on Multi30k, so that their 500-subword
    sentencepiece model is trained once. The cache is keyed by the settings and the lines, so runs
    with other data add their own models beside it; tests of the cache itself use their own folder."""
    return tmp_path_factory.mktemp("subword-cache")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, data_root: Path, subword_cache: Path) -> Iterator[TrainedRun]:
    """One tiny src/train.py run on Multi30k, in this process (tests.helpers.runs.TINY_RUN: 2 layers, 4 steps, a step
    checkpoint after every step, attention pictures at the end), shared by the tests of
    evaluate, translate, average, visualize and bad input. Read-only: a test that writes (reports,
    averaged checkpoints, pictures) writes to its own tmp_path or into a copy; the session fails
    at its end if anything in the run's directory changed."""
    run_dir = tmp_path_factory.mktemp("tiny-run") / "run"
    train(run_dir, *TINY_RUN, data_root=data_root, cache_dir=subword_cache)
    before = snapshot(run_dir)
    yield TrainedRun(run_dir, subword_cache, tuple(TINY_RUN))
    after = snapshot(run_dir)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not changed, f"tests wrote into the shared tiny run {run_dir}: {changed}"


@pytest.fixture(scope="module")
def single_thread():
    """For tiny tensors intra-op threads only add overhead (and contend with other jobs)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def loopback_http(tmp_path: Path):
    """A real HTTP server on the loopback interface: (the folder it serves, its base URL)."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def faulty_http(tmp_path: Path):
    """A real HTTP server on the loopback interface with a download's faults (tests/helpers/faulty_http.py)."""
    from tests.helpers.faulty_http import FaultyServer

    root = tmp_path / "served"
    root.mkdir()
    server = FaultyServer(root)
    yield server
    server.shutdown()
    server.server_close()
