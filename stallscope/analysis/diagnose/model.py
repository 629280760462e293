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

__all__ = ["KINDS", "Finding", "Fix", "Kind", "RunData", "load_run", "title_of"]

Severity = Literal["critical", "warning", "info"]


class Kind(str, Enum):
    """A finding's kind, with everything said of it in one place (docs/architecture.md): its
    ``title`` (what the report, ``diagnose`` and the JSON's ``title`` show), the phrase a sentence
    "… is <verdict>" uses (``verdict``), whether the verdict is calm (a healthy or undecided run:
    ``top`` and the report show it without alarm), and the title a CPU-only run gets where the GPU
    title would name a GPU it does not have. ``mood``: "healthy" (shown as good news), "calm"
    (undecided: no alarm) or "alarm". Extend, don't rename. A member is its string
    (``Kind.HOST_SWAP == "host_swap"``, hashed as one)."""

    _title: str
    verdict: str
    mood: str
    cpu_title: str | None

    def __new__(
        cls, value: str, title: str, verdict: str, mood: str = "alarm", cpu_title: str | None = None
    ) -> Kind:
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj._title = title
        obj.verdict = verdict
        obj.mood = mood
        obj.cpu_title = cpu_title
        return obj

    @property
    def calm(self) -> bool:
        """No alarm: a healthy run, or one not diagnosed (yet)."""
        return self.mood != "alarm"

    @property
    def healthy(self) -> bool:
        return self.mood == "healthy"

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @property
    def title(self) -> str:  # type: ignore[override]  # the kind's title, not str.title()
        return self._title

    def title_for(self, has_gpu: bool = True) -> str:
        """The title, for a run with or without a GPU."""
        return self.cpu_title if (self.cpu_title and not has_gpu) else self._title

    @classmethod
    def parse(cls, kind: str) -> Kind:
        """The member whose string is ``kind`` (ValueError: no such kind)."""
        return cls(kind)  # type: ignore[call-arg]  # a lookup by value, not a new member

    @classmethod
    def lookup(cls, kind: str) -> Kind | None:
        """The member whose string is ``kind``, None for a kind from an older or newer run."""
        try:
            return cls.parse(kind)
        except ValueError:
            return None

    INPUT_FETCH = (
        "input_bound.fetch",
        "Input-bound: storage cannot feed the trainer fast enough",
        "input-bound",
    )
    INPUT_PREP = (
        "input_bound.prep",
        "Input-bound: CPU preprocessing cannot keep up",
        "input-bound",
    )
    INPUT_WAIT = (
        "input_bound.wait",
        "Input-bound: the loading waits on something other than the CPU or the disk",
        "input-bound",
    )
    H2D_BOUND = (
        "h2d_bound",
        "Host-to-device copies hold the GPU back",
        "bound by host-to-device copies",
    )
    COMPUTE_BOUND = (
        "compute_bound",
        "Compute-bound: the GPU is the bottleneck (healthy)",
        "compute-bound (healthy)",
        "healthy",
        "Compute-bound: the CPU is the bottleneck (healthy: training, not input, takes the time)",
    )
    GPU_THROTTLED = ("gpu_throttled", "GPU clocks are throttled", "held back by a throttled GPU")
    GPU_MEMORY_GROWTH = (
        "gpu_memory_growth",
        "GPU memory keeps growing",
        "growing its GPU memory without bound",
    )
    HOST_SWAP = ("host_swap", "The host is swapping", "swapping")
    SHM_PRESSURE = ("shm_pressure", "/dev/shm is nearly full", "short of shared memory")
    PCIE_DEGRADED = (
        "pcie_degraded",
        "PCIe link runs below its maximum",
        "on a PCIe link below its maximum",
    )
    DISK_HEALTH = (
        "disk_health",
        "A disk reports health problems",
        "reading from a disk that reports health problems",
    )
    STRAGGLER_RANK = (
        "straggler_rank",
        "One rank is slower than the others",
        "held back by a straggler",
    )
    INSUFFICIENT_DATA = (
        "insufficient_data",
        "Not enough data to name a bottleneck",
        "not diagnosed yet (too little data)",
        "calm",
    )
    INPUT_EPOCH_START = (
        "input_bound.epoch_start",
        "Every epoch starts with a long wait for data",
        "input-bound",
    )
    INPUT_HEAD_OF_LINE = (
        "input_bound.head_of_line",
        "Slow samples hold up the batches",
        "input-bound",
    )
    INPUT_GIL = (
        "input_bound.gil",
        "Input-bound: loader threads share one GIL (Python-bound prep)",
        "input-bound",
    )
    GPU_HELD_IDLE = ("gpu_held_idle", "A GPU is held but idle", "holding a GPU it does not use")
    WAITING_FOR_PEERS = (
        "waiting_for_peers",
        "Ranks wait for a slower rank in the all-reduce",
        "waiting for a slower rank",
    )
    COMMUNICATION_BOUND = (
        "communication_bound",
        "Communication-bound: the collectives are the limit",
        "communication-bound",
    )
    RANK_JITTER = (
        "rank_jitter",
        "Each step waits for a different slow rank",
        "held back by ranks out of step",
    )
    CPU_CONTENTION = (
        "cpu_contention",
        "The host is short of CPU: other processes take the training's cores",
        "short of CPU on a busy host",
    )
    HOST_BOUND = (
        "host_bound",
        "Host-bound: the GPU waits for the CPU to issue its work",
        "host-bound (the GPU waits for the CPU)",
    )
    SLOW_EXIT = ("slow_exit", "The trainer's exit takes long after its last step", "slow to exit")
    DATA_WAIT_UNKNOWN = (
        "data_wait_unknown",
        "Whether the trainer waits for data cannot be told without the probe",
        "not diagnosed without the probe (its data wait cannot be told)",
        "calm",
    )
    GPU_HEALTH = (
        "gpu_health",
        "A GPU needs attention: XID errors or memory repairs pending",
        "on a GPU that needs a person",
    )
    COMMAND_FAILED = ("command_failed", "The training command failed", "a command that failed")
    GPU_SLOWDOWN = ("gpu_slowdown", "The GPU slowed the training", "slowed by its GPU")


#: every finding kind's string, in :class:`Kind`'s order
KINDS: tuple[str, ...] = tuple(k.value for k in Kind)


def title_of(kind: str, has_gpu: bool = True) -> str:
    """The title of a kind (an unknown one, from an older or newer run: the kind itself)."""
    k = Kind.lookup(kind)
    return kind if k is None else k.title_for(has_gpu)


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
            "kind": self.kind.value,
            "title": self.kind.title,
            "severity": self.severity,
            "confidence": round(self.confidence, 2),
            "summary": self.summary,
            "evidence": thawed(self.evidence),  # facts quoted as evidence are read-only
            "fixes": [f.as_dict() for f in self.fixes],
            "est_speedup": round(self.est_speedup, 2),
            "rule": self.rule,
        }
