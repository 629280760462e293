"""Online: which rank the others wait for, as a training runs (``top``, the run's alerts).

Under DDP every rank's step ends in the all-reduce, so a slow rank makes its peers wait there
(the probe's communication time, ``sources/comm.py``) while its own wait stays small. Each
interval (a collector sample, a ``top`` frame) gives every rank's communication share over the
steps that interval saw; a rank's **gap** is the largest share among the other ranks minus its
own: about 0 while the ranks keep pace, the peers' wait for it once it is slower.

A rank is flagged:

* by **change**: a one-sided CUSUM on its gap (baseline: median and 1.4826 × MAD of the gaps it
  had while not flagged, up to :data:`HISTORY` intervals with the newest :data:`RECENT` left out,
  re-read every 10 intervals after a warm-up of 20, the scale floored at 0.01; each standardised
  value clipped to ±3 so one odd interval adds little; k = 1, alarm when the sum passes h = 8)
  while the gap is at least :data:`MIN_GAP` above its baseline: noise that never moves the
  gap 5 points never flags a rank. ``benchmarks/bench_straggler.py`` (4 ranks, σ 0.02 per
  interval, 20 seeds): a rank 10% slower is flagged in a median of 5 intervals (p95 7), 20%
  or 50% slower in 3, with no false alarm in 20 healthy hours;
* or by **level**: a gap of at least :data:`LEVEL_GAP`
  (0.15, the diagnosis's threshold) for :data:`LEVEL_INTERVALS` intervals in a row, for a rank
  slow from the start (no change to see).

It is cleared after :data:`CLEAR_INTERVALS` intervals in a row under half of MIN_GAP.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from stallscope.stats import median

__all__ = ["CLEAR_INTERVALS", "LEVEL_INTERVALS", "MIN_GAP", "StragglerWatch", "gaps"]

#: a gap below this is noise, whatever the CUSUM says
MIN_GAP = 0.05
#: the diagnosis's threshold (signals.COMM_GAP): held this many intervals, flagged without a
#: change
LEVEL_GAP = 0.15
LEVEL_INTERVALS = 3
CLEAR_INTERVALS = 3
#: intervals of a rank's gap kept for its baseline, and the newest ones left out of it
HISTORY = 300
RECENT = 10


def gaps(shares: Mapping[int, float]) -> dict[int, float]:
    """Per rank: the largest communication share among the other ranks minus its own."""
    if len(shares) < 2:
        return {}
    return {r: max(v for q, v in shares.items() if q != r) - s for r, s in shares.items()}


@dataclass
class _Rank:
    #: the gaps while not flagged, newest last (the baseline is re-read from them)
    seen: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    base: float | None = None
    scale: float = 0.01
    cusum: float = 0.0
    level_run: int = 0  #: intervals in a row at or above LEVEL_GAP
    low_run: int = 0  #: intervals in a row under MIN_GAP / 2
    flagged: bool = False


class StragglerWatch:
    """Feed it each interval's communication shares per rank (:meth:`update`); it answers
    which ranks are flagged, with their gap (see the module docstring)."""

    def __init__(self, warmup: int = 20, k: float = 1.0, h: float = 8.0, clip: float = 3.0) -> None:
        self.warmup, self.k, self.h, self.clip = warmup, k, h, clip
        self._ranks: dict[int, _Rank] = {}

    def update(self, shares: Mapping[int, float]) -> dict[int, float]:
        """One interval: ``shares`` = rank -> its communication share (0-1) over the steps of
        the interval (ranks without steps left out). Returns the flagged ranks and their gap."""
        out: dict[int, float] = {}
        for rank, g in gaps(shares).items():
            st = self._ranks.setdefault(rank, _Rank())
            self._step(st, g)
            if st.flagged:
                out[rank] = round(g, 3)
        return out

    def _step(self, st: _Rank, g: float) -> None:
        st.level_run = st.level_run + 1 if g >= LEVEL_GAP else 0
        st.low_run = st.low_run + 1 if g < MIN_GAP / 2 else 0
        if not st.flagged:
            st.seen.append(g)
        n = len(st.seen)
        if n >= self.warmup and (st.base is None or n % 10 == 0):
            # the baseline from what was seen before the last RECENT intervals (a change under
            # way is not absorbed into it), re-read every 10 intervals: a longer history, a
            # steadier scale
            ref = list(st.seen)[: max(self.warmup, n - RECENT)]
            st.base = median(ref)
            st.scale = max(1.4826 * median([abs(x - st.base) for x in ref]), 0.01)
        if st.base is not None:
            z = max(-self.clip, min(self.clip, (g - st.base) / st.scale))
            st.cusum = max(0.0, st.cusum + z - self.k)
        if not st.flagged:
            shifted = st.base is not None and g - st.base >= MIN_GAP
            if (st.cusum > self.h and shifted) or st.level_run >= LEVEL_INTERVALS:
                st.flagged = True
        elif st.low_run >= CLEAR_INTERVALS:
            st.flagged = False
            st.cusum = 0.0
