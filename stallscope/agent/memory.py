"""Keeping a long-running agent's resident memory flat.

Two things grew the agent's RSS over its first hour under ``benchmarks/bench_soak.py`` while
its Python objects stayed constant (measured: the count of objects, SQLite's own memory
counter, and RSS before and after ``malloc_trim`` called from a debugger):

* **free memory glibc keeps**: bursts (many processes to read while other trainings start and
  end, a burst of requests) leave freed chunks inside malloc's heaps that glibc does not hand
  back; ``malloc_trim(0)`` returns those pages to the kernel (1.6 MiB of a 36.7 MiB agent
  after 21 minutes beside other trainings). :class:`TrimSink` calls it once a minute, after a
  sample (glibc only; elsewhere it does nothing);
* **SQLite's page cache** of the agent's store fills as the store grows (2 MiB by SQLite's
  default): the agent appends samples and reads recent ones, so :data:`STORE_CACHE_KIB` bounds
  it lower.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

from stallscope.collect import Sample
from stallscope.collect.sinks import Sink

__all__ = ["STORE_CACHE_KIB", "TrimSink", "malloc_trim"]

#: the agent store's SQLite page cache (appending samples and reading the last minutes)
STORE_CACHE_KIB = 512
#: how often free heap memory is handed back to the kernel
TRIM_EVERY_S = 60.0


def _glibc_trim() -> Callable[[], object] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


_TRIM = _glibc_trim()


def malloc_trim() -> bool:
    """Hand free heap memory back to the kernel; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM()
    return True


class TrimSink(Sink):
    """Calls :func:`malloc_trim` after a sample, at most every ``every_s`` seconds (a few
    milliseconds, on the collector's thread, between samples)."""

    name = "trim"

    def __init__(
        self, every_s: float = TRIM_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self.clock = clock
        self.trims = 0
        self._next = clock() + every_s

    def write(self, sample: Sample) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.every_s
        if malloc_trim():
            self.trims += 1
