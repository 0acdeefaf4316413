"""Prepare a task's data ahead of training: `python src/prepare.py task=wmt_en_de [task.raw_dir=...]`.

Composes conf/prepare.yaml and runs the task's datamodule ``prepare_data`` (for WMT14: locate or
download the archives, clean, learn the shared subword model, binarise; see docs/wmt.md).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from aiayn.cli import CONFIG_DIR
from aiayn.cli.errors import reports_errors


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
