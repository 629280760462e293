"""The terminal for ``stallscope top``: keys read one at a time (cbreak mode) and the
terminal's settings put back whatever happens.

:func:`cbreak` switches the terminal on ``fd`` to cbreak mode (keys arrive without Enter and
are not echoed; Ctrl-C still sends SIGINT) and restores the saved settings in a ``finally``.
:func:`signals_raise` turns SIGTERM and SIGHUP into a :class:`Terminated` exception, so they
unwind through those ``finally`` blocks too (the screen and the terminal come back as they were
before the process exits), and restores the previous handlers afterwards.
"""

from __future__ import annotations

import os
import signal
import termios
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Terminated", "cbreak", "read_keys", "signals_raise"]


class Terminated(Exception):
    """A signal asked us to stop; ``signum`` is which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Cbreak mode on the terminal ``fd`` for the block; its settings restored after."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def read_keys(fd: int) -> str:
    """The keys waiting on ``fd`` (an empty string at end of input)."""
    try:
        data = os.read(fd, 64)
    except (BlockingIOError, InterruptedError):
        return ""
    return data.decode("utf-8", "replace")


@contextmanager
def signals_raise(
    on_winch: Callable[[], None] | None = None,
    stop: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP),
) -> Iterator[None]:
    """Within the block, the ``stop`` signals raise :class:`Terminated`; SIGWINCH (the window
    was resized) calls ``on_winch``. The previous handlers are put back after."""

    def raise_(signum: int, _frame: FrameType | None) -> None:
        raise Terminated(signum)

    def winch(_signum: int, _frame: FrameType | None) -> None:
        if on_winch is not None:
            on_winch()

    old = {s: signal.signal(s, raise_) for s in stop}
    if on_winch is not None:
        old[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, winch)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
