"""What the fact builders share: the statistics they name and the run's processes by role."""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stallscope import stats
from stallscope.store import Series, StepRow

if TYPE_CHECKING:
    from stallscope.analysis.rundata import RunData

__all__ = ["alive_together", "mean", "median", "p95", "rank_pids", "step_median", "tree_of"]


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def median(xs: Sequence[float]) -> float | None:
    return stats.median(xs) if xs else None


#: a step row's data wait, and its wall time (data wait plus host time)
_WAIT = operator.attrgetter("wait_s")


def _step_wall(s: StepRow) -> float:
    return s.wait_s + s.host_s


def step_median(rows: Sequence[StepRow], value: Any) -> float | None:
    """The median step's ``value(row)`` in ms, a row of ``n`` steps counting ``n`` times with
    its mean step (``value`` of the row over ``n``); None without rows."""
    if not rows:
        return None
    return stats.weighted_median((value(s) * 1000 / s.n, s.n) for s in rows)


def p95(xs: Sequence[float]) -> float | None:
    return stats.percentile(xs, 95) if xs else None


def _cores(v: Any) -> int | None:
    """A core count from a file (meta.json, the probe's config): a positive integer, or None
    for anything else (text, a list, a bool, a negative number)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 20:
        return v
    return None


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def _by_ts_sum(series: list[Series]) -> dict[float, float]:
    out: dict[float, float] = defaultdict(float)
    for s in series:
        for t, v in zip(s.ts, s.v):
            out[t] += v
    return out


def _procs(data: RunData, metric: str, role: str, only: set[str] | None = None) -> list[Series]:
    roles = data.roles()
    return [
        s
        for (n, e), s in data.series.items()
        if n == metric and roles.get(e) == role and (only is None or e in only)
    ]


def rank_pids(data: RunData) -> dict[int, str]:
    """rank -> the pid of its training process (the probe says which)."""
    return {
        int(p["rank"]): str(p["pid"])
        for p in data.probes
        if p.get("pid") is not None and p.get("rank") is not None
    }


def tree_of(data: RunData, root: str) -> set[str]:
    """``root`` and every recorded process below it (a rank and its DataLoader workers)."""
    parent = {
        str(e["entity"]): str((e.get("attrs") or {}).get("ppid"))
        for e in data.entities
        if e["source"] == "procs"
    }
    out, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in out and p not in out}
        out |= new
        grew = bool(new)
    return out


def _share(series: list[Series]) -> float | None:
    vals = [v for s in series for v in s.v]
    return round(sum(vals) / len(vals), 3) if vals else None


def alive_together(series: Sequence[Series]) -> int:
    """How many of these processes were alive at one time: the most common count of them in
    one sample (ties: the larger). A DataLoader without persistent workers starts new workers
    each epoch, so the distinct pids over a run are a multiple of its num_workers."""
    per_ts: dict[float, int] = defaultdict(int)
    for s in series:
        for t in set(s.ts):
            per_ts[t] += 1
    if not per_ts:
        return 0
    counts: dict[int, int] = defaultdict(int)
    for n in per_ts.values():
        counts[n] += 1
    return max(counts, key=lambda n: (counts[n], n))
