"""The prep side of an input stall (input_bound.prep): how many workers to ask for, what they
are expected to give (the loader model's, :mod:`stallscope.loadermodel`, on this run's CPU),
the ceiling of removing the stall, and the fixes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from stallscope.analysis.diagnose.model import Fix
from stallscope.analysis.diagnose.rules.common import _workers_now
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import (
    BUSY_SPARE,
    OTHERS_BUSY_CORES,
    others_taking_cores,
    spare_cores,
)
from stallscope.loadermodel import (
    MIN_GAIN,
    stall_cap,
    worker_gain,
    workers_measured_slower,
    workers_target,
)


def prep_gain(fx: Facts, target: int, stall: float | None = None) -> float | None:
    """The speed-up to expect from ``target`` workers instead of today's, for a prep stall
    (:func:`stallscope.loadermodel.worker_gain`: new workers only add throughput with CPU they
    can use, never more than removing the whole stall would give)."""
    nw = _workers_now(fx)
    spare = spare_cores(fx)
    if not nw or fx.loader.worker_cpu_pct is None or spare is None:
        return None
    return worker_gain(
        nw,
        target,
        fx.loader.worker_cpu_pct / 100.0,
        spare,
        fx.steps.stall_fraction if stall is None else stall,
    )


def _prep_estimate(fx: Facts, stall: float | None = None) -> float:
    """est_speedup of a prep stall: what its first fix is expected to deliver. When that fix is
    more workers, the CPU they can get bounds it; when it is cheaper per-sample work (no idle
    CPU), how much cheaper is the user's choice: the bound is removing the wait entirely."""
    nw = _workers_now(fx)
    cores = fx.host.physical_cores
    spare = spare_cores(fx)
    if nw is not None and cores and nw < cores and spare is not None and spare >= BUSY_SPARE:
        gain = prep_gain(fx, _prep_target(fx, nw, cores), stall)
        if gain is not None:
            return gain
    return stall_ceiling(fx, fx.steps.stall_fraction if stall is None else stall)[0]


#: the trainer's main-thread run-queue wait (% of the time) from which DataLoader workers on
#: the same cores are taken to slow its compute as well as its input
SHARED_RUNQ_PCT = 5.0
#: the least step left once the stall and the core sharing are gone (share of today's step)
MIN_LEFT = 0.05
#: the least cores of lower-priority processes' CPU (``niced_others_cpu_cores``) a reason names
NICED_NAMED_CORES = 0.05


def stall_ceiling(fx: Facts, stall: float | None) -> tuple[float, str | None]:
    """(the speed-up if the whole stall went away, what that assumed beyond "compute
    unchanged"). Where the loading shares the cores with the compute (DataLoader workers beside
    a trainer that waited for a CPU ≥ :data:`SHARED_RUNQ_PCT` of the time, no other process
    taking cores: that is ``cpu_contention``), removing the loading also gives the compute the
    CPU the loading took from it: the trainer's run-queue wait goes with the stall (measured:
    one worker decoding beside the trainer on 2 cores, the stall's own ceiling ×1.9-2.1, the
    loading removed ×5.2)."""
    base = stall_cap(stall)
    runq = fx.procs.main_runq_pct
    if stall is None or runq is None or runq < SHARED_RUNQ_PCT or not fx.loader.workers:
        return base, None
    if others_taking_cores(fx) >= OTHERS_BUSY_CORES:
        return base, None  # other processes take the cores: cpu_contention's
    left = max(MIN_LEFT, 1.0 - stall - runq / 100.0)
    est = round(1.0 / left, 2)
    if est <= base:
        return base, None
    return est, (
        f"the loading shares the cores with the compute: the trainer waited for a CPU "
        f"{runq:.0f}% of the time, which goes with the loading (the stall's own "
        f"ceiling, compute unchanged, is ×{base:.2f})"
    )


def _prep_target(fx: Facts, nw: int, cores: int) -> int:
    """The workers a prep stall asks for (:func:`stallscope.loadermodel.workers_target`),
    below any count the run's autotune measured no faster than today's."""
    target = workers_target(nw, fx.steps.stall_fraction or 0.0, cores)
    slower = _autotune_slower(fx, nw)
    return target if slower is None else min(target, slower - 1)


def _autotune_slower(fx: Facts, nw: int) -> int | None:
    """The fewest workers above ``nw`` that the run's own autotune measured no faster (by
    :data:`~stallscope.loadermodel.MIN_GAIN`) than ``nw`` or fewer; None without one."""
    tuned = fx.loader.config.get("autotune")
    # facts are read-only: tables are mappings, lists tuples
    trials = tuned.get("trials") if isinstance(tuned, Mapping) else None
    if not isinstance(trials, (list, tuple)):
        return None
    pairs = [
        (t["num_workers"], float(t["steps_per_s"]))
        for t in trials
        if isinstance(t, Mapping)
        and type(t.get("num_workers")) is int
        and isinstance(t.get("steps_per_s"), (int, float))
        and math.isfinite(t["steps_per_s"])
    ]
    return workers_measured_slower(pairs, nw)


def _prep_fixes(fx: Facts) -> list[Fix]:
    fixes: list[Fix] = []
    nw = _workers_now(fx)
    cores = fx.host.physical_cores
    stall = fx.steps.stall_fraction or 0.0
    spare = spare_cores(fx)
    if nw is not None and cores and nw < cores and spare is not None and spare < BUSY_SPARE:
        busy = fx.host.host_cpu_median_pct or 0.0
        fixes.append(
            Fix(
                "make per-sample work cheaper: decode at lower resolution, move augmentation to "
                "the GPU, or preprocess once offline",
                f"the CPUs are already {busy:.0f}% busy: more workers would only share the same "
                "cores",
            )
        )
    if nw is not None and cores:
        target = _prep_target(fx, nw, cores)
        gain = prep_gain(fx, target)
        slower = _autotune_slower(fx, nw)
        if fixes:  # the CPUs are busy: more workers would contradict the fix above
            pass
        elif nw < cores and target > nw and (gain is None or gain >= MIN_GAIN):
            fixes.append(
                Fix(
                    f"num_workers {nw} → {target} ({cores} physical cores"
                    + (
                        f", workers at {fx.loader.worker_cpu_pct:.0f}% CPU"
                        if fx.loader.worker_cpu_pct
                        else ""
                    )
                    + ")",
                    f"loading keeps up when workers deliver 1/(1−{stall:.2f}) ≈ "
                    f"{1 / max(1 - stall, 0.1):.1f}× today's rate; more workers than physical "
                    "cores only adds context switches" + _gain_note(fx, target),
                    gain,
                    {"num_workers": target},
                )
            )
        elif slower is not None and target <= nw:
            fixes.append(
                Fix(
                    "make per-sample work cheaper: decode at lower resolution, move augmentation "
                    "to the GPU, or preprocess once offline",
                    f"this run's autotune measured num_workers={slower} no faster than {nw}: more "
                    "workers do not help here",
                )
            )
        else:
            fixes.append(
                Fix(
                    "make per-sample work cheaper: decode at lower resolution, move augmentation "
                    "to the GPU, or preprocess once offline",
                    f"num_workers ({nw}) already matches the {cores} physical cores"
                    if nw >= cores
                    else f"more workers promise less than ×{MIN_GAIN:.2f}: there is little idle "
                    "CPU for them",
                )
            )
    else:
        fixes.append(
            Fix(
                "raise num_workers toward the number of physical cores (start at min(4, cores))",
                _more_workers_why(fx),
            )
        )
    return fixes


def _more_workers_why(fx: Facts) -> str:
    """Why more workers, from this run's own evidence only (a run with no workers is never
    told its workers are saturated)."""
    if fx.loader.workers:
        cpu = fx.loader.worker_cpu_pct
        return (
            f"its {fx.loader.workers} worker(s) ran at {cpu:.0f}% of a core each: more of "
            "them prepare more batches at once"
            if cpu is not None
            else f"its {fx.loader.workers} worker(s) did not keep up with the trainer"
        )
    cpu = fx.procs.main_cpu_pct
    return (
        "the trainer loads its own data (no DataLoader worker processes)"
        + (f" at {cpu:.0f}% CPU" if cpu is not None else "")
        + ": workers would prepare the next batches while it computes"
    )


def _gain_note(fx: Facts, target: int) -> str:
    gain = prep_gain(fx, target)
    spare = spare_cores(fx)
    if gain is None or spare is None:
        return ""
    niced = fx.host.niced_others_cpu_cores or 0.0
    where = (
        f"were idle or went to processes at a lower priority ({niced:.1f} to nice > 0), "
        "which yield them to new workers"
        if niced >= NICED_NAMED_CORES
        else "sat idle"
    )
    return (
        f"; expected ×{gain:.2f}: the workers use {fx.loader.worker_cpu_pct:.0f}% of a core "
        f"each and {spare:.1f} core(s) {where}"
    )
