"""Helpers shared by command modules: argument types, consoles, run lookup."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from stallscope.textsafe import plain, safe

if TYPE_CHECKING:
    from rich.console import Console

    out_console: Console
    err_console: Console

__all__ = [
    "RUN_HELP",
    "add_out_option",
    "bounded",
    "err_console",
    "interval_type",
    "keep_full_type",
    "number_type",
    "out_console",
    "safe",
    "size_type",
    "usage_type",
]

#: the help of a RUN argument
RUN_HELP = "run directory, run id (or prefix), or 'latest'"

N = TypeVar("N", int, float)
T = TypeVar("T")


def __getattr__(name: str) -> Any:
    """``out_console`` and ``err_console``, made on first use: commands that print nothing
    through rich (the long-running agent) never import it (a few MiB of resident memory)."""
    if name in ("out_console", "err_console"):
        from rich.console import Console

        console = Console(stderr=name == "err_console")
        globals()[name] = console
        return console
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def number_type(
    flag: str, cast: Callable[[str], N], ok: Callable[[N], bool], kind: str, limits: str
) -> Callable[[str], N]:
    """An argparse type: ``cast(text)`` (int or float), finite and ``ok``; otherwise one line
    naming the flag, ``{flag} must be {kind}, got 'x'`` when it is no number and
    ``{flag} must be {limits}, got 'x'`` when it is out of range."""

    def parse(text: str) -> N:
        try:
            v = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be {kind}, got {text!r}") from None
        if (isinstance(v, float) and not math.isfinite(v)) or not ok(v):
            raise argparse.ArgumentTypeError(f"{flag} must be {limits}, got {text!r}")
        return v

    return parse


#: ``--interval``: seconds, a finite number between 0.1 and 3600
interval_type = number_type(
    "--interval",
    float,
    lambda v: 0.1 <= v <= 3600,
    "a number of seconds",
    "between 0.1 and 3600 seconds",
)
#: ``--keep-full``: seconds of full resolution, at least one minute, finite
keep_full_type = number_type(
    "--keep-full", float, lambda v: v >= 60, "a number of seconds", "at least 60 seconds"
)


def bounded(flag: str, cast: Callable[[str], N], lo: float, hi: float) -> Callable[[str], N]:
    """An argparse type: a number (``cast`` = int or float) between ``lo`` and ``hi``."""
    return number_type(
        flag,
        cast,
        lambda v: lo <= v <= hi,
        "an integer" if cast is int else "a number",
        f"{lo:g}–{hi:g}",
    )


#: samples per second of a stack sampler
rate_type = bounded("--stack-rate", float, 1, 1000)


def usage_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from a parser that raises :class:`UsageError`: its one line becomes
    argparse's error for the flag."""

    def convert(text: str) -> T:
        from stallscope.errors import UsageError

        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def size_type(text: str) -> int:
    """An argparse type: a byte size such as ``256M`` or ``1GB``."""
    from stallscope.tools.diskbench import parse_size

    return usage_type(parse_size)(text)


def add_out_option(p: argparse.ArgumentParser) -> None:
    """The hidden ``--out`` of a command that reads a stored run: the folder to look the run
    up in (``stallscope run --out``'s default unless given)."""
    from stallscope.store import DEFAULT_OUT

    p.add_argument("--out", default=DEFAULT_OUT, help=argparse.SUPPRESS)


def resolve_run(ref: str, out: str) -> Any:
    """RUN as the commands take it (:func:`stallscope.store.find_run`); when ``latest`` had to
    come from the run index (no run in this folder's ``out``), one line says which it is, so a
    run of another program on a shared account is not taken for one's own."""
    import sys
    from pathlib import Path

    from stallscope.store import find_run
    from stallscope.store.rundir import list_runs

    run = find_run(ref, out)
    if ref == "latest" and not list_runs(Path(out)):
        sys.stderr.write(
            f"stallscope: latest run: {plain(run, 300)} (none in {plain(out, 300)}/)\n"
        )
    return run


def watchable_process(pid: int) -> tuple[list[str], str, float]:
    """(command line, name, start time) of a process ``--pid`` may watch, for every command
    that takes one (``run --pid``, ``top --pid``): one message and exit code 2 otherwise."""
    import os

    import psutil

    from stallscope.errors import UsageError

    if pid == os.getpid():
        raise UsageError(
            f"--pid {pid}: that is this stallscope process itself; give the trainer's pid"
        )
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            name, started = p.name(), p.create_time()
        try:
            cmdline = p.cmdline()
        except psutil.AccessDenied:
            cmdline = []
        open(f"/proc/{pid}/stat").close()  # what the procs source reads
    except psutil.NoSuchProcess:
        raise UsageError(f"--pid {pid}: no such process") from None
    except (psutil.AccessDenied, PermissionError):
        raise UsageError(
            f"--pid {pid}: not allowed to read that process (another user's: "
            "run stallscope as that user or as root)"
        ) from None
    except OSError as exc:
        raise UsageError(f"--pid {pid}: cannot read /proc/{pid}: {exc.strerror}") from None
    return cmdline or [name], name, started


#: programs that run another program named among their arguments (``uv run stallscope ...``)
_TOOL_RUNNERS = frozenset(
    {"uv", "uvx", "pipx", "poetry", "pdm", "hatch", "rye", "conda", "micromamba", "mamba", "pixi"}
)


def runs_stallscope(argv: list[str]) -> bool:
    """Whether a command line runs stallscope: its console script, ``python -m stallscope``,
    or a tool runner given ``stallscope`` (``uv run stallscope ...``)."""
    import os
    import re

    words = [os.path.basename(a) for a in argv]
    if not words:
        return False
    if words[0] == "stallscope":
        return True
    if words[0] in _TOOL_RUNNERS:
        return "stallscope" in words
    if not re.match(r"^(python[0-9.]*|pypy[0-9.]*)$", words[0]):
        return False
    for i, a in enumerate(argv[1:], 1):  # the interpreter's options, then what it runs
        if a == "-m":
            return i + 1 < len(argv) and argv[i + 1].split(".")[0] == "stallscope"
        if a.startswith("-m"):
            return a[2:].split(".")[0] == "stallscope"
        if not a.startswith("-"):
            return words[i] == "stallscope"
    return False


def own_processes(root: int) -> frozenset[int]:
    """The processes a ``--pid`` watch of ``root`` never enters, nor anything under them: this
    stallscope process (and so its py-spy) and the stallscope processes among its ancestors
    below ``root`` (``bash -c 'stallscope run --pid $$'`` watches the shell that started it;
    ``uv run stallscope`` or a wrapper script is one more stallscope above this one)."""
    import os

    import psutil

    own = {os.getpid()}
    try:
        for p in psutil.Process().parents():
            if p.pid == root:
                break
            try:
                if runs_stallscope(p.cmdline()):
                    own.add(p.pid)
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return frozenset(own)


def tree_without(root: int, exclude: frozenset[int]) -> dict[int, int]:
    """``root``'s descendants (pid -> parent pid) now, less the ``exclude`` pids and what is
    under them (:func:`own_processes`)."""
    import psutil

    try:
        kids = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return {}
    parent: dict[int, int] = {}
    for k in kids:
        try:
            parent[k.pid] = k.ppid()
        except psutil.Error:
            continue
    out = {}
    for pid, pp in parent.items():
        up, seen = pid, set()
        while up in parent and up not in exclude and up not in seen:
            seen.add(up)
            up = parent[up]
        if up not in exclude:
            out[pid] = pp
    return out


def nothing_but_self(root: int, exclude: frozenset[int]) -> bool:
    """``root`` started this stallscope and runs nothing else (``bash -c 'stallscope run --pid
    $$'``): its tree less stallscope's own processes is only the chain that leads to this one."""
    import psutil

    try:
        chain = {p.pid for p in psutil.Process().parents()}
    except psutil.Error:
        return False
    return root in chain and not set(tree_without(root, exclude)) - chain
