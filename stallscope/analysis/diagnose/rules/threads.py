"""Loaders built on threads (docs/diagnosis.md "Thread loaders and the GIL"): a
``ThreadPoolExecutor`` prefetching batches into a queue, MONAI's ``ThreadDataLoader``,
torchdata's nodes, a streaming dataset's reader.

The training thread waits in ``queue.get`` / ``Future.result`` while the loader threads work;
the in-process sampler samples those threads too (:mod:`stallscope.sources.stacks.threads`), so
fetch vs prep is told from where the loader threads' samples are (reading, or any other work),
not from DataLoader worker processes, which there are none of. When the loader threads prepare
in Python, they share one GIL: busy by their stacks, they get about one core between them while
the host leaves cores idle, and more threads cannot help (``input_bound.gil``): processes can,
or prep moved into calls that release the GIL.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.analysis.diagnose.model import Finding, Fix, Kind, RunData, Severity
from stallscope.analysis.diagnose.rules.common import STALL_CRIT, STALL_WARN
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import spare_cores
from stallscope.loadermodel import stall_cap

__all__ = ["THREADS", "Gil", "ThreadLimits", "gil", "rule_thread_loader", "thread_stall"]


@dataclass(frozen=True)
class ThreadLimits:
    """The lines of the thread-loader rule (:func:`rule_thread_loader`)."""

    #: the training thread's waits on loader threads, as a share of its data wait: the wait
    #: is on a thread loader
    wait_on_threads: float = 0.5
    min_threads: int = 2  #: input_bound.gil: loader threads that worked (one cannot contend)
    #: ... their thread-seconds preparing (not reading, not idle), share of all of theirs
    prep_share: float = 0.5
    min_busy: float = 1.5  #: ... loader threads working at once (mean over the training)
    #: ... the CPU they got per thread working: busy by their stacks, running less than this
    max_cpu_per_busy: float = 0.6
    max_process_cores: float = 1.3  #: ... the trainer process's CPU stays near one core
    min_spare_cores: float = 0.5  #: ... while the host leaves this many cores idle


THREADS = ThreadLimits()


def thread_stall(fx: Facts) -> float | None:
    """The training thread's data wait (≥ STALL_WARN, measured: probe or sampled stacks) when
    it is a wait on loader threads (≥ :attr:`ThreadLimits.wait_on_threads` of it spent in
    ``queue.get`` / ``Future.result`` while loader threads worked); None otherwise. Where it
    is set, rule_input_bound leaves the verdict to :func:`rule_thread_loader`."""
    stall = fx.steps.stall_fraction
    waited = fx.loader.thread_wait_share
    if (
        fx.steps.stall_source not in ("probe", "stacks")
        or stall is None
        or stall < STALL_WARN
        or not fx.loader.loader_threads
        or waited is None
        or waited < THREADS.wait_on_threads * stall
    ):
        return None
    return stall


@dataclass(frozen=True)
class Gil:
    """What the run shows of loader threads held back by the GIL."""

    busy: float  #: loader threads working at once
    cores: float  #: the CPU they got, in cores
    process: float  #: the trainer process's CPU, in cores
    spare: float  #: cores the host left idle
    estimate: float  #: the speed-up with the prep in processes on the idle cores


def gil(fx: Facts, stall: float) -> Gil | None:
    """The evidence of Python-bound prep in threads sharing one GIL: ≥ ``min_threads`` loader
    threads, mostly preparing (≥ ``prep_share``, more than reading), ≥ ``min_busy`` of them
    working at once yet getting ≤ ``max_cpu_per_busy`` of a core each, the process's CPU ≤
    ``max_process_cores`` while the host leaves ≥ ``min_spare_cores`` idle; else None."""
    prep, fetch = fx.loader.thread_prep_share or 0.0, fx.loader.thread_fetch_share or 0.0
    busy, cores = fx.loader.thread_busy, fx.loader.thread_cpu_cores
    threads = fx.loader.loader_threads
    process = (fx.procs.main_cpu_pct or 0.0) / 100.0
    spare = spare_cores(fx)
    if (
        threads < THREADS.min_threads
        or prep < THREADS.prep_share
        or prep <= fetch
        or busy is None
        or busy < THREADS.min_busy
        or cores is None
        or cores > THREADS.max_cpu_per_busy * busy
        or not fx.procs.main_cpu_pct
        or process > THREADS.max_process_cores
        or spare is None
        or spare < THREADS.min_spare_cores
    ):
        return None
    # in processes the prep gets a core each, up to the cores the threads left idle
    gain = min(float(threads), busy, process + spare) / max(process, 0.1)
    return Gil(busy, cores, round(process, 2), round(spare, 2), min(stall_cap(stall), gain))


_EVIDENCE = (
    "stall_fraction",
    "stall_source",
    "phase_shares",
    "loader_threads",
    "thread_fetch_share",
    "thread_prep_share",
    "thread_idle_share",
    "thread_busy",
    "thread_cpu_cores",
    "thread_wait_share",
    "main_cpu_pct",
    "host_cpu_median_pct",
    "logical_cores",
    "others_cpu_cores",
)


def rule_thread_loader(data: RunData, fx: Facts) -> list[Finding]:
    """input_bound.fetch / input_bound.prep / input_bound.gil for a thread loader: fires when
    the training thread's data wait is on loader threads (:func:`thread_stall`). The loader
    threads' samples decide: reading more than preparing is fetch; preparing with the GIL's
    evidence (:func:`gil`) is gil; else prep."""
    stall = thread_stall(fx)
    if stall is None:
        return []
    fetch, prep = fx.loader.thread_fetch_share or 0.0, fx.loader.thread_prep_share or 0.0
    threads = fx.loader.loader_threads
    g = None if fetch > prep else gil(fx, stall)
    kind = Kind.INPUT_FETCH if fetch > prep else Kind.INPUT_GIL if g else Kind.INPUT_PREP
    ev = fx.evidence(*_EVIDENCE)
    waited = fx.loader.thread_wait_share or 0.0
    head = (
        f"The training thread waited for data {stall:.0%} of the time ({waited:.0%} in "
        f"queue.get / Future.result on its {threads} loader thread(s)); the loader "
        f"threads spent {fetch:.0%} of their time reading, {prep:.0%} preparing"
    )
    rule = (
        f"data wait {stall:.0%} ≥ {STALL_WARN:.0%}; {waited:.0%} of the time waiting on loader "
        f"threads ≥ {THREADS.wait_on_threads:.0%} of the wait; loader threads read {fetch:.0%} "
        f"vs prepare {prep:.0%}"
    )
    est = stall_cap(stall)
    if g is not None:
        ev.update(process_cores=g.process, spare_cores=g.spare)
        summary = (
            f"{head}: {g.busy:.1f} threads at work at once got {g.cores:.2f} core(s) between "
            f"them, the process {g.process:.2f} core(s), while the host left {g.spare:.1f} "
            "core(s) idle: Python-bound prep in threads shares one GIL, so more threads "
            "cannot help."
        )
        rule += (
            f"; {g.busy:.1f} working at once ≥ {THREADS.min_busy:g} with {g.cores:.2f} core(s) "
            f"≤ {THREADS.max_cpu_per_busy:g} each; process {g.process:.2f} ≤ "
            f"{THREADS.max_process_cores:g} core(s); {g.spare:.1f} idle ≥ "
            f"{THREADS.min_spare_cores:g}"
        )
        est = g.estimate
    elif kind == Kind.INPUT_FETCH:
        summary = f"{head}: the loader threads wait on their reads."
    else:
        summary = f"{head}: the loader threads' CPU work cannot keep up."
    severity: Severity = "critical" if stall >= STALL_CRIT else "warning"
    return [
        Finding(
            kind=kind,
            severity=severity,
            confidence=0.8 if g is not None else 0.75,
            summary=summary,
            evidence=ev,
            fixes=_fixes(kind, threads, est),
            est_speedup=round(est, 2),
            rule=rule,
        )
    ]


def _fixes(kind: Kind, threads: int, est: float) -> list[Fix]:
    """Fixes that fit a thread loader."""
    if kind == Kind.INPUT_FETCH:
        return [
            Fix(
                f"more reads in flight: {threads} → {threads * 2} loader threads (or more "
                "requests per thread)",
                "reads release the GIL: threads overlap I/O well, and the storage answers each "
                "read slower than the step needs it",
                est,
            ),
            Fix(
                "copy the dataset to faster local storage (NVMe, the page cache), or pack it "
                "into large shards read in sequence (stallscope pack)",
                "the loader threads spend their time waiting on reads",
            ),
        ]
    if kind == Kind.INPUT_GIL:
        return [
            Fix(
                "prepare in processes, not threads: torch DataLoader(num_workers=N) or a "
                "concurrent.futures.ProcessPoolExecutor",
                "each process has its own GIL: the prep then runs on the cores the threads "
                "left idle",
                est,
            ),
            Fix(
                "move the per-sample Python loops into calls that release the GIL (vectorised "
                "NumPy, PIL, torch ops)",
                "threads then run in parallel while they are inside those calls",
            ),
        ]
    return [
        Fix(
            "move the prep into calls that release the GIL (NumPy, PIL, torch ops) or into "
            "processes (DataLoader(num_workers=N), ProcessPoolExecutor)",
            "the loader threads' CPU work is what the training waits for",
            est,
        ),
        Fix(
            "cache the prepared samples (or precompute them offline)",
            "work done once is not redone every epoch",
        ),
    ]
