"""The live view's sink: keeps the latest :class:`~stallscope.collect.Sample` and wakes the UI.

``write`` runs on the collector's thread and only swaps a reference and writes one byte to a
pipe; the UI loop ``select``s on that pipe beside the terminal, so a new sample and a key press
wake it alike and sampling never waits for drawing (or the other way round)."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from stallscope.collect.sinks import Sink

if TYPE_CHECKING:
    from stallscope.collect.collector import Event, Sample

__all__ = ["LiveSink"]

#: events kept for the view's note line (the newest are shown)
_KEEP_EVENTS = 20


class LiveSink(Sink):
    """Keeps the latest sample (and the run's events) for the live view."""

    name = "live"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latest: Sample | None = None
        self.seq = 0  #: samples received so far
        self.events: list[Event] = []
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    @property
    def fd(self) -> int:
        """Readable when something arrived (a sample, an event, :meth:`wake`)."""
        return self._r

    def write(self, sample: Sample) -> None:
        with self._lock:
            self.latest = sample
            self.seq += 1
        self.wake()

    def event(self, event: Event) -> None:
        with self._lock:
            self.events = [*self.events[-(_KEEP_EVENTS - 1) :], event]
        self.wake()

    def get(self) -> tuple[int, Sample | None]:
        """(sequence number, latest sample)."""
        with self._lock:
            return self.seq, self.latest

    def wake(self) -> None:
        """Make :attr:`fd` readable (also safe from a signal handler)."""
        try:
            os.write(self._w, b".")
        except (BlockingIOError, OSError):  # pipe full (a wake is pending anyway) or closed
            pass

    def drain(self) -> None:
        """Consume pending wake-ups."""
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Called by the collector when it stops; the pipe stays until :meth:`release`."""

    def release(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
