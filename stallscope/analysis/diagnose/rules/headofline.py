"""input_bound.head_of_line: slow samples hold up the batches.

A DataLoader hands batches over in the sampler's order (``in_order=True``, its default): a batch
that holds a slow sample (a large image, a long clip) keeps every ready batch of the other
workers behind it, and those workers stop once their ``prefetch_factor`` batches are done. The
trainer then waits in bursts (long waits on a few steps, none on the rest) while the workers sit
idle part of the time. The same mean cost without the tail is ``input_bound.prep``: every step
waits a little and the workers are busy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stallscope import units
from stallscope.analysis.diagnose.model import Finding, Fix, Kind, RunData, Severity
from stallscope.analysis.diagnose.rules.common import (
    STALL_CRIT,
    STALL_WARN,
    _workers_now,
)
from stallscope.analysis.diagnose.rules.scores import fetch_prep_scores
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import others_taking_cores
from stallscope.analysis.facts.steps import TOP_STEPS
from stallscope.loadermodel import (
    MIN_GAIN,
    ORDER_SIM_BATCHES,
    in_order_speedup,
    loader_time,
    stall_cap,
)
from stallscope.sources.stacks.fetches import draw_costs

__all__ = ["HeadOfLine", "head_of_line", "rule_head_of_line"]

#: the share of the data wait the longest-waiting TOP_STEPS of the steps must hold: the waits
#: come in bursts. Measured 2026-11-29 (2 cores, examples/train_cpu.py, 2 workers, batches of
#: 4, 2% of the samples 41x slower): 0.81-0.83 in order; the same mean cost with no tail
#: 0.32-0.46, the tail with in_order=False 0.55-0.56
BURST_SHARE = 0.7
#: the fewest workers head-of-line blocking needs (one worker hands its batches over in order)
MIN_WORKERS = 2
#: PyTorch from which DataLoader(in_order=False) exists
IN_ORDER_SINCE = (2, 6)
#: batches the workers' own timing must hold before their cost distribution is read
MIN_TIMED_BATCHES = 40
#: a batch cost distribution is heavy-tailed when its 99th percentile is this many times its
#: median. Measured 2026-11-29 (2 cores, the scenario above, the workers' own timing): ×8.9
#: with the tail, ×2.1 for the same mean cost without it (CPU contention alone)
TAIL_RATIO = 5.0


@dataclass(frozen=True)
class HeadOfLine:
    """What the run shows of slow samples holding up the batches."""

    stall: float  #: the trainer's data wait share (probe, or the sampled stacks')
    top_share: float  #: the share of that wait in the longest-waiting TOP_STEPS of the steps
    workers: int
    busy: float  #: a worker's CPU, share of a core (mean over the workers)
    cores: float  #: the cores the workers could use with none of them idle
    estimate: float  #: the speed-up with in_order=False (the smaller of the two below)
    #: the speed-up with every worker kept busy: the cores' bound
    cores_estimate: float
    #: the workers' own timing of each batch (None without it): median and 99th percentile
    #: (ms), the slowest 5%'s share of the loading time, and the speed-up the loader model
    #: simulates from that distribution with in_order=False, and with prefetch_factor doubled
    cost_p50_ms: float | None = None
    cost_p99_ms: float | None = None
    tail_share: float | None = None
    simulated: float | None = None
    simulated_prefetch: float | None = None


def head_of_line(fx: Facts) -> HeadOfLine | None:
    """The evidence when the trainer's data wait (≥ STALL_WARN: the probe's, or with no probe
    the sampled stacks' with the batches the in-trainer sampler timed, ``step_timing_source``
    "counted_batches", and then the workers' own timing required) comes in bursts (the
    longest-waiting :data:`~stallscope.analysis.facts.steps.TOP_STEPS` of the steps hold ≥
    :data:`BURST_SHARE` of it), the loader has ≥ :data:`MIN_WORKERS` workers handing batches
    over in order, the loading is CPU preparation (not fetch), and keeping every worker busy
    would give ≥ MIN_GAIN; else None.

    The estimate: today the workers use W × busy cores and deliver today's rate; with none of
    them idle (in_order=False: no ready batch waits behind a slow one) they use the cores they
    can get, min(W, the host's cores less other processes' and the trainer's own), and deliver
    that much more, so the batches' mean cost alone sets the pace. Never more than the whole
    data wait gone: the wait beyond what the mean cost explains is what goes."""
    stall = fx.steps.stall_fraction
    top = fx.steps.wait_top_share
    # no probe: the sampled stacks' wait, spread as the batches the sampler timed were
    counted = fx.steps.stall_source == "stacks" and fx.steps.step_timing_source == "counted_batches"
    if (
        (fx.steps.stall_source != "probe" and not counted)
        or stall is None
        or stall < STALL_WARN
        or top is None
        or top < BURST_SHARE
    ):
        return None
    nw = _workers_now(fx) or 0
    if nw < MIN_WORKERS or fx.loader.config.get("in_order") is False:
        return None
    cpu = fx.loader.worker_cpu_pct
    cores_all = fx.host.logical_cores or fx.host.physical_cores
    if cpu is None or cpu <= 0 or not cores_all:
        return None
    fs, _fr, ps, _pr = fetch_prep_scores(fx)
    if fs > ps:
        return None  # slow reads: the fetch side's finding
    busy = cpu / 100.0
    free = cores_all - others_taking_cores(fx) - (fx.procs.main_cpu_pct or 0.0) / 100
    cores = min(float(nw), free)
    bound = round(min(stall_cap(stall), cores / (nw * busy)), 2)
    timed = _timed_costs(fx, nw)
    if timed is False:
        return None  # the workers timed their batches: they cost alike, no tail to hold up
    if counted and timed is None:
        return None  # no probe: the workers' own timing must show the tail
    est = bound if timed is None or timed[0] is None else min(bound, timed[0])
    if est < MIN_GAIN:
        return None
    return HeadOfLine(
        stall,
        top,
        nw,
        busy,
        round(cores, 2),
        est,
        bound,
        fx.loader.batch_cost_p50_ms if timed else None,
        fx.loader.batch_cost_p99_ms if timed else None,
        fx.loader.batch_cost_tail_share if timed else None,
        timed[0] if timed else None,
        timed[1] if timed else None,
    )


def _timed_costs(
    fx: Facts, workers: int
) -> tuple[float | None, float | None] | Literal[False] | None:
    """What the workers' own timing of each batch says: None without it (fewer than
    :data:`MIN_TIMED_BATCHES`), False when the costs have no heavy tail (p99 under
    :data:`TAIL_RATIO` × the median), else the speed-ups the loader model simulates from the
    distribution (:func:`~stallscope.loadermodel.loader_time`: PyTorch's dispatch, this
    loader's workers and prefetch_factor, a step computing its median less its median wait)
    with in_order=False and with prefetch_factor doubled."""
    p50, p99 = fx.loader.batch_cost_p50_ms, fx.loader.batch_cost_p99_ms
    if fx.loader.batches_timed < MIN_TIMED_BATCHES or p50 is None or p99 is None or p50 <= 0:
        return None
    if p99 < TAIL_RATIO * p50:
        return False
    costs = draw_costs([fx.loader.batch_cost_hist], ORDER_SIM_BATCHES)
    step, wait = fx.steps.step_ms_median, fx.steps.wait_ms_median
    compute_s = max((step or 0.0) - (wait or 0.0), 0.0) / 1000
    pf = _prefetch(fx)
    reordered = in_order_speedup(costs, workers, compute_s, pf)
    now = loader_time(costs, workers, compute_s, pf, in_order=True)
    more = loader_time(costs, workers, compute_s, pf * 2, in_order=True)
    return reordered, (round(now / more, 2) if more > 0 else None)


def _prefetch(fx: Facts) -> int:
    """The loader's prefetch_factor (PyTorch's default, 2, when the probe did not say)."""
    pf = fx.loader.config.get("prefetch_factor")
    return pf if type(pf) is int and pf > 0 else 2


def _in_order_known(fx: Facts) -> bool | None:
    """Whether the trainer's PyTorch has DataLoader(in_order=...) (None: its version unknown)."""
    version = fx.loader.config.get("torch")
    if not isinstance(version, str):
        return None
    try:
        major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return None
    return (major, minor) >= IN_ORDER_SINCE


def rule_head_of_line(data: RunData, fx: Facts) -> list[Finding]:
    """input_bound.head_of_line: see :func:`head_of_line`. It leads where it fires:
    rule_input_bound then leaves its input_bound.prep out (the same wait, explained by the tail
    rather than by the mean cost)."""
    hol = head_of_line(fx)
    if hol is None:
        return []
    cfg = fx.loader.config
    pf_now = _prefetch(fx)
    idle = 1.0 - hol.busy
    p99 = fx.steps.wait_ms_p99
    med = fx.steps.wait_ms_median
    tail = (
        f"; one step in a hundred waits ≥ {p99:.0f} ms, the median step {med:.1f} ms"
        if p99 is not None and med is not None
        else ""
    )
    fixes = _head_of_line_fixes(fx, hol, pf_now)
    severity: Severity = "critical" if hol.stall >= STALL_CRIT else "warning"
    ev = fx.evidence(
        "stall_fraction",
        "stall_source",
        "wait_top_share",
        "wait_ms_p99",
        "wait_ms_median",
        "step_ms_median",
        "step_timing_source",
        "workers",
        "worker_cpu_pct",
        "worker_runq_pct",
        "main_cpu_pct",
        "others_cpu_cores",
        "niced_others_cpu_cores",
        "logical_cores",
        "batches_timed",
        "batch_cost_p50_ms",
        "batch_cost_p99_ms",
        "batch_cost_tail_share",
    )
    ev.update(
        in_order=cfg.get("in_order", True),
        prefetch_factor=pf_now,
        worker_idle_share=round(idle, 3),
        worker_cores_free=hol.cores,
        cores_estimate=hol.cores_estimate,
        simulated_speedup=hol.simulated,
    )
    return [
        Finding(
            kind=Kind.INPUT_HEAD_OF_LINE,
            severity=severity,
            confidence=0.8,
            summary=(
                f"Slow samples hold up the batches: the trainer waited for data "
                f"{hol.stall:.0%} of the time, in bursts ({hol.top_share:.0%} of the wait "
                f"on the longest-waiting {TOP_STEPS:.0%} of the steps{tail}), while its "
                f"{hol.workers} workers sat idle {idle:.0%} of the time: the loader hands "
                "batches over in order, so a batch with a slow sample keeps the ready ones "
                f"behind it.{_costs_text(hol)}"
            ),
            evidence=ev,
            fixes=fixes,
            est_speedup=hol.estimate,
            rule=(
                f"data wait {hol.stall:.0%} ≥ {STALL_WARN:.0%}; {hol.top_share:.0%} of it on "
                f"{TOP_STEPS:.0%} of the steps ≥ {BURST_SHARE:.0%}; {hol.workers} workers in "
                f"order, busy {hol.busy:.0%}{_costs_rule(hol)}; gain ×{hol.estimate:.2f} ≥ "
                f"×{MIN_GAIN:.2f}"
            ),
        )
    ]


def _costs_text(hol: HeadOfLine) -> str:
    """The workers' own timing of the batches, in words ("" without it)."""
    if hol.cost_p50_ms is None or hol.cost_p99_ms is None:
        return ""
    share = (
        f" (the slowest 5% took {hol.tail_share:.0%} of the loading time)"
        if (hol.tail_share is not None)
        else ""
    )
    return (
        f" The workers timed each batch: {units.duration(hol.cost_p50_ms / 1000)} at the "
        f"median, {units.duration(hol.cost_p99_ms / 1000)} at the 99th percentile{share}."
    )


def _costs_rule(hol: HeadOfLine) -> str:
    if hol.cost_p50_ms is None or hol.cost_p99_ms is None:
        return ""
    ratio = hol.cost_p99_ms / hol.cost_p50_ms
    return f"; a batch's p99 cost ×{ratio:.1f} its median ≥ ×{TAIL_RATIO:.0f}"


def _head_of_line_fixes(fx: Facts, hol: HeadOfLine, pf_now: int) -> list[Fix]:
    """The fixes, in order: in_order=False (or the PyTorch that has it), more batches in
    flight, cheaper slow samples."""
    cfg = fx.loader.config
    has = _in_order_known(fx)
    changes = (
        "batches then come in the order they are ready, not the sampler's: each "
        "sample is still seen once an epoch, but the order of batches changes (keep "
        "in_order=True where it matters: resuming mid-epoch by batch index, runs that "
        "must repeat exactly)"
    )
    why = (
        f"{hol.workers} workers busy {hol.busy:.0%} of the time: with none of them idle "
        f"they use {hol.cores:.1f} core(s) instead of {hol.workers * hol.busy:.1f}, and the "
        f"batches' mean cost alone sets the pace: ×{hol.cores_estimate:.2f} (the wait beyond "
        "what the mean cost explains goes); "
        + (
            f"PyTorch's dispatch simulated with the batch costs the workers measured: "
            f"×{hol.simulated:.2f}; the smaller is the estimate; "
            if hol.simulated is not None
            else ""
        )
        + changes
    )
    first = (
        Fix("DataLoader(in_order=False)", why, hol.estimate, {"in_order": False})
        if has is not False
        else Fix(
            "upgrade to PyTorch ≥ 2.6 and set DataLoader(in_order=False)",
            why + f" (this run's PyTorch is {cfg.get('torch')})",
        )
    )
    fixes = [
        first,
        Fix(
            f"prefetch_factor {pf_now} → {pf_now * 2}",
            "more batches in flight for each worker: the others keep working while one "
            "is held up by a slow sample (costs memory: batches × workers held at once)"
            + (
                "; simulated with the measured batch costs, in order: "
                f"×{hol.simulated_prefetch:.2f}"
                if hol.simulated_prefetch is not None
                else ""
            ),
            hol.simulated_prefetch
            if hol.simulated_prefetch is not None and hol.simulated_prefetch >= MIN_GAIN
            else None,
            change={"prefetch_factor": pf_now * 2},
        ),
        Fix(
            "precompute the slow samples' work once (offline, or cache their transformed "
            "form) so that no sample costs many times the others",
            "a few samples take most of the preparation time",
        ),
        Fix(
            "split the slow samples (long clips, large images, long documents) into "
            "pieces of ordinary cost, or group them into batches of their own",
            "a batch costs as much as its slowest sample",
        ),
    ]
    return fixes
