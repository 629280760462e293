"""What the report reads from a run directory, loaded once.

The store is read in one pass (:meth:`RunStore.read_all`), shared by the summary table and the
plots: a one-hour run at 1 Hz with a few GPUs, disks and processes holds about a million points,
and every extra pass over them costs about a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope.store import RunStore, Series, StepRow, read_meta
from stallscope.summary import summarize

__all__ = ["RunData", "load_run"]


class _OnePassStore(RunStore):
    """A read-only store whose :meth:`read_all` is computed once and then reused."""

    _all: dict[tuple[str, str], Series] | None = None

    def read_all(self) -> dict[tuple[str, str], Series]:
        if self._all is None:
            self._all = super().read_all()
        return self._all


@dataclass
class RunData:
    """A stored run as the report sees it; times are UNIX seconds."""

    run_dir: Path
    meta: dict[str, Any]
    series: dict[tuple[str, str], Series]
    entities: list[dict[str, Any]]
    events: list[dict[str, Any]]
    steps: list[StepRow]
    probes: list[dict[str, Any]]
    summary: dict[str, Any]
    t0: float  #: start of the shared time axis
    t1: float  #: end of the shared time axis
    attrs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def metric(self, name: str) -> dict[str, Series]:
        """Every series of metric ``name`` that has samples, by entity."""
        return {ent: s for (n, ent), s in sorted(self.series.items()) if n == name and s.v}

    def entity_attrs(self, source: str, entity: str) -> dict[str, Any]:
        return self.attrs.get((source, entity), {})


def load_run(run_dir: Path) -> RunData:
    """Read ``meta.json`` and ``run.db`` of ``run_dir`` (raises RunNotFound when absent)."""
    meta = read_meta(run_dir)
    store = _OnePassStore(run_dir / "run.db", readonly=True)
    try:
        series = store.read_all()
        summary = summarize(store, meta.get("data_devices") or ())
        entities = store.entities()
        events = store.events()
        steps = store.steps()
        probes = store.probes()
        span = store.time_range()
    finally:
        store.close()
    starts = [t for t in (_num(meta.get("start")), span[0] if span else None) if t is not None]
    ends = [t for t in (_num(meta.get("end")), span[1] if span else None) if t is not None]
    if steps:
        starts.append(min(s.ts - s.wait_s for s in steps))
        ends.append(max(s.ts + s.host_s for s in steps))
    t0 = min(starts) if starts else 0.0
    t1 = max(ends) if ends else t0
    if t1 <= t0:
        t1 = t0 + 1.0
    attrs = {(e["source"], e["entity"]): e["attrs"] for e in entities
             if isinstance(e.get("attrs"), dict)}
    return RunData(run_dir, meta, series, entities, events, steps, probes, summary, t0, t1,
                   attrs)


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
        return float(v)
    return None
