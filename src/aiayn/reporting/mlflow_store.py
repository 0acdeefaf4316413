"""The MLflow store a run or an evaluation logs into: which one (``sqlite:///mlruns/mlflow.db`` by
default), its check before anything is run, and the lock around a new store's first use; without
MLflow or Lightning, so that a tool refuses a bad store in a second (evaluate.py's ``mlflow=``).
The logger itself is :mod:`aiayn.reporting.mlflow_logger`."""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from filelock import FileLock

from aiayn.errors import ConfigError

DEFAULT_STORE = "sqlite:///mlruns/mlflow.db"


def first_use_lock(tracking_uri: str) -> contextlib.AbstractContextManager:
    """Held around a process's first use of a SQLite store (``<file>.lock`` beside it): MLflow
    migrates a new store's tables as it opens it, and several jobs starting together would each
    migrate the same tables (alembic's ``CommandError``, ``duplicate column name``) and each make
    the same experiment. Another kind of store (a server, a database) migrates itself."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return contextlib.nullcontext()
    return FileLock(f"{tracking_uri[len(prefix):]}.lock")


def local_store(tracking_uri: str) -> tuple[str, str | None]:
    """``tracking_uri`` with a relative SQLite path made absolute (from the working directory,
    the folder made), and where the artifacts of a new experiment go: ``artifacts/`` beside the
    SQLite file (None for another kind of store: the store's own default)."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return tracking_uri, None
    path = Path(tracking_uri[len(prefix):])
    path = path if path.is_absolute() else Path.cwd() / path
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"{prefix}{path}", (path.parent / "artifacts").as_uri()


# The stores MLflow writes to, by the URI's scheme (a database's with its driver, postgresql+psycopg2,
# by the part before "+"): a server, a SQLite file, another database, Databricks.
STORE_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")


def check_store(tracking_uri: str, setting: str) -> None:
    """A ConfigError, before anything is run, for a ``tracking_uri`` MLflow would fail on once the
    work is done (its traceback): a folder (MLflow 3's file store takes no new runs), a scheme that
    names no store, or a server (``http(s)://``) that does not answer (MLflow would retry for
    minutes first). Any answer from a server will do: what it says is MLflow's to judge."""
    given = f"{setting}={tracking_uri}" + (" (MLFLOW_TRACKING_URI)"
                                          if os.environ.get("MLFLOW_TRACKING_URI") == tracking_uri else "")
    scheme = urlparse(tracking_uri).scheme.split("+", 1)[0]
    if scheme in ("", "file"):
        raise ConfigError(f"{given} is a folder, MLflow's file store, which MLflow 3 no longer writes runs to; give a "
                          f"SQLite file there instead, e.g. sqlite:///{Path(urlparse(tracking_uri).path or '.')}/mlflow.db "
                          "(mlflow migrate-filestore moves the runs of an existing one)")
    if scheme not in STORE_SCHEMES:
        raise ConfigError(f"{given}: {scheme}:// names no MLflow store; give a SQLite file ({DEFAULT_STORE}), "
                          "a server (http://host:5000) or a database (postgresql://, mysql://, mssql://)")
    if scheme not in ("http", "https"):
        return
    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=10):
            return
    except urllib.error.HTTPError:
        return  # a server answered
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ConfigError(f"{given}: no MLflow server answers there ({reason}); start it "
                          f"(mlflow server --backend-store-uri {DEFAULT_STORE}), or log into a local store instead: "
                          f"unset MLFLOW_TRACKING_URI for {DEFAULT_STORE}") from None
