"""Prepare a task's data ahead of training: `python src/prepare.py task=wmt_en_de [task.raw_dir=...]`.

Composes conf/prepare.yaml and runs the task's datamodule ``prepare_data`` (for WMT14: locate or
download the archives, clean, learn the shared subword model, binarise, or reuse the folder
prepared from the same raw files, see docs/wmt.md; for a corpus of one's own, the same for its
training split without the cleaning). It checks every split's files on the way,
so a missing or damaged file is found here rather than in a training run: the raw files read
through, and a prepared folder's files against the sizes and SHA-256 recorded when they were
written (one that is not as written is prepared again, said in one line of the log). What the
user can fix (an unknown task, a raw folder that is not there, a damaged archive or file, a full
disk) is one line on stderr and exit status 2. Ctrl-C is one line and exit status 130, with nothing
half-written left (no temporary folder, no lock file).
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from aiayn.cli.command_line import read_by_hydra
from aiayn.cli.errors import INTERRUPTED, fail, reports_composition_errors, reports_errors
from aiayn.cli.naming import CONFIG_DIR
from aiayn.config.identity import override_key


@read_by_hydra("prepare")  # paths as one value, old names, Hydra's options anywhere (aiayn.cli.command_line)
@reports_composition_errors  # an unknown task (or other override Hydra refuses): one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="prepare")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> None:
    from aiayn.training.config_check import check_task

    # The task's decoding is composed with it (a parser's constrained decoding), and nothing here decodes.
    asked = [o for o in HydraConfig.get().overrides.task if override_key(o).split(".", 1)[0] == "decoding"]
    if asked:
        fail(f"{asked[0]}: prepare.py decodes nothing, so it would be ignored; decoding settings are given to "
             "train.py, evaluate.py, translate.py and export.py")
    check_task(OmegaConf.to_container(cfg.task, resolve=True))  # as train.py checks it: vocab_size, the batch sizes, ...
    datamodule = hydra.utils.instantiate(cfg.task.datamodule)
    try:
        datamodule.prepare_data(hashes=True)
    except KeyboardInterrupt:  # what was being written is removed on the way out (aiayn.files.atomic_path)
        fail(f"interrupted before {cfg.task.name} was prepared; nothing half-written was kept. Run the same "
             "command again to prepare it", INTERRUPTED)
    where = getattr(datamodule, "prepared", None)
    report = where / "report.json" if where is not None else None
    print(f"prepared {cfg.task.name}" + (f" in {where}" if where is not None else "")
          + (f" (cleaning report: {report})" if report is not None and report.is_file() else ""))


if __name__ == "__main__":
    main()
