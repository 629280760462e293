"""The machine around the training as facts: its GPUs, the trainer's processes and DataLoader
workers, the dataset's device, the host's other load. Part of
:func:`~stallscope.analysis.facts.build.build`."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.common import (
    _by_ts_sum,
    _procs,
    _r,
    _share,
    alive_together,
    mean,
    median,
    p95,
    rank_pids,
    tree_of,
)
from stallscope.analysis.window import gpu_warmup_end, trainer_gpus
from stallscope.store import Series

if TYPE_CHECKING:
    from stallscope.analysis.facts.build import _Draft
    from stallscope.analysis.rundata import RunData

__all__ = [
    "LIMIT_REACHED",
    "busy_for_training_pct",
    "limited",
    "others_taking_cores",
    "spare_cores",
]


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
    timed = [
        s
        for s in data.steps
        if s.gpu_busy_s is not None and (sig.focus_rank is None or s.rank == sig.focus_rank)
    ]
    busy = sum(s.gpu_busy_s or 0.0 for s in timed)
    idle = sum(s.gpu_idle_s or 0.0 for s in timed)
    if len(timed) >= 10 and busy + idle > 0:
        sig.gpu_busy_share = round(busy / (busy + idle), 3)


def _worker_count(
    config: dict[str, Any], cpu: list[Series], distinct: int
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


def _batch_costs(sig: _Draft, data: RunData, only: set[str] | None) -> None:
    """The workers' batch costs (the focus rank's workers when the run has ranks)."""
    from stallscope.sources.stacks.fetches import cost_summary, merged

    roles = data.roles()
    hists = [
        h
        for pid, h in data.batch_costs.items()
        if roles.get(str(pid)) == "worker" and (only is None or str(pid) in only)
    ]
    got = cost_summary(hists)
    if got is None:
        return
    sig.batch_cost_hist = merged(hists)
    sig.batches_timed = int(got["batches"])
    sig.batch_cost_p50_ms = got["p50_ms"]
    sig.batch_cost_p99_ms = got["p99_ms"]
    sig.batch_cost_tail_share = got["tail_share"]


def _proc_signals(sig: _Draft, data: RunData) -> None:
    roles = data.roles()
    only: set[str] | None = None
    if sig.focus_rank is not None and sig.focus_rank in rank_pids(data):
        only = tree_of(data, rank_pids(data)[sig.focus_rank])  # that rank's own workers
    wcpu = _procs(data, "procs.cpu_pct", "worker", only)
    sig.workers, sig.workers_source = _worker_count(
        sig.config,
        wcpu,
        sum(1 for p, r in roles.items() if r == "worker" and (only is None or p in only)),
    )
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
    _batch_costs(sig, data, only)
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


def _niced_others_cpu(data: RunData, nice: Series | None, cores: int | None) -> float | None:
    """Median over the samples of the cores that processes at nice > 0 beside the training
    kept busy: the host's niced user CPU (``host.cpu_nice_pct``) less the training's own
    processes at nice > 0. The kernel gives a nice-0 process's new workers those cores first
    (a nice-19 loop keeps about 1.5% of a core it shares with one), so they count as spare for
    a trainer at nice <= 0. 0.0 when the trainer's main process runs niced (which of the
    others yield to it is unknown); None when the run recorded neither figure (older runs,
    diagnoses from Prometheus)."""
    if nice is None or not nice.v or not cores:
        return None
    niceness: dict[str, int] = {}
    for e in data.entities:
        attrs = e.get("attrs")
        if e.get("source") == "procs" and isinstance(attrs, dict):
            n = attrs.get("nice")
            if type(n) is int:
                niceness[str(e["entity"])] = n
    mains = [pid for pid, role in data.roles().items() if role == "main"]
    if not mains or any(pid not in niceness for pid in mains):
        return None
    if any(niceness[pid] > 0 for pid in mains):
        return 0.0
    own = _by_ts_sum(
        [s for (n, e), s in data.series.items() if n == "procs.cpu_pct" and niceness.get(e, 0) > 0]
    )
    rest = [v * cores / 100 - own.get(t, 0.0) / 100 for t, v in zip(nice.ts, nice.v)]
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
        out.append(
            {
                "pid": pid,
                "role": roles.get(pid, ""),
                "name": str(a.get("name", "")),
                "cmdline": str(a.get("cmdline", ""))[:400],
                "cpu_mean_pct": _r(mean(cpu.v)) if cpu is not None and cpu.v else None,
                "rss_max_mib": _r(max(rss.v), 1) if rss is not None and rss.v else None,
                "first_ts": e.get("first_ts"),
                "last_ts": e.get("last_ts"),
            }
        )
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
    named = [
        d for d in (data.meta.get("data_devices") or []) if data.get("disk.util_pct", d) is not None
    ]
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
    return (
        d.read_limit_kb_s is not None
        and d.disk_rkb_s_p95 is not None
        and d.disk_rkb_s_p95 >= LIMIT_REACHED * d.read_limit_kb_s
    )


def others_taking_cores(fx: Facts) -> float:
    """Cores the host's other processes took from the training: those they kept busy less those
    of processes at a lower priority (``niced_others_cpu_cores``), which yield them to the
    trainer's new processes. 0.0 when unknown."""
    taken = (fx.host.others_cpu_cores or 0.0) - (fx.host.niced_others_cpu_cores or 0.0)
    return max(0.0, taken)


def busy_for_training_pct(host_pct: float, niced_cores: float | None, cpus: int) -> float:
    """The host's busy CPU (%) less what processes at a lower priority used
    (``niced_others_cpu_cores``): the share the training's new processes could not take.
    :func:`spare_cores` and ``compare``'s shortfall read it here."""
    return max(0.0, host_pct - 100.0 * (niced_cores or 0.0) / cpus) if cpus > 0 else host_pct


def spare_cores(fx: Facts) -> float | None:
    """CPUs the trainer's new processes could have over the run, in cores: those left idle
    (median host CPU) and those that processes at a lower priority used
    (``niced_others_cpu_cores``: a ``nice 19`` batch job yields its cores to new workers);
    None when unknown."""
    # fx.host.<fact> in full: the rules' declarations of what they read find them so
    cpus = fx.host.logical_cores or fx.host.physical_cores
    busy = fx.host.host_cpu_median_pct
    if cpus is None or busy is None:
        return None
    taken = busy_for_training_pct(busy, fx.host.niced_others_cpu_cores, cpus)
    return min(float(cpus), max(0.0, (100.0 - taken) / 100.0 * cpus))
