"""The training window: from a run's first training step to its last.

A process is not its training. Before the loop it imports, builds its model and dataset (start-
up); after it, it saves, tears its DataLoader down and exits (with ``pin_memory`` and
``persistent_workers`` PyTorch joins each worker with a 5-s timeout at exit: 30 s for 6 workers,
measured on an H200). Figures taken over the whole process call a compute-bound training idle
or input-bound, so every figure of a diagnosis is taken inside the window
(:func:`training_window`), and start-up and exit are phases of their own.

Where the window comes from, best first:

1. the probe's steps: the first step's request for its batch to the last step's end;
2. the sampled stacks of the training thread: its first and last training-phase sample (a
   loader's ``__next__``, forward/backward, optimizer...; never the exit's joins);
3. system metrics: while the trainer had DataLoader workers, else while its GPU worked;
4. otherwise the run itself (``source`` "run").

The GPU's own warm-up inside the window (cuDNN autotuning, kernel compilation, lazy module
loading: seconds in which the training thread is in forward while the GPU does nearly nothing)
is found by :func:`gpu_warmup_end`: the GPU's figures of the steady state start there.

Pure functions over :class:`~stallscope.analysis.rundata.RunData`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from stallscope import stats
from stallscope.analysis.stacks import top_stacks, trainer_phases
from stallscope.sources.stacks.aggregate import phase_seconds
from stallscope.sources.stacks.phases import TRAINING, folded_exiting
from stallscope.units import finite_or_none

if TYPE_CHECKING:
    from stallscope.analysis.rundata import RunData

__all__ = [
    "GPU_WARM_FRACTION",
    "TrainingWindow",
    "clip",
    "exit_stacks",
    "gpu_warmup_end",
    "trainer_gpus",
    "training_window",
    "window_of",
]

#: the GPU has warmed up at the first sample reaching this fraction of its working level (the
#: 90th percentile of its utilization inside the window)
GPU_WARM_FRACTION = 0.5
#: ... when that level is at least this (%): a GPU that never gets busy has no warm-up to cut
GPU_WARM_LEVEL_PCT = 50.0
#: samples the steady state needs after the warm-up, else the whole window stands
GPU_STEADY_MIN_SAMPLES = 3


@dataclass(frozen=True)
class TrainingWindow:
    """``start``..``end`` (UNIX seconds) of the training, where that came from, and the
    process's start and end around it (None when unknown)."""

    start: float
    end: float
    source: str  #: "probe", "stacks", "workers", "gpu" or "run"
    run_start: float | None = None
    run_end: float | None = None

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def startup_s(self) -> float | None:
        """From the process's start to the first training step (imports, model, dataset)."""
        if self.source == "run" or self.run_start is None:
            return None
        return round(max(0.0, self.start - self.run_start), 1)

    @property
    def exit_s(self) -> float | None:
        """From the last training step to the process's end (saving, tear-down, exit)."""
        if self.source == "run" or self.run_end is None:
            return None
        return round(max(0.0, self.run_end - self.end), 1)


_num = finite_or_none  # the one check (units.py)


def _probe_window(data: RunData) -> tuple[float, float] | None:
    if not data.steps:
        return None
    start = min(s.ts - s.wait_s for s in data.steps)
    end = max(s.ts + s.host_s for s in data.steps)
    return (start, end) if end > start else None


def _stack_window(
    records: Sequence[Mapping[str, Any]], pids: set[int]
) -> tuple[float, float] | None:
    """First and last training-phase sample of the trainer processes ``pids``: a record ends
    at its ``ts`` and stands for its seconds; its training part starts after its start-up and
    ends before its exit."""
    start = end = None
    for rec in records:
        if rec.get("pid") not in pids:
            continue
        sec = phase_seconds(rec)
        if not any(sec.get(k) for k in TRAINING):
            continue
        ts = float(rec["ts"])
        # the record's after-training part: its tail (new records: the exit is part of it) or
        # the exit moved out of a training phase (records written before the exit phase)
        after = max(sec.get("tail", 0.0), sec.get("exit", 0.0))
        e0 = ts - after
        s0 = e0 - sum(v for k, v in sec.items() if k not in ("startup", "tail", "exit"))
        start = s0 if start is None else min(start, s0)
        end = e0 if end is None else max(end, e0)
    if start is None or end is None or end <= start:
        return None
    return start, end


def _series_window(
    data: RunData, metric: str, entities: Iterable[str], floor: float = 0.0
) -> tuple[float, float] | None:
    ts = [
        t
        for e in entities
        for s in [data.get(metric, e)]
        if s is not None
        for t, v in zip(s.ts, s.v)
        if v > floor
    ]
    return (min(ts), max(ts)) if len(ts) >= 2 and max(ts) > min(ts) else None


def training_window(
    data: RunData, trainer_pids: set[int] | None = None, gpus: Iterable[str] = ()
) -> TrainingWindow:
    """The run's training window (see the module docstring). ``trainer_pids``: the processes
    whose sampled stacks speak for the training (:func:`~stallscope.analysis.stacks.
    trainer_phases`); ``gpus``: the GPUs the training used."""
    # a run still going (or read from Prometheus) has no end: no exit yet
    run_start, run_end = _num(data.meta.get("start")), _num(data.meta.get("end"))
    if run_start is None and data.span is not None:
        run_start = data.span[0]
    win = _probe_window(data)
    source = "probe"
    if win is None and trainer_pids:
        win, source = _stack_window(data.stacks, trainer_pids), "stacks"
    if win is None:
        workers = [p for p, r in data.roles().items() if r == "worker"]
        win, source = _series_window(data, "procs.cpu_pct", workers, -1.0), "workers"
    if win is None:
        win, source = _series_window(data, "gpu.util_pct", gpus, 5.0), "gpu"
    if win is None:
        t0, t1 = data.time_axis()
        return TrainingWindow(t0, t1, "run", run_start, run_end)
    return TrainingWindow(win[0], win[1], source, run_start, run_end)


#: a GPU whose utilization reached this (%) did some work (which GPUs a run used)
GPU_WORKED_PCT = 10.0


def trainer_gpus(data: RunData) -> set[str]:
    """The GPUs this run used: those where the trainer's processes held memory; when that is
    unknown (pids not visible to NVML, e.g. in a container), those that did any work. A CPU run
    on a GPU machine uses none; an 8-GPU node running one job on gpu0 uses gpu0."""
    held = data.all("gpu.trainer_mem_mib")
    if held:
        used = {s.entity for s in held if any(v > 0 for v in s.v)}
        if used:
            return used
    return {s.entity for s in data.all("gpu.util_pct") if s.v and max(s.v) >= GPU_WORKED_PCT}


def window_of(data: RunData) -> TrainingWindow:
    """The training window of a run, its trainer processes and GPUs found as the diagnosis
    finds them (computed once per run: :meth:`RunData.window
    <stallscope.analysis.rundata.RunData.window>`)."""
    pids = {p.pid for p in trainer_phases(data.stacks, data.roles())}
    return training_window(data, pids, trainer_gpus(data))


def clip(data: RunData, win: TrainingWindow) -> RunData:
    """``data`` with every series cut to the window (a sample at ``t`` stands for the interval
    before it: the first one inside the window is kept). Steps, stacks, entities and meta are
    shared, not copied. The whole run when the window is the run."""
    if win.source == "run":
        return data
    series = {}
    for key, s in data.series.items():
        idx = [i for i, t in enumerate(s.ts) if win.start <= t <= win.end + 1.0]
        series[key] = replace(s, ts=[s.ts[i] for i in idx], v=[s.v[i] for i in idx])
    out = replace(data, series=series, span=(win.start, win.end))
    out._roles = data.roles()
    return out


def gpu_warmup_end(ts: Sequence[float], util: Sequence[float]) -> float | None:
    """When a GPU's warm-up ended inside a window: the first sample at which its utilization
    reached :data:`GPU_WARM_FRACTION` of its working level (the window's 90th percentile), when
    that level is ≥ :data:`GPU_WARM_LEVEL_PCT` and ≥ :data:`GPU_STEADY_MIN_SAMPLES` samples
    follow; None when there was no warm-up to leave out (the first sample is already warm, or
    the GPU never got busy)."""
    if len(util) < GPU_STEADY_MIN_SAMPLES + 1:
        return None
    level = stats.percentile(util, 90)
    if level < GPU_WARM_LEVEL_PCT:
        return None
    for i, v in enumerate(util):
        if v >= GPU_WARM_FRACTION * level:
            if i == 0 or len(util) - i < GPU_STEADY_MIN_SAMPLES:
                return None
            return ts[i]
    return None


def exit_stacks(
    records: Iterable[Mapping[str, Any]], pids: set[int], after: float, n: int = 3
) -> list[tuple[str, float]]:
    """The folded stacks the trainer processes spent the most time in after ``after`` (the
    training window's end): what the exit was spent on, heaviest first. The training samples
    of the record the loop ended in are left out."""
    late = [r for r in records if r["ts"] >= after]
    secs: dict[str, float] = defaultdict(float)
    for pid in pids:
        for k, ph, v in top_stacks(late, pid, n=10_000, training=False):
            if ph not in TRAINING or folded_exiting(k):
                secs[k] += v
    return sorted(((k, round(v, 2)) for k, v in secs.items()), key=lambda kv: -kv[1])[:n]
