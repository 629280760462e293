"""Command-line entry point: ``stallscope <command> ...``.

Commands live one per module in :mod:`stallscope.cli`; the registry below is explicit
(no discovery by naming). Every :class:`~stallscope.errors.StallscopeError` becomes one line on
stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sqlite3
import sys
from collections.abc import Sequence

from stallscope import __version__
from stallscope.errors import StallscopeError

#: command modules, in the order ``--help`` lists them
COMMANDS: tuple[str, ...] = (
    "run",
    "snapshot",
    "runs",
    "show",
    "diagnose",
    "report",
    "export",
    "disk",
    "pack",
    "alerts",
    "agent",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line (exit 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"stallscope: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stallscope",
        description="Tells you why your GPU is waiting: watches a training run from the GPU "
        "down to the disk, names the bottleneck with evidence and says how to fix it.",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"stallscope.cli.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = args.func(args)
        return code
    except StallscopeError as exc:
        sys.stderr.write(f"stallscope: error: {exc}\n")
        return exc.exit_code
    except sqlite3.DatabaseError as exc:  # a run.db damaged or from a foreign schema
        sys.stderr.write(f"stallscope: error: run database unreadable ({exc}); "
                         "`PRAGMA integrity_check` in sqlite3 tells more\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("stallscope: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
