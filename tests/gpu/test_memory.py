"""The GPU's memory as the plan reads it (aiayn.config.hardware.this_machine), on a real GPU: what
tests/config/test_memory.py's simulated machines stand for."""

from __future__ import annotations

import pytest
import torch

from aiayn.config.hardware import this_machine

pytestmark = pytest.mark.gpu


def test_this_gpus_memory_is_read() -> None:
    assert this_machine().gpu_memory == min(torch.cuda.get_device_properties(i).total_memory
                                            for i in range(torch.cuda.device_count()))
