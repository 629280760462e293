"""What a loader and its batches look like, read by duck typing (no framework imported).

:func:`sizer_for` decides once per epoch how to count the samples of a loader's batches (dim 0 of
the first tensor, else ``len``); :func:`loader_config` reads the knobs that decide input
throughput off a PyTorch-style ``DataLoader`` (or any iterable: what it lacks is left out). Both
adapters use them; neither imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["batch_size_of", "loader_config", "plain_value", "sizer_for"]


# --- what a batch holds --------------------------------------------------------------------------
def _no_size(_b: Any) -> int | None:
    return None


def sizer_for(batch: Any) -> Callable[[Any], int | None]:
    """A function giving the sample count of batches shaped like ``batch`` (decided once per
    epoch: batches of one loader share a structure)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            return _no_size
        return lambda b: b.shape[0]  # torch.Size items are ints already
    if isinstance(batch, (list, tuple)):
        if batch and getattr(batch[0], "shape", None) is not None and len(batch[0].shape):
            return lambda b: b[0].shape[0]
        if batch and isinstance(batch[0], Mapping):
            inner = sizer_for(batch[0])
            if inner is not _no_size:
                return lambda b: inner(b[0])
        return len
    if isinstance(batch, Mapping):
        for k, v in batch.items():
            s = getattr(v, "shape", None)
            if s is not None and len(s):
                return _key_sizer(k)
        return _no_size
    if hasattr(batch, "__len__") and not isinstance(batch, (str, bytes)):
        return len
    return _no_size


def _key_sizer(key: Any) -> Callable[[Any], int | None]:
    return lambda b: b[key].shape[0]


def batch_size_of(batch: Any) -> int | None:
    """Samples in ``batch``: dim 0 of its first tensor, else ``len(batch)``, else None."""
    try:
        return sizer_for(batch)(batch)
    except (TypeError, IndexError, KeyError, AttributeError):
        return None


# --- loader configuration ------------------------------------------------------------------------
def plain_value(v: Any) -> Any:
    """``v`` itself when JSON has it (None, bool, number, str), else its ``repr``."""
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)


def loader_config(loader: Any) -> dict[str, Any]:
    """The DataLoader knobs that decide input throughput (brief D2), read off ``loader``.

    Works on any iterable: what it does not have is left out. ``dataset_len`` is None for
    unsized (iterable) datasets."""
    cfg: dict[str, Any] = {"loader_type": f"{type(loader).__module__}.{type(loader).__qualname__}"}
    for key in (
        "num_workers",
        "pin_memory",
        "prefetch_factor",
        "persistent_workers",
        "batch_size",
        "drop_last",
        "timeout",
        "in_order",
    ):
        if hasattr(loader, key):
            cfg[key] = plain_value(getattr(loader, key))
    if cfg.get("batch_size") is None:
        bs = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if bs is not None:
            cfg["batch_size"] = plain_value(bs)
    sampler = getattr(loader, "sampler", None)
    if sampler is not None:
        cfg["sampler_type"] = type(sampler).__name__
    ds = getattr(loader, "dataset", None)
    target = ds if ds is not None else loader
    if ds is not None:
        cfg["dataset_type"] = f"{type(ds).__module__}.{type(ds).__qualname__}"
    try:
        cfg["dataset_len" if ds is not None else "len"] = len(target)
    except TypeError:  # iterable-style dataset / generator: no length
        cfg["dataset_len" if ds is not None else "len"] = None
    except Exception as exc:  # a user __len__ that fails: keep the reason, the probe goes on
        cfg["dataset_len_error"] = f"{type(exc).__name__}: {exc}"
    if hasattr(loader, "num_workers"):
        cfg["start_method"] = plain_value(_start_method(loader))
    return cfg


def _start_method(loader: Any) -> Any:
    """How the loader's worker processes start: its multiprocessing context's method, else
    torch.multiprocessing's (when the trainer imported it), else Python's."""
    ctx = getattr(loader, "multiprocessing_context", None)
    if ctx is not None:
        get = getattr(ctx, "get_start_method", None)
        return get() if callable(get) else str(ctx)
    method: Any = None
    tmp = sys.modules.get("torch.multiprocessing")
    if tmp is not None:
        method = tmp.get_start_method(allow_none=True)
    if method is None:
        import multiprocessing

        method = multiprocessing.get_start_method(allow_none=True)
    return method
