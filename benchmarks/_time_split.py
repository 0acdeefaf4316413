"""Where one training step's time goes: the step run once under torch.profiler, its time split by
kind of work, so that a speed target missed says why (benchmarks/train_throughput.py ``--profile``,
benchmarks/gpu_suite.py's targets).

Each operator's own time (on CUDA the kernels it launched itself, on the CPU its own CPU time) goes
to the kind of the innermost operator of its call chain that names one:

* ``matmul``: matrix products (``aten::mm``, ``addmm``, ``bmm``, ...), forward and backward;
* ``attention``: SDPA's fused kernels (``aten::_scaled_dot_product_*``, ``_efficient_attention_*``,
  ``_flash_attention_*``); the explicit Eq. 1's products are matmul, its softmax other;
* ``loss``: the label-smoothed loss (log-softmax, NLL, the fused loss's autograd function);
* ``optimizer``: Adam's update and zeroing the gradients;
* ``other``: the rest (layer norm, dropout, residual sums, ReLU, embeddings, casts, copies).

``busy_s`` is their sum: on CUDA the GPU's kernel time, which set beside the step's time unprofiled
(``busy_share``) says how much of a step the GPU works and how much it waits for the host. The
profiler's own overhead falls on the host, not in the kernels, so the kernel times hold. On the
CPU, where the operators' times are the host's and the profiler inflates them, there is no share.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch

KINDS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::_addmm_activation"),
    "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::_efficient_attention",
                  "aten::_flash_attention", "aten::_cudnn_attention"),
    "loss": ("aten::log_softmax", "aten::_log_softmax", "aten::nll_loss", "LogSoftmaxBackward", "NllLossBackward",
             "_FusedLabelSmoothedLoss"),
    "optimizer": ("Optimizer.step", "Optimizer.zero_grad", "aten::_fused_adam", "aten::_foreach"),
}
TOP = 8  # the operators with the most own time kept by name


def kind_of(chain: list[str]) -> str:
    """The kind of an operator from its call chain, innermost first (its own name, then its callers')."""
    for name in chain:
        for kind, prefixes in KINDS.items():
            if name.startswith(prefixes):
                return kind
    return "other"


def profiled_step(step: Callable[[], Any], device: torch.device, step_seconds: float, rows: int = 0) -> dict:
    """Run ``step`` once under the profiler (``rows`` > 0: print its top operators by own time);
    the split of its time, ``busy_share`` against ``step_seconds`` (the step's time unprofiled)."""
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as profiler:
        if cuda:
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        profiled_s = time.perf_counter() - started
    if rows:
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        print(profiler.key_averages().table(sort_by=sort, row_limit=rows), file=sys.stderr)
    by_kind = dict.fromkeys([*KINDS, "other"], 0.0)
    own: dict[str, float] = {}
    for event in profiler.events():
        if event.device_type != torch.autograd.DeviceType.CPU:
            continue  # a kernel's time is counted with the operator that launched it
        seconds = (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
        if seconds <= 0:
            continue
        chain, caller = [event.name], event.cpu_parent
        while caller is not None:
            chain.append(caller.name)
            caller = caller.cpu_parent
        by_kind[kind_of(chain)] += seconds
        own[event.name] = own.get(event.name, 0.0) + seconds
    busy = sum(by_kind.values())
    top = sorted(own.items(), key=lambda item: -item[1])[:TOP]
    return {"device": device.type, "profiled_step_s": round(profiled_s, 6), "busy_s": round(busy, 6),
            "busy_share": round(busy / step_seconds, 4) if cuda and step_seconds > 0 else None,
            "by_kind": {kind: round(seconds, 6) for kind, seconds in by_kind.items()},
            "top": [[name, round(seconds, 6)] for name, seconds in top]}


def describe(split: dict) -> str:
    """One line: the busy share and each kind's part of the busy time."""
    busy = split["busy_s"] or 1.0
    kinds = ", ".join(f"{kind} {100 * seconds / busy:.0f}%" for kind, seconds in split["by_kind"].items())
    share = f"kernels busy {100 * split['busy_share']:.0f}% of the step; " if split.get("busy_share") else ""
    return f"{share}of that time: {kinds}"
