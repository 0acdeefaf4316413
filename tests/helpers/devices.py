"""Checking on a CPU-only machine that code would run right on a GPU (used by
tests/model/test_device_placement.py and tests/test_inference_devices.py).

:func:`tensors_name_their_device`: inside it, a factory call that names no device (``torch.zeros``,
``arange``, ``full``, ``tensor(...)`` …) makes a meta tensor instead of a CPU one, and any operation
that reads a meta tensor raises :class:`DeviceNotNamed`. With the model and inputs on the CPU, the
code under test then fails exactly where a CUDA run would have met a CPU tensor among CUDA ones.
Torch's own device check alone does not suffice: it lets an index tensor live on another device
(as CUDA lets a CPU index into a CUDA tensor), and indexing a CPU tensor with a meta index returns
garbage without an error; hence the dispatch-level check, which sees every operation's tensors.

:func:`count_host_syncs`: counts the operations that make the host wait for the device, i.e. that
would block on a GPU: reading a value back (``.item()``, ``int``/``float``/``bool`` of a tensor,
``.tolist()``, ``.numpy()``, ``.cpu()``) and the operations whose output size depends on the
data (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``, ``repeat_interleave``
with tensor repeats, ``bincount``, ``equal``). A copy to the CPU written as ``.to(device)`` is not
seen: on a CPU-only machine it cannot be told from a no-op.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

aten = torch.ops.aten


class DeviceNotNamed(RuntimeError):
    """A tensor was created without ``device=`` (it came out on the meta device), or a host
    tensor (:func:`host_tensors`) was computed with before it was moved to a device."""


_HOST = "_made_on_the_host"  # the attribute that marks a host tensor


def host_tensors(tree):
    """Marks the tensors of ``tree`` (a batch, a list …) as made on the host for the device: inside
    :func:`tensors_name_their_device`, any operation on one raises until ``.to(device)`` has
    given a tensor of its own (on a CPU-only machine ``.to("cpu")`` would be a no-op and a
    forgotten one would pass unseen). Returns ``tree``."""
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            setattr(leaf, _HOST, True)
    return tree


class _NoMetaTensors(TorchDispatchMode):
    """Raises as soon as an operation takes or makes a meta tensor, or takes a host tensor."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _refuse_meta(func, (args, kwargs), "was given")
        # (.to itself, as aten.to under inference_mode, as its copy aten._to_copy elsewhere, is the move)
        if func.overloadpacket not in (aten._to_copy, aten.to) and any(getattr(leaf, _HOST, False)
                                                     for leaf in pytree.tree_leaves((args, kwargs))):
            raise DeviceNotNamed(f"{func} was given a tensor made on the host and never moved with .to(device)")
        out = func(*args, **kwargs)
        _refuse_meta(func, out, "made")
        return out


class _MovesOffTheHost(TorchFunctionMode):
    """``.to(...)`` of a host tensor gives a tensor that is not one, even where it copies nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "to" and out is args[0] and getattr(out, _HOST, False):
            with _disable_current_modes():
                out = out.view_as(out)  # the same numbers, unmarked
        return out


def _refuse_meta(func, tree, verb: str) -> None:
    if any(isinstance(leaf, torch.Tensor) and leaf.is_meta for leaf in pytree.tree_leaves(tree)):
        raise DeviceNotNamed(f"{func} {verb} a tensor on no device of its own: a factory call without device= "
                             "(on a GPU it would be a CPU tensor among CUDA ones)")


@contextlib.contextmanager
def tensors_name_their_device() -> Iterator[None]:
    """Device-less factory calls make meta tensors; any operation on one, or on a host tensor
    not yet moved (:func:`host_tensors`), raises DeviceNotNamed."""
    with torch.device("meta"), _MovesOffTheHost(), _NoMetaTensors():
        yield


@contextlib.contextmanager
def on_the_host() -> Iterator[None]:
    """Host-side code (a collator, a data loader's worker) that means its tensors for the CPU,
    inside :func:`tensors_name_their_device`: its device-less factory calls make CPU tensors again
    (mark what it gives with :func:`host_tensors`)."""
    with torch.device("cpu"):
        yield


# Operations that read data back to the host, or whose output size depends on the data.
_SYNC_OPS = {aten.nonzero, aten.equal, aten.masked_select, aten._unique, aten._unique2, aten.unique_dim,
             aten.unique_consecutive, aten.bincount}
# A scalar read back (``.item()``, ``int``/``float``/``bool`` of a tensor): ``_local_scalar_dense``
# where autograd's keys run (no_grad), ``item`` or ``is_nonzero`` under inference_mode, which skips
# them; counted as one kind either way.
_SCALAR_READS = {aten._local_scalar_dense, aten.item, aten.is_nonzero}
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
# Tensor methods that copy to the host without an aten operation seen on a CPU tensor.
_HOST_COPIES = {"tolist", "numpy", "cpu"}


class HostSyncs:
    """What :func:`count_host_syncs` saw: ``kinds`` counts each kind of wait, ``total`` all of them."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


class _DispatchSyncs(TorchDispatchMode):
    def __init__(self, seen: HostSyncs):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in _SCALAR_READS:
            self.seen.kinds["_local_scalar_dense"] += 1
        elif packet in _SYNC_OPS:
            self.seen.kinds[packet.__name__] += 1
        # tensor repeats (self_Tensor: as inference_mode dispatches x.repeat_interleave(repeats))
        elif func in (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor) and \
                kwargs.get("output_size") is None:
            self.seen.kinds["repeat_interleave"] += 1
        elif packet in _INDEXING and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self.seen.kinds["boolean_index"] += 1
        return func(*args, **kwargs)


class _FunctionSyncs(TorchFunctionMode):
    def __init__(self, seen: HostSyncs):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _HOST_COPIES and isinstance(args[0] if args else None, torch.Tensor):
            self.seen.kinds[name] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_host_syncs() -> Iterator[HostSyncs]:
    """Counts the host synchronisations of the code run inside it (see the module docstring)."""
    seen = HostSyncs()
    with _FunctionSyncs(seen), _DispatchSyncs(seen):
        yield seen
