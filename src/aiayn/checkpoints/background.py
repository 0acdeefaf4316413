"""Lightning's checkpoint writers of a training run: :class:`AtomicCheckpointIO` saves through
:func:`aiayn.checkpoints.io.save_checkpoint_atomically`, and :class:`BackgroundCheckpointIO` does so
while training goes on (``checkpoint.in_background``).

A save holds training for as long as it takes to write and hash the file: ~10 s for big's 2.5 GB
on a slow disk, at every ``checkpoint.every_n_train_steps`` steps. Here the state is copied into
host memory (:func:`snapshot`: on a GPU, one device-to-host copy, so that a save takes no GPU memory
the batch plan of aiayn.config.memory did not count) and one background thread writes the copy
through :func:`aiayn.checkpoints.io.save_checkpoint_atomically` while the next steps train.
Everything the run does to its checkpoint files goes through that thread, in order: saves, the
removal of those no longer kept, ``last.ckpt``'s link (:meth:`BackgroundCheckpointIO.after_saves`,
which the callbacks reach through aiayn.training.saving). So the files on disk are always those of
some moment of a synchronous run: a link never names a file not yet written, a checkpoint is
removed only once a newer one is whole, and after a save that failed nothing more is done. A kill
loses at most the save under way (its temporary is removed on resume).

One save at a time: a save asked for while the one before it is still being written waits for it
(and says so once in the run's log), so that at most one copy of the state is held, however
often checkpoints are asked for and however slow the disk.

:meth:`BackgroundCheckpointIO.wait` waits for the thread: the preemption does before it says the
step is saved, and Lightning's teardown does when ``fit`` ends or fails. A save that failed (a
full disk) raises its error at the next save, wait or teardown.
"""
from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from aiayn.checkpoints.digest import remove_digest
from aiayn.checkpoints.io import save_checkpoint_atomically

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, but through :func:`save_checkpoint_atomically`."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's own
            return super().save_checkpoint(checkpoint, path, storage_options)
        save_checkpoint_atomically(checkpoint, path)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        super().remove_checkpoint(path)
        remove_digest(Path(path))


def snapshot(value: Any, _copies: dict | None = None) -> Any:
    """``value`` with every tensor in it copied into host memory (training changes the original a
    moment later) and the dicts, lists and tuples holding them rebuilt; anything else as it is.
    Tensors that are one (the tied embeddings' entries of a state_dict are views of one storage)
    are copied once and stay one, as ``torch.save`` writes them. (Lightning's apply_to_collection
    walks ``bytes`` byte by byte: the subword model in every checkpoint made that a second a save.)"""
    copies = {} if _copies is None else _copies
    if isinstance(value, torch.Tensor):
        same = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), value.stride(),
                value.dtype, value.device)
        if same not in copies:
            copies[same] = value.detach().to("cpu", copy=True)
        return copies[same]
    if isinstance(value, (dict, list)):
        copied = copy.copy(value)  # its own type and attributes (an OrderedDict, a defaultdict)
        for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
            copied[key] = snapshot(item, copies)
        return copied
    if isinstance(value, tuple):
        items = [snapshot(item, copies) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a named tuple, or not
    return value


class BackgroundCheckpointIO(AtomicCheckpointIO):
    """:class:`AtomicCheckpointIO` in one background thread, in the order of the calls."""

    def __init__(self) -> None:
        super().__init__()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._saving: Future | None = None  # the last save asked for
        self._failure: BaseException | None = None
        self._said_it_waited = False

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn pickles the plugin for its ranks
        return {**self.__dict__, "_executor": None, "_pending": [], "_saving": None}

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        self._one_save_at_a_time(path)
        self._saving = self._submit(super().save_checkpoint, snapshot(checkpoint), path, storage_options)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        self._submit(super().remove_checkpoint, path)

    def after_saves(self, action: Callable[..., Any], *args: Any) -> None:
        """Run ``action(*args)`` once the saves asked for before it are on disk."""
        self._submit(action, *args)

    def wait(self) -> None:
        """Return once every save, removal and action asked for is done; raise the error of the
        first that failed."""
        for future in self._pending:
            future.result()
        self._pending = []
        self._raise_failure()

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _one_save_at_a_time(self, path: str | os.PathLike) -> None:
        """Wait for the save before this one (not for the actions after it) to be on disk."""
        previous = self._saving
        if previous is None or previous.done():
            return
        started = time.monotonic()
        previous.result()
        if not self._said_it_waited:
            self._said_it_waited = True
            log.warning("the checkpoint before %s was still being written when it was asked for: training waited "
                        "%.1f s for it (one save at a time, so that one copy of the state is held); if this recurs, "
                        "a larger checkpoint.every_n_train_steps avoids it", Path(path).name,
                        time.monotonic() - started)

    def _submit(self, action: Callable[..., Any], *args: Any) -> Future:
        self._raise_failure()  # as soon as it is known
        self._pending = [future for future in self._pending if not future.done()]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        future = self._executor.submit(self._run, action, *args)
        self._pending.append(future)
        return future

    def _run(self, action: Callable[..., Any], *args: Any) -> None:
        """In the thread: ``action``, unless one before it failed (a link to a checkpoint that was
        not written, or the removal of the one before it, would leave the run worse off)."""
        if self._failure is not None:
            return
        try:
            action(*args)
        except BaseException as error:  # noqa: BLE001  raised in the training thread (_raise_failure)
            self._failure = error

    def _raise_failure(self) -> None:
        if self._failure is None:
            return
        for future in self._pending:  # the actions after it skip themselves while it is set
            future.result()
        self._pending = []
        failure, self._failure = self._failure, None
        raise failure
