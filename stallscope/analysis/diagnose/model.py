"""Outputs of the diagnosis: :class:`Finding` and :class:`Fix`, and the finding kinds.

Its input is :class:`~stallscope.analysis.rundata.RunData`, the one run reader shared with the
summary and the report (re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from stallscope.analysis.facts import thawed
from stallscope.analysis.rundata import RunData, load_run

__all__ = ["KINDS", "Finding", "Fix", "Kind", "RunData", "kind_title", "load_run"]

Severity = Literal["critical", "warning", "info"]

class Kind(str, Enum):
    """A finding's kind, with the plain-language title the report, ``diagnose`` and the JSON
    (``title``) show for it: the one list of kinds (docs/architecture.md). Extend, don't
    rename. A member is its string (``Kind.HOST_SWAP == "host_swap"``, hashed as one)."""

    heading: str

    def __new__(cls, value: str, heading: str) -> Kind:
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.heading = heading
        return obj

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def parse(cls, kind: str) -> Kind:
        """The member whose string is ``kind`` (ValueError: no such kind)."""
        return cls(kind)  # type: ignore[call-arg]  # a lookup by value, not a new member

    INPUT_FETCH = ("input_bound.fetch", "Input-bound: storage cannot feed the trainer fast enough")
    INPUT_PREP = ("input_bound.prep", "Input-bound: CPU preprocessing cannot keep up")
    INPUT_WAIT = ("input_bound.wait",
                  "Input-bound: the loading waits on something other than the CPU or the disk")
    H2D_BOUND = ("h2d_bound", "Host-to-device copies hold the GPU back")
    COMPUTE_BOUND = ("compute_bound", "Compute-bound: the GPU is the bottleneck (healthy)")
    GPU_THROTTLED = ("gpu_throttled", "GPU clocks are throttled")
    GPU_MEMORY_GROWTH = ("gpu_memory_growth", "GPU memory keeps growing")
    HOST_SWAP = ("host_swap", "The host is swapping")
    SHM_PRESSURE = ("shm_pressure", "/dev/shm is nearly full")
    PCIE_DEGRADED = ("pcie_degraded", "PCIe link runs below its maximum")
    DISK_HEALTH = ("disk_health", "A disk reports health problems")
    STRAGGLER_RANK = ("straggler_rank", "One rank is slower than the others")
    INSUFFICIENT_DATA = ("insufficient_data", "Not enough data to name a bottleneck")
    INPUT_EPOCH_START = ("input_bound.epoch_start",
                         "Every epoch starts with a long wait for data")
    GPU_HELD_IDLE = ("gpu_held_idle", "A GPU is held but idle")
    WAITING_FOR_PEERS = ("waiting_for_peers",
                         "Ranks wait for a slower rank in the all-reduce")
    COMMUNICATION_BOUND = ("communication_bound",
                           "Communication-bound: the collectives are the limit")
    RANK_JITTER = ("rank_jitter", "Each step waits for a different slow rank")
    CPU_CONTENTION = ("cpu_contention",
                      "The host is short of CPU: other processes take the training's cores")
    HOST_BOUND = ("host_bound", "Host-bound: the GPU waits for the CPU to issue its work")
    SLOW_EXIT = ("slow_exit", "The trainer's exit takes long after its last step")
    DATA_WAIT_UNKNOWN = ("data_wait_unknown",
                         "Whether the trainer waits for data cannot be told without the probe")
    GPU_HEALTH = ("gpu_health", "A GPU needs attention: XID errors or memory repairs pending")
    COMMAND_FAILED = ("command_failed", "The training command failed")


#: every finding kind's string, in :class:`Kind`'s order
KINDS: tuple[str, ...] = tuple(k.value for k in Kind)


def kind_title(kind: str) -> str:
    """The title of a kind (an unknown one, from an older or newer run: the kind itself)."""
    try:
        return Kind.parse(kind).heading
    except ValueError:
        return kind


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


@dataclass(kw_only=True)
class Finding:
    """One thing the diagnosis found, built by keyword (``kind`` a :class:`Kind`, or its
    string: an unknown one raises)."""

    kind: Kind
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

    def __post_init__(self) -> None:
        self.kind = Kind.parse(self.kind)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value, "title": self.kind.heading, "severity": self.severity,
            "confidence": round(self.confidence, 2), "summary": self.summary,
            "evidence": thawed(self.evidence),  # facts quoted as evidence are read-only
            "fixes": [f.as_dict() for f in self.fixes],
            "est_speedup": round(self.est_speedup, 2), "rule": self.rule,
        }
