"""Train a Transformer: `python src/train.py [task=...] [model=...] [hardware=...] [key=value ...]`.

Composes conf/train.yaml, builds the data, the model and the Lightning Trainer, trains for trainer.max_steps, then
evaluates the test split and prints its metrics; `resume=auto` goes on from its newest checkpoint (checkpoints.resume).
Hydra composes the config before torch and Lightning are imported (:mod:`aiayn.cli.train_run`, the run itself), so
that an override it cannot apply is refused in a second or two, not the six those imports took."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from aiayn.cli import run_folder
from aiayn.cli.command_line import read_by_hydra
from aiayn.cli.errors import fail, reports_composition_errors, reports_errors
from aiayn.cli.hydra_options import shown_part
from aiayn.cli.naming import CONFIG_DIR
from aiayn.config.resolvers import showing_only  # importing aiayn.config registers the schemas and resolvers


@read_by_hydra("train")  # paths as one value, old names, Hydra's options anywhere (aiayn.cli.command_line)
def main(cfg: DictConfig | None = None) -> dict[str, float] | None:
    """The command (``aiayn-train``, ``python src/train.py``); given a composed ``cfg`` (as Hydra's
    main takes one), the run of that config in this process."""
    if cfg is not None:
        return _main(cfg)
    # --cfg job/all prints the config resolved (--resolve), so that it shows what the run will do: the plan's devices,
    # precision and step, not the ${aiayn.plan:} that computes them.
    # On a machine without the GPUs asked for (a login node), it shows the plan for the node asked for.
    # --cfg hydra prints Hydra's settings as written: they read the run's (${run_name}), which it leaves out.
    shown = shown_part(sys.argv[1:])
    showing = shown is not None
    if shown == "hydra" and "--resolve" in sys.argv:
        fail("--cfg hydra cannot --resolve: Hydra's settings read the run's (hydra.run.dir reads run_name), which "
             "--cfg hydra leaves out; --cfg all --resolve shows them resolved")
    if showing and shown != "hydra" and "--resolve" not in sys.argv:
        sys.argv.append("--resolve")
    # What the run folder's callback holds (before Hydra writes there) is let go as the command ends.
    with showing_only(check=_check_shown) if showing else contextlib.nullcontext(), run_folder.until_the_end():
        return _main()


@reports_composition_errors  # an override Hydra cannot apply: one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
@reports_errors  # one line, exit 2, for what the user can fix; exit 1 for a run that stopped on its own
def _main(cfg: DictConfig) -> dict[str, float]:
    try:
        from aiayn.cli import train_run  # torch, Lightning, W&B: seconds, once the config is composed
    except KeyboardInterrupt:  # Ctrl-C in them: the folder Hydra has just made goes, as before it was made
        run_folder.remove_unstarted(Path(cfg.paths.output_dir))
        raise
    return train_run.run(cfg)


def _check_shown(root: DictConfig, plan: dict) -> None:
    from aiayn.cli import train_run

    train_run.check_shown(root, plan)


if __name__ == "__main__":
    main()
