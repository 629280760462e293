"""What the store reads and writes, as Python values: a step row (:class:`StepRow`, the
probe's hand-over tuple :data:`StepTuple`, the bare :data:`StepValues`) and a time series read
back (:class:`Series`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Series", "StepRow", "StepTuple", "StepValues"]


@dataclass(frozen=True)
class StepRow:
    """One training step as the probe saw it (seconds), or ``n`` consecutive short steps
    summed (see the module docstring: ``step`` is the last of them; per step, divide by
    ``n``)."""

    rank: int
    step: int
    ts: float  #: wall time the step's batch was handed over
    wait_s: float  #: host time blocked waiting for the batch (data wait)
    host_s: float  #: host time from batch handed over to the next request (compute + rest)
    h2d_s: float | None = None  #: host-to-device copy time
    gpu_busy_s: float | None = None  #: GPU time between the step's CUDA events
    gpu_idle_s: float | None = None  #: GPU gap before this step (end of previous -> start)
    samples: int | None = None
    epoch: int | None = None
    #: host time blocked in collectives (DDP's gradient all-reduce, torch.distributed calls),
    #: part of ``host_s``; None when the step had none (or the probe could not see them)
    comm_s: float | None = None
    #: how many consecutive steps the row covers (1 but for steps shorter than the probe's
    #: GROUP_S, summed to a row so the probe's cost stays a small share of a step)
    n: int = 1

    @property
    def step_s(self) -> float:
        """The mean step's wall time (data wait plus host time) of the row's steps."""
        return (self.wait_s + self.host_s) / self.n

    @property
    def mean_wait_s(self) -> float:
        """The mean step's data wait of the row's steps."""
        return self.wait_s / self.n


#: one step (or ``n`` summed) as the probe hands it over: (step, clock s, wait_s, host_s,
#: samples, epoch, h2d_s, anything, n) in :class:`stallscope.probe.buffer.StepRecord`'s field
#: order; ``ts`` is a base plus the clock, the eighth field is not stored. The probe's
#: ``RawStep`` is this type (declared once)
StepTuple = tuple[int, float, float, float, "int | None", int, "float | None", Any, int]


#: one step as a bare tuple in :class:`StepRow`'s field order
StepValues = tuple[
    int,
    int,
    float,
    float,
    float,
    "float | None",
    "float | None",
    "float | None",
    "int | None",
    "int | None",
    "float | None",
    int,
]


@dataclass
class Series:
    """A time series read back from the store (rolled-up buckets give their mean)."""

    name: str
    entity: str
    ts: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)
