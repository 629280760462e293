"""How fast a DataLoader can deliver: the one model the diagnosis's fixes, the offline tuner
(``stallscope tune``) and online autotune (``watch(loader, autotune=True)``) predict from, with
one set of thresholds. Pure arithmetic: nothing here reads a file, a clock or a process.

A loader whose ``workers`` each take ``load_s`` seconds of wall time per item (a batch or a
sample; the caller picks one unit and keeps to it) delivers at most the least of:

- ``workers / (load_s × slow)``: each worker delivers one item per load, ``slow`` = 1 + δ (k−1)
  when the workers slow each other's loading by a share δ (``contention``, fitted by the tuner
  from its trials; 0 unless measured);
- ``cores / (cpu_s × slow + main_cpu_s)``: the CPU one item costs the workers and the trainer
  beside them, over the usable cores;
- ``1 / step_s``: the training step takes one item at a time;
- ``storage``: what the storage lets through (items/s), when a limit is known.

Without workers (``workers`` 0) the main process loads and steps in turn: ``1 / (load_s +
step_s)``. :func:`worker_gain` is the same bound seen from a run that only tells the workers'
CPU and the idle cores (the diagnosis: no trial was run), capped by what removing the whole
wait would give (:func:`stall_cap`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = [
    "ALIKE",
    "AT_READ_LIMIT",
    "BUSY_SPARE",
    "CPU_BOUND_SHARE",
    "KEEPS_UP",
    "KEEPS_UP_PACE",
    "MEM_SHARE",
    "MIN_GAIN",
    "NEAR_BEST",
    "OTHERS_BUSY_CORES",
    "SHM_SHARE",
    "alike",
    "gains",
    "keeps_up",
    "rate",
    "shm_fits",
    "shm_need_mib",
    "stall_cap",
    "worker_gain",
    "workers_for_step",
    "workers_measured_slower",
    "workers_target",
    "workers_to_overlap",
]

#: below this share of the time waiting for data the loader keeps up: more tuning cannot help
KEEPS_UP = 0.05
#: a change must promise (or measure) this speed-up to be worth making or listing
MIN_GAIN = 1.05
#: two rates this close (ratio above this) are alike within one window's noise: the lighter
#: configuration is kept; below it, the slower one is a step back
ALIKE = 0.97
#: a prediction: the fewest workers within this share of the best predicted rate
NEAR_BEST = 0.98
#: a configuration whose loader keeps up (:data:`KEEPS_UP`) counts as keeping up, and is the
#: one to recommend, while its rate is at least this share of the fastest one measured; below
#: it, the low wait comes from a step slowed beside the workers (they took its cores), not from
#: a loader that keeps up
KEEPS_UP_PACE = 0.95
#: a rate at this share of what the storage lets through (the cgroup's read limit) is at that
#: limit: more batches in flight cannot raise it
AT_READ_LIMIT = 0.95
#: the trainer and its workers keep this share of the usable cores busy: the CPU is the bound,
#: and batches in flight (prefetch_factor) add no CPU
CPU_BOUND_SHARE = 0.75
#: the share of the available memory the workers may plan to take
MEM_SHARE = 0.8
#: the most a stall's removal is credited with: a 95% wait, ×20
MAX_STALL = 0.95
#: other processes (not the training's) keeping at least this many of the host's cores busy,
#: while every trainer process waits for a CPU: the host is short of CPU (the diagnosis's
#: cpu_contention; the tuner flags such trials)
OTHERS_BUSY_CORES = 0.5
#: idle cores (over the run) under which the CPUs count as busy: more workers or a parallel map
#: would only share the same cores
BUSY_SPARE = 0.25
#: the share of /dev/shm's free space the workers' batches in flight may plan to take
SHM_SHARE = 0.9
#: a batch's size in MiB when it is not known (the workers' batches in flight then take
#: prefetch_factor × 2 × this each: 32 MiB at the default prefetch_factor 2)
SHM_BATCH_MIB_UNKNOWN = 8.0
#: a loader whose workers wait rather than compute (input_bound.wait) is given at least this
#: many more workers, and at most WAIT_MAX_WORKERS in all
WAIT_MORE_WORKERS = 2
WAIT_MAX_WORKERS = 32


def rate(
    workers: int,
    load_s: float,
    *,
    cores: float,
    step_s: float = 0.0,
    cpu_s: float | None = None,
    main_cpu_s: float = 0.0,
    contention: float = 0.0,
    storage: float | None = None,
) -> float:
    """Items per second with ``workers`` workers (the module docstring's bounds). ``cpu_s``:
    the workers' CPU per item (default: ``load_s``, loading all on the CPU); ``main_cpu_s``:
    the trainer's own CPU per item beside them. 0.0 when nothing bounds it (no load, no
    step)."""
    if workers <= 0:
        total = max(load_s, 0.0) + max(step_s, 0.0)
        return 1.0 / total if total > 0 else 0.0
    slow = 1.0 + max(contention, 0.0) * (workers - 1)
    cpu = load_s if cpu_s is None else cpu_s
    bounds: list[float] = []
    if load_s > 0:
        bounds.append(workers / (load_s * slow))
    per_item = max(cpu, 0.0) * slow + max(main_cpu_s, 0.0)
    if cores > 0 and per_item > 0:
        bounds.append(cores / per_item)
    if step_s > 0:
        bounds.append(1.0 / step_s)
    if storage is not None and storage > 0:
        bounds.append(storage)
    return min(bounds) if bounds else 0.0


def stall_cap(stall: float | None) -> float:
    """The speed-up if the data wait (a share of the time) went away entirely: wall / (wall −
    wait), credited up to a :data:`MAX_STALL` wait; 1.0 without a wait."""
    if stall is None or not stall > 0:
        return 1.0
    return round(1.0 / max(1.0 - min(stall, MAX_STALL), 1.0 - MAX_STALL), 2)


def worker_gain(
    workers: int, target: int, worker_cpu: float, spare_cores: float, stall: float | None
) -> float | None:
    """The speed-up ``target`` workers promise over ``workers``, when loading is what the
    training waits for, from a run alone: the workers now keep ``worker_cpu`` of a core busy
    each (the CPU bound: their rate is their CPU), a new worker adds at most one core, and no
    more than the ``spare_cores`` left idle. Never more than :func:`stall_cap`. None when the
    run does not tell (no workers, no CPU, no more workers)."""
    if workers <= 0 or target <= workers or not worker_cpu > 0 or spare_cores < 0:
        return None
    used = worker_cpu * workers
    added = min(float(target - workers), spare_cores)
    return round(min(stall_cap(stall), (used + added) / used), 2)


def workers_target(workers: int, stall: float, cores: int) -> int:
    """The workers that would deliver 1 / (1 − stall) times today's rate, at least one more
    than today, never more than the physical ``cores``."""
    want = math.ceil(max(workers, 1) / max(1.0 - stall, 0.1))
    return min(max(want, workers + 1), cores)


def workers_to_overlap(workers: int, stall: float) -> int:
    """Workers whose loading waits (a remote store, a lock) rather than computes: enough to
    overlap the waits, 1 / (1 − stall) times today's, at least :data:`WAIT_MORE_WORKERS` more,
    at most :data:`WAIT_MAX_WORKERS` (past the cores is fine: they wait)."""
    need = 1.0 / max(1.0 - stall, 0.1)
    return min(
        WAIT_MAX_WORKERS, max(workers + WAIT_MORE_WORKERS, math.ceil(max(workers, 1) * need))
    )


def workers_for_step(load_s: float, step_s: float, workers: int) -> int:
    """Workers that each load one item in ``load_s`` while a step takes ``step_s``: enough to
    deliver an item a step (more than ``workers`` when the step cannot be fed now)."""
    if step_s > 0 and math.isfinite(load_s):
        return math.ceil(load_s / step_s)
    return workers + 1


def shm_need_mib(workers: int, prefetch_factor: int = 2, batch_mib: float | None = None) -> float:
    """MiB of /dev/shm the workers' batches in flight take: each worker keeps
    ``prefetch_factor`` batches, each passed through shared memory (×2: the worker's copy and
    the one being handed over); a batch of unknown size counts :data:`SHM_BATCH_MIB_UNKNOWN`."""
    size = SHM_BATCH_MIB_UNKNOWN if batch_mib is None or batch_mib <= 0 else batch_mib
    return size * workers * max(prefetch_factor, 1) * 2


def shm_fits(need_mib: float, free_mib: float) -> bool:
    """Whether ``need_mib`` of batches fit in /dev/shm's ``free_mib`` (:data:`SHM_SHARE`)."""
    return need_mib <= SHM_SHARE * free_mib


def keeps_up(wait_share: float | None) -> bool:
    """Whether a loader waited on for this share of the time keeps up (:data:`KEEPS_UP`)."""
    return wait_share is not None and wait_share < KEEPS_UP


def gains(new: float, old: float) -> bool:
    """Whether a rate of ``new`` is worth the change from ``old`` (:data:`MIN_GAIN`)."""
    return old > 0 and new >= MIN_GAIN * old


def alike(new: float, best: float) -> bool:
    """Whether ``new`` is within one window's noise of ``best`` (:data:`ALIKE`)."""
    return best > 0 and new >= ALIKE * best


def workers_measured_slower(trials: Iterable[tuple[int, float]], workers: int) -> int | None:
    """Given measured (worker count, rate) pairs, the smallest worker count above ``workers``
    that did not gain :data:`MIN_GAIN` over the best rate measured with ``workers`` or fewer,
    or None when no such measurement exists. A fix must not advise what a run measured."""
    trials = [(k, r) for k, r in trials if r > 0]
    base = max((r for k, r in trials if k <= workers), default=None)
    if base is None:
        return None
    worse = [k for k, r in trials if k > workers and not gains(r, base)]
    return min(worse) if worse else None


#: batches the in-order simulation draws from a measured cost distribution
ORDER_SIM_BATCHES = 3000


def in_order_speedup(
    costs_s: Sequence[float], workers: int, compute_s: float, prefetch_factor: int = 2
) -> float | None:
    """The speed-up ``DataLoader(in_order=False)`` gives a loader of ``workers`` workers whose
    batches cost ``costs_s`` (seconds each, drawn as measured: a heavy tail shows), feeding a
    step that computes ``compute_s``: the time the steps take in order over the time they take
    when any ready batch may go first (:func:`loader_time`, PyTorch's dispatch). The workers'
    costs are taken as they are (the cores they share are the caller's bound). None with fewer
    than two workers or no costs."""
    if workers < 2 or not costs_s:
        return None
    in_order = loader_time(costs_s, workers, compute_s, prefetch_factor, in_order=True)
    any_order = loader_time(costs_s, workers, compute_s, prefetch_factor, in_order=False)
    return round(in_order / any_order, 2) if any_order > 0 else None


def loader_time(
    costs_s: Sequence[float],
    workers: int,
    compute_s: float,
    prefetch_factor: int = 2,
    *,
    in_order: bool,
) -> float:
    """Seconds a training takes over ``costs_s``'s batches, as PyTorch's DataLoader hands them
    over: ``prefetch_factor`` × ``workers`` indices sent at the start and one more each time
    the step takes a batch; in order, batch i goes to worker i mod ``workers`` and the step
    takes batch i next, ready or not; with ``in_order=False`` the next index goes to the next
    worker with fewer than ``prefetch_factor`` batches and the step takes the first batch
    ready. Each worker works through its batches one after another."""
    n = len(costs_s)
    free_at = [0.0] * workers  # when each worker is through the batches it has been sent
    queued = [0] * workers
    done: dict[int, float] = {}  # sent, not yet taken: batch -> when it is ready
    owner: dict[int, int] = {}
    sent = turn = 0

    def send(now: float) -> None:
        nonlocal sent, turn
        for _ in range(workers):
            w, turn = turn % workers, turn + 1
            if in_order or queued[w] < prefetch_factor:
                break
        else:
            return
        free_at[w] = max(free_at[w], now) + costs_s[sent]
        done[sent], owner[sent] = free_at[w], w
        queued[w] += 1
        sent += 1

    for _ in range(min(n, prefetch_factor * workers)):
        send(0.0)
    t = 0.0
    for taken in range(n):
        i = taken if in_order else min(done, key=done.__getitem__)
        t = max(t, done.pop(i))  # the step waits for its batch
        queued[owner.pop(i)] -= 1
        if sent < n:
            send(t)
        t += compute_s
    return t
