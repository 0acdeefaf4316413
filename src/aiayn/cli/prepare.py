"""Prepare a task's data ahead of training: `python src/prepare.py task=wmt_en_de [task.raw_dir=...]`.

Composes conf/prepare.yaml and runs the task's datamodule ``prepare_data`` (for WMT14: locate or
download the archives, clean, learn the shared subword model, binarise, or reuse the folder
prepared from the same raw files; see docs/wmt.md). It checks every split's files on the way,
so a missing or damaged file is found here rather than in a training run. What the user can fix
(an unknown task, a raw folder that is not there, a damaged archive or file) is one line on
stderr and exit status 2.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from aiayn.cli import CONFIG_DIR
from aiayn.cli.errors import reports_composition_errors, reports_errors


@reports_composition_errors  # an unknown task (or other override Hydra refuses): one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="prepare")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> None:
    datamodule = hydra.utils.instantiate(cfg.task.datamodule)
    datamodule.prepare_data()
    where = getattr(datamodule, "prepared", None)
    if where is not None:
        print(f"prepared {cfg.task.name} in {where} (cleaning report: {where / 'report.json'})")
    else:
        print(f"prepared {cfg.task.name}")


if __name__ == "__main__":
    main()
