"""The Trainer schema (aiayn.config.trainer) is Lightning's Trainer, argument for argument, with
Lightning's defaults; conf/train.yaml sets only what aiayn changes, and a misspelt argument is
refused while composing."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from lightning.pytorch import Trainer
from omegaconf import OmegaConf

from aiayn.config.trainer import PASSED_BY_TRAIN, TrainerConfig
from tests.helpers.runs import REPO


def test_the_schema_is_lightnings_trainer_with_its_defaults() -> None:
    lightning = {name: parameter.default for name, parameter in inspect.signature(Trainer.__init__).parameters.items()
                 if name != "self" and name not in PASSED_BY_TRAIN}
    ours = {field.name: field.default for field in fields(TrainerConfig)}
    assert ours == lightning


def test_train_yaml_sets_only_what_it_changes_and_misspelt_arguments_are_refused() -> None:
    trainer = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "train.yaml").trainer, resolve=False)
    defaults = {field.name: field.default for field in fields(TrainerConfig)}
    restated = [key for key, value in trainer.items() if defaults[key] == value]
    assert restated == [], "conf/train.yaml restates Lightning's defaults"
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["trainer.limit_val_batches=3", "trainer.detect_anomaly=true"])
        assert (cfg.trainer.limit_val_batches, cfg.trainer.detect_anomaly, cfg.trainer.num_nodes) == (3, True, 1)
        with pytest.raises(ConfigCompositionException, match="trainer.max_step"):
            compose("train", overrides=["trainer.max_step=10"])
