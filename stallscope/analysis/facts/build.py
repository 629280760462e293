"""How the facts of a run are computed (:func:`build`), once, from what it recorded.

Pure functions over :class:`~stallscope.analysis.rundata.RunData`. The figures are gathered in
a private draft, one flat name each, then frozen into :class:`~stallscope.analysis.facts.Facts`
by domain. Every value here can appear in a finding's evidence, so names carry units.
"""

from __future__ import annotations

import operator
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stallscope import stats
from stallscope.analysis.facts import Facts
from stallscope.analysis.stacks import ProcPhases, trainer_phases
from stallscope.analysis.throughput import throughput
from stallscope.analysis.window import (
    TrainingWindow,
    clip,
    exit_stacks,
    gpu_warmup_end,
    trainer_gpus,
)
from stallscope.loadermodel import BUSY_SPARE, OTHERS_BUSY_CORES
from stallscope.store import Series, StepRow

if TYPE_CHECKING:
    from stallscope.analysis.rundata import RunData

__all__ = ["BUSY_SPARE", "COMM_GAP", "COMM_GAP_STARVED", "COMM_HEAVY", "LIMIT_REACHED",
           "NO_TRAINING_SAMPLES", "OTHERS_BUSY_CORES", "RUNQ_BUSY_PCT", "build", "exit_status",
           "limited", "mean", "median", "p95", "run_duration", "spare_cores", "starved"]

#: a rank whose peers spend ≥ this share of their step more in collectives than it does is the
#: one they wait for (docs/diagnosis.md "Communication wait")
COMM_GAP = 0.15
#: every rank in collectives ≥ this share of its step, none waiting for another: the network
#: or the topology is the limit
COMM_HEAVY = 0.30
#: a rank's process waiting for a CPU this share of the time, and this many points more than
#: the others', is short of CPU (a busy host or a CPU quota), not slow by its own work
RUNQ_BUSY_PCT = 20.0
#: ... and such a rank is the one its peers wait for from this gap on: time it spends frozen
#: (throttled, or runnable with no core) inside a collective counts as its own collective wait,
#: so the gap shrinks (measured: 0.11 on a 0.3-core quota with a CPU hog on the host)
COMM_GAP_STARVED = 0.05


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def median(xs: Sequence[float]) -> float | None:
    return stats.median(xs) if xs else None


#: a step row's data wait, and its wall time (data wait plus host time)
_WAIT = operator.attrgetter("wait_s")


def _step_wall(s: StepRow) -> float:
    return s.wait_s + s.host_s


def step_median(rows: Sequence[StepRow], value: Any) -> float | None:
    """The median step's ``value(row)`` in ms, a row of ``n`` steps counting ``n`` times with
    its mean step (``value`` of the row over ``n``); None without rows."""
    if not rows:
        return None
    return stats.weighted_median((value(s) * 1000 / s.n, s.n) for s in rows)


def p95(xs: Sequence[float]) -> float | None:
    return stats.percentile(xs, 95) if xs else None


def _cores(v: Any) -> int | None:
    """A core count from a file (meta.json, the probe's config): a positive integer, or None
    for anything else (text, a list, a bool, a negative number)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 20:
        return v
    return None


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


@dataclass
class _Draft:
    """The facts while they are computed: flat, mutable, private (frozen by :func:`build`)."""

    duration_s: float = 0.0
    samples: int = 0
    # --- probe ---
    steps: int = 0
    ranks: int = 0
    #: the training window (analysis/window.py): where it came from, its length, and the
    #: process's start-up before it and exit after it (seconds; None when unknown)
    window_source: str | None = None
    window_s: float | None = None
    startup_s: float | None = None
    exit_s: float | None = None
    #: what the exit was spent on: the heaviest folded stacks after the window, with seconds
    exit_stacks: list[tuple[str, float]] = field(default_factory=list)
    #: data wait / step wall time over every step of the window, as the trainer's own timer
    #: sees it (probe); or the sampled or estimated share (``stall_source``)
    stall_fraction: float | None = None
    #: the probe's share with each rank's first step left out (warm-up: worker start,
    #: cuDNN autotuning): the steady state, labelled as such wherever it is shown
    steady_stall_fraction: float | None = None
    #: "probe", "stacks" (sampled stacks), "gpu_idle", "main_thread" or None
    stall_source: str | None = None
    #: the training thread's share of time per phase, from its sampled stacks (the focus rank's)
    phase_shares: dict[str, float] = field(default_factory=dict)
    stack_sampler: str | None = None  #: "inproc" (injected by `run`) or "py-spy" (attached)
    stack_samples: int = 0
    wait_ms_median: float | None = None
    step_ms_median: float | None = None
    h2d_share: float | None = None
    epochs: int = 0
    epoch_start_wait_s: float | None = None  #: median wait of the first step of epochs >= 1
    #: what each epoch start cost beyond an ordinary step's wait (s), and all of them together
    epoch_start_cost_s: float | None = None
    epoch_start_total_s: float | None = None
    samples_per_s: float | None = None
    throughput_source: str | None = None
    # --- exit ---
    exit_code: int | None = None
    exit_signal: str | None = None
    interrupted: bool = False
    error: str | None = None
    error_at_s: float | None = None
    trained: bool | None = None
    main_python: bool | None = None
    processes: list[dict[str, Any]] = field(default_factory=list)
    # --- gpu ---
    gpus: int = 0
    #: NVML utilization over the window's steady state (after the GPU's warm-up)
    gpu_util_median_pct: float | None = None
    gpu_idle_share: float | None = None
    #: seconds at the window's start before the GPU reached its working level (cuDNN
    #: autotuning, kernel compilation, lazy loading); left out of the two figures above
    gpu_warmup_s: float | None = None
    #: the GPU's busy share between the steps' CUDA events (probe): 1 less the gaps between
    #: steps on the GPU's timeline. A step's own span counts as busy, so this tells a GPU
    #: waiting between steps (for data) from one that is not; NVML's utilization tells busy
    #: from merely fed (host-bound) inside the steps
    gpu_busy_share: float | None = None
    # --- the trainer's processes ---
    workers: int = 0  #: DataLoader workers alive at one time (LoaderFacts)
    workers_source: str | None = None
    worker_cpu_pct: float | None = None  #: mean CPU of one worker (100 = one core)
    worker_d_share: float | None = None  #: share of worker samples in state D
    worker_blkio_pct: float | None = None
    worker_runq_pct: float | None = None
    worker_read_kb_s: float | None = None  #: all workers together, from storage
    worker_rchar_kb_s: float | None = None  #: all workers together, incl. page cache
    main_cpu_pct: float | None = None  #: mean CPU of the trainer's main process(es)
    main_runq_pct: float | None = None  #: the trainer's main process(es): run-queue wait
    #: share of the training time the trainer's main thread ran (no probe: the consumer's busy
    #: share; the rest it waited, for data above all)
    main_thread_busy_share: float | None = None
    main_d_share: float | None = None
    #: the trainer runs TensorFlow (threads named tf_*): tf.data works on its threads
    tf_trainer: bool = False
    main_read_kb_s: float | None = None
    # --- dataset device ---
    device: str | None = None
    device_named: bool = False  #: from --data (True) or the busiest device (False)
    disk_util_median_pct: float | None = None
    disk_util_p95_pct: float | None = None
    disk_r_await_median_ms: float | None = None
    disk_r_await_p95_ms: float | None = None
    disk_rkb_s_median: float | None = None
    disk_rkb_s_p95: float | None = None
    disk_r_s_median: float | None = None
    disk_rareq_kb_median: float | None = None
    disk_rkb_s_cv: float | None = None  #: variation of read throughput while reading
    disk_aqu_sz_median: float | None = None
    #: the read limit of the trainer's cgroup on that device, kB/s (meta ``read_limits``)
    read_limit_kb_s: float | None = None
    # --- host ---
    host_cpu_median_pct: float | None = None
    host_max_core_median_pct: float | None = None
    #: cores the host's other processes kept busy (median over samples: the host's busy cores
    #: less the training's own processes' CPU)
    others_cpu_cores: float | None = None
    iowait_median_pct: float | None = None
    psi_io_median_pct: float | None = None
    mem_available_min_mib: float | None = None
    # --- ranks (DDP): each rank's own picture; the job goes at the pace of the worst ---
    ranks_detail: list[dict[str, Any]] = field(default_factory=list)
    focus_rank: int | None = None  #: the rank whose input holds the job back (its evidence)
    #: the rank its peers wait for in collectives (the probe's communication time: the rank
    #: with the least, ≥ 15 points below the most), whatever its cause
    comm_straggler: int | None = None
    #: the collective's own cost as a share of the step: per step, the least wait of any rank
    #: in it (the slowest rank of that step waits only for the transfer), over the steps every
    #: rank recorded; the rest of the ranks' wait is for each step's slowest rank. None when
    #: the steps are not per-step records (rebuilt from Prometheus' totals) or not timed
    comm_transfer_share: float | None = None
    # --- loader configuration (probe) ---
    config: dict[str, Any] = field(default_factory=dict)
    physical_cores: int | None = None
    logical_cores: int | None = None


def _by_ts_sum(series: list[Series]) -> dict[float, float]:
    out: dict[float, float] = defaultdict(float)
    for s in series:
        for t, v in zip(s.ts, s.v):
            out[t] += v
    return out


def _procs(data: RunData, metric: str, role: str, only: set[str] | None = None) -> list[Series]:
    roles = data.roles()
    return [s for (n, e), s in data.series.items() if n == metric and roles.get(e) == role
            and (only is None or e in only)]


def rank_pids(data: RunData) -> dict[int, str]:
    """rank -> the pid of its training process (the probe says which)."""
    return {int(p["rank"]): str(p["pid"]) for p in data.probes
            if p.get("pid") is not None and p.get("rank") is not None}


def tree_of(data: RunData, root: str) -> set[str]:
    """``root`` and every recorded process below it (a rank and its DataLoader workers)."""
    parent = {str(e["entity"]): str((e.get("attrs") or {}).get("ppid"))
              for e in data.entities if e["source"] == "procs"}
    out, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in out and p not in out}
        out |= new
        grew = bool(new)
    return out


def build(data: RunData) -> Facts:
    """The facts of ``data`` (:func:`stallscope.analysis.facts.compute_facts`)."""
    return Facts.of(vars(_draft(data)))


def _draft(data: RunData) -> _Draft:
    sig = _Draft()
    meta = data.meta
    cost = data.get("collector.cpu_s")
    sig.samples = len(cost.v) if cost else 0
    dur = run_duration(meta, data.span[1] if data.span else None)
    if dur is not None:
        sig.duration_s = dur
    elif cost and cost.ts:
        sig.duration_s = round(cost.ts[-1] - cost.ts[0], 1)
    _exit_facts(sig, meta)
    sig.physical_cores = _cores(meta.get("physical_cores"))
    sig.logical_cores = _cores(meta.get("logical_cores"))

    _probe_signals(sig, data)
    # one definition of the throughput for every surface (analysis/throughput.py)
    sig.samples_per_s, sig.throughput_source = throughput(data)
    procs = trainer_phases(data.stacks, data.roles())
    win = data.window()
    _window_signals(sig, data, win, procs)
    full, data = data, clip(data, win)  # every figure below is the training's, not the process's
    # probe > sampled stacks > system metrics for the stall; the stacks' phases are evidence
    # either way (where the training thread was: host-bound or GPU-bound)
    _stack_signals(sig, data, procs, stall=sig.stall_source is None)
    _gpu_signals(sig, data, full)
    _proc_signals(sig, data)
    sig.processes = _process_rows(data, full)
    _disk_signals(sig, data)

    host = {k: data.get(f"host.{k}") for k in ("cpu_pct", "cpu_max_core_pct", "iowait_pct",
                                                 "psi_io_some_pct", "mem_available_mib")}
    sig.host_cpu_median_pct = _r(median(host["cpu_pct"].v)) if host["cpu_pct"] else None
    sig.host_max_core_median_pct = (_r(median(host["cpu_max_core_pct"].v))
                                    if host["cpu_max_core_pct"] else None)
    sig.others_cpu_cores = _others_cpu(data, host["cpu_pct"], sig.logical_cores)
    sig.iowait_median_pct = _r(median(host["iowait_pct"].v)) if host["iowait_pct"] else None
    sig.psi_io_median_pct = (_r(median(host["psi_io_some_pct"].v))
                             if host["psi_io_some_pct"] else None)
    sig.mem_available_min_mib = (_r(min(host["mem_available_mib"].v))
                                 if host["mem_available_mib"] and host["mem_available_mib"].v
                                 else None)
    _trained_facts(sig, data, full)
    if sig.stall_fraction is None and sig.gpu_idle_share is not None:
        sig.stall_fraction = sig.gpu_idle_share
        sig.stall_source = "gpu_idle"
    if sig.stall_fraction is None and sig.main_thread_busy_share is not None and sig.workers:
        # no probe, no GPU: the trainer's main thread is the consumer; while it does not run it
        # waits (for the next batch, above all). With num_workers=0 it loads the data itself,
        # so its busy share says nothing about waiting: no estimate then.
        sig.stall_fraction = round(max(0.0, 1.0 - sig.main_thread_busy_share), 3)
        sig.stall_source = "main_thread"
    return sig


#: signals a user sends to stop a training (Ctrl-C, `kill`, a scheduler's cancel)
_STOPS = frozenset({"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"})


def run_duration(meta: dict[str, Any], last_sample: float | None) -> float | None:
    """Seconds the run lasted (one decimal): start to end once finished, start to now while it
    runs, start to its last sample once interrupted (a killed monitor never wrote an end).
    ``show``, ``runs``, the report and the facts all read it here."""
    import time

    from stallscope.store.rundir import run_state

    start = meta.get("start")
    if not isinstance(start, (int, float)) or isinstance(start, bool):
        return None
    state = run_state(meta)
    end = (meta.get("end") if state == "finished" else time.time() if state == "running"
           else last_sample)
    if not isinstance(end, (int, float)) or isinstance(end, bool):
        return None
    return round(max(0.0, float(end) - float(start)), 1)


def exit_status(meta: dict[str, Any]) -> tuple[int | None, str | None, bool]:
    """(exit code, the signal that ended or stopped it, interrupted) from meta.json: the exit as
    a shell reports it (a child killed by signal N is 128 + N: ``run`` returns that, meta.json
    keeps what ``wait`` said, -N). A run stopped by the user (a stop signal it died of, or one
    ``run`` forwarded to it) is interrupted: its exit is not a finding. ``runs`` and the facts
    both read it here."""
    import signal as _signal

    code = meta.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool):
        return None, None, False
    name = None
    if code < 0 or code > 128:
        n = -code if code < 0 else code - 128
        try:
            name = _signal.Signals(n).name
        except ValueError:
            name = f"signal {n}" if code < 0 else None
        code = 128 + n
    forwarded = [s for s in meta.get("signals_forwarded") or [] if isinstance(s, str)]
    name = name or (forwarded[0] if forwarded else None)
    return code, name, bool(name in _STOPS or any(f in _STOPS for f in forwarded))


def _exit_facts(sig: _Draft, meta: dict[str, Any]) -> None:
    sig.exit_code, sig.exit_signal, sig.interrupted = exit_status(meta)


#: stack samples that, holding no training frame, show a process that did not train
NO_TRAINING_SAMPLES = 20


def _trained_facts(sig: _Draft, data: RunData, full: RunData) -> None:
    """Whether the run trained, the trainer's last uncaught exception, and whether its main
    process is Python (see :class:`~stallscope.analysis.facts.RunFacts`)."""
    from stallscope.sources.stacks.phases import TRAINING

    if full.errors:
        last = full.errors[-1]
        sig.error = last["error"]
        start = full.meta.get("start")
        if isinstance(start, (int, float)):
            sig.error_at_s = round(max(0.0, last["ts"] - start), 1)
    frames = sum(v for k, v in sig.phase_shares.items() if k in TRAINING)
    if sig.steps or frames >= 0.05 or sig.window_source in ("probe", "stacks", "workers", "gpu"):
        sig.trained = True
    elif sig.stack_samples >= NO_TRAINING_SAMPLES or not full.series:
        sig.trained = False
    mains = [e for e in full.entities if e.get("source") == "procs"
             and full.roles().get(str(e.get("entity"))) == "main"]
    if mains:
        sig.main_python = any("python" in str((e.get("attrs") or {}).get(k, "")).lower()
                              for e in mains for k in ("name", "cmdline"))


def _window_signals(sig: _Draft, data: RunData, win: TrainingWindow,
                    procs: list[ProcPhases]) -> None:
    sig.window_source = win.source
    if win.source == "run":
        return
    sig.window_s = round(win.seconds, 1)
    sig.startup_s = win.startup_s
    sig.exit_s = win.exit_s
    if sig.exit_s:
        sig.exit_stacks = exit_stacks(data.stacks, {p.pid for p in procs}, win.end)


def _probe_signals(sig: _Draft, data: RunData) -> None:
    if data.probes:
        # the probe keeps the DataLoader's knobs under "loader", the machine's beside them
        raw = data.probes[0]["config"]
        loader = raw.get("loader")
        cfg = {k: v for k, v in raw.items() if k != "loader"}
        if isinstance(loader, dict):
            cfg.update(loader)  # one flat table: each field once
        sig.config = cfg
        if _cores(cfg.get("physical_cores")):  # the probe's config is a file too: checked
            sig.physical_cores = _cores(cfg.get("physical_cores"))
    steps = data.steps
    if not steps:
        return
    sig.steps = sum(s.n for s in steps)
    sig.ranks = len({s.rank for s in steps})
    # the first step of the run includes worker start-up and is reported apart (epoch gaps)
    first: dict[int, int] = {}
    for s in steps:
        first[s.rank] = min(first.get(s.rank, s.step), s.step)
    body = [s for s in steps if s.step != first[s.rank]] or steps
    _rank_signals(sig, data, body)
    wait = sum(s.wait_s for s in body)
    wall = sum(s.wait_s + s.host_s for s in body)
    if sig.focus_rank is not None:  # the rank that holds the job back speaks for it
        body = [s for s in body if s.rank == sig.focus_rank]
        wait = sum(s.wait_s for s in body)
        wall = sum(s.wait_s + s.host_s for s in body)
    # the headline share counts every step, as the trainer's own timer does (the first step
    # holds the workers' start and the GPU's warm-up: a real part of the wait)
    every = [s for s in steps if sig.focus_rank is None or s.rank == sig.focus_rank]
    all_wall = sum(s.wait_s + s.host_s for s in every)
    if wall > 0 and all_wall > 0:
        sig.stall_fraction = round(sum(s.wait_s for s in every) / all_wall, 3)
        sig.steady_stall_fraction = round(wait / wall, 3)
        sig.stall_source = "probe"
    if sig.focus_rank is not None:
        cfgs = [p["config"] for p in data.probes if p.get("rank") == sig.focus_rank]
        focus_cfg: Any = cfgs[0] if cfgs else None
        if isinstance(focus_cfg, dict):
            loader = focus_cfg.get("loader")
            sig.config = {k: v for k, v in focus_cfg.items() if k != "loader"}
            if isinstance(loader, dict):
                sig.config.update(loader)
    sig.wait_ms_median = _r(step_median(body, _WAIT))
    sig.step_ms_median = _r(step_median(body, _step_wall))
    # over the steps whose copies were timed (the probe times short steps' device in pairs,
    # one in so many: probe/device.py)
    copied = [s for s in body if s.h2d_s is not None]
    copy_wall = sum(s.wait_s + s.host_s for s in copied)
    if copied and copy_wall > 0:
        sig.h2d_share = round(sum(s.h2d_s or 0.0 for s in copied) / copy_wall, 3)
    epochs: dict[int, list[StepRow]] = defaultdict(list)
    for s in steps:
        if s.epoch is not None:
            epochs[s.epoch].append(s)
    sig.epochs = len(epochs)
    # an epoch's first step is a row of its own (probe/watch.py)
    firsts = [w[0].wait_s for e, w in sorted(epochs.items()) if e >= 1 and w]
    if firsts:
        sig.epoch_start_wait_s = _r(median(firsts), 3)
        usual = (step_median([s for ws in epochs.values() for s in ws[1:]], _WAIT)
                 or 0.0) / 1000
        extra = [max(0.0, f - usual) for f in firsts]
        sig.epoch_start_cost_s = _r(median(extra), 3)
        sig.epoch_start_total_s = _r(sum(extra), 2)


def _stack_signals(sig: _Draft, data: RunData, procs: list[ProcPhases], stall: bool) -> None:
    """The stall from the sampled stacks of the training thread: its data share (waiting for
    the next batch, or loading it itself). With several ranks each gets its own picture, and
    the rank that waits most, by ≥ 15 points, speaks for the job (as with the probe).
    ``stall`` False (the probe measured it): only where the thread was, as evidence."""
    if not procs:
        return
    if not stall:
        focus_p = next((p for p in procs if p.rank == sig.focus_rank), procs[0])
        sig.phase_shares = focus_p.shares()
        sig.stack_sampler = focus_p.sampler or None
        sig.stack_samples = sum(p.samples for p in procs)
        return
    roles = data.roles()
    detail = []
    for p in procs:
        d: dict[str, Any] = {"rank": p.rank if p.rank is not None else 0, "pid": p.pid,
                             "stall_fraction": round(p.share("data"), 3),
                             "comm_share": round(p.share("comm"), 3),
                             "compute_share": round(p.share("compute"), 3),
                             "sampled_s": round(p.total_s, 1), "source": "stacks"}
        workers = {q for q in tree_of(data, str(p.pid)) if roles.get(q) == "worker"}
        d["workers"] = alive_together(_procs(data, "procs.cpu_pct", "worker", workers)) \
            or len(workers)
        w = [v for s in _procs(data, "procs.cpu_pct", "worker", workers) for v in s.v]
        if w:
            d["worker_cpu_pct"] = _r(mean(w))
        runq_s = data.series.get(("procs.runq_wait_pct", str(p.pid)))
        if runq_s is not None and runq_s.v:
            d["runq_wait_pct"] = _r(mean(runq_s.v))
        detail.append(d)
    focus = procs[0]
    if max(p.share("graph") for p in procs) >= 0.5:
        # most of the time inside a compiled TensorFlow function, where the input pipeline
        # runs too: the stacks cannot split it (docs/diagnosis.md); system metrics decide
        sig.phase_shares = focus.shares()
        return
    if len(detail) >= 2:
        sig.ranks_detail = detail
        worst = max(detail, key=lambda d: d["stall_fraction"])
        best = min(detail, key=lambda d: d["stall_fraction"])
        if worst["stall_fraction"] >= 0.15 and \
                worst["stall_fraction"] - best["stall_fraction"] >= 0.15:
            sig.focus_rank = worst["rank"]
            focus = next(p for p in procs if p.pid == worst["pid"])
        if any(p.seconds.get("comm") for p in procs):  # DDP's wait timed (sources/comm.py)
            _comm_focus(sig, detail)
        sig.ranks = len(detail)
    sig.stall_fraction = round(focus.share("data"), 3)
    sig.stall_source = "stacks"
    sig.phase_shares = focus.shares()
    sig.stack_sampler = focus.sampler or None
    sig.stack_samples = sum(p.samples for p in procs)
    if focus.seconds.get("h2d"):
        sig.h2d_share = round(focus.share("h2d"), 3)


def _rank_signals(sig: _Draft, data: RunData, body: list[StepRow]) -> None:
    """Per rank, where its steps go. Under DDP the all-reduce makes every rank's step as long as
    the slowest rank's, so step times look alike; the data-wait share tells which rank's input
    holds the job back. That rank becomes the focus: its figures are the run's (a job whose
    rank 1 waits 92% and rank 0 3% waits for data, not "47%")."""
    by_rank: dict[int, list[StepRow]] = defaultdict(list)
    for s in body:
        by_rank[s.rank].append(s)
    if len(by_rank) < 2:
        return
    pids = rank_pids(data)
    roles = data.roles()
    detail = []
    for rank, rows in sorted(by_rank.items()):
        wall = sum(s.wait_s + s.host_s for s in rows)
        d: dict[str, Any] = {
            "rank": rank, "steps": sum(s.n for s in rows),
            "stall_fraction": round(sum(s.wait_s for s in rows) / wall, 3) if wall else None,
            "wait_ms_median": _r(step_median(rows, _WAIT)),
            "step_ms_median": _r(step_median(rows, _step_wall))}
        comm = [s.comm_s for s in rows if s.comm_s is not None]
        if comm and wall:
            d["comm_share"] = round(sum(comm) / wall, 3)
            d["compute_ms_median"] = _r(step_median(
                rows, lambda s: s.host_s - (s.comm_s or 0.0)))
        pid = pids.get(rank)
        if pid is not None:
            d["pid"] = int(pid)
            runq_s = data.series.get(("procs.runq_wait_pct", pid))
            runq = runq_s.v if runq_s is not None else []
            if runq:
                d["runq_wait_pct"] = _r(mean(runq))
            workers = {p for p in tree_of(data, pid) if roles.get(p) == "worker"}
            d["workers"] = alive_together(_procs(data, "procs.cpu_pct", "worker", workers)) \
                or len(workers)
            w = [v for s in _procs(data, "procs.cpu_pct", "worker", workers) for v in s.v]
            if w:
                d["worker_cpu_pct"] = _r(mean(w))
        detail.append(d)
    sig.ranks_detail = detail
    if "prometheus" not in data.meta:  # per-step records, not totals spread over steps
        sig.comm_transfer_share = _transfer_share(by_rank)
    shares = [d for d in detail if d["stall_fraction"] is not None]
    if not shares:
        return
    worst = max(shares, key=lambda d: d["stall_fraction"])
    best = min(shares, key=lambda d: d["stall_fraction"])
    if worst["stall_fraction"] >= 0.15 and worst["stall_fraction"] - best["stall_fraction"] >= 0.15:
        sig.focus_rank = worst["rank"]
    _comm_focus(sig, detail)


def _transfer_share(by_rank: dict[int, list[StepRow]]) -> float | None:
    """Per step that every rank recorded with its communication time: the least of those
    times (the transfer: the step's slowest rank waits for nothing else), summed over the
    steps' wall time (the longest rank's). None under 10 such steps. Rows of several short
    steps are left out: ranks sum different steps together."""
    steps: dict[int, list[StepRow]] = defaultdict(list)
    for rows in by_rank.values():
        for s in rows:
            if s.comm_s is not None and s.n == 1:
                steps[s.step].append(s)
    full = [rows for rows in steps.values() if len(rows) == len(by_rank)]
    wall = sum(max(s.wait_s + s.host_s for s in rows) for rows in full)
    if len(full) < 10 or wall <= 0:
        return None
    return round(sum(min(s.comm_s or 0.0 for s in rows) for rows in full) / wall, 3)


def starved(rank: Mapping[str, Any], peers: Sequence[Mapping[str, Any]]) -> bool:
    """``rank``'s process waited for a CPU ≥ RUNQ_BUSY_PCT of the time and ≥ that many points
    more than its peers' median (a CPU quota on it, or a host busy around it)."""
    runq = rank.get("runq_wait_pct")
    theirs = median([d["runq_wait_pct"] for d in peers
                     if d.get("runq_wait_pct") is not None]) or 0.0
    return runq is not None and runq >= RUNQ_BUSY_PCT and runq - theirs >= RUNQ_BUSY_PCT


def _comm_focus(sig: _Draft, detail: list[dict[str, Any]]) -> None:
    """The rank the others wait for in collectives: the least communication share, ≥ COMM_GAP
    below the most (every rank's share known); ≥ COMM_GAP_STARVED below when that rank is short
    of CPU (its frozen time inside collectives counts as its own wait there)."""
    timed = [d for d in detail if d.get("comm_share") is not None]
    if len(timed) < 2 or len(timed) != len(detail):
        return
    least = min(timed, key=lambda d: d["comm_share"])
    most = max(timed, key=lambda d: d["comm_share"])
    gap = most["comm_share"] - least["comm_share"]
    if gap >= COMM_GAP or (gap >= COMM_GAP_STARVED
                           and starved(least, [d for d in timed if d is not least])):
        sig.comm_straggler = least["rank"]


def _gpu_signals(sig: _Draft, data: RunData, full: RunData) -> None:
    """The GPU's side, inside the window: NVML's utilization over the steady state (the GPU's
    warm-up left out: :func:`~stallscope.analysis.window.gpu_warmup_end`), and the probe's
    CUDA-event busy share."""
    mine = trainer_gpus(full)
    utils = [s for s in data.all("gpu.util_pct") if s.entity in mine]
    sig.gpus = len(utils)
    per_ts: dict[float, list[float]] = defaultdict(list)
    for s in utils:
        for t, v in zip(s.ts, s.v):
            per_ts[t].append(v)
    ts = sorted(per_ts)
    mean_util = [sum(per_ts[t]) / len(per_ts[t]) for t in ts]
    warm = gpu_warmup_end(ts, mean_util)
    if warm is not None:
        sig.gpu_warmup_s = round(warm - ts[0], 1)
    vals = [v for s in utils for t, v in zip(s.ts, s.v) if warm is None or t >= warm]
    if vals:
        sig.gpu_util_median_pct = _r(median(vals))
        sig.gpu_idle_share = round(sum(100 - v for v in vals) / len(vals) / 100, 3)
    timed = [s for s in data.steps if s.gpu_busy_s is not None
             and (sig.focus_rank is None or s.rank == sig.focus_rank)]
    busy = sum(s.gpu_busy_s or 0.0 for s in timed)
    idle = sum(s.gpu_idle_s or 0.0 for s in timed)
    if len(timed) >= 10 and busy + idle > 0:
        sig.gpu_busy_share = round(busy / (busy + idle), 3)


def _share(series: list[Series]) -> float | None:
    vals = [v for s in series for v in s.v]
    return round(sum(vals) / len(vals), 3) if vals else None


def alive_together(series: Sequence[Series]) -> int:
    """How many of these processes were alive at one time: the most common count of them in
    one sample (ties: the larger). A DataLoader without persistent workers starts new workers
    each epoch, so the distinct pids over a run are a multiple of its num_workers."""
    per_ts: dict[float, int] = defaultdict(int)
    for s in series:
        for t in set(s.ts):
            per_ts[t] += 1
    if not per_ts:
        return 0
    counts: dict[int, int] = defaultdict(int)
    for n in per_ts.values():
        counts[n] += 1
    return max(counts, key=lambda n: (counts[n], n))


def _worker_count(config: dict[str, Any], cpu: list[Series], distinct: int
                  ) -> tuple[int, str | None]:
    """(DataLoader workers, where that came from): the loader's own num_workers where the probe
    read it ("config"), else the workers alive together in the samples ("processes")."""
    nw = config.get("num_workers")
    if isinstance(nw, int) and not isinstance(nw, bool) and 0 <= nw < 1 << 16:
        return nw, "config"
    together = alive_together(cpu)
    if together:
        return together, "processes"
    return (distinct, "processes") if distinct else (0, None)


def _proc_signals(sig: _Draft, data: RunData) -> None:
    roles = data.roles()
    only: set[str] | None = None
    if sig.focus_rank is not None and sig.focus_rank in rank_pids(data):
        only = tree_of(data, rank_pids(data)[sig.focus_rank])  # that rank's own workers
    wcpu = _procs(data, "procs.cpu_pct", "worker", only)
    sig.workers, sig.workers_source = _worker_count(
        sig.config, wcpu, sum(1 for p, r in roles.items()
                              if r == "worker" and (only is None or p in only)))
    if wcpu:
        # mean over samples of the mean worker: busy workers at 100% read as 100
        per_ts: dict[float, list[float]] = defaultdict(list)
        for s in wcpu:
            for t, v in zip(s.ts, s.v):
                per_ts[t].append(v)
        sig.worker_cpu_pct = _r(mean([sum(v) / len(v) for v in per_ts.values()]))
    sig.worker_d_share = _share(_procs(data, "procs.d_state", "worker", only))
    blk = [v for s in _procs(data, "procs.blkio_wait_pct", "worker", only) for v in s.v]
    sig.worker_blkio_pct = _r(mean(blk))
    rq = [v for s in _procs(data, "procs.runq_wait_pct", "worker", only) for v in s.v]
    sig.worker_runq_pct = _r(mean(rq))
    rd = _by_ts_sum(_procs(data, "procs.read_kb_s", "worker", only))
    sig.worker_read_kb_s = _r(mean(list(rd.values())), 1)
    rc = _by_ts_sum(_procs(data, "procs.rchar_kb_s", "worker", only))
    sig.worker_rchar_kb_s = _r(mean(list(rc.values())), 1)
    mcpu = [v for s in _procs(data, "procs.cpu_pct", "main") for v in s.v]
    sig.main_cpu_pct = _r(mean(mcpu))
    mrq = [v for s in _procs(data, "procs.runq_wait_pct", "main") for v in s.v]
    sig.main_runq_pct = _r(mean(mrq))
    sig.main_thread_busy_share = _main_thread_busy(data, wcpu)
    sig.main_d_share = _share(_procs(data, "procs.d_state", "main"))
    # any thread of the trainer in D (tf.data and threaded decoders read on their own threads)
    dt = [min(1.0, v) for s in _procs(data, "procs.d_threads", "main") for v in s.v]
    if dt:
        sig.main_d_share = max(sig.main_d_share or 0.0, round(sum(dt) / len(dt), 3))
    sig.tf_trainer = any(v > 0 for s in _procs(data, "procs.tf_threads", "main") for v in s.v)
    mr = _by_ts_sum(_procs(data, "procs.read_kb_s", "main"))
    sig.main_read_kb_s = _r(mean(list(mr.values())), 1)


def _others_cpu(data: RunData, host: Series | None, cores: int | None) -> float | None:
    """Median over the samples of the host's busy cores less the training's own processes'
    (the procs source samples only the trainer's tree, in the same tick as the host)."""
    if host is None or not host.v or not cores:
        return None
    own = _by_ts_sum([s for (n, _e), s in data.series.items() if n == "procs.cpu_pct"])
    if not own:
        return None
    rest = [v * cores / 100 - own[t] / 100 for t, v in zip(host.ts, host.v) if t in own]
    m = median(rest)
    return None if m is None else _r(max(0.0, m))


def _process_rows(data: RunData, full: RunData) -> list[dict[str, Any]]:
    """The training's processes, main first then by CPU: each one's mean CPU over the training
    window (``data``, clipped), its peak memory over the run (``full``)."""
    roles = full.roles()
    out: list[dict[str, Any]] = []
    for e in full.entities:
        if e.get("source") != "procs":
            continue
        pid = str(e["entity"])
        raw = e.get("attrs")
        a: dict[str, Any] = raw if isinstance(raw, dict) else {}
        cpu = data.get("procs.cpu_pct", pid)
        rss = full.get("procs.rss_mib", pid)
        out.append({"pid": pid, "role": roles.get(pid, ""), "name": str(a.get("name", "")),
                    "cmdline": str(a.get("cmdline", ""))[:400],
                    "cpu_mean_pct": _r(mean(cpu.v)) if cpu is not None and cpu.v else None,
                    "rss_max_mib": _r(max(rss.v), 1) if rss is not None and rss.v else None,
                    "first_ts": e.get("first_ts"), "last_ts": e.get("last_ts")})
    out.sort(key=lambda r: (r["role"] != "main", -float(r["cpu_mean_pct"] or 0.0)))
    return out


def _main_thread_busy(data: RunData, workers: list[Series]) -> float | None:
    """Mean share of time the trainer's main thread ran or was ready to run, over the training:
    from the first sample at which a DataLoader worker exists (before it, the script sets up:
    builds its dataset, imports, starts workers), per main process, then averaged over them.

    Run-queue time counts as working: a trainer slowed by other processes on its cores is not
    waiting for data (``procs.main_thread_active_pct``; the process's CPU use for runs recorded
    before that metric existed)."""
    started = min((s.ts[0] for s in workers if s.ts), default=None)
    if started is None:
        return None
    roles = data.roles()
    shares = []
    for pid, role in roles.items():
        if role != "main":
            continue
        s = data.get("procs.main_thread_active_pct", pid)
        if s is None or not s.v:
            s = data.get("procs.cpu_pct", pid)
        vals = [min(v, 100.0) for t, v in zip(s.ts, s.v) if t >= started] if s else []
        if vals:
            shares.append(sum(vals) / len(vals) / 100.0)
    return round(sum(shares) / len(shares), 3) if shares else None


def _disk_signals(sig: _Draft, data: RunData) -> None:
    named = [d for d in (data.meta.get("data_devices") or [])
             if data.get("disk.util_pct", d) is not None]
    if named:
        dev = named[0]
        sig.device_named = True
    else:
        reads = {s.entity: sum(s.v) for s in data.all("disk.rkb_s")}
        if not reads or max(reads.values()) <= 0:
            return
        dev = max(reads, key=lambda d: reads[d])
    sig.device = dev
    limits = data.meta.get("read_limits")
    limit = limits.get(dev) if isinstance(limits, dict) else None
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > 0:
        sig.read_limit_kb_s = float(limit) / 1024.0

    def vals(key: str) -> list[float]:
        s = data.get(f"disk.{key}", dev)
        return s.v if s else []

    util = vals("util_pct")
    sig.disk_util_median_pct = _r(median(util))
    sig.disk_util_p95_pct = _r(p95(util))
    rkb = vals("rkb_s")
    sig.disk_rkb_s_median = _r(median(rkb), 1)
    sig.disk_rkb_s_p95 = _r(p95(rkb), 1)
    sig.disk_r_s_median = _r(median(vals("r_s")), 1)
    aw = [a for a, r in zip(vals("r_await_ms"), vals("r_s")) if r > 0]
    sig.disk_r_await_median_ms = _r(median(aw))
    sig.disk_r_await_p95_ms = _r(p95(aw))
    rq = [a for a, r in zip(vals("rareq_kb"), vals("r_s")) if r > 0]
    sig.disk_rareq_kb_median = _r(median(rq))
    sig.disk_aqu_sz_median = _r(median(vals("aqu_sz")))
    busy = [v for v in rkb if v > 100]
    if len(busy) >= 3:
        m = sum(busy) / len(busy)
        sig.disk_rkb_s_cv = _r(statistics.pstdev(busy) / m if m else None, 3)


#: share of the cgroup's read limit the device's p95 read rate must reach for the reads to
#: count as held at that limit
LIMIT_REACHED = 0.8


def limited(fx: Facts) -> bool:
    """The trainer's cgroup limits reads of the dataset's device and the reads reached that
    limit (p95 of the device's read rate at least :data:`LIMIT_REACHED` of it)."""
    d = fx.disk
    return (d.read_limit_kb_s is not None and d.disk_rkb_s_p95 is not None
            and d.disk_rkb_s_p95 >= LIMIT_REACHED * d.read_limit_kb_s)




def spare_cores(fx: Facts) -> float | None:
    """CPUs left idle over the run (median host CPU), in cores; None when unknown."""
    h = fx.host
    cpus = h.logical_cores or h.physical_cores
    if cpus is None or h.host_cpu_median_pct is None:
        return None
    return max(0.0, (100.0 - h.host_cpu_median_pct) / 100.0 * cpus)
