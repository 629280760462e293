"""Batches and samples a PyTorch trainer takes from its DataLoaders, counted from inside it.

The in-process sampler (:mod:`.inproc`) installs this once ``torch.utils.data.dataloader`` has
been imported: every DataLoader iterator's ``__next__`` (``_BaseDataLoaderIter.__next__``, which
the single- and multi-process iterators share) then adds one batch, and the batch's length, to
two counters of this process. The sampler writes the counts of each window into its record
(``batches``, ``samples``), so a run with no probe still has a throughput: ``compare`` reads
samples/s from them.

Each batch's handover is timed too: the wait in ``__next__`` (what the probe calls a step's
data wait) and the time from the iterator's previous handover to this one (a step's wall time),
each counted in a log-bucket histogram of this process (:data:`WAITS`, :data:`STEPS`, in
:mod:`.fetches`' buckets: a time is known within ±10%). Each iterator's first batch is left
out (the workers' start, an epoch's start: their own findings). The sampler writes each
window's counts into its record (``wait_b``, ``step_b``): with no probe, the diagnosis still
sees whether the waits come in bursts (``input_bound.head_of_line``). Two clock reads and two
dict updates a batch.

The length of a batch is that of its first tensor-like element (anything with a ``shape``: a
tensor, a NumPy array), found in the batch itself, a tuple or list, or a dict's values; a batch
with none counts as a batch without samples. Counting costs one Python call per batch (well
under a microsecond beside a step of milliseconds) and changes nothing the training sees: the
batch is returned as it came, and an exception from ``__next__`` (``StopIteration`` at an
epoch's end) passes through uncounted.
"""

from __future__ import annotations

import sys
from time import perf_counter
from typing import Any

from stallscope.sources.stacks.fetches import bucket

__all__ = ["COUNTS", "STEPS", "WAITS", "batch_len", "install", "installed", "uninstall"]

#: this process's totals: [batches, samples] (written by the iterating thread only)
COUNTS = [0, 0]
#: this process's batch waits and step times so far, bucket -> batches (each iterator's first
#: batch left out; written by the iterating thread only)
WAITS: dict[int, int] = {}
STEPS: dict[int, int] = {}
#: the iterator attribute that holds the time of its previous handover
_LAST = "_stallscope_handed_at"

_MODULE = "torch.utils.data.dataloader"
_CLASS = "_BaseDataLoaderIter"
_original: list[Any] = []


def batch_len(batch: Any) -> int:
    """The number of samples in ``batch`` (0 when no element says)."""
    n = _len_of(batch)
    if n is not None:
        return n
    items = (
        batch
        if isinstance(batch, (tuple, list))
        else (batch.values() if isinstance(batch, dict) else ())
    )
    for item in items:
        n = _len_of(item)
        if n is not None:
            return n
    return 0


def _len_of(item: Any) -> int | None:
    """The first dimension of a tensor-like ``item``; None when it has no shape to say."""
    shape = getattr(item, "shape", None)
    try:
        if shape is not None and len(shape) > 0:
            return max(0, int(shape[0]))
    except (TypeError, ValueError):
        pass
    return None


def install() -> bool:
    """Count from now on, once PyTorch's DataLoader module is there (not imported here: the
    sampler asks again later). True once installed."""
    if _original:
        return True
    mod = sys.modules.get(_MODULE)
    cls = getattr(mod, _CLASS, None) if mod is not None else None
    nxt = getattr(cls, "__next__", None)
    if cls is None or nxt is None:
        return False

    def __next__(self: Any) -> Any:
        asked = perf_counter()
        batch = nxt(self)
        got = perf_counter()
        COUNTS[0] += 1
        COUNTS[1] += batch_len(batch)
        last = getattr(self, _LAST, None)
        if last is not None:
            k = bucket(got - asked)
            WAITS[k] = WAITS.get(k, 0) + 1
            k = bucket(got - last)
            STEPS[k] = STEPS.get(k, 0) + 1
        try:
            setattr(self, _LAST, got)
        except AttributeError:  # an iterator class with __slots__: counted, not timed
            pass
        return batch

    __next__.__qualname__ = nxt.__qualname__
    __next__.__doc__ = nxt.__doc__
    _original[:] = [cls, nxt]
    cls.__next__ = __next__
    return True


def installed() -> bool:
    return bool(_original)


def uninstall() -> None:
    """Put PyTorch's own ``__next__`` back (tests)."""
    if _original:
        cls, nxt = _original
        cls.__next__ = nxt
        _original.clear()
