"""The command lines of the tools that are not Hydra apps (``experiments/tables.py``, Table 4's
baseline): argparse, whose mistakes are said as every tool says one — one line naming what is wrong
and what to do, exit status 2 — not argparse's usage block above its error."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from aiayn.cli.errors import USER_ERROR


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` (its sub-commands' too) that refuses a command line in one line:
    ``tables.py run: the following arguments are required: --root (see tables.py run --help)``."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR)
