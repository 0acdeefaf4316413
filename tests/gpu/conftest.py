"""What the GPU tests share: the device, with fp32 matrix products in full fp32 while a test runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def cuda() -> Iterator[torch.device]:
    """The CUDA device. Matrix products in fp32 use full fp32, not TF32, for the duration of the
    test: the fp32 tolerances of these tests assume it, and src/train.py sets "high" (TF32) for its
    own process, which a test run in this process must not inherit."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield torch.device("cuda")
    finally:
        torch.set_float32_matmul_precision(previous)
