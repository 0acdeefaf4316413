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
from tests.helpers.inprocess import run_tool
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


@pytest.mark.parametrize("limit, line", [
    # Before: each passed --cfg job and the plan, and the run failed as Lightning's Trainer was built
    # (an AttributeError's traceback for the number, Lightning's "Timer(duration=...)" for the rest).
    ("3600", ("trainer.max_time=3600 is not a duration Lightning takes; give DD:HH:MM:SS (trainer.max_time=00:01:00:00) "
             "or a mapping such as {hours:12}")),
    ("1:30:00", ("trainer.max_time=1:30:00 is not a duration Lightning takes; give DD:HH:MM:SS "
                "(trainer.max_time=00:01:30:00) or a mapping such as {hours:12}")),
    ("soon", ("trainer.max_time=soon is not a duration Lightning takes; give DD:HH:MM:SS (trainer.max_time=00:12:00:00 "
             "for 12 hours) or a mapping such as {hours:12}")),
    ("{hour:1}", ("trainer.max_time={'hour': 1}: a mapping takes numbers for weeks, days, hours, minutes, seconds, "
                 "milliseconds, microseconds (e.g. trainer.max_time={hours:12}), or give DD:HH:MM:SS (00:12:00:00)")),
])
def test_a_time_limit_lightning_would_refuse_is_refused_in_one_line_with_the_value_to_give(
        limit: str, line: str, tmp_path) -> None:
    result = run_tool("src/train.py", "debug=tiny", f"trainer.max_time={limit}", "--cfg", "job", cwd=tmp_path, check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [f"train.py: {line}"], result.stderr[-3000:]


@pytest.mark.parametrize("limit", ["00:01:30:00", "{hours:1.5}", "{days:1,hours:1,minutes:30}"])
def test_the_time_limits_lightning_takes_are_taken_and_its_timer_reads_them(limit: str, tmp_path) -> None:
    from lightning.pytorch.callbacks import Timer

    result = run_tool("src/train.py", "debug=tiny", f"trainer.max_time={limit}", "--cfg", "job", cwd=tmp_path)
    given = OmegaConf.to_container(OmegaConf.create(result.stdout))["trainer"]["max_time"]
    assert Timer(duration=given).time_remaining() == 5400 + ("days" in limit) * 86400  # as the run's Trainer builds it
