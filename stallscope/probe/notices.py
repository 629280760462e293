"""What the probe tells the user: one stderr line now, and an event in the run at the next write.

Nothing the probe does raises into the trainer; what goes wrong is said here, once per kind
(:class:`Notices`), on whichever thread found it.
"""

from __future__ import annotations

import time

from stallscope.errors import warn

__all__ = ["Notices", "warn"]


class Notices:
    """A recorder's trouble, told once per key: on stderr at once, and kept in ``unsent`` for
    the writer thread to store as the run's events (never I/O on the training thread beyond the
    one stderr line)."""

    #: keys said on stderr only: failing to write the run is no event the run can hold
    STDERR_ONLY = ("write", "open")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._said: set[str] = set()
        self.unsent: list[tuple[float, str]] = []  #: (time, message) not yet in the run

    def say(self, key: str, msg: str) -> None:
        """Tell ``msg`` unless something of kind ``key`` was told already."""
        if key in self._said:
            return
        self._said.add(key)
        warn(msg)
        if key not in self.STDERR_ONLY:
            self.unsent.append((time.time(), f"rank {self.rank}: {msg}"))
