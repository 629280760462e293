"""Rules about the input pipeline: fetch vs prep (input_bound.*; the fetch side's evidence and
fixes in :mod:`.fetch`, the prep side's in :mod:`.prep`), epoch starts, host-to-device copies,
and the trainers whose data wait cannot be told without the probe.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope import units
from stallscope.analysis.diagnose.model import Finding, Fix, Kind, RunData, Severity
from stallscope.analysis.diagnose.rules.common import (
    STALL_CRIT,
    STALL_WARN,
    _pct,
    _workers_now,
    pid_to_look_at,
)
from stallscope.analysis.diagnose.rules.fetch import _fetch_fixes
from stallscope.analysis.diagnose.rules.headofline import head_of_line
from stallscope.analysis.diagnose.rules.prep import _prep_estimate, _prep_fixes, stall_ceiling
from stallscope.analysis.diagnose.rules.scores import SCORES, fetch_prep_scores, host_io_points
from stallscope.analysis.diagnose.rules.threads import thread_stall
from stallscope.analysis.diagnose.tfdata import (
    is_tf,
    tf_fetch_fixes,
    tf_prep_estimate,
    tf_prep_fixes,
)
from stallscope.analysis.facts import Facts
from stallscope.loadermodel import stall_cap, workers_to_overlap

#: a data wait from which "at least N×" is said rather than the formula (input_bound.wait)
WAIT_SHARE_HIGH = 0.9
#: input_bound.epoch_start: epochs needed, the extra wait of an epoch's first step (s), and
#: the share of the steps' time all of them together must reach
EPOCHS_MIN = 3
EPOCH_COST_S = 1.0
EPOCH_COST_SHARE = 0.05
#: the trainer reading its own files at this rate (KiB/s) is said in data_wait_unknown
OWN_READ_KB_S = 100.0
#: fewer machine samples than this: rule_loading_in_trainer says nothing
MIN_SAMPLES = 3


@dataclass(frozen=True)
class _StallSource:
    """How far an input-bound verdict can go on one way of measuring the stall
    (:attr:`StepFacts.stall_source`)."""

    base: float  #: confidence when the fetch/prep evidence is one-sided
    min_stall: float | None  #: the stall it needs; None: no stall is measured
    min_score: int  #: the points the stronger of fetch and prep needs
    src: str  #: how the stall was measured, in the summary
    rule: str  #: the rule in words; {stall} {fs} {ps} filled in
    #: measured per step (the probe): epoch starts are split off, and no "add the probe" fix
    measured: bool = False


_STALL_SOURCES: dict[str | None, _StallSource] = {
    "probe": _StallSource(
        0.9,
        STALL_WARN,
        0,
        "per-step probe",
        f"data wait {{stall}} ≥ {STALL_WARN:.0%}; fetch score {{fs}} vs prep score {{ps}}",
        measured=True,
    ),
    "stacks": _StallSource(
        0.85,
        STALL_WARN,
        0,
        "sampled stacks of the training thread",
        f"sampled data wait {{stall}} ≥ {STALL_WARN:.0%} (training-thread stacks in the "
        "loader's frames); fetch score {fs} vs prep score {ps}",
        measured=True,
    ),
    "gpu_idle": _StallSource(
        0.6, 0.3, 2, "GPU idle share", "GPU idle {stall} ≥ 30%; fetch score {fs} vs prep score {ps}"
    ),
    "main_thread": _StallSource(
        0.7,
        STALL_WARN,
        0,
        "estimated: the time the trainer's main thread did not run; no probe, no GPU",
        f"estimated data wait {{stall}} (main thread idle) ≥ {STALL_WARN:.0%}; fetch score "
        "{fs} vs prep score {ps}",
    ),
    None: _StallSource(
        0.4,
        None,
        4,
        "estimated",
        "no stall measurement; fetch score {fs} vs prep score {ps} (≥ 4 needed)",
    ),
}


_INPUT_EVIDENCE = (
    "stall_fraction",
    "stall_source",
    "phase_shares",
    "stack_samples",
    "stack_sampler",
    "wait_ms_median",
    "step_ms_median",
    "gpu_util_median_pct",
    "workers",
    "worker_cpu_pct",
    "worker_d_share",
    "worker_blkio_pct",
    "worker_runq_pct",
    "worker_read_kb_s",
    "device",
    "disk_util_median_pct",
    "disk_r_await_median_ms",
    "disk_rkb_s_median",
    "disk_r_s_median",
    "disk_rareq_kb_median",
    "psi_io_median_pct",
    "iowait_median_pct",
    "host_cpu_median_pct",
    "physical_cores",
    "read_limit_kb_s",
    "niced_others_cpu_cores",
)


def rule_input_bound(data: RunData, fx: Facts) -> list[Finding]:
    """input_bound.fetch / input_bound.prep.

    Fires when the trainer waited for data ≥ 15% of step time (probe), or, without the probe,
    when the GPU was idle ≥ 30% of the time, or (no GPU, no probe) when the workers or disk show a
    clear saturation pattern (:data:`_STALL_SOURCES`). fetch vs prep is decided by scoring the
    signals of :func:`_fetch_prep_scores`; the side with more points wins."""
    if thread_stall(fx) is not None:
        return []  # the wait is on a thread loader: rule_thread_loader's (rules/threads.py)
    how = _STALL_SOURCES.get(fx.steps.stall_source) or _STALL_SOURCES[None]
    fs, freasons, ps, preasons = fetch_prep_scores(fx)
    stall = fx.steps.stall_fraction
    if how.min_stall is not None and (stall is None or stall < how.min_stall):
        return []
    if max(fs, ps) < how.min_score:
        return []
    steady = _steady_stall(data, fx) if how.measured else None
    if steady is not None:
        # the epoch starts are input_bound.epoch_start's; this finding is about the wait
        # between them, and says so
        if steady < STALL_WARN:
            return []
        stall = steady
    fetch = fs > ps
    if not fetch and head_of_line(fx) is not None:
        return []  # the wait comes from slow samples holding up the batches: that finding's
    kind = Kind.INPUT_FETCH if fetch else Kind.INPUT_PREP
    reasons = freasons if fetch else preasons
    # fetch's lead from host-wide I/O alone (iowait, PSI: another process's I/O shows there
    # too; CI's parallel tests gave 10% iowait to a trainer whose loading sleeps) does not
    # outweigh a loading that neither computes nor waits in D state
    host_only = fetch and fs - host_io_points(fx) <= ps
    waits = loading_waits(fx, stall) if how.measured and (not fetch or host_only) else None
    if waits is not None:
        return [_wait_finding(data, fx, how, stall, steady is not None, waits, fs, ps)]
    margin = abs(fs - ps) / max(fs + ps, 1)
    confidence = how.base * (0.6 + 0.4 * margin) if max(fs, ps) >= 2 else how.base * 0.5
    severity: Severity = "critical" if stall is not None and stall >= STALL_CRIT else "warning"
    ev = fx.evidence(*_INPUT_EVIDENCE)
    ev.update(score_fetch=fs, score_prep=ps, signals=reasons)
    if fx.steps.samples_per_s is not None:
        ev["samples_per_s"] = fx.steps.samples_per_s
    if fx.comm.focus_rank is not None:
        ev["rank"] = fx.comm.focus_rank
    tf = is_tf(fx)
    note = _input_note(fx, tf, how)
    if note:
        ev["note"] = note
    summary = _input_summary(fx, how, stall, fetch, steady is not None, reasons)
    fixes = _input_fixes(data, fx, how, fetch, tf)
    cap, shared = stall_ceiling(fx, stall)
    if tf and not fetch:
        est = tf_prep_estimate(fx, cap)
    else:
        est = cap if fetch else _prep_estimate(fx, stall)
    rule = how.rule.format(stall=_pct(stall), fs=fs, ps=ps)
    if shared is not None and est == cap:
        ev["ceiling_assumes"] = shared
        rule += f"; ceiling ×{cap:.2f}: {shared}"
    return [
        Finding(
            kind=kind,
            severity=severity,
            confidence=min(confidence, 0.95),
            summary=summary,
            evidence=ev,
            fixes=fixes,
            est_speedup=est,
            rule=rule,
        )
    ]


#: the loading side's CPU (% of one core: each worker's mean, or the trainer's own at
#: num_workers=0) below which a data wait is not CPU preprocessing: the loading waits on
#: something else (a network or remote store, a lock, a sleep). Measured 2026-11-27: the CPU
#: demo's two prep-bound workers 173% together; a loader sleeping 4 ms a sample 7-21%
WAIT_CPU_PCT = 40.0
#: ... and its workers' run-queue wait below this (% of the time): starved of CPU by other
#: processes is cpu_contention's
WAIT_RUNQ_PCT = 20.0
#: ... at num_workers=0, the trainer's run-queue wait below this share of the stall
RUNQ_EXPLAINS = 0.5


def loading_waits(fx: Facts, stall: float | None) -> float | None:
    """The loading side's CPU (% of one core) when the trainer waits for data while the
    loading neither computes nor reads the disk; None otherwise."""
    if stall is None or stall < STALL_WARN or is_tf(fx):
        return None
    cpu = fx.loader.worker_cpu_pct if fx.loader.workers else fx.procs.main_cpu_pct
    if cpu is None or cpu >= WAIT_CPU_PCT:
        return None
    # waiting for a CPU is not waiting on something else: the workers' own run-queue wait; at
    # num_workers=0 the trainer's, when it explains a good part of the stall (a trainer on a
    # busy host waited for a CPU 62% of the time: input_bound.wait was wrong; one whose loading
    # sleeps waits mostly on the sleep, whatever a busy host adds)
    if fx.loader.workers:
        if (fx.loader.worker_runq_pct or 0.0) >= WAIT_RUNQ_PCT:
            return None
    elif (fx.procs.main_runq_pct or 0.0) / 100.0 >= RUNQ_EXPLAINS * stall:
        return None
    d = fx.loader.worker_d_share if fx.loader.workers else fx.procs.main_d_share
    if d is not None and d >= SCORES.d_state:
        return None
    return cpu


def _wait_finding(
    data: RunData,
    fx: Facts,
    how: _StallSource,
    stall: float | None,
    between_epochs: bool,
    cpu: float,
    fs: int,
    ps: int,
) -> Finding:
    """input_bound.wait: more workers overlap the waits, past the physical cores."""
    who = (
        f"the workers use {cpu:.0f}% of a core each"
        if fx.loader.workers
        else f"the trainer, which loads its own data (num_workers=0), uses {cpu:.0f}% of a core"
    )
    reason = (
        f"{who} and are rarely in D state"
        if fx.loader.workers
        else f"{who} and is rarely in D state"
    )
    summary = _input_summary(
        fx,
        how,
        stall,
        False,
        between_epochs,
        [reason],
        what="the loading waits on something other than the CPU or the "
        "disk (a network or remote store, a lock, a sleep)",
    )
    nw = _workers_now(fx) or 0
    share = stall or 0.0
    need = 1 / max(1.0 - share, 0.1)
    target = workers_to_overlap(nw, share)  # the loader model's (loadermodel.py)
    rate = (
        f"at least {need:.0f}× today's rate"
        if share >= WAIT_SHARE_HIGH
        else f"1/(1−{share:.2f}) ≈ {need:.1f}× today's rate"
    )
    cores = fx.host.physical_cores
    fixes = [
        Fix(
            f"num_workers {nw} → {target}",
            f"{who}: the loading waits rather than computes, so more workers overlap its "
            f"waits, and more of them than the {cores or 'physical'} cores is fine for "
            f"that (each is a process: watch host memory); loading keeps up when it "
            f"delivers {rate}",
            None,
            {"num_workers": target},
        ),
        Fix(
            "find what the loading waits on: " + _dump_advice(data, fx),
            "a remote store or a service that answers slowly is fixed at its end, or by "
            "caching the data locally",
        ),
    ]
    fixes += _loader_fixes(fx)
    if not how.measured:
        fixes.append(
            Fix(
                "wrap the loader with stallscope.watch(loader) to measure data wait per step",
                "without the probe the stall is estimated from system "
                "metrics only (lower confidence)",
            )
        )
    ev = fx.evidence(*_INPUT_EVIDENCE)
    ev.update(score_fetch=fs, score_prep=ps, signals=[reason], loading_cpu_pct=cpu)
    return Finding(
        kind=Kind.INPUT_WAIT,
        severity="critical" if stall is not None and stall >= STALL_CRIT else "warning",
        confidence=min(how.base * 0.8, 0.95),
        summary=summary,
        evidence=ev,
        fixes=fixes,
        est_speedup=stall_cap(stall),
        rule=how.rule.format(stall=_pct(stall), fs=fs, ps=ps)
        + (" (fetch's lead from host-wide iowait/PSI only)" if fs > ps else "")
        + f"; the loading's CPU {cpu:.0f}% of a core < {WAIT_CPU_PCT:.0f}%, D state < 10%",
    )


def _dump_advice(data: RunData, fx: Facts) -> str:
    """Where to point py-spy: the run's own worker (or trainer) pid, runnable while it trains."""
    who = "worker" if fx.loader.workers else "main"
    pid = pid_to_look_at(data, who)
    what = "a DataLoader worker" if fx.loader.workers else "the trainer (it loads its own data)"
    if pid is None:
        return f"py-spy dump of {what} shows where it waits"
    return (
        f"`py-spy dump --pid {pid}` ({what} of this run: another pid when the training "
        "runs again) shows where it waits"
    )


def _input_summary(
    fx: Facts,
    how: _StallSource,
    stall: float | None,
    fetch: bool,
    between_epochs: bool,
    reasons: list[str],
    what: str | None = None,
) -> str:
    what = what or (
        "storage cannot deliver the data fast enough"
        if fetch
        else "CPU preprocessing (decode/transform) cannot keep up"
    )
    if stall is not None:
        who = (
            f"rank {fx.comm.focus_rank} waited for data {stall:.0%} of its steps"
            if fx.comm.focus_rank is not None
            else f"the trainer waited for data {stall:.0%} of the time"
        )
        if between_epochs:
            who += " between epoch starts"
        src = how.src
        if fx.steps.stall_source == "probe" and fx.loader.config.get("added_by"):
            src += f", added by {fx.loader.config['added_by']}: no code in the trainer"
        summary = f"Input-bound: {who} ({src}); {what}."
    else:
        summary = f"Likely input-bound: {what} (no probe and no GPU to measure the stall)."
    if reasons:
        joined = "; ".join(reasons[:2])
        summary += " " + joined[:1].upper() + joined[1:] + "."
    return summary


def _input_fixes(data: RunData, fx: Facts, how: _StallSource, fetch: bool, tf: bool) -> list[Fix]:
    if tf:  # a tf.data pipeline: its own knobs, not DataLoader arguments
        fixes = (
            _fetch_fixes(data, fx, tf=True) + tf_fetch_fixes(data, fx)
            if fetch
            else tf_prep_fixes(data, fx)
        )
    else:
        fixes = _fetch_fixes(data, fx) if fetch else _prep_fixes(fx)
        fixes += _loader_fixes(fx)
    if not how.measured:
        fixes.append(
            Fix(
                "wrap the loader with stallscope.watch(loader) to measure data wait per step",
                "without the probe the stall is estimated from system "
                "metrics only (lower confidence)",
            )
        )
    return fixes


def _input_note(fx: Facts, tf: bool, how: _StallSource) -> str | None:
    """Why system metrics alone could not have split this stall from compute."""
    if not how.measured:
        return None
    if fx.steps.stall_source == "stacks":
        shares = ", ".join(f"{k} {v:.0%}" for k, v in fx.steps.phase_shares.items())
        times = f" {fx.steps.stack_samples} times" if fx.steps.stack_samples else ""
        return (
            f"no code in the trainer: its training thread's stack was sampled{times} "
            f"({fx.steps.stack_sampler}); where its time went: {shares}."
        )
    if tf:
        return (
            "tf.data prepares elements on threads inside the trainer process: the "
            "probe times each step's wait for its element inside the train "
            "function, which system metrics alone cannot split from compute."
        )
    if not fx.loader.workers:
        return (
            "num_workers=0: loading runs on the training thread, so system metrics "
            "cannot split it from compute; the probe's data-wait timing does."
        )
    return None


def _loader_fixes(fx: Facts) -> list[Fix]:
    fixes: list[Fix] = []
    cfg = fx.loader.config
    if (
        cfg.get("num_workers")
        and cfg.get("persistent_workers") is False
        and fx.steps.epochs >= 2
        and (fx.steps.epoch_start_wait_s or 0) > 1.0
    ):
        fixes.append(
            Fix(
                "persistent_workers=True",
                f"workers restart each epoch: {fx.steps.epoch_start_wait_s:.1f} s gap at "
                "epoch boundaries",
                change={"persistent_workers": True},
            )
        )
    if cfg.get("num_workers") and cfg.get("prefetch_factor") in (1,):
        fixes.append(
            Fix(
                "prefetch_factor=2 (or more)",
                "one batch in flight per worker leaves no slack for slow samples",
                change={"prefetch_factor": 2},
            )
        )
    return fixes


def _steady_stall(data: RunData, fx: Facts) -> float | None:
    """The stall between epoch starts, when input_bound.epoch_start fires (else None)."""
    total = fx.steps.epoch_start_total_s
    if total is None or not rule_epoch_start(data, fx):
        return None
    first: dict[int, int] = {}
    for s in data.steps:  # each rank's first step is its start-up, left out as in the stall
        first[s.rank] = min(first.get(s.rank, s.step), s.step)
    body = [s for s in data.steps if s.step != first[s.rank]]
    wait = sum(s.wait_s for s in body) - total
    wall = sum(s.wait_s + s.host_s for s in body) - total
    return 0.0 if wall <= 0 else round(max(0.0, wait) / wall, 3)


def rule_epoch_start(data: RunData, fx: Facts) -> list[Finding]:
    """input_bound.epoch_start: the first step of every epoch waits ≥ 1 s longer than an
    ordinary step (median over epochs ≥ 1), in ≥ 2 epochs, and those waits add up to ≥ 5% of
    the steps' wall time: DataLoader workers restarted each epoch (no persistent_workers), or a
    dataset or sampler rebuilt each epoch. Caught even when the stall over the whole run is
    small, because it recurs."""
    cost, total = fx.steps.epoch_start_cost_s, fx.steps.epoch_start_total_s
    if cost is None or total is None or fx.steps.epochs < EPOCHS_MIN or cost < EPOCH_COST_S:
        return []
    wall = sum(s.wait_s + s.host_s for s in data.steps)
    if wall <= 0 or total / wall < EPOCH_COST_SHARE:
        return []
    cfg = fx.loader.config
    fixes = []
    gain = round(wall / (wall - total), 2)
    if cfg.get("num_workers") and cfg.get("persistent_workers") is False:
        fixes.append(
            Fix(
                "persistent_workers=True",
                f"workers restart each epoch: {fx.steps.epoch_start_wait_s:.1f} s gap at "
                "epoch boundaries",
                gain,
                {"persistent_workers": True},
            )
        )
    fixes.append(
        Fix(
            "build the dataset, its index and the sampler once, outside the epoch "
            "loop; open files or databases lazily in each worker and keep them",
            "whatever happens at the start of every epoch is paid once per epoch",
        )
    )
    share = total / wall
    return [
        Finding(
            kind=Kind.INPUT_EPOCH_START,
            severity="critical" if share >= STALL_CRIT else "warning",
            confidence=0.8,
            summary=f"Every epoch starts with a {cost:.1f} s wait for the first batch "
            f"({fx.steps.epochs} epochs, {total:.0f} s in all, {share:.0%} of the steps' "
            "time): the input pipeline restarts at each epoch boundary. The speed-up "
            "counts only those waits: a restart also slows the steps around it (forks, "
            "prefetch bursts), so expect at least that much.",
            evidence=fx.evidence(
                "epochs",
                "epoch_start_wait_s",
                "epoch_start_cost_s",
                "epoch_start_total_s",
                "wait_ms_median",
                "workers",
            ),
            fixes=fixes,
            est_speedup=gain,
            rule=f"epoch start cost {cost:.1f} s ≥ 1 s over {fx.steps.epochs} epochs, "
            f"{share:.0%} ≥ 5% of step time",
        )
    ]


def rule_h2d(data: RunData, fx: Facts) -> list[Finding]:
    """h2d_bound: host-to-device copies take ≥ 15% of step time (probe h2d timing)."""
    share = fx.steps.h2d_share
    if share is None or share < STALL_WARN:
        return []
    fixes = []
    if not fx.loader.config.get("pin_memory"):
        fixes.append(
            Fix(
                "pin_memory=True and .to(device, non_blocking=True)",
                "pageable memory is copied twice and blocks the host",
            )
        )
    fixes.append(
        Fix(
            "move less data: send uint8 images and normalise on the GPU",
            f"copies take {share:.0%} of each step",
        )
    )
    h2d_sev: Severity = "critical" if share >= STALL_CRIT else "warning"
    return [
        Finding(
            kind=Kind.H2D_BOUND,
            severity=h2d_sev,
            confidence=0.85,
            summary=f"Host-to-device copies take {share:.0%} of step time.",
            evidence=fx.evidence("h2d_share", "step_ms_median")
            | {"pin_memory": fx.loader.config.get("pin_memory")},
            fixes=fixes,
            est_speedup=stall_cap(share),
            rule=f"h2d share {share:.0%} ≥ {STALL_WARN:.0%}",
        )
    ]


def rule_tf_blind(data: RunData, fx: Facts) -> list[Finding]:
    """data_wait_unknown for a TensorFlow trainer without the probe and without a GPU: tf.data
    prepares elements on threads inside the trainer process, beside the threads that run the
    training step, and neither their names nor their CPU tell the two apart (TF 2.21 leaves
    both on unnamed inter-op threads). The run is never called compute-bound then."""
    if not fx.procs.tf_trainer or fx.steps.stall_source is not None or fx.gpu.gpus:
        return []
    return [
        Finding(
            kind=Kind.DATA_WAIT_UNKNOWN,
            severity="info",
            confidence=0.5,
            summary=f"A TensorFlow trainer at {fx.procs.main_cpu_pct or 0:.0f}% CPU: "
            "tf.data runs its input pipeline on threads inside the trainer, which "
            "system metrics cannot tell from the training step's, so whether it waits "
            "for data is not known without the probe.",
            evidence=fx.evidence(
                "main_cpu_pct", "main_d_share", "host_cpu_median_pct", "disk_util_median_pct"
            ),
            fixes=[
                Fix(
                    "model.fit(..., callbacks=[stallscope.integrations.keras."
                    "StallscopeCallback()]), or stallscope.watch(dataset) in a custom "
                    "loop",
                    "the probe times each step's wait for its element inside the train function",
                )
            ],
            est_speedup=1.0,
            rule="TensorFlow threads (tf_*) in the trainer, no probe, no GPU",
        )
    ]


#: a running run younger than this has not shown whether its loader has worker processes
#: (they start with the first iteration, after the imports and the model's set-up)
YOUNG_RUN_S = 30.0


def rule_loading_in_trainer(data: RunData, fx: Facts) -> list[Finding]:
    """data_wait_unknown for a CPU trainer without DataLoader worker processes, the probe or a
    GPU (PyTorch ``num_workers=0``, a threaded decoder, a hand-written loop): it loads and
    prepares data on its own threads between its steps, and CPU time spent decoding looks
    exactly like CPU time spent computing. The run is never called compute-bound then: a
    ``num_workers=0`` trainer that waited for its own loading 90% of the time looked healthy."""
    if (
        fx.procs.tf_trainer
        or fx.steps.stall_source is not None
        or fx.gpu.gpus
        or fx.loader.workers
        or fx.run.samples < MIN_SAMPLES
    ):
        return []
    ends = [t for s in data.series.values() for t in (s.ts[:1] + s.ts[-1:])]
    sampled = max(ends) - min(ends) if ends else 0.0  # what was seen so far
    if data.meta.get("end") is None and sampled < YOUNG_RUN_S:
        # a run still starting (the verdict so far in `top`): its DataLoader may not have
        # started its workers yet; "it has none" is not claimed before it could be seen
        return []
    read = fx.procs.main_read_kb_s
    reads = (
        f"; it read {units.rate(units.kib(read))} of files itself"
        if read and read >= OWN_READ_KB_S
        else ""
    )
    return [
        Finding(
            kind=Kind.DATA_WAIT_UNKNOWN,
            severity="info",
            confidence=0.5,
            summary="The trainer has no DataLoader worker processes: it loads and "
            f"prepares data on its own threads between its steps{reads}, and system "
            f"metrics cannot tell that time from compute "
            f"({fx.procs.main_cpu_pct or 0:.0f}% CPU), so whether it waits for data "
            "is not known without the probe.",
            evidence=fx.evidence(
                "main_cpu_pct",
                "main_read_kb_s",
                "main_d_share",
                "workers",
                "host_cpu_median_pct",
                "disk_util_median_pct",
            ),
            fixes=[
                Fix(
                    "wrap the loader with stallscope.watch(loader)",
                    "the probe times each step's wait for its batch",
                ),
                Fix(
                    "DataLoader(num_workers=N): load in worker processes beside the step",
                    "loading then overlaps the step instead of adding to it (and system "
                    "metrics can see it)",
                ),
            ],
            est_speedup=1.0,
            rule="no DataLoader workers, no probe, no GPU, not TensorFlow",
        )
    ]
