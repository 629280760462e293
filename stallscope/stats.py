"""The few statistics stallscope needs, written once: percentile, median and a least-squares
line, each with one rule for the edge cases (no values, a flat line).

Pure functions over plain sequences; no numpy (the core install does not need it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Line", "fit_line", "median", "percentile", "weighted_median"]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), ``q`` in [0, 100]; NaN when
    there are no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    """The median (the mean of the middle two for an even count); NaN when there are none."""
    xs = list(values)
    return float(statistics.median(xs)) if xs else math.nan


def weighted_median(pairs: Iterable[tuple[float, int]]) -> float:
    """The median of values each counted ``w`` times (``(value, w)`` pairs, whole ``w``; those
    under 1 are left out): what :func:`median` gives on the values repeated, without repeating
    them. NaN when there are none."""
    xs = sorted((v, w) for v, w in pairs if w >= 1)
    total = sum(w for _, w in xs)
    if not total:
        return math.nan
    lo_at, hi_at = (total - 1) // 2, total // 2  # where the middle one or two sit
    lo: float | None = None
    seen = 0
    for v, w in xs:
        seen += w
        if lo is None and seen > lo_at:
            lo = v
        if seen > hi_at:
            assert lo is not None
            return float((lo + v) / 2)
    raise AssertionError("unreachable: the weights add up to total")


@dataclass(frozen=True)
class Line:
    """A least-squares line ``v = mean_v + slope * (t - mean_t)`` and how well it fits."""

    slope: float  #: units of v per unit of t (per second for time series)
    mean_t: float
    mean_v: float
    #: share of v's variance the line explains, 0..1. The agreed rule for a flat line: values
    #: with no spread at all are explained completely (r2 1, slope 0); points that all share one
    #: t have no line through them (r2 0, slope 0).
    r2: float
    n: int

    def at(self, t: float) -> float:
        """The line's value at ``t``."""
        return self.mean_v + self.slope * (t - self.mean_t)


def fit_line(points: Iterable[tuple[float, float]]) -> Line:
    """Least-squares line through ``(t, v)`` pairs (any order); ValueError when empty."""
    pts = list(points)
    n = len(pts)
    if n == 0:
        raise ValueError("fit_line needs at least one point")
    # the values are scaled by their largest magnitude first: a finite 1e300 in a store would
    # overflow its square (a hand-edited or damaged run.db holds anything finite)
    scale = max(abs(v) for _, v in pts) or 1.0
    mt = sum(t for t, _ in pts) / n
    mu = sum(v / scale for _, v in pts) / n
    stt = sum((t - mt) ** 2 for t, _ in pts)
    suu = sum((v / scale - mu) ** 2 for _, v in pts)
    if stt <= 0:
        return Line(0.0, mt, mu * scale, 0.0, n)
    stu = sum((t - mt) * (v / scale - mu) for t, v in pts)
    slope = stu / stt * scale
    r2 = 1.0 if suu <= 0 else min(1.0, (stu * stu) / (stt * suu))
    return Line(slope, mt, mu * scale, r2, n)


def json_finite(v: Any) -> Any:
    """``v`` with NaN and infinities as None, in nested dicts, lists and tuples: what strict
    JSON can hold (``json.dumps(..., allow_nan=False)``)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_finite(x) for x in v]
    return v
