"""Helpers shared by command modules: argument types, consoles, run lookup."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stallscope.textsafe import safe

if TYPE_CHECKING:
    from rich.console import Console

    out_console: Console
    err_console: Console

__all__ = ["bounded", "err_console", "interval_type", "keep_full_type", "out_console", "safe",
           "size_type"]


def __getattr__(name: str) -> Any:
    """``out_console`` and ``err_console``, made on first use: commands that print nothing
    through rich (the long-running agent) never import it (a few MiB of resident memory)."""
    if name in ("out_console", "err_console"):
        from rich.console import Console

        console = Console(stderr=name == "err_console")
        globals()[name] = console
        return console
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def interval_type(text: str) -> float:
    """``--interval``: seconds, a finite number between 0.1 and 3600."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--interval must be a number of seconds, got {text!r}"
                                         ) from None
    if not math.isfinite(v) or not 0.1 <= v <= 3600:
        raise argparse.ArgumentTypeError(f"--interval must be between 0.1 and 3600 seconds, "
                                         f"got {text!r}")
    return v


def keep_full_type(text: str) -> float:
    """``--keep-full``: seconds of full resolution, at least one minute, finite."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--keep-full must be a number of seconds, got "
                                         f"{text!r}") from None
    if not math.isfinite(v) or v < 60:
        raise argparse.ArgumentTypeError(f"--keep-full must be at least 60 seconds, got {text!r}")
    return v



def bounded(flag: str, cast: Callable[[str], float], lo: float, hi: float
            ) -> Callable[[str], float]:
    """An argparse type: a number (``cast`` = int or float) between ``lo`` and ``hi``."""
    kind = "an integer" if cast is int else "a number"

    def parse(text: str) -> float:
        try:
            v = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be {kind}, got {text!r}") from None
        if not math.isfinite(v) or not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{flag} must be {lo:g}–{hi:g}, got {text!r}")
        return v

    return parse


def size_type(text: str) -> int:
    """An argparse type: a byte size such as ``256M`` or ``1GB``."""
    from stallscope.errors import UsageError
    from stallscope.tools.diskbench import parse_size

    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
