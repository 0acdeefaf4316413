"""Average a run's last checkpoints (§6.1):
`python src/average.py dir=<run dir or its checkpoints/> last=5 out=<file.ckpt>`.

Writes `out` (atomically) as the newest of those checkpoints with the averaged weights, and prints
which checkpoints went in. A missing folder or too few checkpoints is one line on stderr, exit 2.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from aiayn.training.averaging import average_checkpoints, last_checkpoints, save_checkpoint_atomically


def fail(message: str) -> None:
    print(f"average.py: error: {message}", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path="../conf", config_name="average")
def main(cfg: DictConfig) -> None:
    for key in ("dir", "out"):
        if OmegaConf.is_missing(cfg, key) or cfg[key] in (None, ""):
            fail(f"give {key}=...  (usage: python src/average.py dir=<run dir> last=5 out=<file.ckpt>)")
    if not isinstance(cfg.last, int) or isinstance(cfg.last, bool) or cfg.last < 1:
        fail(f"last must be a positive number of checkpoints, not {cfg.last!r}")
    try:
        paths = last_checkpoints(cfg.dir, cfg.last)
        checkpoint = average_checkpoints(paths)
    except ValueError as error:  # DataError too: missing folder, too few or unreadable checkpoints
        fail(str(error))
    for path, step in zip(paths, checkpoint["averaged_steps"]):
        print(f"  step {step}: {path}")
    out = save_checkpoint_atomically(checkpoint, cfg.out)
    print(f"averaged {len(paths)} checkpoints (newest: step {checkpoint.get('global_step', '?')}) -> {out}")


if __name__ == "__main__":
    main()
