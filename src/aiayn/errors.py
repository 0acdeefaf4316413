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


def user_error_behind(error: BaseException) -> UserError | None:
    """The UserError ``error`` is, or was raised from or while handling (a resolver's ConfigError,
    which omegaconf wraps, maybe more than once, in its own errors); None where there is none."""
    seen: set[int] = set()
    inner: BaseException | None = error
    while inner is not None and id(inner) not in seen:
        if isinstance(inner, UserError):
            return inner
        seen.add(id(inner))
        inner = inner.__cause__ or inner.__context__
    return None
