"""The sampled stacks as the collector sees them: per sampled process, the share of the last
:data:`WINDOW_S` seconds its training thread spent in each phase (``stacks.data_pct``...), for
``top``, the alert engine and the agent's ``/metrics``.

It reads the records the samplers append to ``<run>/stacks/<pid>.jsonl``
(:mod:`~stallscope.sources.stacks.aggregate`): incrementally, from the offset it reached, a
line cut short left for the next read. With ``attach`` pids it also runs py-spy on them
(:mod:`~stallscope.sources.stacks.pyspy`), which writes the same records.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from stallscope.metrics import Point
from stallscope.sources.base import Source
from stallscope.sources.stacks.aggregate import RecordTail, phase_seconds, stacks_dir
from stallscope.sources.stacks.phases import PHASES

__all__ = ["WINDOW_S", "StacksSource", "window_shares"]

#: seconds of records each reading summarises: a process's shares stay in every reading
#: while it samples (a gauge that does not come and go between the trainer's 1 s records)
WINDOW_S = 10.0


def window_shares(seconds: dict[str, float]) -> dict[str, float] | None:
    """Each phase's share of the sampled training time (``startup`` left out), in %, plus
    ``sampled_s``; None when nothing was sampled after start-up."""
    total = sum(v for k, v in seconds.items() if k in PHASES)
    if total <= 0:
        return None
    out = {f"{p}_pct": round(100.0 * seconds.get(p, 0.0) / total, 2) for p in PHASES}
    out["sampled_s"] = round(total, 3)
    return out


class StacksSource(Source):
    """Phase shares of every sampled process of one run (``run_dir``); ``attach``: pids to
    sample with py-spy (``run --pid``); ``owner``: read only files of this uid, never a link
    (the agent reading a user's run)."""

    name = "stacks"
    transient_entities = True

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        attach: Sequence[int] = (),
        rate_hz: float | None = None,
        *,
        owner: int | None = None,
    ) -> None:
        self.folder = stacks_dir(run_dir)
        self.attach = list(attach)
        self.rate_hz = rate_hz
        self._tail = RecordTail(self.folder, owner=owner)
        self._rank: dict[str, int | None] = {}
        #: (record time, pid, seconds per phase) of the last WINDOW_S seconds
        self._recent: list[tuple[float, str, dict[str, float]]] = []
        self._sampler: Any = None

    def open(self) -> None:
        if self.attach:
            from stallscope.sources.stacks.pyspy import DEFAULT_RATE_HZ, PySpySampler

            self._sampler = PySpySampler(self.folder, self.attach, self.rate_hz or DEFAULT_RATE_HZ)
            self._sampler.start()  # raises SourceUnavailable with the reason

    def sample(self, now: float) -> Any:
        if self._sampler is not None:
            for kind, msg in self._sampler.drain_notes():
                self.emit(kind, msg)
        for recs in self._tail.read_new().values():
            for rec in recs:
                pid = str(rec["pid"])
                rank = rec.get("rank")
                self._rank[pid] = rank if isinstance(rank, int) else None
                self._recent.append((float(rec["ts"]), pid, phase_seconds(rec)))
        horizon = now - WINDOW_S
        self._recent = [r for r in self._recent if r[0] >= horizon]
        by_pid: dict[str, dict[str, float]] = {}
        for _ts, pid, secs in self._recent:
            d = by_pid.setdefault(pid, {})
            for k, v in secs.items():
                d[k] = d.get(k, 0.0) + v
        out: dict[str, dict[str, Any]] = {}
        for pid, seconds in by_pid.items():
            shares = window_shares(seconds)
            if shares is not None:
                out[pid] = shares
        return out

    def points(self, payload: Any) -> list[Point]:
        return [
            Point(f"stacks.{k}", pid, float(v)) for pid, d in payload.items() for k, v in d.items()
        ]

    def entities(self, payload: Any) -> dict[str, dict[str, Any]]:
        return {pid: {"rank": self._rank.get(pid)} for pid in payload}

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
