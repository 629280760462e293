"""Outputs of the diagnosis: :class:`Finding` and :class:`Fix`, and the finding kinds.

Its input is :class:`~stallscope.analysis.rundata.RunData`, the one run reader shared with the
summary and the report (re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from stallscope.analysis.rundata import RunData, load_run

__all__ = ["KINDS", "Finding", "Fix", "RunData", "load_run"]

Severity = Literal["critical", "warning", "info"]

#: finding kinds (docs/architecture.md): extend, don't rename
KINDS: tuple[str, ...] = (
    "input_bound.fetch", "input_bound.prep", "h2d_bound", "compute_bound", "gpu_throttled",
    "gpu_memory_growth", "host_swap", "shm_pressure", "pcie_degraded", "disk_health",
    "straggler_rank", "insufficient_data", "input_bound.epoch_start", "gpu_held_idle",
    "waiting_for_peers", "communication_bound", "rank_jitter",
    "cpu_contention", "host_bound", "slow_exit", "data_wait_unknown", "gpu_health",
)


@dataclass(frozen=True)
class Fix:
    action: str  #: what to change, with this run's numbers
    why: str  #: the evidence that makes it the right change
    #: the speed-up this fix alone is expected to give (None: not estimated); the finding's
    #: ``est_speedup`` is the ceiling, if the whole stall went away
    expected: float | None = None
    #: the loader settings the fix changes (``{"num_workers": 2}``), so ``compare`` can tell
    #: which fix a second run applied
    change: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action, "why": self.why}
        if self.expected is not None:
            out["expected_speedup"] = round(self.expected, 2)
        if self.change:
            out["change"] = dict(self.change)
        return out


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
    #: the run holds too little data for any other finding to mean anything (rule_insufficient
    #: alone): the others are dropped, but for facts that need no time series
    too_little_data: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "severity": self.severity,
            "confidence": round(self.confidence, 2), "summary": self.summary,
            "evidence": self.evidence,
            "fixes": [f.as_dict() for f in self.fixes],
            "est_speedup": round(self.est_speedup, 2), "rule": self.rule,
        }
