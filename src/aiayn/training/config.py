"""Moved to :mod:`aiayn.config.schemas`; kept while the experiment modules move (removed with them)."""

from aiayn.config.schemas import *  # noqa: F403
from aiayn.config.schemas import network_arguments  # noqa: F401
