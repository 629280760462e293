"""The fetch vs prep scoring (docs/diagnosis.md "input_bound.fetch vs input_bound.prep"): points
for "storage cannot keep up" against "CPU preprocessing cannot keep up", each with its reason,
from the run's facts; the side with more points wins. Its lines are one named set,
:data:`SCORES`. The input rules, compute-bound's check and the straggler's cause read it."""

from __future__ import annotations

from dataclasses import dataclass

from stallscope import units
from stallscope.analysis.diagnose.tfdata import is_tf
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import limited

__all__ = ["SCORES", "ScoreLimits", "fetch_prep_scores", "host_io_points"]


@dataclass(frozen=True)
class ScoreLimits:
    """The lines of the fetch vs prep scoring (:func:`fetch_prep_scores`; docs/diagnosis.md
    "input_bound.fetch vs input_bound.prep"): each crossed gives the side its points."""

    d_state_strong: float = 0.25  #: share of samples in D state: 2 fetch points
    d_state: float = 0.10  #: ... 1 fetch point; under it, workers rarely blocked: 1 prep point
    blkio_pct: float = 20.0  #: workers blocked on block I/O (% of the time): 2 fetch points
    await_ms: float = 20.0  #: read latency (r_await median): 1 fetch point
    await_high_ms: float = 50.0  #: ... 2 fetch points
    flat_cv: float = 0.2  #: read throughput varying less than this: a ceiling, 1 fetch point
    flat_min_kb_s: float = 1024.0  #: ... when reading more than this (KiB/s)
    psi_io_pct: float = 10.0  #: I/O pressure (PSI some): 1 fetch point
    iowait_pct: float = 10.0  #: CPU iowait: 1 fetch point
    worker_saturated_pct: float = 80.0  #: each worker's CPU: 2 prep points
    worker_busy_pct: float = 55.0  #: ... 1 prep point
    worker_idle_pct: float = 40.0  #: ... under it: waiting, not computing, 1 fetch point
    main_busy_pct: float = 80.0  #: the trainer loading on its own thread, busy: 2 prep points
    main_idle_pct: float = 50.0  #: ... barely computing while blocked on reads: 1 fetch point
    runq_pct: float = 15.0  #: workers waiting for a CPU: 1 prep point
    host_busy_pct: float = 85.0  #: every CPU busy (median host CPU): 1 prep point
    device_busy_pct: float = 80.0  #: the dataset's device busy (%util): 1 fetch point
    device_idle_pct: float = 30.0  #: ... mostly idle (and reading < flat_min_kb_s): 1 prep


SCORES = ScoreLimits()


def fetch_prep_scores(fx: Facts) -> tuple[int, list[str], int, list[str]]:
    """Points for 'storage can't keep up' vs 'CPU preprocessing can't keep up', with reasons."""
    fetch_why: list[str] = []
    prep_why: list[str] = []
    fetch_pts = prep_pts = 0
    d = fx.loader.worker_d_share if fx.loader.workers else fx.procs.main_d_share
    who = (
        "workers"
        if fx.loader.workers
        else "the trainer's threads"
        if fx.procs.tf_trainer or is_tf(fx)
        else "the trainer (num_workers=0)"
    )
    if d is not None:
        if d >= SCORES.d_state_strong:
            fetch_pts += 2
            fetch_why.append(f"{who} in D state (waiting on I/O) in {d:.0%} of samples")
        elif d >= SCORES.d_state:
            fetch_pts += 1
            fetch_why.append(f"{who} in D state in {d:.0%} of samples")
        elif fx.loader.workers:
            prep_pts += 1
            prep_why.append(f"workers rarely in D state ({d:.0%} of samples)")
    if fx.loader.worker_blkio_pct is not None and fx.loader.worker_blkio_pct >= SCORES.blkio_pct:
        fetch_pts += 2
        fetch_why.append(
            f"workers blocked on block I/O {fx.loader.worker_blkio_pct:.0f}% of the time"
        )
    dev_fetch, dev_prep = _device_scores(fx, fetch_why, prep_why)
    fetch_pts, prep_pts = fetch_pts + dev_fetch, prep_pts + dev_prep
    aw = fx.disk.disk_r_await_median_ms
    if aw is not None and aw >= SCORES.await_ms:
        fetch_pts += 2 if aw >= SCORES.await_high_ms else 1
        fetch_why.append(
            f"read latency {aw:.0f} ms (r_await; > {SCORES.await_ms:.0f} ms deserves attention)"
        )
    if (
        fx.disk.disk_rkb_s_cv is not None
        and fx.disk.disk_rkb_s_cv < SCORES.flat_cv
        and (fx.disk.disk_rkb_s_median or 0) > SCORES.flat_min_kb_s
        and fetch_pts > 0
    ):
        fetch_pts += 1
        flat = units.rate(units.kib(fx.disk.disk_rkb_s_median or 0))
        fetch_why.append(
            f"read throughput flat at ~{flat} (variation {fx.disk.disk_rkb_s_cv:.0%}): a ceiling"
        )
    fetch_pts += _host_io_scores(fx, fetch_why)
    dev_fetch, dev_prep = _cpu_scores(fx, d, fetch_why, prep_why)
    fetch_pts, prep_pts = fetch_pts + dev_fetch, prep_pts + dev_prep
    return fetch_pts, fetch_why, prep_pts, prep_why


def _host_io_scores(fx: Facts, fetch_why: list[str]) -> int:
    """The fetch side's points from host-wide I/O figures (PSI, iowait): any process's I/O
    shows there, the training's or another's."""
    pts = 0
    if fx.host.psi_io_median_pct is not None and fx.host.psi_io_median_pct >= SCORES.psi_io_pct:
        pts += 1
        fetch_why.append(
            "I/O pressure: some task stalled on I/O "
            f"{fx.host.psi_io_median_pct:.0f}% of "
            "the time (PSI)"
        )
    if fx.host.iowait_median_pct is not None and fx.host.iowait_median_pct >= SCORES.iowait_pct:
        pts += 1
        fetch_why.append(f"CPU iowait {fx.host.iowait_median_pct:.0f}%")
    return pts


def host_io_points(fx: Facts) -> int:
    """How many of :func:`fetch_prep_scores`' fetch points are host-wide (PSI, iowait)."""
    return _host_io_scores(fx, [])


def _cpu_scores(
    fx: Facts, d: float | None, fetch_why: list[str], prep_why: list[str]
) -> tuple[int, int]:
    """The loading's CPU part of :func:`fetch_prep_scores` (``d``: the loading side's D-state
    share): busy workers or a busy trainer loading itself point to prep, idle ones to fetch;
    returns (fetch, prep) points."""
    fetch_pts = prep_pts = 0
    wc = fx.loader.worker_cpu_pct
    if fx.loader.workers and wc is not None:
        if wc >= SCORES.worker_saturated_pct:
            prep_pts += 2
            prep_why.append(f"each worker at {wc:.0f}% CPU (saturated)")
        elif wc >= SCORES.worker_busy_pct:
            prep_pts += 1
            prep_why.append(f"workers at {wc:.0f}% CPU")
        elif wc < SCORES.worker_idle_pct:
            fetch_pts += 1
            fetch_why.append(f"workers mostly idle on CPU ({wc:.0f}%): waiting, not computing")
    mc = fx.procs.main_cpu_pct
    if (
        not fx.loader.workers
        and mc is not None
        and mc >= SCORES.main_busy_pct
        and (d is None or d < SCORES.d_state)
        and fx.steps.stall_source in ("probe", "stacks")
    ):
        # the training thread measurably waits on its own loading, and the process is busy
        # on the CPU, not blocked on reads: the loading is CPU work (decode, transform)
        prep_pts += 2
        prep_why.append(
            f"the trainer loads on its own thread at {mc:.0f}% CPU, rarely blocked on "
            "reads: loading is CPU work"
        )
    if (
        not fx.loader.workers
        and d is not None
        and d >= SCORES.d_state_strong
        and mc is not None
        and mc < SCORES.main_idle_pct
    ):
        # loading on the trainer's own threads (num_workers=0, tf.data): blocked reads while the
        # process barely computes
        fetch_pts += 1
        fetch_why.append(
            f"the trainer at {mc:.0f}% CPU while its threads wait on I/O: reading, not computing"
        )
    if fx.loader.worker_runq_pct is not None and fx.loader.worker_runq_pct >= SCORES.runq_pct:
        prep_pts += 1
        prep_why.append(
            "workers waiting for a free CPU "
            f"{fx.loader.worker_runq_pct:.0f}% of the time "
            "(CPU contention)"
        )
    if (
        fx.host.host_cpu_median_pct is not None
        and fx.host.host_cpu_median_pct >= SCORES.host_busy_pct
        and (fx.host.iowait_median_pct or 0) < SCORES.iowait_pct
    ):
        prep_pts += 1
        prep_why.append(f"all CPUs busy ({fx.host.host_cpu_median_pct:.0f}%)")
    return fetch_pts, prep_pts


def _device_scores(fx: Facts, fetch_why: list[str], prep_why: list[str]) -> tuple[int, int]:
    """The dataset device's part of :func:`fetch_prep_scores`: its read limit, else its own
    busy share (reasons appended to ``fetch_why`` and ``prep_why``); returns (fetch, prep)
    points."""
    util = fx.disk.disk_util_median_pct
    fetch_pts = prep_pts = 0
    if limited(fx):
        # a limit stands before the device: the device's own idleness says nothing
        fetch_pts += 2
        fetch_why.append(
            f"reads of {fx.disk.device} reached the trainer's cgroup read limit "
            f"({units.rate(units.kib(fx.disk.read_limit_kb_s or 0))}; p95 "
            f"{units.rate(units.kib(fx.disk.disk_rkb_s_p95 or 0))})"
        )
    elif util is not None:
        if util >= SCORES.device_busy_pct:
            fetch_pts += 1
            fetch_why.append(f"{fx.disk.device} busy {util:.0f}% of the time (iostat %util)")
        elif (
            util < SCORES.device_idle_pct
            and (fx.disk.disk_rkb_s_median or 0) < SCORES.flat_min_kb_s
        ):
            prep_pts += 1
            prep_why.append(f"{fx.disk.device} mostly idle ({util:.0f}% util)")
    return fetch_pts, prep_pts
