"""Inputs and outputs of the diagnosis: :class:`RunData` in, :class:`Finding` out.

``RunData`` is the one "metric source" interface the rules see: everything a run recorded,
already read into memory. :func:`load_run` fills it from a run directory; a Prometheus reader
can fill the same structure for clusters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stallscope.store import RunStore, Series, StepRow, read_meta

__all__ = ["KINDS", "Finding", "Fix", "RunData", "load_run"]

Severity = Literal["critical", "warning", "info"]

#: finding kinds (DESIGN.md): extend, don't rename
KINDS: tuple[str, ...] = (
    "input_bound.fetch", "input_bound.prep", "h2d_bound", "compute_bound", "gpu_throttled",
    "gpu_memory_growth", "host_swap", "shm_pressure", "pcie_degraded", "disk_health",
    "straggler_rank", "insufficient_data",
)


@dataclass(frozen=True)
class Fix:
    action: str  #: what to change, with this run's numbers
    why: str  #: the evidence that makes it the right change


@dataclass
class Finding:
    kind: str
    severity: Severity
    confidence: float
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fixes: list[Fix] = field(default_factory=list)
    est_speedup: float = 1.0
    rule: str = ""  #: the rule that fired, in words (shown by `diagnose`, documented in docs/)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "severity": self.severity,
            "confidence": round(self.confidence, 2), "summary": self.summary,
            "evidence": self.evidence,
            "fixes": [{"action": f.action, "why": f.why} for f in self.fixes],
            "est_speedup": round(self.est_speedup, 2), "rule": self.rule,
        }


@dataclass
class RunData:
    """Everything one run recorded."""

    meta: dict[str, Any]
    series: dict[tuple[str, str], Series]
    steps: list[StepRow] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    entities: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  #: e.g. SMART health of data devices

    def get(self, name: str, entity: str = "") -> Series | None:
        return self.series.get((name, entity))

    def all(self, name: str) -> list[Series]:
        return [s for (n, _), s in sorted(self.series.items()) if n == name]

    def roles(self) -> dict[str, str]:
        """pid -> role (main / worker / launcher) of the trainer's processes."""
        from stallscope.sources.procs import infer_roles

        probe_pids = {str(p["pid"]) for p in self.probes if p.get("pid") is not None}
        return infer_roles([e for e in self.entities if e["source"] == "procs"], probe_pids)


def load_run(run_dir: Path) -> RunData:
    meta = read_meta(run_dir)
    store = RunStore(run_dir / "run.db", readonly=True)
    try:
        return RunData(meta=meta, series=store.read_all(), steps=store.steps(),
                       probes=store.probes(), entities=store.entities(), events=store.events())
    finally:
        store.close()
