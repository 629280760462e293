"""Diagnosis rules: pure functions from a run's signals and series to findings.

Each rule documents its trigger in its docstring; docs/diagnosis.md explains them for users.
The verdict comes from combinations of signals, scored, never from one threshold: e.g. a
throughput-capped cloud disk shows low %util and low await while the trainer starves, so the
workers' D state and their flat read rate count as much as the device's %util.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stallscope import units
from stallscope.analysis.diagnose.model import Finding, Fix, Kind, RunData, Severity
from stallscope.analysis.diagnose.signals import (
    BUSY_SPARE,
    COMM_GAP,
    COMM_GAP_STARVED,
    COMM_HEAVY,
    OTHERS_BUSY_CORES,
    RUNQ_BUSY_PCT,
    Signals,
    limited,
    median,
    spare_cores,
    starved,
    trainer_gpus,
)
from stallscope.analysis.diagnose.tfdata import (
    is_tf,
    tf_compute_fix,
    tf_fetch_fixes,
    tf_prep_estimate,
    tf_prep_fixes,
)
from stallscope.loadermodel import (
    MIN_GAIN,
    stall_cap,
    worker_gain,
    workers_measured_slower,
    workers_target,
)
from stallscope.sources.owner import OWNER_KEYS, describe
from stallscope.stats import fit_line
from stallscope.textsafe import plain

__all__ = ["RULES", "run_rules"]

#: NVML clocks-event reasons that mean the GPU was slowed by heat or a hardware power event.
#: sw_power_cap (0x4) is left out: a datacenter GPU at full load sits at its power cap by
#: design, and gpu_idle / application-clock reasons are choices, not trouble.
_THROTTLE_BITS = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                  0x80: "hw_power_brake"}

STALL_WARN = 0.15  #: data wait share of step time from which input is called a bottleneck
STALL_CRIT = 0.40


def _speedup(stall: float | None) -> float:
    """Upper bound if the stall went away entirely: wall / (wall - wait)."""
    return stall_cap(stall)


# --- input bound: fetch vs prep ------------------------------------------------------------------
def _fetch_prep_scores(sig: Signals) -> tuple[int, list[str], int, list[str]]:
    """Points for 'storage can't keep up' vs 'CPU preprocessing can't keep up', with reasons."""
    f: list[str] = []
    p: list[str] = []
    fs = ps = 0
    d = sig.worker_d_share if sig.workers else sig.main_d_share
    who = ("workers" if sig.workers else "the trainer's threads" if sig.tf_trainer or is_tf(sig)
           else "the trainer (num_workers=0)")
    if d is not None:
        if d >= 0.25:
            fs += 2
            f.append(f"{who} in D state (waiting on I/O) in {d:.0%} of samples")
        elif d >= 0.10:
            fs += 1
            f.append(f"{who} in D state in {d:.0%} of samples")
        elif sig.workers:
            ps += 1
            p.append(f"workers rarely in D state ({d:.0%} of samples)")
    if sig.worker_blkio_pct is not None and sig.worker_blkio_pct >= 20:
        fs += 2
        f.append(f"workers blocked on block I/O {sig.worker_blkio_pct:.0f}% of the time")
    dfs, dps = _device_scores(sig, f, p)
    fs, ps = fs + dfs, ps + dps
    aw = sig.disk_r_await_median_ms
    if aw is not None and aw >= 20:
        fs += 2 if aw >= 50 else 1
        f.append(f"read latency {aw:.0f} ms (r_await; > 20 ms deserves attention)")
    if (sig.disk_rkb_s_cv is not None and sig.disk_rkb_s_cv < 0.2
            and (sig.disk_rkb_s_median or 0) > 1024 and fs > 0):
        fs += 1
        f.append(f"read throughput flat at ~{sig.disk_rkb_s_median / 1024:.1f} MB/s "  # type: ignore[operator]
                 f"(variation {sig.disk_rkb_s_cv:.0%}): a ceiling")
    if sig.psi_io_median_pct is not None and sig.psi_io_median_pct >= 10:
        fs += 1
        f.append(f"I/O pressure: some task stalled on I/O {sig.psi_io_median_pct:.0f}% of "
                 "the time (PSI)")
    if sig.iowait_median_pct is not None and sig.iowait_median_pct >= 10:
        fs += 1
        f.append(f"CPU iowait {sig.iowait_median_pct:.0f}%")
    wc = sig.worker_cpu_pct
    if sig.workers and wc is not None:
        if wc >= 80:
            ps += 2
            p.append(f"each worker at {wc:.0f}% CPU (saturated)")
        elif wc >= 55:
            ps += 1
            p.append(f"workers at {wc:.0f}% CPU")
        elif wc < 40:
            fs += 1
            f.append(f"workers mostly idle on CPU ({wc:.0f}%): waiting, not computing")
    mc = sig.main_cpu_pct
    if (not sig.workers and mc is not None and mc >= 80 and (d is None or d < 0.1)
            and sig.stall_source in ("probe", "stacks")):
        # the training thread measurably waits on its own loading, and the process is busy
        # on the CPU, not blocked on reads: the loading is CPU work (decode, transform)
        ps += 2
        p.append(f"the trainer loads on its own thread at {mc:.0f}% CPU, rarely blocked on "
                 "reads: loading is CPU work")
    if not sig.workers and d is not None and d >= 0.25 and mc is not None and mc < 50:
        # loading on the trainer's own threads (num_workers=0, tf.data): blocked reads while the
        # process barely computes
        fs += 1
        f.append(f"the trainer at {mc:.0f}% CPU while its threads wait on I/O: reading, not "
                 "computing")
    if sig.worker_runq_pct is not None and sig.worker_runq_pct >= 15:
        ps += 1
        p.append(f"workers waiting for a free CPU {sig.worker_runq_pct:.0f}% of the time "
                 "(CPU contention)")
    if (sig.host_cpu_median_pct is not None and sig.host_cpu_median_pct >= 85
            and (sig.iowait_median_pct or 0) < 10):
        ps += 1
        p.append(f"all CPUs busy ({sig.host_cpu_median_pct:.0f}%)")
    return fs, f, ps, p


def _device_scores(sig: Signals, f: list[str], p: list[str]) -> tuple[int, int]:
    """The dataset device's part of :func:`_fetch_prep_scores`: its read limit, else its own
    busy share (reasons appended to ``f`` and ``p``); returns (fetch, prep) points."""
    util = sig.disk_util_median_pct
    fs = ps = 0
    if limited(sig):
        # a limit stands before the device: the device's own idleness says nothing
        fs += 2
        f.append(f"reads of {sig.device} reached the trainer's cgroup read limit "
                 f"({units.rate(units.kib(sig.read_limit_kb_s or 0))}; p95 "
                 f"{units.rate(units.kib(sig.disk_rkb_s_p95 or 0))})")
    elif util is not None:
        if util >= 80:
            fs += 1
            f.append(f"{sig.device} busy {util:.0f}% of the time (iostat %util)")
        elif util < 30 and (sig.disk_rkb_s_median or 0) < 1024:
            ps += 1
            p.append(f"{sig.device} mostly idle ({util:.0f}% util)")
    return fs, ps


@dataclass(frozen=True)
class _StallSource:
    """How far an input-bound verdict can go on one way of measuring the stall
    (:attr:`Signals.stall_source`)."""

    base: float  #: confidence when the fetch/prep evidence is one-sided
    min_stall: float | None  #: the stall it needs; None: no stall is measured
    min_score: int  #: the points the stronger of fetch and prep needs
    src: str  #: how the stall was measured, in the summary
    rule: str  #: the rule in words; {stall} {fs} {ps} filled in
    #: measured per step (the probe): epoch starts are split off, and no "add the probe" fix
    measured: bool = False


_STALL_SOURCES: dict[str | None, _StallSource] = {
    "probe": _StallSource(
        0.9, STALL_WARN, 0, "per-step probe",
        f"data wait {{stall}} ≥ {STALL_WARN:.0%}; fetch score {{fs}} vs prep score {{ps}}",
        measured=True),
    "stacks": _StallSource(
        0.85, STALL_WARN, 0, "sampled stacks of the training thread",
        f"sampled data wait {{stall}} ≥ {STALL_WARN:.0%} (training-thread stacks in the "
        "loader's frames); fetch score {fs} vs prep score {ps}", measured=True),
    "gpu_idle": _StallSource(
        0.6, 0.3, 2, "GPU idle share",
        "GPU idle {stall} ≥ 30%; fetch score {fs} vs prep score {ps}"),
    "main_thread": _StallSource(
        0.7, STALL_WARN, 0, "estimated: the time the trainer's main thread did not run; "
        "no probe, no GPU",
        f"estimated data wait {{stall}} (main thread idle) ≥ {STALL_WARN:.0%}; fetch score "
        "{fs} vs prep score {ps}"),
    None: _StallSource(
        0.4, None, 4, "estimated",
        "no stall measurement; fetch score {fs} vs prep score {ps} (≥ 4 needed)"),
}

_INPUT_EVIDENCE = ("stall_fraction", "stall_source", "phase_shares", "stack_samples",
                   "stack_sampler", "wait_ms_median", "step_ms_median",
                   "gpu_util_median_pct", "workers", "worker_cpu_pct", "worker_d_share",
                   "worker_blkio_pct", "worker_runq_pct", "worker_read_kb_s", "device",
                   "disk_util_median_pct", "disk_r_await_median_ms", "disk_rkb_s_median",
                   "disk_r_s_median", "disk_rareq_kb_median", "psi_io_median_pct",
                   "iowait_median_pct", "host_cpu_median_pct", "physical_cores",
                   "read_limit_kb_s")


def rule_input_bound(data: RunData, sig: Signals) -> list[Finding]:
    """input_bound.fetch / input_bound.prep.

    Fires when the trainer waited for data ≥ 15% of step time (probe), or, without the probe,
    when the GPU was idle ≥ 30% of the time, or (no GPU, no probe) when the workers or disk show a
    clear saturation pattern (:data:`_STALL_SOURCES`). fetch vs prep is decided by scoring the
    signals of :func:`_fetch_prep_scores`; the side with more points wins."""
    how = _STALL_SOURCES.get(sig.stall_source) or _STALL_SOURCES[None]
    fs, freasons, ps, preasons = _fetch_prep_scores(sig)
    stall = sig.stall_fraction
    if how.min_stall is not None and (stall is None or stall < how.min_stall):
        return []
    if max(fs, ps) < how.min_score:
        return []
    steady = _steady_stall(data, sig) if how.measured else None
    if steady is not None:
        # the epoch starts are input_bound.epoch_start's; this finding is about the wait
        # between them, and says so
        if steady < STALL_WARN:
            return []
        stall = steady
    fetch = fs > ps
    kind = Kind.INPUT_FETCH if fetch else Kind.INPUT_PREP
    reasons = freasons if fetch else preasons
    margin = abs(fs - ps) / max(fs + ps, 1)
    confidence = how.base * (0.6 + 0.4 * margin) if max(fs, ps) >= 2 else how.base * 0.5
    severity: Severity = "critical" if stall is not None and stall >= STALL_CRIT else "warning"
    ev = sig.evidence(*_INPUT_EVIDENCE)
    ev.update(score_fetch=fs, score_prep=ps, signals=reasons)
    if sig.samples_per_s is not None:
        ev["samples_per_s"] = sig.samples_per_s
    if sig.focus_rank is not None:
        ev["rank"] = sig.focus_rank
    tf = is_tf(sig)
    note = _input_note(sig, tf, how)
    if note:
        ev["note"] = note
    summary = _input_summary(sig, how, stall, fetch, steady is not None, reasons)
    fixes = _input_fixes(data, sig, how, fetch, tf)
    if tf and not fetch:
        est = tf_prep_estimate(sig, _speedup(stall))
    else:
        est = _speedup(stall) if fetch else _prep_estimate(sig, stall)
    rule = how.rule.format(stall=_pct(stall), fs=fs, ps=ps)
    return [Finding(
        kind=kind,
        severity=severity,
        confidence=min(confidence, 0.95),
        summary=summary,
        evidence=ev,
        fixes=fixes,
        est_speedup=est,
        rule=rule,
    )]


def _input_summary(sig: Signals, how: _StallSource, stall: float | None, fetch: bool,
                   between_epochs: bool, reasons: list[str]) -> str:
    what = ("storage cannot deliver the data fast enough" if fetch else
            "CPU preprocessing (decode/transform) cannot keep up")
    if stall is not None:
        who = (f"rank {sig.focus_rank} waited for data {stall:.0%} of its steps"
               if sig.focus_rank is not None else
               f"the trainer waited for data {stall:.0%} of the time")
        if between_epochs:
            who += " between epoch starts"
        src = how.src
        if sig.stall_source == "probe" and sig.config.get("added_by"):
            src += f", added by {sig.config['added_by']}: no code in the trainer"
        summary = f"Input-bound: {who} ({src}); {what}."
    else:
        summary = f"Likely input-bound: {what} (no probe and no GPU to measure the stall)."
    if reasons:
        joined = "; ".join(reasons[:2])
        summary += " " + joined[:1].upper() + joined[1:] + "."
    return summary


def _input_fixes(data: RunData, sig: Signals, how: _StallSource, fetch: bool, tf: bool
                 ) -> list[Fix]:
    if tf:  # a tf.data pipeline: its own knobs, not DataLoader arguments
        fixes = (_fetch_fixes(data, sig, tf=True) + tf_fetch_fixes(data, sig)
                 if fetch else tf_prep_fixes(data, sig))
    else:
        fixes = _fetch_fixes(data, sig) if fetch else _prep_fixes(sig)
        fixes += _loader_fixes(sig)
    if not how.measured:
        fixes.append(Fix("wrap the loader with stallscope.watch(loader) to measure data wait "
                         "per step", "without the probe the stall is estimated from system "
                         "metrics only (lower confidence)"))
    return fixes


def _input_note(sig: Signals, tf: bool, how: _StallSource) -> str | None:
    """Why system metrics alone could not have split this stall from compute."""
    if not how.measured:
        return None
    if sig.stall_source == "stacks":
        shares = ", ".join(f"{k} {v:.0%}" for k, v in sig.phase_shares.items())
        times = f" {sig.stack_samples} times" if sig.stack_samples else ""
        return (f"no code in the trainer: its training thread's stack was sampled{times} "
                f"({sig.stack_sampler}); where its time went: {shares}.")
    if tf:
        return ("tf.data prepares elements on threads inside the trainer process: the "
                "probe times each step's wait for its element inside the train "
                "function, which system metrics alone cannot split from compute.")
    if not sig.workers:
        return ("num_workers=0: loading runs on the training thread, so system metrics "
                "cannot split it from compute; the probe's data-wait timing does.")
    return None


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _workers_now(sig: Signals) -> int | None:
    nw = sig.config.get("num_workers")
    if nw is None and sig.workers:
        return sig.workers
    return int(nw) if nw is not None else None


def prep_gain(sig: Signals, target: int, stall: float | None = None) -> float | None:
    """The speed-up to expect from ``target`` workers instead of today's, for a prep stall
    (:func:`stallscope.loadermodel.worker_gain`: new workers only add throughput with CPU they
    can use, never more than removing the whole stall would give)."""
    nw = _workers_now(sig)
    spare = spare_cores(sig)
    if not nw or sig.worker_cpu_pct is None or spare is None:
        return None
    return worker_gain(nw, target, sig.worker_cpu_pct / 100.0, spare,
                       sig.stall_fraction if stall is None else stall)


def _prep_estimate(sig: Signals, stall: float | None = None) -> float:
    """est_speedup of a prep stall: what its first fix is expected to deliver. When that fix is
    more workers, the CPU they can get bounds it; when it is cheaper per-sample work (no idle
    CPU), how much cheaper is the user's choice: the bound is removing the wait entirely."""
    nw = _workers_now(sig)
    cores = sig.physical_cores
    spare = spare_cores(sig)
    if nw is not None and cores and nw < cores and spare is not None and spare >= BUSY_SPARE:
        gain = prep_gain(sig, _prep_target(sig, nw, cores), stall)
        if gain is not None:
            return gain
    return _speedup(sig.stall_fraction if stall is None else stall)


def _prep_target(sig: Signals, nw: int, cores: int) -> int:
    """The workers a prep stall asks for (:func:`stallscope.loadermodel.workers_target`),
    below any count the run's autotune measured no faster than today's."""
    target = workers_target(nw, sig.stall_fraction or 0.0, cores)
    slower = _autotune_slower(sig, nw)
    return target if slower is None else min(target, slower - 1)


def _autotune_slower(sig: Signals, nw: int) -> int | None:
    """The fewest workers above ``nw`` that the run's own autotune measured no faster (by
    :data:`~stallscope.loadermodel.MIN_GAIN`) than ``nw`` or fewer; None without one."""
    tuned = sig.config.get("autotune")
    trials = tuned.get("trials") if isinstance(tuned, dict) else None
    if not isinstance(trials, list):
        return None
    pairs = [(t["num_workers"], float(t["steps_per_s"])) for t in trials
             if isinstance(t, dict) and type(t.get("num_workers")) is int
             and isinstance(t.get("steps_per_s"), (int, float))
             and math.isfinite(t["steps_per_s"])]
    return workers_measured_slower(pairs, nw)


def _prep_fixes(sig: Signals) -> list[Fix]:
    fixes: list[Fix] = []
    nw = _workers_now(sig)
    cores = sig.physical_cores
    stall = sig.stall_fraction or 0.0
    spare = spare_cores(sig)
    if nw is not None and cores and nw < cores and spare is not None and spare < BUSY_SPARE:
        busy = sig.host_cpu_median_pct or 0.0
        fixes.append(Fix(
            "make per-sample work cheaper: decode at lower resolution, move augmentation to "
            "the GPU, or preprocess once offline",
            f"the CPUs are already {busy:.0f}% busy: more workers would only share the same "
            "cores"))
    if nw is not None and cores:
        target = _prep_target(sig, nw, cores)
        gain = prep_gain(sig, target)
        slower = _autotune_slower(sig, nw)
        if fixes:  # the CPUs are busy: more workers would contradict the fix above
            pass
        elif nw < cores and target > nw and (gain is None or gain >= MIN_GAIN):
            fixes.append(Fix(
                f"num_workers {nw} → {target} ({cores} physical cores"
                + (f", workers at {sig.worker_cpu_pct:.0f}% CPU" if sig.worker_cpu_pct else "")
                + ")",
                f"loading keeps up when workers deliver 1/(1−{stall:.2f}) ≈ "
                f"{1 / max(1 - stall, 0.1):.1f}× today's rate; more workers than physical "
                "cores only adds context switches"
                + _gain_note(sig, target), gain, {"num_workers": target}))
        elif slower is not None and target <= nw:
            fixes.append(Fix(
                "make per-sample work cheaper: decode at lower resolution, move augmentation "
                "to the GPU, or preprocess once offline",
                f"this run's autotune measured num_workers={slower} no faster than {nw}: more "
                "workers do not help here"))
        else:
            fixes.append(Fix(
                "make per-sample work cheaper: decode at lower resolution, move augmentation "
                "to the GPU, or preprocess once offline",
                f"num_workers ({nw}) already matches the {cores} physical cores" if nw >= cores
                else f"more workers promise less than ×{MIN_GAIN:.2f}: there is little idle "
                     "CPU for them"))
    else:
        fixes.append(Fix("raise num_workers toward the number of physical cores (start at "
                         "min(4, cores))", "workers are CPU-saturated"))
    return fixes


def _gain_note(sig: Signals, target: int) -> str:
    gain = prep_gain(sig, target)
    spare = spare_cores(sig)
    if gain is None or spare is None:
        return ""
    return (f"; expected ×{gain:.2f}: the workers use {sig.worker_cpu_pct:.0f}% of a core "
            f"each and {spare:.1f} core(s) sat idle")


def _fetch_fixes(data: RunData, sig: Signals, *, tf: bool = False) -> list[Fix]:
    """Fixes for a fetch stall. ``tf``: only the storage-level ones (the tf.data pipeline's
    own come from :func:`~stallscope.analysis.diagnose.tfdata.tf_fetch_fixes`)."""
    fixes: list[Fix] = []
    dev = sig.device
    info = data.device_info().get(dev or "", {})
    aw = sig.disk_r_await_median_ms
    kind = ("virtual/network disk" if info.get("virtual") else
            "rotational" if info.get("rotational") else info.get("kind") or "")
    capped = (aw is not None and aw < 10 and (sig.disk_util_median_pct or 0) < 50
              and (sig.worker_d_share or sig.main_d_share or 0) >= 0.25)
    if dev and limited(sig):
        limit = units.kib(sig.read_limit_kb_s or 0.0)
        p95 = units.rate(units.kib(sig.disk_rkb_s_p95 or 0))
        fixes.append(Fix(f"reads of /dev/{dev} are held at the trainer's cgroup read limit "
                         f"({units.rate(limit)}): raise or lift the I/O limit (cgroup io.max / "
                         "blkio throttle, `docker run --device-read-bps`, the pod's I/O limits), "
                         "or copy the dataset to storage the limit does not cover",
                         f"the device's read rate reached {p95} (p95) against a limit of "
                         f"{units.rate(limit)}"))
    elif dev and capped:
        # what the trainer itself gets; the device total also counts other processes
        rate = sig.worker_read_kb_s or sig.main_read_kb_s or sig.disk_rkb_s_median or 0.0
        util = sig.disk_util_median_pct or 0.0
        who = "workers" if sig.workers else "the trainer's threads"
        fixes.append(Fix(f"reads of /dev/{dev} look capped before the device (trainer reads "
                         f"~{units.rate(units.kib(rate))}, device not busy, {who} waiting): "
                         "raise "
                         "the volume's provisioned throughput/IOPS or lift the I/O limit "
                         "(cgroup io.max / blkio throttle), or copy the dataset to local NVMe",
                         f"{who} wait on I/O while the device shows {util:.0f}% util and "
                         f"{aw:.0f} ms await: the limit is above the device"))
    elif dev:
        detail = ", ".join(x for x in (kind, f"await {aw:.0f} ms" if aw is not None else "",
                                       f"{sig.disk_util_median_pct:.0f}% util"
                                       if sig.disk_util_median_pct is not None else "") if x)
        fixes.append(Fix(f"dataset on /dev/{dev} ({detail}): move it to local NVMe"
                         + ("" if tf else
                            ", or pack it with `stallscope pack SRC DST` to read sequentially"),
                         "the device serves reads too slowly for the trainer"))
    if tf:
        return fixes
    rq = sig.disk_rareq_kb_median
    if rq is not None and rq < 64 and (sig.disk_r_s_median or 0) > 50:
        fixes.append(Fix("pack the small files into WebDataset shards (`stallscope pack`)",
                         f"reads average {rq:.0f} kB at {sig.disk_r_s_median:.0f} r/s: "
                         "many small random reads, each paying a seek/metadata lookup"))
    size = data.dataset_bytes
    avail = sig.mem_available_min_mib
    if size and avail and size / 1048576 < 0.7 * avail:
        fixes.append(Fix(f"dataset {units.size(size)} < available RAM "
                         f"{units.size(units.mib(avail))}: cache it in memory (or copy it to "
                         "/dev/shm or local disk first)",
                         "after one pass every read is served from RAM"))
    nw = _workers_now(sig)
    if nw is not None and sig.physical_cores and nw < min(4, sig.physical_cores) \
            and not (info.get("rotational") and not info.get("virtual")):
        fixes.append(Fix(f"num_workers {nw} → {min(4, sig.physical_cores)} to keep more reads "
                         "in flight", "SSD/NVMe serve parallel reads faster than one at a time; "
                         "on a spinning disk this adds seeks instead"))
    return fixes


def _loader_fixes(sig: Signals) -> list[Fix]:
    fixes: list[Fix] = []
    cfg = sig.config
    if (cfg.get("num_workers") and cfg.get("persistent_workers") is False and sig.epochs >= 2
            and (sig.epoch_start_wait_s or 0) > 1.0):
        fixes.append(Fix("persistent_workers=True",
                         f"workers restart each epoch: {sig.epoch_start_wait_s:.1f} s gap at "
                         "epoch boundaries", change={"persistent_workers": True}))
    if cfg.get("num_workers") and cfg.get("prefetch_factor") in (1,):
        fixes.append(Fix("prefetch_factor=2 (or more)",
                         "one batch in flight per worker leaves no slack for slow samples",
                         change={"prefetch_factor": 2}))
    return fixes


def _steady_stall(data: RunData, sig: Signals) -> float | None:
    """The stall between epoch starts, when input_bound.epoch_start fires (else None)."""
    total = sig.epoch_start_total_s
    if total is None or not rule_epoch_start(data, sig):
        return None
    first: dict[int, int] = {}
    for s in data.steps:  # each rank's first step is its start-up, left out as in the stall
        first[s.rank] = min(first.get(s.rank, s.step), s.step)
    body = [s for s in data.steps if s.step != first[s.rank]]
    wait = sum(s.wait_s for s in body) - total
    wall = sum(s.wait_s + s.host_s for s in body) - total
    return 0.0 if wall <= 0 else round(max(0.0, wait) / wall, 3)


def rule_epoch_start(data: RunData, sig: Signals) -> list[Finding]:
    """input_bound.epoch_start: the first step of every epoch waits ≥ 1 s longer than an
    ordinary step (median over epochs ≥ 1), in ≥ 2 epochs, and those waits add up to ≥ 5% of
    the steps' wall time: DataLoader workers restarted each epoch (no persistent_workers), or a
    dataset or sampler rebuilt each epoch. Caught even when the stall over the whole run is
    small, because it recurs."""
    cost, total = sig.epoch_start_cost_s, sig.epoch_start_total_s
    if cost is None or total is None or sig.epochs < 3 or cost < 1.0:
        return []
    wall = sum(s.wait_s + s.host_s for s in data.steps)
    if wall <= 0 or total / wall < 0.05:
        return []
    cfg = sig.config
    fixes = []
    gain = round(wall / (wall - total), 2)
    if cfg.get("num_workers") and cfg.get("persistent_workers") is False:
        fixes.append(Fix("persistent_workers=True",
                         f"workers restart each epoch: {sig.epoch_start_wait_s:.1f} s gap at "
                         "epoch boundaries", gain, {"persistent_workers": True}))
    fixes.append(Fix("build the dataset, its index and the sampler once, outside the epoch "
                     "loop; open files or databases lazily in each worker and keep them",
                     "whatever happens at the start of every epoch is paid once per epoch"))
    share = total / wall
    return [Finding(
        kind=Kind.INPUT_EPOCH_START,
        severity="critical" if share >= STALL_CRIT else "warning",
        confidence=0.8,
        summary=f"Every epoch starts with a {cost:.1f} s wait for the first batch "
                f"({sig.epochs} epochs, {total:.0f} s in all, {share:.0%} of the steps' "
                "time): the input pipeline restarts at each epoch boundary. The speed-up "
                "counts only those waits: a restart also slows the steps around it (forks, "
                "prefetch bursts), so expect at least that much.",
        evidence=sig.evidence("epochs", "epoch_start_wait_s", "epoch_start_cost_s",
                 "epoch_start_total_s", "wait_ms_median", "workers"),
        fixes=fixes,
        est_speedup=gain,
        rule=f"epoch start cost {cost:.1f} s ≥ 1 s over {sig.epochs} epochs, "
             f"{share:.0%} ≥ 5% of step time",
    )]


# --- host-to-device copies -----------------------------------------------------------------------
def rule_h2d(data: RunData, sig: Signals) -> list[Finding]:
    """h2d_bound: host-to-device copies take ≥ 15% of step time (probe h2d timing)."""
    share = sig.h2d_share
    if share is None or share < 0.15:
        return []
    fixes = []
    if not sig.config.get("pin_memory"):
        fixes.append(Fix("pin_memory=True and .to(device, non_blocking=True)",
                         "pageable memory is copied twice and blocks the host"))
    fixes.append(Fix("move less data: send uint8 images and normalise on the GPU",
                     f"copies take {share:.0%} of each step"))
    h2d_sev: Severity = "critical" if share >= 0.4 else "warning"
    return [Finding(kind=Kind.H2D_BOUND, severity=h2d_sev, confidence=0.85,
                    summary=f"Host-to-device copies take {share:.0%} of step time.",
                    evidence=sig.evidence("h2d_share", "step_ms_median") | {"pin_memory":
                                                                   sig.config.get("pin_memory")},
                    fixes=fixes, est_speedup=_speedup(share), rule=f"h2d share {share:.0%} ≥ 15%")]


# --- healthy -------------------------------------------------------------------------------------
def rule_compute_bound(data: RunData, sig: Signals) -> list[Finding]:
    """compute_bound: data wait < 15% of step time (probe) and, when there is a GPU, it is busy
    ≥ 70% of the time. Without a GPU the CPU trainer itself is the compute."""
    if sig.stall_source is None and sig.gpus == 0:
        if sig.tf_trainer:  # tf.data prepares on the trainer's own threads: see rule_tf_blind
            return []
        if not sig.workers:  # loading shares the trainer's threads: see rule_loading_in_trainer
            return []
        # CPU training without the probe: the trainer process itself is the compute
        fs, _, ps, _ = _fetch_prep_scores(sig)
        if (sig.main_cpu_pct or 0) >= 80 and max(fs, ps) < 2:
            return [Finding(
                kind=Kind.COMPUTE_BOUND, severity="info", confidence=0.5,
                summary=f"Likely compute-bound: the trainer process computes at "
                        f"{sig.main_cpu_pct:.0f}% CPU while its workers and the disk show "
                        "no saturation.",
                evidence=sig.evidence("main_cpu_pct", "worker_cpu_pct", "worker_d_share",
                                      "disk_util_median_pct"),
                fixes=[Fix("wrap the loader with stallscope.watch(loader) to confirm",
                           "without the probe or a GPU the data wait is not measured")],
                rule="trainer ≥ 80% CPU, no fetch/prep signal (no probe, no GPU)")]
        return []
    if sig.stall_source == "main_thread" and sig.stall_fraction is not None:
        if sig.stall_fraction >= STALL_WARN:
            return []
        busy = sig.main_thread_busy_share or 0.0
        return [Finding(
            kind=Kind.COMPUTE_BOUND, severity="info", confidence=0.7,
            summary=f"Compute-bound (healthy): the trainer's main thread ran {busy:.0%} of "
                    f"the time, so it waited for data about {sig.stall_fraction:.0%} "
                    "(an estimate: no probe, no GPU).",
            evidence=sig.evidence("stall_fraction", "stall_source", "main_thread_busy_share",
                                  "main_cpu_pct", "worker_cpu_pct", "workers"),
            fixes=[Fix("nothing to fix in the input pipeline; to go faster, make the "
                       "model step cheaper (a larger batch, torch.compile, more "
                       "torch threads)", "the trainer computes; it rarely waits"),
                   Fix("wrap the loader with stallscope.watch(loader) to measure it",
                       "the probe times each step's data wait instead of estimating it")],
            rule=f"estimated data wait {sig.stall_fraction:.0%} < "
                 f"{STALL_WARN:.0%} (main thread idle share, no probe, no GPU)")]
    if sig.stall_source not in ("probe", "stacks") or sig.stall_fraction is None:
        if sig.gpu_util_median_pct is not None and sig.gpu_util_median_pct >= 80:
            return [Finding(kind=Kind.COMPUTE_BOUND, severity="info", confidence=0.6,
                            summary=f"The GPU is busy (median {sig.gpu_util_median_pct:.0f}% "
                            "utilization): compute is the bottleneck, which is healthy.",
                            evidence=sig.evidence("gpu_util_median_pct"),
                            fixes=[Fix("wrap the loader with stallscope.watch(loader)",
                                 "confirms with per-step data wait")], est_speedup=1.0,
                            rule="GPU util ≥ 80% (no probe)")]
        return []
    if sig.stall_fraction >= STALL_WARN:
        return []
    if sig.gpu_util_median_pct is not None and sig.gpu_util_median_pct < GPU_BUSY_PCT:
        return []  # the GPU idles without waiting for data: rule_host_bound
    if sig.gpu_util_median_pct is None and sig.gpu_busy_share is not None \
            and sig.gpu_busy_share < GPU_BUSY_PCT / 100:
        return []
    gpu = (f", GPU busy {sig.gpu_util_median_pct:.0f}%" if sig.gpu_util_median_pct is not None
           else f", GPU busy {sig.gpu_busy_share:.0%} between the steps' CUDA events"
           if sig.gpu_busy_share is not None else "")
    if sig.gpu_warmup_s:
        gpu += f" once warm (its first {sig.gpu_warmup_s:.0f} s of training were warm-up)"
    fixes = [tf_compute_fix() if is_tf(sig) else _gpu_compute_fixes()[0] if sig.gpus else
             Fix("nothing to fix in the input pipeline; to go faster, make the model step "
                 "cheaper (mixed precision, larger batch, torch.compile)",
                 "the step is compute time, not waiting")]
    stacks = sig.stall_source == "stacks"
    how = (" (sampled stacks of the training thread, no code in the trainer)" if stacks else
           f" (per-step probe, added by {sig.config['added_by']}: no code in the trainer)"
           if sig.config.get("added_by") else "")
    return [Finding(kind=Kind.COMPUTE_BOUND, severity="info", confidence=0.8 if stacks else 0.85,
                    summary=f"Compute-bound (healthy): the trainer waited for data only "
                    f"{sig.stall_fraction:.0%} of the time{gpu}{how}.",
                    evidence=sig.evidence("stall_fraction", "stall_source", "phase_shares",
                                 "stack_samples", "wait_ms_median", "step_ms_median",
                                 "gpu_util_median_pct", "gpu_warmup_s", "gpu_busy_share",
                                 "worker_cpu_pct", "samples_per_s"),
                    fixes=fixes, est_speedup=1.0, rule=f"{'sampled ' if stacks else ''}data wait "
                    f"{sig.stall_fraction:.0%} < {STALL_WARN:.0%}")]


#: NVML utilization (%, the window's steady state) from which a GPU counts as busy: at or
#: above it a run that does not wait for data is compute-bound, below it host-bound
GPU_BUSY_PCT = 70.0
#: the training thread's share in forward/backward/optimizer code (sampled stacks) from which
#: it counts as busy issuing work, and the share waiting for the GPU under which it does not
#: wait for it
HOST_BUSY_SHARE = 0.5
HOST_GPU_WAIT_SHARE = 0.2


def _gpu_compute_fixes() -> list[Fix]:
    return [Fix("make the GPU's work cheaper: bf16 autocast (torch.autocast('cuda', "
                "dtype=torch.bfloat16)), channels_last for convolutions, torch.compile(model), "
                "a larger batch if memory allows", "the GPU is busy: it is the bottleneck, and "
                "the input keeps up")]


def rule_host_bound(data: RunData, sig: Signals) -> list[Finding]:
    """host_bound: a GPU training that does not wait for data (< 15%) nor for copies (< 15%),
    whose GPU is busy < 70% of the window's steady state (NVML), while its training thread is
    in forward/backward/optimizer code ≥ 50% of the time and waits for the GPU < 20% (sampled
    stacks; without them the probe's data wait alone says the gap is the host's step code):
    the GPU waits for the CPU to issue its work (Python overhead, many small kernels)."""
    if not sig.gpus or sig.gpu_util_median_pct is None or sig.stall_fraction is None:
        return []
    if sig.stall_source not in ("probe", "stacks") or sig.stall_fraction >= STALL_WARN:
        return []
    if (sig.h2d_share or 0.0) >= 0.15 or sig.gpu_util_median_pct >= GPU_BUSY_PCT:
        return []
    util = sig.gpu_util_median_pct
    shares = sig.phase_shares
    if shares:
        busy = shares.get("compute", 0.0)
        waits = shares.get("gpu_wait", 0.0)
        if busy < HOST_BUSY_SHARE or waits >= HOST_GPU_WAIT_SHARE:
            return []
        where = (f"its training thread was in forward/backward/optimizer code {busy:.0%} of "
                 f"the time and waited for the GPU only {waits:.0%} (sampled stacks)")
        confidence = 0.8
        rule = (f"GPU util {util:.0f}% < {GPU_BUSY_PCT:.0f}%, data wait "
                f"{sig.stall_fraction:.0%} < {STALL_WARN:.0%}, thread in compute {busy:.0%} ≥ "
                f"{HOST_BUSY_SHARE:.0%}, waiting for the GPU {waits:.0%} < "
                f"{HOST_GPU_WAIT_SHARE:.0%}")
    else:
        where = (f"the trainer waited for data only {sig.stall_fraction:.0%} of its steps "
                 "(per-step probe), so the rest of each step is its own host code")
        confidence = 0.6
        rule = (f"GPU util {util:.0f}% < {GPU_BUSY_PCT:.0f}%, data wait "
                f"{sig.stall_fraction:.0%} < {STALL_WARN:.0%} (no stacks)")
    est = round(min(5.0, GPU_BUSY_PCT / max(util, 14.0)), 2)
    fixes = [
        Fix("capture the step in CUDA graphs: torch.compile(model, mode=\"reduce-overhead\")",
            "one launch replays the step's kernels: the CPU's per-kernel cost goes away"),
        Fix("a larger batch (same steps, more work per launch)",
            f"the GPU is busy {util:.0f}%: each kernel is too short to hide its launch"),
        Fix("fused optimizers: torch.optim.AdamW(..., fused=True) (or foreach=True)",
            "one kernel per parameter group instead of several per parameter"),
        Fix("fewer host syncs per step: log loss.item() every N steps, not every step",
            "each .item() waits for the GPU to drain, then the CPU starts issuing again"),
    ]
    ev = sig.evidence("gpu_util_median_pct", "gpu_warmup_s", "gpu_busy_share",
                      "stall_fraction", "stall_source", "phase_shares", "stack_samples",
                      "step_ms_median", "main_cpu_pct", "window_s")
    sev: Severity = "warning"
    return [Finding(kind=Kind.HOST_BOUND, severity=sev, confidence=confidence,
                    summary=f"Host-bound: the GPU was busy only {util:.0f}% of the training (NVML, "
                    f"steady state) while {where}: the GPU waits for the CPU to issue its "
                    "work (Python overhead, kernels too short to hide their launch).",
                    evidence=ev, fixes=fixes, est_speedup=est, rule=rule)]


#: seconds after the last training step from which a trainer's exit is called slow
SLOW_EXIT_S = 5.0


def rule_slow_exit(data: RunData, sig: Signals) -> list[Finding]:
    """slow_exit: the trainer's process took ≥ 5 s to end after its last training step. When
    its stacks show a DataLoader joining its workers at exit (PyTorch joins each worker with a
    5-s timeout when ``pin_memory`` and ``persistent_workers`` are both on), it says so and
    names the fix; a team running many short jobs or sweeps pays this on every run."""
    exit_s = sig.exit_s
    if exit_s is None or exit_s < SLOW_EXIT_S or not sig.window_source \
            or sig.window_source == "run":
        return []
    stacks = sig.exit_stacks
    joins = sum(v for k, v in stacks if "dataloader.py" in k and ("join" in k or "_clean_up" in k
                                                                   or "_shutdown" in k))
    total = sig.window_s or 0.0
    cfg = sig.config
    workers = cfg.get("num_workers") if isinstance(cfg.get("num_workers"), int) else sig.workers
    ev: dict[str, Any] = {"exit_s": exit_s, "window_s": sig.window_s,
                          "exit_stacks": [{"stack": k, "s": v} for k, v in stacks]}
    if workers:
        ev["workers"] = workers
    for k in ("pin_memory", "persistent_workers"):
        if k in cfg:
            ev[k] = cfg[k]
    pinned = (cfg.get("pin_memory") is True and cfg.get("persistent_workers") is True) or \
        any("_clean_up_worker " in k for k, _ in stacks)
    what = (f"its DataLoader joined its {workers} worker processes for {joins:.0f} s"
            if workers else f"its DataLoader joined its workers for {joins:.0f} s")
    if joins >= 0.5 * exit_s and not pinned:
        why = (f"{what} after the loop: a worker still working on a batch finishes it "
               "before it stops")
        fixes = [Fix("shut the loader down as soon as the last batch you need is taken "
                     "(`del loader` and any iterator of it) and keep per-batch work short: "
                     "each worker ends its current batch before it can stop", why)]
    elif joins >= 0.5 * exit_s:
        why = (f"{what}: with pin_memory and persistent_workers PyTorch's exit waits up to "
               "5 s for each worker before stopping it (PyTorch issue 81794)")
        fixes = [Fix("end the workers once training is done: drop every reference to the "
                     "loader and its iterator (`del loader`) before the script ends, so "
                     "PyTorch stops them at once rather than at interpreter exit",
                     why),
                 Fix("persistent_workers=False when epochs are few (it keeps the workers "
                     "between epochs, and makes exit join them one by one)",
                     "the exit then takes about a second (measured on an H200, 2 workers: "
                     "11.0 s with both options on, 1.0-1.7 s with either off)",
                     change={"persistent_workers": False})]
    else:
        top = stacks[0][0].rsplit(";", 1)[-1] if stacks else "nothing sampled"
        why = f"the exit's heaviest stack ends in {top}"
        fixes = [Fix("look at what runs after the loop (saving, closing files, joining "
                     "threads or processes): `stallscope report` lists the exit's stacks",
                     why)]
    life = total + exit_s + (sig.startup_s or 0.0)
    share = exit_s / life if total else None
    more = f" ({share:.0%} of the process's life)" if share else ""
    return [Finding(
        kind=Kind.SLOW_EXIT,
        severity="warning",
        confidence=0.9 if joins >= 0.5 * exit_s else 0.7,
        summary=f"The trainer took {exit_s:.0f} s to exit after its last training step"
                f"{more}: {why}. A team running many short jobs or sweeps pays this on "
                "every run.",
        evidence=ev,
        fixes=fixes,
        est_speedup=1.0,
        rule=f"exit {exit_s:.1f} s ≥ {SLOW_EXIT_S:.0f} s after the last training step",
    )]


# --- GPU health ----------------------------------------------------------------------------------
def rule_gpu_throttled(data: RunData, sig: Signals) -> list[Finding]:
    """gpu_throttled: thermal/power clock-event reasons active in ≥ 20% of the samples, or the
    GPU at ≥ 85 °C (the usual alert threshold for sustained heat)."""
    out = []
    mine = trainer_gpus(data)
    for s in data.all("gpu.throttle_mask"):
        if s.entity not in mine:
            continue
        masks = [int(v) for v in s.v]
        if not masks:
            continue
        bad = [m for m in masks if any(m & b for b in _THROTTLE_BITS)]
        temp = data.get("gpu.temp_c", s.entity)
        tmax = max(temp.v) if temp and temp.v else None
        share = len(bad) / len(masks)
        if share < 0.2 and (tmax is None or tmax < 85):
            continue
        reasons = sorted({n for m in bad for b, n in _THROTTLE_BITS.items() if m & b})
        mem = data.get("gpu.mem_temp_c", s.entity)
        ev = {"gpu": s.entity, "throttled_share": round(share, 3), "reasons": reasons,
              "temp_max_c": tmax,
              # HBM heats apart from the core: a hot memory throttles a GPU with a cool core
              "mem_temp_max_c": max(mem.v) if mem is not None and mem.v else None}
        fixes = []
        if any("thermal" in r for r in reasons) or (tmax or 0) >= 85:
            fixes.append(Fix("check cooling: fans, airflow, inlet temperature, dust",
                             f"thermal slowdown; max temperature {tmax} °C"))
        if any("power" in r for r in reasons):
            fixes.append(Fix("check the power limit (nvidia-smi -q -d POWER) and PSU/cabling",
                             "clocks capped by the power limit"))
        out.append(Finding(
            kind=Kind.GPU_THROTTLED,
            severity="warning",
            confidence=0.9,
            summary=f"{s.entity} was throttled ({', '.join(reasons) or 'temperature'}) "
                    f"in {share:.0%} of samples.",
            evidence=ev,
            fixes=fixes,
            est_speedup=round(1 + 0.2 * share, 2),
            rule="thermal/power throttle reasons in ≥ 20% of samples or ≥ 85 °C",
        ))
    return out


def rule_gpu_health(data: RunData, sig: Signals) -> list[Finding]:
    """gpu_health: a GPU needs a person. An XID error during the run (the codes the NVIDIA
    device plugin treats as application errors left out), a row remap pending a reset or
    failed, or a page retirement pending. Any GPU of the machine, whether the trainer's or not:
    the next job lands on it."""
    from stallscope.sources.gpu import XID_MEANINGS

    out = []
    mine = trainer_gpus(data)

    def peak(name: str, entity: str) -> float:
        s = data.get(name, entity)
        return max(s.v) if s is not None and s.v else 0.0

    for s in data.all("gpu.health_problem"):
        if not s.v or max(s.v) < 0.5:
            continue
        gpu = s.entity
        xids = int(peak("gpu.xid_count", gpu))
        last = data.get("gpu.xid_last", gpu)
        code = next((int(v) for v in reversed(last.v) if v), 0) if last is not None else 0
        pending, failed = peak("gpu.row_remap_pending", gpu), peak("gpu.row_remap_failed", gpu)
        pages = peak("gpu.retired_pages_pending", gpu)
        what, fixes = [], []
        if xids:
            meaning, todo = XID_MEANINGS.get(code, ("an XID NVIDIA's catalog lists",
                                                    "drain the node if it repeats"))
            what.append(f"{xids} XID error{'s' if xids > 1 else ''} (last: XID {code}, "
                        f"{meaning})")
            fixes.append(Fix(f"{todo[0].upper()}{todo[1:]}", f"XID {code} on {gpu}: {meaning}"))
        if failed:
            what.append("a row remap failed")
            fixes.append(Fix(f"replace the GPU behind {gpu}",
                             "a row remap failed (remapped_rows.failure): its memory can no "
                             "longer hide bad rows"))
        if pending:
            what.append("a row remap waits for a reset")
            fixes.append(Fix(f"reset the GPU when its jobs end (nvidia-smi -r -i "
                             f"{gpu.removeprefix('gpu')}), or reboot the node",
                             "the remap takes effect at the next reset (remapped_rows.pending)"))
        if pages:
            what.append("a page retirement waits for a reset")
            fixes.append(Fix("reset the GPU or reboot the node when its jobs end",
                             "pages are retired at the next reset (retired_pages.pending)"))
        ev = {"gpu": gpu, "trainer_gpu": gpu in mine, "xid_count": xids, "xid_last": code,
              "row_remap_pending": int(pending), "row_remap_failed": int(failed),
              "retired_pages_pending": int(pages)}
        out.append(Finding(
            kind=Kind.GPU_HEALTH,
            severity="critical",
            confidence=0.95,
            summary=f"{gpu} needs attention: {'; '.join(what) or 'a health flag'}.",
            evidence=ev,
            fixes=fixes,
            est_speedup=1.0,
            rule="an XID (not an application's), a pending or failed row remap, or a "
                 "pending page retirement",
        ))
    return out


def rule_gpu_memory_growth(data: RunData, sig: Signals) -> list[Finding]:
    """gpu_memory_growth: after the first quarter of the run (warm-up), GPU memory rises
    steadily (linear fit r² ≥ 0.8) by ≥ 512 MiB and ≥ 2% of the card over ≥ 10 samples: a leak
    (tensors kept across steps)."""
    out = []
    mine = trainer_gpus(data)
    for full in data.all("gpu.mem_used_mib"):
        # the first quarter of the run is warm-up (weights, CUDA context, allocator pools):
        # memory rising there is loading, not leaking
        skip = len(full.v) // 4
        ts, vs = full.ts[skip:], full.v[skip:]
        if full.entity not in mine or len(vs) < 10:
            continue
        s = full
        line = fit_line(zip(ts, vs))
        slope, r2 = line.slope, line.r2
        grew = vs[-1] - vs[0]
        total = data.get("gpu.mem_total_mib", s.entity)
        cap = total.v[-1] if total and total.v else None
        if slope <= 0 or r2 < 0.8 or grew < 512 or (cap and grew < 0.02 * cap):
            continue
        ev = {"gpu": s.entity, "growth_mib": round(grew), "rate_mib_per_min": round(slope * 60, 1),
              "r2": round(r2, 3)}
        if cap:
            ev["minutes_to_full"] = round((cap - vs[-1]) / slope / 60, 1)
        out.append(Finding(
            kind=Kind.GPU_MEMORY_GROWTH,
            severity="warning",
            confidence=min(0.95, r2),
            summary=f"{s.entity} memory grows steadily ({slope * 60:.0f} MiB/min, "
                    f"+{grew:.0f} MiB): likely a leak.",
            evidence=ev,
            fixes=[Fix("look for tensors kept across steps (loss accumulated without "
                  ".item()/.detach(), lists of outputs, caches)",
                  "memory rises linearly while the workload is steady")],
            est_speedup=1.0,
            rule="linear growth r² ≥ 0.8, ≥ 512 MiB and ≥ 2% of the card",
        ))
    return out


def rule_pcie_degraded(data: RunData, sig: Signals) -> list[Finding]:
    """pcie_degraded: under load (util ≥ 30%) the link runs below its max generation or width
    in ≥ 50% of samples. (Idle GPUs drop to a low generation to save power: not a finding.)"""
    out = []
    mine = trainer_gpus(data)
    for s in data.all("gpu.util_pct"):
        if s.entity not in mine:
            continue
        g = {k: data.get(f"gpu.{k}", s.entity) for k in
             ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")}
        if any(v is None or not v.v for v in g.values()):
            continue
        idx = {t: i for i, t in enumerate(s.ts)}
        loaded = degraded = 0
        worst: tuple[float, float] = (99.0, 99.0)
        for series_t, gen, gmax, wid, wmax in zip(g["pcie_gen"].ts, g["pcie_gen"].v,  # type: ignore[union-attr]
                                                  g["pcie_gen_max"].v, g["pcie_width"].v,  # type: ignore[union-attr]
                                                  g["pcie_width_max"].v):  # type: ignore[union-attr]
            i = idx.get(series_t)
            if i is None or s.v[i] < 30:
                continue
            loaded += 1
            if gen < gmax or wid < wmax:
                degraded += 1
                worst = min(worst, (gen, wid))
        if loaded and degraded / loaded >= 0.5:
            gmax = g["pcie_gen_max"].v[-1]  # type: ignore[union-attr]
            wmax = g["pcie_width_max"].v[-1]  # type: ignore[union-attr]
            out.append(Finding(
                kind=Kind.PCIE_DEGRADED, severity="warning", confidence=0.8,
                summary=f"{s.entity} PCIe link at Gen{worst[0]:.0f} x{worst[1]:.0f} under load "
                f"(max Gen{gmax:.0f} x{wmax:.0f}).",
                evidence={"gpu": s.entity, "gen": worst[0], "gen_max": gmax, "width": worst[1],
                 "width_max": wmax, "degraded_share": round(degraded / loaded, 3)},
                fixes=[Fix("reseat the card / check the slot and riser; check BIOS PCIe settings",
                     "a degraded link cuts host-to-device bandwidth")],
                est_speedup=1.0, rule="link below max gen/width in ≥ 50% of loaded samples"))
    return out


# --- host ----------------------------------------------------------------------------------------
def rule_host_swap(data: RunData, sig: Signals) -> list[Finding]:
    """host_swap: swapping ≥ 1 MB/s in ≥ 10% of samples (in or out)."""
    si, so = data.get("host.swap_in_kb_s"), data.get("host.swap_out_kb_s")
    if not si or not so or not si.v:
        return []
    rates = [a + b for a, b in zip(si.v, so.v)]
    active = [r for r in rates if r >= 1024]
    share = len(active) / len(rates)
    if share < 0.1:
        return []
    sev: Severity = "critical" if share >= 0.3 else "warning"
    return [Finding(
        kind=Kind.HOST_SWAP,
        severity=sev,
        confidence=0.9,
        summary=f"The host swapped in {share:.0%} of samples (peak {max(rates) / 1024:.0f} "
                "MB/s): memory is overcommitted.",
        evidence={"swap_share": round(share, 3), "swap_peak_kb_s": round(max(rates)),
                 "mem_available_min_mib": sig.mem_available_min_mib},
        fixes=[Fix("reduce memory: fewer num_workers or a smaller prefetch_factor (each "
              "worker holds batches), smaller in-memory caches, or add RAM",
              "every swapped page costs a disk read on the critical path")],
        est_speedup=1.0,
        rule="swap ≥ 1 MB/s in ≥ 10% of samples",
    )]


def rule_shm_pressure(data: RunData, sig: Signals) -> list[Finding]:
    """shm_pressure: /dev/shm ≥ 80% full (critical ≥ 95%), or smaller than 1 GiB while
    DataLoader workers are in use (Docker's default is 64 MB): workers die with bus errors."""
    used, total = data.get("host.shm_used_mib"), data.get("host.shm_total_mib")
    if not used or not total or not used.v or not total.v:
        return []
    cap = total.v[-1]
    peak = max(used.v)
    frac = peak / cap if cap else 0.0
    small = cap < 1024 and (sig.workers > 0 or (sig.config.get("num_workers") or 0) > 0)
    if frac < 0.8 and not small:
        return []
    # a small /dev/shm that the run did not fill is worth knowing, not the verdict of the run
    sev: Severity = "critical" if frac >= 0.95 else "warning" if frac >= 0.8 else "info"
    return [Finding(
        kind=Kind.SHM_PRESSURE,
        severity=sev,
        confidence=0.9,
        summary=f"/dev/shm peaked at {peak:.0f} of {cap:.0f} MiB ({frac:.0%}): DataLoader "
                "workers pass batches through it and fail with bus errors when it is full.",
        evidence={"shm_peak_mib": round(peak, 1), "shm_total_mib": round(cap, 1),
                 "shm_peak_share": round(frac, 3)},
        fixes=[Fix("enlarge /dev/shm (docker run --shm-size=8g, or mount -o remount,"
                  "size=... /dev/shm)", f"only {cap:.0f} MiB available"),
              Fix("lower prefetch_factor or batch size; remove stale files in /dev/shm",
                  "each worker keeps prefetch_factor batches in shared memory")],
        est_speedup=1.0,
        rule="/dev/shm ≥ 80% full, or < 1 GiB with workers",
    )]


# --- DDP -----------------------------------------------------------------------------------------
def rule_straggler(data: RunData, sig: Signals) -> list[Finding]:
    """straggler_rank: with ≥ 2 ranks, one rank waits for data ≥ 15% of its steps and ≥ 15
    points more than the least-waiting rank (under DDP the all-reduce evens out step times, so
    where each rank spends its step tells, not how long it is); or, where steps are not tied
    together, one rank's median step takes ≥ 1.2× the median rank's."""
    detail = {d["rank"]: d for d in sig.ranks_detail}
    if sig.focus_rank is not None and sig.focus_rank in detail:
        r = detail[sig.focus_rank]
        host = _host_of(data, r["rank"])
        others = [d for d in sig.ranks_detail if d["rank"] != sig.focus_rank]
        best = min(others, key=lambda d: d["stall_fraction"] or 0.0)
        where = f"rank {r['rank']} (host {host}" + (f", pid {r['pid']})" if "pid" in r else ")")
        wcpu = (f"; its {r['workers']} DataLoader worker(s) at {r['worker_cpu_pct']:.0f}% CPU"
                if r.get("worker_cpu_pct") is not None and r.get("workers") else "")
        fs, _, ps, _ = _fetch_prep_scores(sig)
        fixes = (_fetch_fixes(data, sig) if fs > ps else _prep_fixes(sig)) + _loader_fixes(sig)
        fixes = [Fix(f"on rank {r['rank']}: {f.action}", f.why) for f in fixes]
        fixes.append(Fix(f"compare rank {r['rank']}'s data with the others' (shard size, "
                         "storage, transform)", "the ranks run the same code; the slow one "
                         "differs in what it reads or where"))
        ev = {"rank": r["rank"], "host": host, "cause": "input", "ranks": sig.ranks_detail,
              "stall_fraction": r["stall_fraction"], "data_wait_share": r["stall_fraction"],
              "best_rank": best["rank"], "best_stall_fraction": best["stall_fraction"]}
        return [Finding(
            kind=Kind.STRAGGLER_RANK,
            severity="critical" if r["stall_fraction"] >= STALL_CRIT
                     else "warning",
            confidence=0.85,
            summary=f"Rank {r['rank']} holds the job back: it waited for data "
                    f"{r['stall_fraction']:.0%} of its steps while rank {best['rank']} "
                    f"waited {best['stall_fraction']:.0%}{wcpu}. The all-reduce makes every "
                    f"rank wait for {where}.",
            evidence=ev,
            fixes=fixes,
            est_speedup=_prep_estimate(sig) if ps >= fs else _speedup(r["stall_fraction"]),
            rule=f"rank data wait {r['stall_fraction']:.0%} ≥ 15% and ≥ 15 points above "
                 f"rank {best['rank']}'s {best['stall_fraction']:.0%}",
        )]
    if sig.comm_straggler is not None and sig.comm_straggler in detail:
        return _comm_straggler(data, sig, detail[sig.comm_straggler])
    per: dict[int, list[float]] = defaultdict(list)
    for s in data.steps:
        per[s.rank].append(s.wait_s + s.host_s)
    if len(per) < 2:
        return []
    med = {r: median(v) or 0.0 for r, v in per.items()}
    typical = median(list(med.values())) or 0.0
    slow = max(med, key=lambda r: med[r])
    if typical <= 0 or med[slow] < 1.2 * typical:
        return []
    wshare = (detail.get(slow) or {}).get("stall_fraction") or 0.0
    return [Finding(
        kind=Kind.STRAGGLER_RANK,
        severity="warning",
        confidence=0.8,
        summary=f"Rank {slow} is a straggler: its median step takes "
                f"{med[slow] * 1000:.0f} ms vs {typical * 1000:.0f} ms typical; the others "
                "wait for it at every all-reduce.",
        evidence={"rank": slow, "step_ms_median": round(med[slow] * 1000, 1),
                 "typical_step_ms": round(typical * 1000, 1),
                 "data_wait_share": round(wshare, 3), "ranks": sig.ranks_detail},
        fixes=[Fix(f"look at rank {slow}'s node: its data wait share is {wshare:.0%}"
              + (" (input-bound there)" if wshare >= STALL_WARN else
                 " (slow compute: check that GPU's clocks/throttling)"),
              "all ranks go at the pace of the slowest")],
        est_speedup=round(med[slow] / typical, 2),
        rule="slowest rank ≥ 1.2× the median rank",
    )]


def _host_of(data: RunData, rank: int) -> str:
    """Where ``rank`` ran: its node in a job read across nodes (``diagnose --prometheus``),
    else the run's host."""
    hosts = data.meta.get("rank_hosts")
    if isinstance(hosts, dict) and hosts.get(str(rank)):
        return str(hosts[str(rank)])
    return data.meta.get("host") or "this host"


def _peers_wait(sig: Signals, slow: int) -> tuple[list[dict[str, Any]], float]:
    """The other ranks with their communication share, and the least of those shares."""
    peers = [d for d in sig.ranks_detail if d["rank"] != slow and d.get("comm_share") is not None]
    return peers, min((d["comm_share"] for d in peers), default=0.0)


def _comm_straggler(data: RunData, sig: Signals, r: dict[str, Any]) -> list[Finding]:
    """straggler_rank from communication time: the peers wait in collectives for rank ``r``,
    whose own data wait is not the cause (that is the input branch above). Its cause: short
    of CPU (its process waits for a core), else its own compute is slower than the peers'."""
    host = _host_of(data, r["rank"])
    peers, peer_comm = _peers_wait(sig, r["rank"])
    gap = peer_comm - (r.get("comm_share") or 0.0)
    peer_compute = median([d["compute_ms_median"] for d in peers
                           if d.get("compute_ms_median") is not None])
    mine = r.get("compute_ms_median")
    runq = r.get("runq_wait_pct")
    peer_runq = median([d["runq_wait_pct"] for d in peers
                        if d.get("runq_wait_pct") is not None]) or 0.0
    names = ", ".join(str(d["rank"]) for d in peers)
    wait_words, their = (f"rank {names} waits", "its") if len(peers) == 1 else (
        f"ranks {names} wait", "their")
    if starved(r, peers):
        cause = "cpu"
        why = (f"its process waited for a CPU {runq:.0f}% of the time (run-queue wait; the "
               f"others {peer_runq:.0f}%): a busy host or a CPU quota (cgroup cpu.max / "
               "cpu.cfs_quota_us) slows it")
        fixes = [Fix(f"on rank {r['rank']}'s host {host}: give the trainer its cores back (look "
                     "for other processes, a CPU quota on its container or cgroup, or too many "
                     "DataLoader workers for the cores)",
                     f"its trainer waited for a CPU {runq:.0f}% of the time; the others did not")]
    else:
        cause = "compute"
        peer_share = median([d["compute_share"] for d in peers
                             if d.get("compute_share") is not None])
        if mine is not None and peer_compute:
            slower = (f"{mine:.0f} ms of compute per step against {peer_compute:.0f} ms on "
                      "the others")
        elif r.get("compute_share") is not None and peer_share is not None:
            slower = (f"it computes {r['compute_share']:.0%} of its time against "
                      f"{peer_share:.0%} on the others (sampled stacks)")
        else:
            slower = "more compute per step"
        why = f"its own step is slower: {slower}"
        fixes = [Fix(f"compare rank {r['rank']}'s work with the others': a larger shard or "
                     "batch, longer sequences, a different model branch, or a slower or "
                     "throttled device (its GPU's clocks and throttle reasons)",
                     "the ranks run the same code; the slow one does more or runs slower")]
    on = f" (on {host})" if data.meta.get("rank_hosts") else ""
    ev = {"rank": r["rank"], "host": host, "cause": cause, "ranks": sig.ranks_detail,
          "comm_share": r.get("comm_share"), "peers_comm_share": round(peer_comm, 3),
          "compute_ms_median": mine, "peers_compute_ms_median": peer_compute,
          "runq_wait_pct": runq, "peers_runq_wait_pct": peer_runq,
          "data_wait_share": r.get("stall_fraction")}
    return [Finding(
        kind=Kind.STRAGGLER_RANK,
        severity="critical" if gap >= STALL_CRIT else "warning",
        confidence=0.85,
        summary=f"Rank {r['rank']}{on} holds the job back: {wait_words} for it in the "
                f"all-reduce {peer_comm:.0%} of {their} step time, while it waits "
                f"{r.get('comm_share') or 0.0:.0%}; {why}.",
        evidence=ev,
        fixes=fixes,
        est_speedup=_speedup(gap),
        rule=f"peers' communication wait {peer_comm:.0%} ≥ "
             f"{(COMM_GAP if gap >= COMM_GAP else COMM_GAP_STARVED):.0%} above rank "
             f"{r['rank']}'s {r.get('comm_share') or 0.0:.0%} (collectives timed, "
             f"{'probe' if mine is not None else 'sampled stacks'}); "
             + ("run-queue wait ≥ 20% and ≥ 20 points above the others'"
                if cause == "cpu" else "its data wait is not the cause"),
    )]


def _busy_host(sig: Signals) -> tuple[float, float] | None:
    """(least run-queue wait %, other processes' cores) when every trainer process waited for a
    CPU ≥ RUNQ_BUSY_PCT of the time while other processes kept ≥ OTHERS_BUSY_CORES busy."""
    if len(sig.ranks_detail) >= 2:
        waits = [d.get("runq_wait_pct") for d in sig.ranks_detail]
    else:
        waits = [sig.main_runq_pct]
    others = sig.others_cpu_cores
    if any(w is None for w in waits) or others is None or others < OTHERS_BUSY_CORES:
        return None
    least = min(w for w in waits if w is not None)
    return (least, others) if least >= RUNQ_BUSY_PCT else None


def rule_cpu_contention(data: RunData, sig: Signals) -> list[Finding]:
    """cpu_contention: every trainer process (each rank, or the one trainer) waited for a CPU
    ≥ 20% of the time while other processes kept ≥ 0.5 of the host's cores busy: a busy host,
    not the training's own work. A rank short of CPU alone is a straggler (``starved``)."""
    busy = _busy_host(sig)
    if busy is None:
        return []
    least, others = busy
    ranks = sig.ranks_detail
    host = data.meta.get("host") or "this host"
    cores = f" of its {sig.logical_cores}" if sig.logical_cores else ""
    if len(ranks) >= 2:
        who = "every rank waited for a CPU (" + ", ".join(
            f"rank {d['rank']} {d['runq_wait_pct']:.0f}%" for d in ranks) + " of the time"
    else:
        who = f"the trainer waited for a CPU {least:.0f}% of the time ("
    summary = (f"The host is short of CPU for this training: {who}"
               f"{', ' if len(ranks) >= 2 else ''}run-queue wait) while other processes kept "
               f"{others:.1f}{cores} cores busy.")
    comm = [d.get("comm_share") for d in ranks]
    if len(ranks) >= 2 and sig.comm_straggler is None and all(c is not None for c in comm):
        shares = ", ".join(f"rank {d['rank']} {d['comm_share']:.0%}" for d in ranks)
        summary += (f" While the ranks share too few cores, their wait in the all-reduce "
                    f"({shares} of the step) cannot show which rank the others wait for.")
    others_busy = [b for b in data.meta.get("busy_others") or []
                   if isinstance(b, dict) and isinstance(b.get("pid"), int)
                   and isinstance(b.get("cores"), (int, float))][:3]
    # the run names who took the cores when they were still there at its end; else the
    # command that lists them, last, so it prints whole on a line of its own
    action = (f"give the training its cores back on {host}: stop or move the other busy "
              "processes: " + ", ".join(
                  f"pid {b['pid']} ({plain(str(b.get('name', '?')), 40)}, {b['cores']:.1f} "
                  "cores)" for b in others_busy) + ", or run on a less loaded node"
              if others_busy else
              f"give the training its cores back on {host}: stop or move the other busy "
              "processes, or run on a less loaded node; they are listed by "
              "`ps -eo pid,pcpu,comm --sort=-pcpu | head`")
    fixes = [Fix(action,
                 f"its processes were ready to run but waited for a CPU {least:.0f}% of the "
                 f"time while other processes used {others:.1f} cores")]
    ev: dict[str, Any] = {"runq_wait_pct": least, "others_cpu_cores": others,
                          "host_cpu_median_pct": sig.host_cpu_median_pct,
                          "logical_cores": sig.logical_cores}
    if others_busy:
        ev["busiest_others"] = others_busy
    if len(ranks) >= 2:
        ev["ranks"] = ranks
    return [Finding(
        kind=Kind.CPU_CONTENTION,
        severity="critical" if least >= STALL_CRIT * 100 else "warning",
        confidence=0.8,
        summary=summary,
        evidence=ev,
        fixes=fixes,
        est_speedup=_speedup(least / 100),
        rule=f"every trainer process waited for a CPU ≥ {RUNQ_BUSY_PCT:.0f}% of the time "
             f"(least {least:.0f}%) and other processes kept ≥ {OTHERS_BUSY_CORES} "
             f"core busy ({others:.1f})",
    )]


def rule_waiting_for_peers(data: RunData, sig: Signals) -> list[Finding]:
    """waiting_for_peers: the ranks a straggler holds back, with the share of their step spent
    in collectives waiting (their GPUs idle in the all-reduce, their step looks like compute)."""
    slow = sig.focus_rank if sig.focus_rank is not None else sig.comm_straggler
    if slow is None:
        return []
    peers, _least = _peers_wait(sig, slow)
    waiting = [d for d in peers if d["comm_share"] >= COMM_GAP]
    if not waiting:
        return []
    names = ", ".join(str(d["rank"]) for d in waiting)
    shares = ", ".join(f"rank {d['rank']} {d['comm_share']:.0%}" for d in waiting)
    who, their = (f"Rank {names} waits", "its") if len(waiting) == 1 else (
        f"Ranks {names} wait", "their")
    return [Finding(kind=Kind.WAITING_FOR_PEERS, severity="info", confidence=0.85,
                    summary=f"{who} for rank {slow} in the all-reduce ({shares} of {their} step "
                    f"time): {their} devices sit idle there, so {their} step looks like "
                    f"compute. It goes away with rank {slow}'s own cause.",
                    evidence={"rank": slow, "waiting_ranks": [d["rank"] for d in waiting],
                     "comm_share": {str(d["rank"]): d["comm_share"] for d in waiting}},
                    fixes=[Fix(f"fix rank {slow} (the straggler finding); nothing to change on "
                         f"rank{'s' if len(waiting) > 1 else ''} {names}", f"{their} wait is "
                         f"rank {slow}'s slowness, passed on by the collective")],
                    est_speedup=1.0, rule=f"communication wait ≥ {COMM_GAP:.0%} of the step while "
                    f"rank {slow} is the straggler")]


def rule_communication_bound(data: RunData, sig: Signals) -> list[Finding]:
    """communication_bound: every rank spends ≥ 30% of its step in collectives and none waits
    for another (no straggler): the network or the topology is the limit."""
    ranks = sig.ranks_detail
    if len(ranks) < 2 or sig.focus_rank is not None or sig.comm_straggler is not None:
        return []
    shares = [d.get("comm_share") for d in ranks]
    if any(x is None for x in shares):
        return []
    least = min(x for x in shares if x is not None)
    if least < COMM_HEAVY or _busy_host(sig) is not None:
        return []  # ranks that wait for a CPU wait for one another: see rule_cpu_contention
    transfer = sig.comm_transfer_share
    if transfer is not None and transfer < least / 2:
        return [_rank_jitter(sig, least, transfer)]
    if transfer is not None:
        told = ""
    elif "prometheus" in data.meta:
        told = (" (from Prometheus' totals the transfer itself and the wait for each step's "
                "slowest rank cannot be told apart: `stallscope diagnose` on a run's own "
                "records splits them)")
    else:
        told = (" (sampled stacks give shares, not each step's times, so the transfer itself "
                "and the wait for each step's slowest rank cannot be told apart: the probe, "
                "`stallscope.watch(loader)` in each rank, splits them)")
    return [Finding(
        kind=Kind.COMMUNICATION_BOUND,
        severity="critical" if least >= STALL_CRIT else "warning",
        confidence=0.8,
        summary=f"Communication-bound: every rank spends at least {least:.0%} of its step in "
                "collectives (the gradient all-reduce), and no rank is waited for: the "
                f"network or the topology is the limit{told}.",
        evidence={"comm_share": {str(d["rank"]): d["comm_share"] for d in ranks},
                 "transfer_share": transfer, "ranks": ranks},
        fixes=[Fix("all-reduce less often: a larger batch per rank, or gradient "
                  "accumulation with model.no_sync() for all but the last micro-batch",
                  "the collective's cost is per step, not per sample"),
              Fix("send less: a compression hook (model.register_comm_hook(None, "
                  "fp16_compress_hook)) or larger buckets (bucket_cap_mb)",
                  "fewer bytes, fewer round trips"),
              Fix("check the interconnect: NCCL_DEBUG=INFO for the transport chosen, "
                  "`nvidia-smi topo -m` for the GPUs' links",
                  "a fallback to sockets or PCIe across sockets multiplies the cost")],
        est_speedup=_speedup(least),
        rule=f"every rank's communication wait ≥ {COMM_HEAVY:.0%} of "
             "its step, no straggler",
    )]


def _rank_jitter(sig: Signals, least: float, transfer: float) -> Finding:
    """rank_jitter: every rank waits heavily in collectives, but the transfer is a small part
    of it: each step waits for that step's slowest rank, a different one each time."""
    jitter = least - transfer
    return Finding(
        kind=Kind.RANK_JITTER,
        severity="critical" if jitter >= STALL_CRIT else "warning",
        confidence=0.8,
        summary=f"The ranks wait for each other, not for the network: every rank spends at least "
                f"{least:.0%} of its step in collectives, but the all-reduce itself takes "
                f"{transfer:.0%} (the least wait in each step). The rest is each step waiting for "
                "that step's slowest rank, a different one each time: the ranks' step times vary "
                "from step to step.",
        evidence={"comm_share": {str(d["rank"]): d["comm_share"] for d in sig.ranks_detail},
                 "transfer_share": transfer, "jitter_share": round(jitter, 3),
                 "ranks": sig.ranks_detail},
        fixes=[Fix("make every rank's step as even as possible: enough DataLoader workers and "
                  "prefetch_factor that no batch arrives late, no other work on the trainers' "
                  "cores "
                  "(one CPU thread per rank: torch.set_num_threads), batches of even size "
                  "(bucket sequences by length)",
                  "a step lasts as long as its slowest rank's; spikes on any rank cost every rank"),
              Fix("look at one rank's steps over time (stallscope report RUN): spikes at a "
                  "period point to garbage collection (gc.freeze() after setup) or logging",
                  "periodic spikes have one cause; random ones come from contention")],
        est_speedup=_speedup(jitter),
        rule=f"every rank's communication wait ≥ {COMM_HEAVY:.0%}, the transfer (least wait per "
             "step) under half of it (per-step records)",
    )


# --- disk health (from stallscope disk / SMART) --------------------------------------------------
def rule_disk_health(data: RunData, sig: Signals) -> list[Finding]:
    """disk_health: the dataset's drive has a SMART verdict of ageing or failing."""
    out = []
    for drive in data.disk_health:
        verdict = drive.get("verdict")
        if verdict not in ("ageing", "failing"):
            continue
        dsev: Severity = "critical" if verdict == "failing" else "warning"
        out.append(Finding(kind=Kind.DISK_HEALTH, severity=dsev, confidence=0.9,
                           summary=f"The dataset's drive {drive.get('device')} is {verdict}: "
                           + "; ".join(drive.get("reasons", [])[:3]),
                           evidence={"device": drive.get("device"), "model": drive.get("model"),
                            "verdict": verdict, "reasons": drive.get("reasons", []),
                            "growth": drive.get("growth", {})},
                           fixes=[Fix("back up the dataset and checkpoints now; plan to replace "
                                      "the "
                                "drive", "SMART counters that grow predict failure")],
                           est_speedup=1.0, rule="SMART verdict ageing/failing (see "
                                                 "docs/disk-health.md)"))
    return out


def rule_tf_blind(data: RunData, sig: Signals) -> list[Finding]:
    """data_wait_unknown for a TensorFlow trainer without the probe and without a GPU: tf.data
    prepares elements on threads inside the trainer process, beside the threads that run the
    training step, and neither their names nor their CPU tell the two apart (TF 2.21 leaves
    both on unnamed inter-op threads). The run is never called compute-bound then."""
    if not sig.tf_trainer or sig.stall_source is not None or sig.gpus:
        return []
    return [Finding(kind=Kind.DATA_WAIT_UNKNOWN, severity="info", confidence=0.5,
                    summary=f"A TensorFlow trainer at {sig.main_cpu_pct or 0:.0f}% CPU: tf.data "
                            "runs "
                    "its input pipeline on threads inside the trainer, which system metrics "
                    "cannot tell from the training step's, so whether it waits for data is not "
                    "known without the probe.",
                    evidence=sig.evidence("main_cpu_pct", "main_d_share", "host_cpu_median_pct",
                                 "disk_util_median_pct"),
                    fixes=[Fix("model.fit(..., callbacks=[stallscope.integrations.keras."
                         "StallscopeCallback()]), or stallscope.watch(dataset) in a custom "
                         "loop", "the probe times each step's wait for its element inside the "
                         "train function")],
                    est_speedup=1.0, rule="TensorFlow threads (tf_*) in the trainer, no probe, "
                                          "no GPU")]


#: a running run younger than this has not shown whether its loader has worker processes
#: (they start with the first iteration, after the imports and the model's set-up)
YOUNG_RUN_S = 30.0


def rule_loading_in_trainer(data: RunData, sig: Signals) -> list[Finding]:
    """data_wait_unknown for a CPU trainer without DataLoader worker processes, the probe or a
    GPU (PyTorch ``num_workers=0``, a threaded decoder, a hand-written loop): it loads and
    prepares data on its own threads between its steps, and CPU time spent decoding looks
    exactly like CPU time spent computing. The run is never called compute-bound then: a
    ``num_workers=0`` trainer that waited for its own loading 90% of the time looked healthy."""
    if sig.tf_trainer or sig.stall_source is not None or sig.gpus or sig.workers \
            or sig.samples < 3:
        return []
    if data.meta.get("end") is None and (sig.duration_s or 0.0) < YOUNG_RUN_S:
        # a run still starting (the verdict so far in `top`): its DataLoader may not have
        # started its workers yet; "it has none" is not claimed before it could be seen
        return []
    read = sig.main_read_kb_s
    reads = (f"; it read {read / 1024:.1f} MB/s of files itself" if read and read >= 100
             else "")
    return [Finding(kind=Kind.DATA_WAIT_UNKNOWN, severity="info", confidence=0.5,
                    summary="The trainer has no DataLoader worker processes: it loads and "
                            "prepares "
                    f"data on its own threads between its steps{reads}, and system metrics "
                    f"cannot tell that time from compute ({sig.main_cpu_pct or 0:.0f}% CPU), so "
                    "whether it waits for data is not known without the probe.",
                    evidence=sig.evidence("main_cpu_pct", "main_read_kb_s", "main_d_share",
                                          "workers", "host_cpu_median_pct",
                                          "disk_util_median_pct"),
                    fixes=[Fix("wrap the loader with stallscope.watch(loader)",
                         "the probe times each step's wait for its batch"),
                     Fix("DataLoader(num_workers=N): load in worker processes beside the step",
                         "loading then overlaps the step instead of adding to it (and system "
                         "metrics can see it)")],
                    est_speedup=1.0, rule="no DataLoader workers, no probe, no GPU, not "
                                          "TensorFlow")]


#: how long a GPU must sit idle while held before it is called held-idle, and what "held" is
HELD_IDLE_S = 600.0
HELD_MIB = 256.0
IDLE_PCT = 1.0


def rule_gpu_held_idle(data: RunData, sig: Signals) -> list[Finding]:
    """gpu_held_idle: a GPU at ≤ 1% utilization for the last ≥ 10 minutes of the run while
    processes hold ≥ 256 MiB of its memory: allocated to a job that does not use it (a hung
    or finished job that keeps its context, a notebook left open). Under MIG NVML gives no
    utilization: no series, no verdict (never read as idle)."""
    out = []
    for s in data.all("gpu.util_pct"):
        if not s.ts:
            continue
        end = s.ts[-1]
        since = end
        for t, v in zip(reversed(s.ts), reversed(s.v)):
            if v > IDLE_PCT:
                break
            since = t
        idle_s = end - since
        if idle_s < HELD_IDLE_S:
            continue
        holders = []
        for ps in data.all("gpu.proc_mem_mib"):
            if not ps.entity.startswith(f"{s.entity}:"):
                continue
            held = [v for t, v in zip(ps.ts, ps.v) if t >= since]
            if held and min(held) >= HELD_MIB:
                pid = ps.entity.split(":", 1)[1]
                attrs = data.entity_attrs("gpu", ps.entity)
                holders.append({"pid": int(pid) if pid.isdigit() else pid,
                                "mem_mib": round(held[-1]),
                                **{k: attrs[k] for k in OWNER_KEYS if attrs.get(k)}})
        if not holders:
            continue
        who = ", ".join(describe(h) or f"pid {h['pid']}" for h in holders[:3])
        ev = {"gpu": s.entity, "idle_s": round(idle_s), "util_max_pct": max(
            v for t, v in zip(s.ts, s.v) if t >= since), "holders": holders}
        out.append(Finding(
            kind=Kind.GPU_HELD_IDLE, severity="warning", confidence=0.9,
            summary=f"{s.entity} did no work for the last {idle_s / 60:.0f} min while {who} "
            f"held {sum(h['mem_mib'] for h in holders):.0f} MiB of its memory: allocated, "
            "unused.", evidence=ev,
            fixes=[Fix("end or release the job holding it (or lower its GPU request)",
                 "a held GPU cannot be scheduled to another job"),
             Fix("if it should be training: look for a hang (stallscope top --pid PID, "
                 "py-spy dump --pid PID)", "no kernel ran on it for minutes")],
            est_speedup=1.0, rule=f"GPU utilization ≤ {IDLE_PCT:g}% for ≥ {HELD_IDLE_S / 60:.0f} "
                                  "min while "
                 f"processes hold ≥ {HELD_MIB:.0f} MiB"))
    return out


#: below this much CPU (100 = one core), the watched processes together do nothing a
#: training does
IDLE_TREE_CPU_PCT = 10.0
#: nor this much reading (kB/s, page cache included), nor this share of samples in D state
IDLE_TREE_READ_KB_S = 100.0
IDLE_TREE_D_SHARE = 0.1


def rule_not_training(data: RunData, sig: Signals) -> list[Finding]:
    """insufficient_data ("nothing looks like a training"): no probe steps, no training frames
    in the sampled stacks, no GPU held by the watched processes, and those processes together
    used under 10% of a core, read under 100 kB/s and were rarely in D state. Then no verdict
    is made: a sleeping script or ``--pid 1`` is not input-bound."""
    if sig.steps or sig.samples < 3:
        return []
    from stallscope.sources.stacks.phases import TRAINING

    frames = sum(v for k, v in (sig.phase_shares or {}).items() if k in TRAINING)
    if frames >= 0.05 or trainer_gpus(data):
        return []
    tree = (sig.main_cpu_pct or 0.0) + (sig.worker_cpu_pct or 0.0) * sig.workers
    read = (sig.main_read_kb_s or 0.0) + (sig.worker_read_kb_s or 0.0)
    blocked = max(sig.main_d_share or 0.0, sig.worker_d_share or 0.0)
    if tree >= IDLE_TREE_CPU_PCT or read >= IDLE_TREE_READ_KB_S or blocked >= IDLE_TREE_D_SHARE:
        return []
    procs = 1 + sig.workers
    stacks = (f"no training frames in {sig.stack_samples} sampled stacks" if sig.stack_samples
              else "no stacks sampled")
    return [Finding(
        kind=Kind.INSUFFICIENT_DATA, severity="info", confidence=0.9,
        summary=f"Nothing here looks like a training: no steps, {stacks}, no GPU work, and its "
        f"{procs} process{'es' if procs > 1 else ''} used {tree:.1f}% of one core and read "
        f"{read:.0f} kB/s. No verdict.",
        evidence={"tree_cpu_pct": round(tree, 2), "processes": procs, "read_kb_s": round(read, 1),
         "d_share": round(blocked, 3), "stack_samples": sig.stack_samples},
        fixes=[Fix("watch the training itself: `stallscope run -- python train.py`, or `--pid` of "
             "the Python process that runs the training loop",
             "the watched processes did no work a training does")],
        est_speedup=1.0, rule="no steps, no training frames, no GPU, < 10% of a core, < 100 kB/s "
                              "read, "
        "< 10% of samples in D state", too_little_data=True)]


def rule_insufficient(data: RunData, sig: Signals) -> list[Finding]:
    """insufficient_data: fewer than 3 samples and fewer than 10 probe steps."""
    if sig.samples >= 3 or sig.steps >= 10:
        return []
    return [Finding(kind=Kind.INSUFFICIENT_DATA, severity="info", confidence=1.0,
                    summary=f"Too little data to diagnose: {sig.samples} samples and {sig.steps} "
                            "steps.",
                    evidence={"samples": sig.samples, "steps": sig.steps,
                     "duration_s": sig.duration_s},
                    fixes=[Fix("run longer (≥ 30 s of training) or lower --interval",
                         "rules need several samples to tell a pattern from noise")],
                    est_speedup=1.0, rule="< 3 samples and < 10 steps", too_little_data=True)]


Rule = Callable[[RunData, Signals], list[Finding]]

RULES: tuple[Rule, ...] = (
    rule_insufficient, rule_not_training, rule_input_bound, rule_epoch_start, rule_h2d,
    rule_compute_bound,
    rule_host_bound, rule_slow_exit,
    rule_tf_blind, rule_loading_in_trainer, rule_gpu_throttled, rule_gpu_health,
    rule_gpu_memory_growth, rule_pcie_degraded, rule_host_swap, rule_shm_pressure,
    rule_straggler, rule_waiting_for_peers, rule_communication_bound, rule_cpu_contention,
    rule_disk_health, rule_gpu_held_idle,
)

_SEV = {"critical": 0, "warning": 1, "info": 2}
#: kinds about the process around the training, listed after every finding about the training
#: itself (the verdict names what limited the training)
AFTER_TRAINING = frozenset({"slow_exit"})


def run_rules(data: RunData, sig: Signals) -> list[Finding]:
    """Every rule's findings, most important first."""
    findings = [f for rule in RULES for f in rule(data, sig)]
    # what happened after the training (its exit) never outranks what limited the training
    findings.sort(key=lambda f: (f.kind in AFTER_TRAINING, _SEV[f.severity], -f.est_speedup,
                                 -f.confidence))
    insufficient = [f for f in findings if f.too_little_data]
    if insufficient:
        # too little data: that is the verdict; only facts that need no time series stay
        keep = [f for f in findings
                if f.kind in ("disk_health", "gpu_health", "shm_pressure", "gpu_held_idle")]
        findings = insufficient + keep
    return findings



