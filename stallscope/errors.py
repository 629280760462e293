"""The exceptions stallscope raises. Every error a user can cause derives from
:class:`StallscopeError`; the CLI prints its message on one line and exits non-zero."""

from __future__ import annotations

import sys

__all__ = [
    "ParseError",
    "RunNotFound",
    "SourceUnavailable",
    "StallscopeError",
    "UsageError",
    "warn",
]


def warn(msg: str) -> None:
    """One line on stderr (``stallscope: msg``) from inside a trainer or a library call; never
    raises (stderr may be closed at shutdown)."""
    try:
        sys.stderr.write(f"stallscope: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        return


class StallscopeError(Exception):
    """Base class: a problem the user can act on, described in one line."""

    exit_code: int = 2


class UsageError(StallscopeError):
    """A bad flag value, config or argument."""


class RunNotFound(StallscopeError):
    """A run directory that does not exist or is not a stallscope run."""


class SourceUnavailable(StallscopeError):
    """A metric source cannot work on this machine (no driver, no permission, not Linux...).

    The message says why, once; the collector goes on without that source."""


class ParseError(StallscopeError):
    """Input from the machine or a file that does not have the expected shape.

    The message quotes the offending line or field so the problem can be reported."""
