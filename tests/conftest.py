"""Shared test fixtures."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


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
