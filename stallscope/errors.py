"""The exceptions stallscope raises, and how it tells what goes wrong without raising.

Every error a user can cause derives from :class:`StallscopeError`; the CLI prints its message
on one line and exits non-zero.

What goes wrong without stopping anything (a store that cannot be written, a probe that turns
itself off) is logged through the standard library's :mod:`logging`, on the ``stallscope``
logger and its children (``stallscope.probe``, ``stallscope.agent``, ``stallscope.collect``,
``stallscope.sources.gpu``). ``stallscope/__init__.py`` adds a :class:`logging.NullHandler`
there and one handler of its own, :class:`FallbackHandler`: while the program has configured
no logging, that handler prints each warning as one line ``stallscope: ...`` on stderr, as
stallscope always did; once the program has (a handler on the root logger or on a
``stallscope`` logger), the records go to the program's handlers only. The CLI prints through
:func:`logging_to_stderr` with :class:`PlainFormatter` (the same lines); the agent with
:class:`LogfmtFormatter` (``time=... level=WARN source=... msg=...``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "LOGGER",
    "FallbackHandler",
    "LogfmtFormatter",
    "ParseError",
    "PlainFormatter",
    "RunNotFound",
    "SourceUnavailable",
    "StallscopeError",
    "StderrHandler",
    "UsageError",
    "logging_configured",
    "logging_to_stderr",
    "warn",
]

#: the name of the package's logger; every logger of the package is under it
LOGGER = "stallscope"


def warn(msg: str, logger: str = LOGGER) -> None:
    """Log ``msg`` as a warning on ``logger`` (``stallscope: msg`` on stderr unless the program
    configured logging, see the module's docstring) from inside a trainer or a library call;
    never raises (stderr may be closed at shutdown, a program's handler may fail)."""
    try:
        logging.getLogger(logger).warning(msg)
    except Exception:
        return


class StderrHandler(logging.Handler):
    """One line per record on whatever ``sys.stderr`` is when the record comes (a test's capture,
    a redirected stream), flushed; never raises and never prints logging's own "--- Logging
    error ---" report (stderr may be closed at shutdown)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            stream = sys.stderr
            if stream is None:  # started with fd 2 closed
                return
            stream.write(line + "\n")
            stream.flush()
        except Exception:
            return


class PlainFormatter(logging.Formatter):
    """``stallscope: message``: what the CLI and a trainer's stderr show, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        return f"stallscope: {record.getMessage()}"


#: the level names of Go's log/slog, which node_exporter's logfmt lines carry
_LEVELS = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARN",
    logging.ERROR: "ERROR",
}


def _level_name(levelno: int) -> str:
    for no in (logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= no:
            return _LEVELS[no]
    return "DEBUG"


def _logfmt_value(value: str) -> str:
    """``value`` as it goes after ``key=``: bare when it is a plain word, else double-quoted with
    ``"``, ``\\`` and control characters escaped (one line always)."""
    if value and value.isprintable() and not any(c in value for c in ' ="\\'):
        return value
    import json  # here: `import stallscope` stays light

    return json.dumps(value, ensure_ascii=False)


def _source(record: logging.LogRecord) -> str:
    """``agent/node.py:257``: the file below the package (else its name) and the line."""
    path = record.pathname.replace("\\", "/")
    _, sep, tail = path.rpartition("/stallscope/")
    return f"{tail if sep else record.filename}:{record.lineno}"


class LogfmtFormatter(logging.Formatter):
    """node_exporter's line (Go's log/slog text handler): ``time=2026-11-27T19:40:01.123Z
    level=WARN source=agent/server.py:74 msg="a request from 10.0.0.7 failed: ..."``. The time
    is UTC to the millisecond; levels DEBUG, INFO, WARN, ERROR; ``err=`` follows when the record
    carries an exception (its type and message, never a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        secs = int(record.created)
        ms = min(int((record.created - secs) * 1000), 999)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{ms:03d}Z"
        parts = [
            f"time={stamp}",
            f"level={_level_name(record.levelno)}",
            f"source={_logfmt_value(_source(record))}",
            f"msg={_logfmt_value(record.getMessage())}",
        ]
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            parts.append(f"err={_logfmt_value(f'{type(exc).__name__}: {exc}')}")
        return " ".join(parts)


def _foreign(handler: logging.Handler) -> bool:
    """A handler the program put there: not the package's NullHandler or fallback, nor pytest's
    log capture (a handler on the root logger during every test, which shows nothing; the
    warnings still reach stderr under pytest, where tests read them)."""
    if isinstance(handler, (logging.NullHandler, FallbackHandler)):
        return False
    return not type(handler).__module__.startswith("_pytest.")


def logging_configured(name: str = LOGGER) -> bool:
    """Whether a record of logger ``name`` reaches a handler the program added: one on that
    logger, on a parent up to the root (as far as ``propagate`` lets the record go), other
    than the package's own."""
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None:
        if any(_foreign(h) for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


class FallbackHandler(StderrHandler):
    """On the ``stallscope`` logger from the package's import: ``stallscope: message`` on stderr
    for a warning or worse, only while the program has configured no logging that gets the
    record (:func:`logging_configured`), as Python's own last resort does for an unconfigured
    program. A trainer that calls ``logging.basicConfig()`` or adds a handler gets the records
    there instead, once."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(PlainFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        if not logging_configured(record.name):
            super().emit(record)


#: the handlers :func:`logging_to_stderr` installed, innermost last
_ACTIVE: list[StderrHandler] = []


@contextmanager
def logging_to_stderr(
    formatter: logging.Formatter, level: int = logging.WARNING
) -> Iterator[StderrHandler]:
    """For a command's duration: the ``stallscope`` logger's records of ``level`` or worse, one
    line each on stderr in ``formatter``'s form. Nested (the agent inside the CLI), the inner
    handler stands in for the outer one until it ends. Everything is as before afterwards."""
    logger = logging.getLogger(LOGGER)
    handler = StderrHandler(level)
    handler.setFormatter(formatter)
    outer = _ACTIVE[-1] if _ACTIVE else None
    if outer is not None:
        logger.removeHandler(outer)
    old_level = logger.level
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    _ACTIVE.append(handler)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        _ACTIVE.remove(handler)
        logger.setLevel(old_level)
        if outer is not None:
            logger.addHandler(outer)


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
