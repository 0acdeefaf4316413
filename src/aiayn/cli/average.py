"""Average a run's last checkpoints (§6.1):
`python src/average.py ckpt=<checkpoint, or a run dir> average_last=5 out=<file.ckpt>`.

``ckpt`` and ``average_last`` mean what they mean in evaluate.py and export.py: the
``average_last`` checkpoints ending at ``ckpt`` (a run dir or its checkpoints/ folder: its newest).
Without ``average_last``, as many as the run's own recipe averages (its ``checkpoint.average_last``:
base 5, big 20).

Writes `out` (atomically) as the newest of those checkpoints with the averaged weights, and prints
which checkpoints went in. A missing folder, too few or mismatched checkpoints is one line on stderr, exit 2.
"""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from aiayn.checkpoints.given import one_checkpoint
from aiayn.cli.command_line import read_by_hydra
from aiayn.cli.errors import reports_composition_errors, reports_errors
from aiayn.cli.naming import CONFIG_DIR, tool_command
from aiayn.cli.outputs import output_file
from aiayn.errors import ConfigError, DataError


@read_by_hydra("average")  # paths as one value, old names, Hydra's options anywhere (aiayn.cli.command_line)
@reports_composition_errors  # an override Hydra cannot apply: one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="average")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> None:
    for key in ("ckpt", "out"):
        if OmegaConf.is_missing(cfg, key) or cfg[key] in (None, ""):
            raise ConfigError(f"give {key}=...  (usage: {tool_command()} ckpt=<run dir or checkpoint> "
                              "[average_last=5] out=<file.ckpt>)")
    if cfg.average_last is not None and cfg.average_last < 1:
        raise ConfigError(f"average_last must be a positive number of checkpoints, not {cfg.average_last!r}")
    out = Path(cfg.out)
    if out.is_dir():
        raise ConfigError(f"out={cfg.out} is a folder; give the file to write, e.g. out={out / 'averaged.ckpt'}")
    from aiayn.checkpoints.averaging import (  # torch: once settings are checked
        average_checkpoints,
        last_checkpoints,
        recipe_window,
    )
    from aiayn.checkpoints.io import checkpoint_step, not_found, save_checkpoint_atomically

    if os.path.lexists(out):
        raise ConfigError(f"out={cfg.out} exists; averaging never writes over a file: give a new name, e.g. "
                          f"out={out.with_name('averaged.ckpt')}")
    if out.name.startswith("last") or checkpoint_step(out) is not None:
        raise ConfigError(f"out={cfg.out}: a name a run gives its own checkpoints (resume would take it for that "
                          f"step); give another, e.g. out={out.with_name('averaged.ckpt')}")
    output_file(cfg.out)  # its folder can be made and written in, checked before any checkpoint is read
    ckpt = Path(one_checkpoint(cfg.ckpt, "one checkpoint (or run folder)"))
    if not ckpt.exists() and (ckpt.suffix == ".ckpt" or ckpt.is_symlink()):  # a checkpoint meant, not a folder
        raise DataError(not_found(ckpt))
    count = recipe_window(ckpt) if cfg.average_last is None else cfg.average_last  # the run's own §6.1 window
    # DataError: missing folder, too few checkpoints
    paths = (last_checkpoints(ckpt.parent, count, ending_at=ckpt) if ckpt.is_file()
             else last_checkpoints(ckpt, count))
    checkpoint = average_checkpoints(paths)  # DataError: unreadable checkpoints, or of different models
    for path, step in zip(paths, checkpoint["averaged_steps"]):
        print(f"  step {step}: {path}")
    out = save_checkpoint_atomically(checkpoint, cfg.out)
    recipes = " (the run's checkpoint.average_last)" if cfg.average_last is None else ""
    what = f"averaged {len(paths)} checkpoints{recipes}" if len(paths) > 1 else "copied the checkpoint (average_last=1)"
    print(f"{what} (newest: step {checkpoint.get('global_step', '?')}) -> {out}")


if __name__ == "__main__":
    main()
