"""A checkpoint saved in the background on a GPU (checkpoint.in_background, the default): the state
is copied into host memory, so a save takes no GPU memory beyond what the batch plan counted
(aiayn.config.memory), and the file holds CPU tensors equal to the GPU's, the tied embeddings once.
(tests/checkpoints/test_background.py: the same writer on the CPU.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.background import BackgroundCheckpointIO, snapshot
from aiayn.model import Transformer

pytestmark = pytest.mark.gpu


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


def test_a_gpus_training_state_is_copied_into_host_memory_and_written_from_there(cuda: torch.device,
                                                                                 tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Transformer(2000, 2000, n_layers=1, d_model=64, d_ff=128, n_heads=2).to(cuda)
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    state = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "global_step": 1}
    torch.cuda.synchronize(cuda)
    before = torch.cuda.memory_allocated(cuda)
    copied = snapshot(state)
    assert torch.cuda.memory_allocated(cuda) == before, "the copy took GPU memory"
    assert all(tensor.device.type == "cpu" for tensor in _tensors(copied))
    assert len(_tensors(copied)) == len(_tensors(state))

    writer = BackgroundCheckpointIO()
    writer.save_checkpoint(state, tmp_path / "step0000001.ckpt")
    writer.teardown()
    loaded = torch.load(tmp_path / "step0000001.ckpt", weights_only=False)  # no map_location: CPU tensors
    assert all(tensor.device.type == "cpu" for tensor in _tensors(loaded))
    assert all(torch.equal(loaded["state_dict"][name], tensor.cpu()) for name, tensor in state["state_dict"].items())
    moments = loaded["optimizer_states"][0]["state"][0]
    assert torch.equal(moments["exp_avg_sq"], state["optimizer_states"][0]["state"][0]["exp_avg_sq"].cpu())
    assert loaded["state_dict"]["src_embedding.weight"].untyped_storage().data_ptr() == \
        loaded["state_dict"]["tgt_embedding.weight"].untyped_storage().data_ptr()
