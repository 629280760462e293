"""Command-line entry point: ``stallscope <command> ...``.

Commands live one per module in :mod:`stallscope.cli`; the registry below is explicit
(no discovery by naming). Every :class:`~stallscope.errors.StallscopeError` becomes one line on
stderr and a non-zero exit, never a traceback.

Standard output that cannot be written is handled here, once, for every command:

* a closed pipe (``stallscope runs | head -1``): exit 141 quietly, as a classic tool killed by
  SIGPIPE does (128 + 13; ``set -o pipefail`` sees it the same way);
* any other write error (``> /dev/full``: ENOSPC, a dead terminal: EIO): one line
  ``stallscope: cannot write output: <reason>`` on stderr and exit 1.

Either way stdout is then pointed at ``/dev/null``, so that Python's own flush at exit has
nothing left to fail on (no "Exception ignored ... BrokenPipeError").

What the library logs while a command runs (the ``stallscope`` logger's warnings: a store that
cannot be written, an NVML call that fails) is printed by a handler installed here, one line
``stallscope: ...`` on stderr each (:func:`~stallscope.errors.logging_to_stderr`); the agent
replaces it with its logfmt lines for its lifetime.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any, TextIO, cast

from stallscope.errors import PlainFormatter, StallscopeError, logging_to_stderr
from stallscope.textsafe import error_text
from stallscope.version import __version__

#: exit status when stdout is a pipe whose reader went away (128 + SIGPIPE, as `yes | head`)
EXIT_BROKEN_PIPE = 141
#: exit status when stdout cannot be written for another reason (full disk, I/O error)
EXIT_OUTPUT_FAILED = 1

#: command modules, in the order ``--help`` lists them
COMMANDS: tuple[str, ...] = (
    "run",
    "snapshot",
    "runs",
    "show",
    "diagnose",
    "compare",
    "report",
    "export",
    "disk",
    "pack",
    "alerts",
    "agent",
    "top",
    "tune",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line (exit 2) instead of usage + message."""

    #: the command the user typed, when this is the top-level parser (an unrecognized flag
    #: is reported here, and its help is the command's)
    command: str | None = None

    def error(self, message: str) -> None:  # type: ignore[override]
        where = f"{self.prog} {self.command}" if self.command else self.prog
        sys.stderr.write(f"stallscope: error: {message} (see `{where} --help`)\n")
        raise SystemExit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``only`` (a known command name): a command then
    imports only its own module (the agent, a long-lived process, stays small)."""
    parser = _Parser(
        prog="stallscope",
        description="Tells you why your GPU is waiting: watches a training run from the GPU "
        "down to the disk, names the bottleneck with evidence and says how to fix it.",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS if only is None else (only,):
        module = importlib.import_module(f"stallscope.cli.{name}")
        module.register(sub)
    return parser


class OutputError(Exception):
    """Writing to stdout failed; ``__cause__`` is the OSError. Not an OSError itself, so no
    ``except OSError`` of a command (or argparse's, which swallows them) mistakes it for its
    own and goes on."""


class _GuardedStdout:
    """Wraps ``sys.stdout`` for the duration of a command: an OSError from writing or flushing
    it becomes :class:`OutputError`, so that the entry point can tell a failed output apart
    from a failed input (both are OSError) and report it once."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if self._stream is None:  # started with fd 1 closed (`cmd >&-`): Python has no stdout
            closed = OSError(errno.EBADF, "standard output is closed")
            raise OutputError(closed) from closed
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise OutputError(exc) from exc

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._stream is None:
            return  # nothing was written (write() said why)
        try:
            self._stream.flush()
        except OSError as exc:
            raise OutputError(exc) from exc

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer...
        if self._stream is None:
            if name == "isatty":
                return lambda: False
            raise AttributeError(name)
        return getattr(self._stream, name)


def _silence_stdout(stream: TextIO) -> None:
    """Point fd 1 at /dev/null so that the interpreter's last flush of what is still buffered
    succeeds quietly."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(fd, stream.fileno())
        finally:
            os.close(fd)
    except (OSError, ValueError, AttributeError):  # no real fd (a test's capture): nothing to do
        pass


def _output_failed(exc: BaseException | None, stream: TextIO) -> int:
    _silence_stdout(stream)
    if isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno == errno.EPIPE):
        return EXIT_BROKEN_PIPE
    reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
    try:
        sys.stderr.write(f"stallscope: cannot write output: {reason}\n")
        sys.stderr.flush()
    except OSError:
        pass
    return EXIT_OUTPUT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    real = sys.stdout
    sys.stdout = cast(TextIO, _GuardedStdout(real))
    try:
        try:
            with logging_to_stderr(PlainFormatter()):
                code = _dispatch(argv)
        except SystemExit:  # argparse: --help, --version, a bad flag
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return code
    except OutputError as exc:
        return _output_failed(exc.__cause__, real)
    finally:
        sys.stdout = real


def _dispatch(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = words[0] if words and words[0] in COMMANDS else None
    parser = build_parser(command)
    if isinstance(parser, _Parser):
        parser.command = command
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        _check_out(args)
        code: int = args.func(args)
        return code
    except StallscopeError as exc:
        sys.stderr.write(f"stallscope: error: {error_text(exc)}\n")
        return exc.exit_code
    except sqlite3.DatabaseError as exc:  # a run.db damaged or from a foreign schema
        sys.stderr.write(
            f"stallscope: error: run database unreadable ({exc}); "
            "`PRAGMA integrity_check` in sqlite3 tells more\n"
        )
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("stallscope: interrupted\n")
        return 130
    except BrokenPipeError as exc:  # written to stdout without going through sys.stdout
        raise OutputError(exc) from exc


def _check_out(args: argparse.Namespace) -> None:
    """The runs folder of a command that has one (``--out``, else ``$STALLSCOPE_OUT``) refused
    in one line when its name cannot be a folder here (:func:`~stallscope.store.paths.
    out_problem`): too long (``ENAMETOOLONG`` from the first ``stat``) or not UTF-8 (the run
    index could not hold it)."""
    if not hasattr(args, "out"):
        return
    from stallscope.errors import UsageError
    from stallscope.store.paths import DEFAULT_OUT, default_out, out_problem
    from stallscope.textsafe import plain

    given = args.out not in (None, DEFAULT_OUT)
    out = str(args.out) if given else default_out()
    why = out_problem(out)
    if why:
        raise UsageError(
            f"{'--out' if given else '$STALLSCOPE_OUT'} {plain(out, 100)} {why}; "
            "give a folder whose name is UTF-8 and fits"
        )


if __name__ == "__main__":
    sys.exit(main())
