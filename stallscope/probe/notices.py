"""What the probe tells the user: one warning now, and an event in the run at the next write.

Nothing the probe does raises into the trainer; what goes wrong is said here, once per kind
(:class:`Notices`), on whichever thread found it. The warning goes to the
``stallscope.probe`` logger: one line ``stallscope: ...`` on the trainer's stderr unless the
trainer configured logging, then through its handlers only (:mod:`stallscope.errors`,
docs/probe.md "Warnings and logging").
"""

from __future__ import annotations

import time

from stallscope.errors import warn as _warn
from stallscope.textsafe import error_text

__all__ = ["LOGGER", "Notices", "warn"]

#: the probe's logger (the integrations' too)
LOGGER = "stallscope.probe"


def warn(msg: str) -> None:
    """``msg`` as a warning of the probe's logger; never raises. Its text is made safe for a
    terminal first (:func:`~stallscope.textsafe.error_text`: control characters shown as
    ``\\x1b``, each line clipped): it quotes paths and values from the environment
    (``$STALLSCOPE_RUN_DIR``, ``$STALLSCOPE_ALERTS``) and the errors naming them."""
    _warn(error_text(msg), LOGGER)


class Notices:
    """A recorder's trouble, told once per key: logged at once (one stderr line by default), and
    kept in ``unsent`` for the writer thread to store as the run's events (never I/O on the
    training thread beyond that line)."""

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
        msg = error_text(msg)  # the run's events are shown by `show` and the report as well
        warn(msg)
        if key not in self.STDERR_ONLY:
            self.unsent.append((time.time(), f"rank {self.rank}: {msg}"))
