"""Batches and samples a PyTorch trainer takes from its DataLoaders, counted from inside it.

The in-process sampler (:mod:`.inproc`) installs this once ``torch.utils.data.dataloader`` has
been imported: every DataLoader iterator's ``__next__`` (``_BaseDataLoaderIter.__next__``, which
the single- and multi-process iterators share) then adds one batch, and the batch's length, to
two counters of this process. The sampler writes the counts of each window into its record
(``batches``, ``samples``), so a run with no probe still has a throughput: ``compare`` reads
samples/s from them.

The length of a batch is that of its first tensor-like element (anything with a ``shape``: a
tensor, a NumPy array), found in the batch itself, a tuple or list, or a dict's values; a batch
with none counts as a batch without samples. Counting costs one Python call per batch (well
under a microsecond beside a step of milliseconds) and changes nothing the training sees: the
batch is returned as it came, and an exception from ``__next__`` (``StopIteration`` at an
epoch's end) passes through uncounted.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["COUNTS", "batch_len", "install", "installed", "uninstall"]

#: this process's totals: [batches, samples] (written by the iterating thread only)
COUNTS = [0, 0]

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
        batch = nxt(self)
        COUNTS[0] += 1
        COUNTS[1] += batch_len(batch)
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
