"""What each batch cost the loader, timed inside the DataLoader's workers.

The in-process sampler (:mod:`.inproc`) installs this once ``torch.utils.data`` has been imported
in the trainer: the fetchers PyTorch's workers call for every batch
(``torch.utils.data._utils.fetch._MapDatasetFetcher.fetch`` and ``_IterableDatasetFetcher.fetch``:
the samples read, transformed and collated) are then timed. Workers forked after that (Linux's
default start method) inherit the timed fetchers; each process keeps a histogram of its batches'
costs in :data:`BASE`-wide logarithmic buckets and appends it, at most every :data:`FLUSH_S`
seconds and when the worker exits, to ``<run>/fetches/<pid>.jsonl``::

    {"ts": 1764400000.0, "pid": 4242, "ppid": 4200, "n": 37, "sum_s": 1.93, "b": {"31": 30}}

(``ppid``: the process that started the worker, its trainer; bucket ``k`` holds costs in
[:data:`FLOOR_S` × BASE^k, FLOOR_S × BASE^(k+1))). A run whose batches cost alike has a
narrow histogram; one whose few slow samples hold up the batches in order
(``input_bound.head_of_line``) has a tail: the diagnosis reads the median, the 99th percentile
and the share of the loading time its slowest batches took (:func:`cost_summary`). Timing
costs two clock reads and a dict update per batch (a batch takes milliseconds); the batch is
returned as it came and an exception passes through untimed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "BASE",
    "EDGES_S",
    "FLOOR_S",
    "K_HI",
    "K_LO",
    "FetchRecord",
    "Histogram",
    "add_counts",
    "bucket",
    "bucket_of_le",
    "cost_summary",
    "draw_costs",
    "histogram",
    "install",
    "installed",
    "le_text",
    "merged",
    "parse_record",
    "read_histograms",
    "uninstall",
]

#: the ratio of one bucket's upper edge to its lower: a cost is known within ±10%
BASE = 1.2
#: the lower edge of bucket 0 (a batch cheaper than this counts in it)
FLOOR_S = 1e-5
#: seconds between two appends of one process's histogram
FLUSH_S = 5.0
#: the folder of the run the histograms go to
FOLDER = "fetches"
#: the most of one process's file read back (a line each FLUSH_S: days of a worker's life)
MAX_FILE_BYTES = 4 << 20
#: the most files read back (workers restarted every epoch make one each)
MAX_FILES = 4096

_MODULE = "torch.utils.data._utils.fetch"
_CLASSES = ("_MapDatasetFetcher", "_IterableDatasetFetcher")
_original: list[tuple[Any, Any]] = []


def bucket(cost_s: float) -> int:
    """The bucket of a batch that took ``cost_s`` seconds."""
    if not cost_s > FLOOR_S:  # NaN, negative, tiny
        return 0
    return int(math.log(cost_s / FLOOR_S) / math.log(BASE))


#: the fetch buckets whose lower edges bound the agent's ``stallscope_loader_batch_seconds``
#: buckets (``le``): a batch of fetch bucket k counts under ``le`` = its upper edge
K_LO, K_HI = 25, 85
#: those ``le`` bounds, seconds: 0.95 ms ... 53.8 s (the histogram's fixed bucket set)
EDGES_S: tuple[float, ...] = tuple(FLOOR_S * BASE**k for k in range(K_LO, K_HI + 1))


def le_text(edge: float) -> str:
    """An ``le`` bound as the agent's exposition writes it."""
    return f"{edge:.6g}"


def bucket_of_le(le: str) -> int | None:
    """The fetch bucket the batches of the exported histogram's bucket ``le`` stand for:
    ``le`` = EDGES_S[i] holds fetch buckets up to K_LO + i - 1 (its count less the previous
    bound's is bucket K_LO + i - 1), ``+Inf`` the ones from K_HI on; None for a bound that is
    not one of :data:`EDGES_S` (read as a number: Prometheus may spell it otherwise)."""
    try:
        x = float(le)
    except ValueError:
        return None
    if x == math.inf:
        return K_HI
    for i, edge in enumerate(EDGES_S):
        if abs(x - edge) <= 1e-5 * edge:
            return K_LO + i - 1
    return None


def bucket_mid_s(k: int) -> float:
    """The geometric middle of bucket ``k``: the cost it stands for."""
    return float(FLOOR_S * BASE ** (k + 0.5))


class _Recorder:
    """This process's histogram since its last append, and where it goes."""

    def __init__(self) -> None:
        self.pid = 0
        self.path: str | None = None
        self.counts: dict[int, int] = {}
        self.n = 0
        self.sum_s = 0.0
        self.flushed = 0.0

    def add(self, cost_s: float) -> None:
        pid = os.getpid()
        if pid != self.pid:  # a worker forked with its parent's counts: start its own
            self._start(pid)
        k = bucket(cost_s)
        self.counts[k] = self.counts.get(k, 0) + 1
        self.n += 1
        self.sum_s += cost_s
        now = time.monotonic()
        if now - self.flushed >= FLUSH_S:
            self.flush(now)

    def _start(self, pid: int) -> None:
        self.pid, self.counts, self.n, self.sum_s = pid, {}, 0, 0.0
        self.flushed = time.monotonic()
        run_dir = os.environ.get("STALLSCOPE_RUN_DIR")
        self.path = os.path.join(run_dir, FOLDER, f"{pid}.jsonl") if run_dir else None
        try:  # a worker leaves through multiprocessing's exit: its finalizers, not atexit
            from multiprocessing import util

            util.Finalize(None, self.flush, exitpriority=10)
        except Exception:
            pass
        import atexit

        atexit.register(self.flush)

    def flush(self, now: float | None = None) -> None:
        """Append the histogram since the last append (nothing when no batch was timed); an
        error loses this histogram, never the trainer's batch."""
        self.flushed = time.monotonic() if now is None else now
        if not self.n or self.path is None or self.pid != os.getpid():
            return
        rec = {
            "ts": round(time.time(), 3),
            "pid": self.pid,
            "ppid": os.getppid(),
            "n": self.n,
            "sum_s": round(self.sum_s, 6),
            "b": {str(k): c for k, c in sorted(self.counts.items())},
        }
        self.counts, self.n, self.sum_s = {}, 0, 0.0
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass


RECORDER = _Recorder()


def install() -> bool:
    """Time the fetchers from now on, once PyTorch's DataLoader is there (not imported here: the
    sampler asks again later). True once installed."""
    if _original:
        return True
    mod = sys.modules.get(_MODULE)
    if mod is None:
        return False
    found = [
        (cls, cls.fetch)
        for cls in (getattr(mod, name, None) for name in _CLASSES)
        if cls is not None and callable(getattr(cls, "fetch", None))
    ]
    if not found:
        return False
    for cls, fetch in found:
        cls.fetch = _timed(fetch)
    _original[:] = found
    return True


def _timed(fetch: Any) -> Any:
    clock, add = time.perf_counter, RECORDER.add

    def timed_fetch(self: Any, possibly_batched_index: Any) -> Any:
        t0 = clock()
        batch = fetch(self, possibly_batched_index)
        add(clock() - t0)
        return batch

    timed_fetch.__qualname__ = fetch.__qualname__
    timed_fetch.__doc__ = fetch.__doc__
    return timed_fetch


def installed() -> bool:
    return bool(_original)


def uninstall() -> None:
    """Put PyTorch's own fetchers back (tests)."""
    for cls, fetch in _original:
        cls.fetch = fetch
    _original.clear()


# --- read back -----------------------------------------------------------------------------------
Histogram = Mapping[int, int]


def read_histograms(run_dir: Path) -> dict[int, dict[int, int]]:
    """pid -> its batches' cost histogram (bucket -> count) over the run, from
    ``<run>/fetches/``: regular files only, not links, each read up to :data:`MAX_FILE_BYTES`;
    lines that are not such records are skipped."""
    from stallscope.safefile import read_unfollowed

    folder = Path(run_dir) / FOLDER
    try:
        names = sorted(p for p in os.listdir(folder) if p.endswith(".jsonl"))[:MAX_FILES]
    except OSError:
        return {}
    out: dict[int, dict[int, int]] = {}
    for name in names:
        try:
            raw, _more, _uid = read_unfollowed(folder / name, MAX_FILE_BYTES)
        except OSError:
            continue
        for line in raw.decode("utf-8", "replace").splitlines():
            rec = _record(line)
            if rec is not None:
                pid, counts = rec
                add_counts(out.setdefault(pid, {}), counts)
    return out


def _parsed(line: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: a line nested far too deep
        return None


def _record(line: str) -> tuple[int, dict[int, int]] | None:
    return _fields(_parsed(line))


def _fields(rec: Any) -> tuple[int, dict[int, int]] | None:
    b = rec.get("b") if isinstance(rec, dict) else None
    pid = rec.get("pid") if isinstance(rec, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool):
        return None
    counts = histogram(b)
    return None if counts is None else (pid, counts)


def histogram(b: Any) -> dict[int, int] | None:
    """A histogram as written to a file (``{"31": 30}``: bucket -> count) read back; None when
    ``b`` is not one (a bucket that is no whole number in 0-999, a count that is no whole
    number ≥ 0)."""
    if not isinstance(b, dict):
        return None
    counts: dict[int, int] = {}
    for k, c in b.items():
        try:
            ki = int(k)
        except (TypeError, ValueError):
            return None
        if not 0 <= ki < 1000 or not isinstance(c, int) or isinstance(c, bool) or c < 0:
            return None
        counts[ki] = c
    return counts


class FetchRecord(NamedTuple):
    """One appended histogram, as :func:`parse_record` reads it back."""

    pid: int
    ppid: int | None  #: the worker's parent, its trainer (None: a record written without it)
    counts: dict[int, int]  #: bucket -> batches
    sum_s: float  #: the batches' summed cost, seconds (0.0 when the record has no valid one)


def parse_record(line: str) -> FetchRecord | None:
    """One line of ``<run>/fetches/<pid>.jsonl`` (None: not such a record), for readers that
    follow the files as they grow (the agent, :mod:`stallscope.agent.trainfetches`)."""
    rec = _parsed(line)
    got = _fields(rec)
    if got is None:
        return None
    ppid, sum_s = rec.get("ppid"), rec.get("sum_s")
    if not isinstance(ppid, int) or isinstance(ppid, bool) or ppid <= 0:
        ppid = None
    ok = isinstance(sum_s, (int, float)) and not isinstance(sum_s, bool)
    return FetchRecord(got[0], ppid, got[1], float(sum_s) if ok and 0 <= sum_s < 1e9 else 0.0)


def add_counts(into: dict[int, int], counts: Mapping[int, int]) -> None:
    """Add histogram ``counts`` (bucket -> count) into ``into``; counts of 0 or less add
    nothing."""
    for k, c in counts.items():
        if c > 0:
            into[k] = into.get(k, 0) + c


def merged(hists: Iterable[Histogram]) -> dict[int, int]:
    total: dict[int, int] = {}
    for h in hists:
        add_counts(total, h)
    return total


def cost_summary(hists: Iterable[Histogram], tail: float = 0.05) -> dict[str, float] | None:
    """The batches' costs over every histogram: ``batches``, ``p50_ms``, ``p99_ms`` (each a
    bucket's middle: ±10%), ``tail_share``: the share of all the loading time the slowest
    ``tail`` of the batches took (0.05 for costs alike; a few slow samples holding most of the
    time push it towards 1). None without a batch."""
    total = merged(hists)
    n = sum(total.values())
    if n <= 0:
        return None
    keys = sorted(total)

    def quantile(q: float) -> float:
        rank, seen = q * n, 0
        for k in keys:
            seen += total[k]
            if seen >= rank:
                return bucket_mid_s(k)
        return bucket_mid_s(keys[-1])

    time_all = sum(bucket_mid_s(k) * c for k, c in total.items())
    left, time_tail = max(1.0, tail * n), 0.0
    for k in reversed(keys):
        take = min(float(total[k]), left)
        time_tail += take * bucket_mid_s(k)
        left -= take
        if left <= 0:
            break
    return {
        "batches": float(n),
        "p50_ms": round(quantile(0.5) * 1000, 3),
        "p99_ms": round(quantile(0.99) * 1000, 3),
        "tail_share": round(time_tail / time_all, 3) if time_all > 0 else 0.0,
    }


def draw_costs(hists: Iterable[Histogram], n: int, seed: int = 0) -> list[float]:
    """``n`` batch costs (seconds) spread as the histograms' are (each bucket's share of ``n``,
    at its middle), in a shuffled order fixed by ``seed``: what a simulation of the loader
    draws from (:func:`~stallscope.loadermodel.in_order_speedup`)."""
    import random

    total = merged(hists)
    count = sum(total.values())
    if count <= 0 or n <= 0:
        return []
    out: list[float] = []
    seen = 0
    for k in sorted(total):
        seen += total[k]
        out += [bucket_mid_s(k)] * (round(seen * n / count) - len(out))
    random.Random(seed).shuffle(out)
    return out
