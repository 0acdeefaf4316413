"""``hydra/sweeper=aiayn`` (conf/train.yaml's sweeper): Hydra's basic sweeper — the same expansion
of globs, ranges and comma lists — that checks every job before the first starts, may go on past
a failing job (``hydra.sweeper.keep_going``) and ends with a table of the jobs. The work is
:mod:`aiayn.cli.sweep`'s; Hydra finds plugins in the ``hydra_plugins`` package only, so the class
it names lives here, and imports aiayn only when a sweep runs (Hydra imports this module in every
tool it starts).
"""

from dataclasses import dataclass
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore


@dataclass
class AiaynSweeperConf:
    _target_: str = "hydra_plugins.aiayn_sweeper.AiaynSweeper"
    max_batch_size: int | None = None  # as the basic sweeper's: jobs handed to the launcher at once
    params: dict[str, str] | None = None  # as the basic sweeper's
    # false (Hydra's way): the sweep stops at the first job that fails. true: every job runs; the
    # sweep ends with the table and the exit status of the first that failed.
    keep_going: bool = False


ConfigStore.instance().store(group="hydra/sweeper", name="aiayn", node=AiaynSweeperConf, provider="aiayn")


class AiaynSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 keep_going: bool = False) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.keep_going = keep_going

    def sweep(self, arguments: list[str]) -> Any:
        from aiayn.cli.sweep import sweep

        return sweep(self, arguments)
