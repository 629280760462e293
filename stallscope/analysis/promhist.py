"""What ``diagnose --prometheus`` reads back of the agent's histograms and loader-thread gauges,
as the run's own files hold it, so the same facts and rules follow (:mod:`.promdata`):

* ``stallscope_loader_batch_seconds`` (a trainer's DataLoader workers' batch costs,
  :mod:`stallscope.agent.trainfetches`): its buckets' increase over the window is the workers'
  fetch histogram bucket for bucket (the exported bounds are the fetch buckets' own edges), put
  under one of that trainer's worker processes, as ``<run>/fetches/`` gives it per worker
  (:attr:`~stallscope.analysis.rundata.RunData.batch_costs`);
* ``stallscope_train_step_data_wait_seconds`` (each step's data wait, per rank): the step rows
  rebuilt from the counters between two points get the waits of that interval's buckets, scaled
  to the interval's exact total, instead of its mean each (:class:`WaitSpread`), so a wait that
  comes in bursts on a few steps reads as such;
* ``stallscope_stacks_loader_*`` and ``stallscope_stacks_gil_*``: a stacks record's ``threads``
  part (:func:`threads_parts`);
* ``stallscope_stacks_batch_wait_seconds`` and ``..._step_seconds`` (the batches a trainer took,
  timed by its in-trainer sampler): their buckets' increase over the window is its records'
  ``wait_b`` and ``step_b`` (:func:`attach_batch_times`), what an unmodified trainer's waits
  are spread by.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from stallscope.sources.stacks.fetches import add_counts, bucket_of_le
from stallscope.sources.stacks.threads import LOADER_PHASES
from stallscope.store import Series

__all__ = [
    "BATCH_BUCKETS",
    "TIMED_BUCKETS",
    "WAIT_BUCKETS",
    "Columns",
    "WaitSpread",
    "attach_batch_times",
    "batch_costs_of",
    "threads_parts",
]

#: the bucket series of the two histograms
BATCH_BUCKETS = "stallscope_loader_batch_seconds_bucket"
WAIT_BUCKETS = "stallscope_train_step_data_wait_seconds_bucket"
#: the bucket series of a trainer's timed batches -> the records' key they give back
TIMED_BUCKETS = {
    "stallscope_stacks_batch_wait_seconds_bucket": "wait_b",
    "stallscope_stacks_batch_step_seconds_bucket": "step_b",
}

#: one histogram's buckets: ``le`` -> (times, cumulative counts)
Columns = dict[str, tuple[list[float], list[float]]]


def _increase(ts: list[float], vs: list[float], start: float, step: float) -> float:
    """What a counter grew by over the window: from 0 when its series began inside the window
    (after its first query step), else from its first point; a drop is a restart."""
    if not vs:
        return 0.0
    total = vs[0] if ts[0] > start + 1.5 * step else 0.0
    for a, b in itertools.pairwise(vs):
        total += b - a if b >= a else b
    return total


def _by_bound(cols: Columns) -> list[tuple[float, str]]:
    out = []
    for le in cols:
        try:
            x = float(le)
        except ValueError:
            continue
        if not math.isnan(x):
            out.append((x, le))
    return sorted(out)


def _fetch_counts(cols: Columns, start: float, step: float) -> dict[int, int]:
    """A trainer's batches over the window per fetch bucket, from its cumulative buckets."""
    out: dict[int, int] = {}
    below = 0.0
    for _x, le in _by_bound(cols):
        k = bucket_of_le(le)
        upto = _increase(*cols[le], start, step)
        n = round(max(0.0, upto - below))
        below = max(below, upto)
        if k is not None and n > 0:
            out[k] = out.get(k, 0) + n
    return out


def batch_costs_of(
    hists: Mapping[tuple[str, str], Columns],
    run: str | None,
    entities: Mapping[tuple[str, str], Mapping[str, Any]],
    start: float,
    step: float,
) -> dict[Any, dict[int, int]]:
    """Worker entity -> its trainer's workers' fetch histogram over the window, for the run
    ``run`` (every run when None): each trainer's (``(run, pid)`` -> its buckets) under the
    first of its workers (a procs entity whose ``ppid`` is the trainer), as the facts read the
    run's own per-worker files summed (:func:`~stallscope.analysis.facts.machine`). A trainer
    none of whose workers is known is left out (the facts count workers' batches only). The
    key is that worker's pid, or its group's entity (``<trainer>/workers``) under
    ``worker_series = "rank"``: the facts read it as ``str(pid)``."""
    out: dict[Any, dict[int, int]] = {}
    for (run_id, pid), cols in sorted(hists.items()):
        if run is not None and run_id != str(run):
            continue
        counts = _fetch_counts(cols, start, step)
        workers = sorted(
            (
                ent
                for (src, ent), a in entities.items()
                if src == "procs"
                and a.get("role") == "worker"
                and str(a.get("ppid")) == pid
                and (run is None or str(a.get("run")) == str(run))
            ),
            key=lambda e: (len(e), e),
        )
        if not counts or not workers:
            continue
        key: Any = int(workers[0]) if workers[0].isdigit() else workers[0]
        add_counts(out.setdefault(key, {}), counts)
    return out


class WaitSpread:
    """The data waits of a rank's steps between two points, from its wait histogram: the
    steps each bucket gained there, at the bucket's geometric middle, scaled so they sum to
    the interval's wait (the totals stay exact). The largest first."""

    def __init__(self, cols: Columns) -> None:
        bounds = _by_bound(cols)
        self.les = [le for _x, le in bounds]
        self.mids: list[float] = []
        lower = 0.0
        for x, _le in bounds:
            if math.isinf(x):
                self.mids.append(lower * 1.5)
            else:
                self.mids.append(math.sqrt(lower * x) if lower > 0 else x / 2)
                lower = x
        self.at = [dict(zip(*cols[le])) for le in self.les]

    def waits(self, t_from: float | None, t: float, k: int, total_s: float) -> list[float] | None:
        """The ``k`` steps' waits between ``t_from`` (None: from nothing, the series' start or
        a restart) and ``t``; None when the buckets do not hold those ``k`` steps (a missed
        scrape, an agent without the histogram)."""
        if not self.les:
            return None
        cum = []
        for at in self.at:
            cur = at.get(t)
            base = 0.0 if t_from is None else at.get(t_from)
            if cur is None or base is None or not math.isfinite(cur - base):
                return None
            cum.append(cur - base)
        per = [max(0.0, b - a) for a, b in zip([0.0, *cum], cum)]
        counts = [round(c) for c in per]
        if sum(counts) != k:
            return None
        out = [m for m, c in zip(self.mids, counts) for _ in range(c)]
        got = sum(out)
        scale = total_s / got if got > 0 else 0.0
        return sorted((w * scale for w in out), reverse=True)


_THREAD_KEYS = (
    "loader_threads",
    *(f"loader_{p}_s" for p in LOADER_PHASES),
    "loader_cpu_s",
    "loader_wait_s",
    "gil_wait_s",
    "gil_wakes",
)


def threads_parts(series: Mapping[tuple[str, str], Series], ent: str) -> dict[float, dict]:
    """Point time -> a stacks record's ``threads`` part of process ``ent`` there (the points
    where loader threads worked), as :mod:`stallscope.sources.stacks.threads` writes it."""
    cols: dict[str, dict[float, float]] = {}
    for key in _THREAD_KEYS:
        s = series.get((f"stacks.{key}", ent))
        if s is not None:
            cols[key] = {t: v for t, v in zip(s.ts, s.v) if math.isfinite(v) and v >= 0}
    out: dict[float, dict] = {}
    for t, threads in cols.get("loader_threads", {}).items():
        n = round(threads)
        if n <= 0:
            continue
        at = {key: col[t] for key, col in cols.items() if t in col}
        part: dict[str, Any] = {
            "n": n,
            "s": {p: at.get(f"loader_{p}_s", 0.0) for p in LOADER_PHASES},
            "cpu_s": at.get("loader_cpu_s", 0.0),
            "wait_s": at.get("loader_wait_s", 0.0),
        }
        wakes = round(at.get("gil_wakes", 0.0))
        if "gil_wait_s" in at and wakes > 0:
            part["gil_s"], part["wakes"] = at["gil_wait_s"], wakes
        out[t] = part
    return out


def attach_batch_times(
    records: list[dict[str, Any]],
    timed: Mapping[tuple[str, str], Mapping[str, Columns]],
    run: str | None,
    start: float,
    step: float,
) -> None:
    """Each trainer's timed batches over the window (``(run, pid)`` -> ``wait_b`` / ``step_b``
    -> its buckets) onto the first of its stacks ``records`` (both histograms, or neither),
    as its records in a run directory hold them: the facts sum them per process."""
    first: dict[int, dict[str, Any]] = {}
    for rec in records:
        first.setdefault(rec["pid"], rec)
    for (run_id, pid), cols in sorted(timed.items()):
        if run is not None and run_id != str(run):
            continue
        into = first.get(int(pid)) if pid.isdigit() else None
        got = {key: _fetch_counts(c, start, step) for key, c in cols.items()}
        if into is None or not got.get("wait_b") or "step_b" not in got:
            continue
        for key in ("wait_b", "step_b"):
            into[key] = {str(k): c for k, c in sorted(got[key].items())}
