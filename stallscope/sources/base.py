"""The seam every metric source plugs into.

A source is a thin, stateful reader around pure parsers: ``open()`` checks that it can
work here (raising :class:`~stallscope.errors.SourceUnavailable` with the reason if not),
``sample(now)`` returns one JSON-able payload in the shape of the ``snapshot --json``
contract (see DESIGN.md), computing rates against its own previous reading. The first
``sample`` after ``open`` may return ``None`` for counter-based sources (nothing to diff yet).
"""

from __future__ import annotations

import abc
import os
from typing import Any, ClassVar


class Source(abc.ABC):
    """One metric source (gpu, disk, host, procs...)."""

    name: ClassVar[str]

    def open(self) -> None:  # noqa: B027 - optional hook
        """Check the source works here; raise SourceUnavailable(reason) if not."""

    @abc.abstractmethod
    def sample(self, now: float) -> Any:
        """Return one payload (JSON-able), or None while priming counters."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles (NVML, file descriptors)."""


class ProcFile:
    """A ``/proc`` or ``/sys`` file kept open and re-read with ``pread`` at offset 0.

    The kernel regenerates such files on every read from the start, so one descriptor serves
    the whole run; this avoids an ``open``/``close`` pair per sample (about 20 µs each).
    """

    __slots__ = ("fd", "path", "size")

    def __init__(self, path: str, size: int = 8192) -> None:
        self.path = path
        self.size = size
        self.fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> bytes:
        """The whole file; grows the buffer when the content did not fit."""
        if self.fd is None:
            raise OSError(f"{self.path} is closed")
        while True:
            data = os.pread(self.fd, self.size, 0)
            if len(data) < self.size:
                return data
            self.size *= 2

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def close_all(files: dict[Any, ProcFile]) -> None:
    """Close every kept descriptor of a source and forget them (its ``close()``)."""
    for f in files.values():
        f.close()
    files.clear()
