"""Where each trainer process's training thread spent its time, from the sampled stacks.

Pure functions over the records of ``<run>/stacks/`` (:attr:`RunData.stacks
<stallscope.analysis.rundata.RunData.stacks>`): the phase seconds of each trainer process
(:func:`trainer_phases`), its phases over time and its heaviest folded stacks, for the
diagnosis (sampled stacks rank between the probe and system metrics), the report and ``top``.

A trainer process is one whose training thread reached a training phase (samples before that
are start-up and count nowhere) and whose role is not a DataLoader worker or a launcher
(:meth:`RunData.roles <stallscope.analysis.rundata.RunData.roles>` counts a process whose
sampler read a rank as a trainer, whatever its process tree showed). Its rank is the
``RANK`` its launcher gave it; several processes without one (a
helper script beside the trainer) leave the one that trained longest as the trainer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from stallscope.sources.stacks.aggregate import phase_seconds
from stallscope.sources.stacks.phases import PHASES, TRAINING

__all__ = [
    "MIN_TRAINING_S",
    "ProcPhases",
    "batch_throughput",
    "phases_over_time",
    "top_stacks",
    "trainer_phases",
]

#: seconds of sampled training a process needs before its shares mean anything
MIN_TRAINING_S = 2.0


@dataclass
class ProcPhases:
    """One trainer process: its rank, sampler, and seconds per phase (start-up left out)."""

    pid: int
    rank: int | None
    sampler: str
    seconds: dict[str, float] = field(default_factory=dict)
    #: stack samples taken
    samples: int = 0
    #: DataLoader batches the process took, and the data samples in them (counted by the
    #: in-trainer sampler: :mod:`stallscope.sources.stacks.batches`; 0 where nothing counted)
    batches: int = 0
    batch_samples: int = 0
    #: those batches' waits and step times (bucket -> batches, :mod:`stallscope.sources.stacks.
    #: batches`; each iterator's first batch left out), empty where nothing timed them
    wait_b: dict[int, int] = field(default_factory=dict)
    step_b: dict[int, int] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.get(p, 0.0) for p in PHASES)

    def share(self, phase: str) -> float:
        t = self.total_s
        return self.seconds.get(phase, 0.0) / t if t > 0 else 0.0

    def shares(self) -> dict[str, float]:
        return {p: round(self.share(p), 3) for p in PHASES if self.seconds.get(p)}


def trainer_phases(
    records: Iterable[Mapping[str, Any]], roles: Mapping[str, str] | None = None
) -> list[ProcPhases]:
    """The trainer processes of a run, by rank (see the module docstring)."""
    procs: dict[int, ProcPhases] = {}
    for rec in records:
        pid = rec["pid"]
        p = procs.get(pid)
        if p is None:
            rank = rec.get("rank")
            p = procs[pid] = ProcPhases(
                pid,
                rank if isinstance(rank, int) and rank >= 0 else None,
                str(rec.get("sampler") or ""),
            )
        for k, v in phase_seconds(rec).items():
            p.seconds[k] = p.seconds.get(k, 0.0) + v
        n = rec.get("n")
        p.samples += n if isinstance(n, int) and n > 0 else 0
        b, bs = rec.get("batches"), rec.get("samples")
        if _count(b) and _count(bs):  # a hand-edited file can hold anything
            p.batches += b
            p.batch_samples += bs
        _add_times(p, rec.get("wait_b"), rec.get("step_b"))
    roles = roles or {}
    out = [
        p
        for p in procs.values()
        if sum(p.seconds.get(k, 0.0) for k in TRAINING) >= MIN_TRAINING_S
        and roles.get(str(p.pid)) not in ("worker", "launcher")
    ]
    ranked = [p for p in out if p.rank is not None]
    if ranked:
        by_rank: dict[int, ProcPhases] = {}
        for p in sorted(ranked, key=lambda p: p.total_s):
            by_rank[p.rank] = p  # type: ignore[index]  # the longest-training wins a rank
        return [by_rank[r] for r in sorted(by_rank)]
    return [max(out, key=lambda p: p.total_s)] if out else []


def _add_times(p: ProcPhases, waits: Any, steps: Any) -> None:
    """A record's batch wait and step histograms into ``p`` (both, or neither when either is
    not a histogram)."""
    from stallscope.sources.stacks.fetches import add_counts, histogram

    w, st = histogram(waits), histogram(steps)
    if w is None or st is None:
        return
    add_counts(p.wait_b, w)
    add_counts(p.step_b, st)


def _count(v: Any) -> TypeGuard[int]:
    return type(v) is int and 0 <= v < 1 << 40


def batch_throughput(procs: Iterable[ProcPhases], seconds: float) -> float | None:
    """Data samples per second of the trainer processes together over ``seconds`` of training
    (their DataLoader batches, counted inside them); None where nothing was counted."""
    total = sum(p.batch_samples for p in procs)
    return round(total / seconds, 2) if total > 0 and seconds > 0 else None


def phases_over_time(
    records: Iterable[Mapping[str, Any]], pid: int, t0: float, bucket_s: float
) -> list[tuple[float, dict[str, float]]]:
    """(seconds since ``t0``, seconds per phase) in buckets of ``bucket_s`` for one process."""
    buckets: dict[int, dict[str, float]] = defaultdict(dict)
    for rec in records:
        if rec["pid"] != pid:
            continue
        b = buckets[int((rec["ts"] - t0) // bucket_s)]
        for k, v in phase_seconds(rec).items():
            if k in PHASES:
                b[k] = b.get(k, 0.0) + v
    return [(i * bucket_s, d) for i, d in sorted(buckets.items())]


#: stack phases outside the training: never listed with its stacks
_OUTSIDE = frozenset({"startup", "exit", "tail"})
_STARTUP = frozenset({"startup"})


def top_stacks(
    records: Iterable[Mapping[str, Any]], pid: int, n: int = 10, *, training: bool = True
) -> list[tuple[str, str, float]]:
    """The ``n`` folded stacks of one process that stood for the most time, as
    ``(folded, phase, seconds)``: the training's, as :attr:`ProcPhases.total_s` counts them
    (start-up and the exit after the last step left out: 9 s of an exit's ``rmtree`` were
    listed under "97.1 s sampled"). ``training=False``: the exit's too (only start-up left out),
    for what the exit was spent on."""
    outside = _OUTSIDE if training else _STARTUP
    secs: dict[str, float] = defaultdict(float)
    phase: dict[str, str] = {}
    for rec in records:
        if rec["pid"] != pid:
            continue
        stacks, phases = rec.get("stacks"), rec.get("stack_phase")
        if not isinstance(stacks, dict):
            continue
        for k, v in stacks.items():
            ph = phases.get(k) if isinstance(phases, dict) else None
            if not isinstance(v, (int, float)) or ph in outside:
                continue
            secs[str(k)] += float(v)
            phase[str(k)] = str(ph or "other")
    top = sorted(secs.items(), key=lambda kv: -kv[1])[:n]
    return [(k, phase[k], round(v, 3)) for k, v in top]
