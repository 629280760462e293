"""The probe's steps as the collector sees them: per rank, the data-wait share and step time of
the last :data:`WINDOW_S` seconds, read from the run's own ``run.db`` (table ``steps``, written by
the probe inside the trainer).

This is what lets the alert engine, which runs in the collector, alert on what only the probe
measures: "rank 1 has waited for data 45% of the last 30 s" (``probe.wait_pct``), "rank 3's
steps take 2.1x the other ranks'" (``probe.rank_slowdown``) and, under DDP with communication
timed, "the other ranks wait for rank 1 in the all-reduce" (``probe.waited_for``, from each
interval's communication shares: :mod:`stallscope.sources.straggler`). The formulas are the
diagnosis's (docs/diagnosis.md): wait share = sum(wait_s) / sum(wait_s + host_s); the first step
of each rank (worker start-up) is left out; a row of ``n`` short steps (the probe sums steps
shorter than a millisecond) counts ``n`` steps, each its mean.

Reads are incremental (per rank, steps after the last one seen; the table's key is
(rank, step)), through a read-only connection, so a long run costs the same per sample as a
short one. :func:`window_points` is the pure part.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from stallscope.errors import SourceUnavailable
from stallscope.metrics import Point
from stallscope.sources.base import Source
from stallscope.sources.straggler import StragglerWatch, gaps
from stallscope.stats import weighted_median
from stallscope.store.db import comm_column, n_column

__all__ = ["MIN_STEPS", "WINDOW_S", "StepsSource", "window_points"]

#: seconds of steps each reading summarises
WINDOW_S = 30.0
#: steps a rank needs in the window before its figures mean anything
MIN_STEPS = 5

#: seconds between looks for a first probe while none has written a step: steps are read by
#: number, so none is missed; the first are read at most this late (at --interval 0.25 the
#: look was a tenth of a sample's cost, in a run without a probe)
PROBE_POLL_S = 1.0

#: (ts, wait_s, host_s, n) of one row of the steps table: ``n`` steps, their sums
Step = tuple[float, float, float, int]


def window_points(steps: Mapping[int, Sequence[Step]]) -> dict[str, dict[str, float]]:
    """Per rank (entity ``rank<N>``) with ≥ :data:`MIN_STEPS` steps: ``wait_pct`` (data-wait
    share, %), ``step_ms`` (median step time) and, with ≥ 2 such ranks, ``rank_slowdown`` (its
    median step time / the median of the other ranks' medians). Pure."""
    out: dict[str, dict[str, float]] = {}
    med: dict[int, float] = {}
    for rank, rows in sorted(steps.items()):
        if sum(r[3] for r in rows) < MIN_STEPS:
            continue
        wait = sum(r[1] for r in rows)
        wall = sum(r[1] + r[2] for r in rows)
        if wall <= 0:
            continue
        med[rank] = weighted_median(((r[1] + r[2]) / r[3], r[3]) for r in rows)
        out[f"rank{rank}"] = {
            "wait_pct": round(100.0 * wait / wall, 2),
            "step_ms": round(med[rank] * 1000.0, 3),
        }
    if len(med) >= 2:
        for rank, m in med.items():
            others = median(v for r, v in med.items() if r != rank)
            if others > 0:
                out[f"rank{rank}"]["rank_slowdown"] = round(m / others, 3)
    return out


class StepsSource(Source):
    """Per rank, the last :data:`WINDOW_S` seconds of the probe's steps in ``db_path``."""

    name = "probe"

    def __init__(self, db_path: str | Path, window_s: float = WINDOW_S) -> None:
        self.db_path = Path(db_path)
        self.window_s = window_s
        self._db: sqlite3.Connection | None = None
        self._comm = "NULL"  #: the steps table's communication column, once it exists
        self._n = "1"  #: its steps-a-row column, once it exists (schema version 3)
        self._polled = float("-inf")  #: when the probes table was last read
        self._last: dict[int, int] = {}
        self._rows: dict[int, deque[Step]] = {}
        #: which rank the others wait for in collectives, interval by interval
        self._stragglers = StragglerWatch()

    def open(self) -> None:
        if not self.db_path.exists():
            raise SourceUnavailable(f"no run database at {self.db_path}")

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = sqlite3.connect(
                f"file:{self.db_path}?mode=ro", uri=True, timeout=1.0, check_same_thread=False
            )
        return self._db

    def sample(self, now: float) -> Any:
        if not self._last and not self._rows and 0 <= now - self._polled < PROBE_POLL_S:
            return {}  # no probe yet, and asked less than PROBE_POLL_S ago
        self._polled = now
        db = self._conn()
        ranks = db.execute("SELECT rank FROM probes").fetchall()
        comm, n = self._comm, self._n
        if ranks and comm != "comm_s":  # asked until the column is there (it never goes)
            comm = self._comm = comm_column(db)
        if ranks and n != "n":
            n = self._n = n_column(db)
        shares: dict[int, float] = {}  # this interval's communication share per rank
        for (rank,) in ranks:
            last = self._last.get(rank, 0)  # step 0 (worker start-up) is never read
            rows = db.execute(
                f"SELECT step, ts, wait_s, host_s, {comm}, {n} FROM steps WHERE "
                "rank = ? AND step > ? ORDER BY step",
                (rank, last),
            ).fetchall()
            if rows:
                self._last[rank] = rows[-1][0]
                q = self._rows.setdefault(rank, deque())
                q.extend(
                    (ts, w, h, k if isinstance(k, int) and k >= 1 else 1)
                    for _s, ts, w, h, _c, k in rows
                )
                timed = [(w + h, c) for _s, _ts, w, h, c, _k in rows if isinstance(c, float)]
                wall = sum(x for x, _c in timed)
                if len(timed) >= 2 and wall > 0:
                    shares[rank] = sum(c for _x, c in timed) / wall
        horizon = now - self.window_s
        for q in self._rows.values():
            while q and q[0][0] < horizon:
                q.popleft()
        out = window_points(self._rows)
        if len(shares) >= 2:  # DDP with communication timed: who do the others wait for
            flagged = self._stragglers.update(shares)
            for rank, g in gaps(shares).items():
                d = out.setdefault(f"rank{rank}", {})
                d["peers_wait_pct"] = round(100.0 * max(g, 0.0), 2)
                d["waited_for"] = 1.0 if rank in flagged else 0.0
        return out

    def points(self, payload: Any) -> list[Point]:
        return [
            Point(f"probe.{k}", entity, v) for entity, d in payload.items() for k, v in d.items()
        ]

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
