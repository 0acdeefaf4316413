"""Loading a trained module back from its checkpoint's hyper-parameters, also those written while
the model config still carried the training recipe."""

from __future__ import annotations

import pytest
import torch

from aiayn.checkpoints.trained import module_arguments, put_weights
from aiayn.errors import DataError
from aiayn.model import Transformer
from aiayn.training.module import TranslationModule

NETWORK = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "dropout": 0.1, "max_positions": 64}
HPARAMS = {"vocab_size": 100, "optim": {"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4, "lr_factor": 1.0},
           "decoding": {}}


def test_todays_hyper_parameters_are_the_modules_arguments() -> None:
    saved = {**HPARAMS, "model": NETWORK, "label_smoothing": 0.2}
    assert module_arguments(saved) is saved


def test_a_checkpoint_whose_model_config_carried_the_recipe() -> None:
    old = {**HPARAMS, "model": {**NETWORK, "d_model": 64, "d_ff": 128, "d_k": 32, "d_v": 32, "name": "small",
                                "label_smoothing": 0.2, "train_steps": 10, "warmup_steps": 4, "lr_factor": 1.0,
                                "validate_every_n_steps": 5, "width_divisor": 2}}
    arguments = module_arguments(old)
    assert arguments["model"] == NETWORK and arguments["label_smoothing"] == 0.2  # the widths trained
    with torch.device("meta"):
        module = TranslationModule(**arguments)
    assert module.model.d_model == 32 and module.label_smoothing == 0.2


def test_a_run_config_naming_a_class_that_has_moved_points_at_its_new_place() -> None:
    from hydra.utils import get_object

    from aiayn.checkpoints.trained import MOVED_TARGETS, _moved_targets

    old = {"task": {"datamodule": {"_target_": "aiayn.data.datamodule.Multi30kDataModule", "src_lang": "en"}},
           "logger": {"_target_": "aiayn.training.loggers.wandb_logger"}, "callbacks": [{"_target_": "x.Y"}]}
    config = _moved_targets(old)
    assert config["task"]["datamodule"] == {"_target_": "aiayn.data.multi30k.Multi30kDataModule", "src_lang": "en"}
    assert config["logger"]["_target_"] == "aiayn.reporting.loggers.wandb_logger"
    assert config["callbacks"] == [{"_target_": "x.Y"}]  # names that did not move stay
    for new in MOVED_TARGETS.values():  # every new place exists
        assert callable(get_object(new))


def test_a_separate_vocabularies_checkpoint_with_an_untied_output_projection_is_refused_in_one_line():
    """Written before model.share_embeddings=false kept the target embedding as the pre-softmax
    matrix (§3.4): its own ``output_projection.weight`` has no place in the network built now."""
    sizes = {"n_layers": 1, "d_model": 8, "d_ff": 16, "n_heads": 2, "d_k": 4, "d_v": 4, "max_positions": 8}
    model = Transformer(11, 13, share_embeddings=False, **sizes)
    weights = {**model.state_dict(), "output_projection.weight": torch.zeros(13, 8)}
    with pytest.raises(DataError) as refused:
        put_weights(model, weights, "old.ckpt")
    message = str(refused.value)
    assert message.startswith("old.ckpt: its weights are laid out otherwise") and "\n" not in message
    assert "not this network's 1 (output_projection.weight)" in message
