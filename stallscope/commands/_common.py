"""Helpers shared by command modules: argument types, consoles, run lookup."""

from __future__ import annotations

import argparse
import math

from rich.console import Console

from stallscope.textsafe import safe

__all__ = ["err_console", "interval_type", "keep_full_type", "out_console", "safe"]

out_console = Console()
err_console = Console(stderr=True)


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

