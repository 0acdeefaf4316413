"""Errors a user can fix, each reported by the command-line tools as one line (exit status 2).

Every message names the setting, file (and line) or checkpoint at fault and what to do about
it. Code that catches "anything the user can fix" catches :class:`UserError`.
"""

from __future__ import annotations


class UserError(ValueError):
    """A problem with the user's input or settings, not with aiayn; the message says what to change."""


class ConfigError(UserError):
    """A setting that cannot work; the message names it and what to do."""


class DataError(UserError):
    """Missing or malformed data, or an unreadable checkpoint; the message names the file (and line)."""
