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
from stallscope.analysis.facts.build import others_taking_cores, spare_cores
from stallscope.loadermodel import stall_cap

__all__ = ["THREADS", "Gil", "ThreadLimits", "gil", "rule_thread_loader", "thread_stall"]


@dataclass(frozen=True)
class ThreadLimits:
    """The lines of the thread-loader rule (:func:`rule_thread_loader`)."""

    #: the training thread's waits on loader threads, as a share of its data wait: the wait
    #: is on a thread loader
    wait_on_threads: float = 0.5
    min_threads: int = 2  #: input_bound.gil: loader threads that worked (one cannot contend)
    #: ... their thread-seconds preparing (not idle), share of all of theirs (threads waiting
    #: for the GIL after a read are seen on the read's line: not more than reading is asked)
    prep_share: float = 0.3
    min_busy: float = 1.5  #: ... loader threads working at once (mean over the training)
    #: ... the sampler's mean wait for the GIL per wake (ms), its run-queue wait left out: 80%
    #: of CPython's switch interval (5 ms), the most a thread running Python holds the GIL
    #: against a waiter. Measured (examples/train_threads.py, 4 threads, 2 cores, others busy):
    #: 4-12 ms a window preparing in Python, 0.3-3.4 sorting with NumPy
    min_gil_wait_ms: float = 4.0
    max_process_cores: float = 1.3  #: ... the trainer process's CPU stays near one core
    min_more_cores: float = 0.5  #: ... while the host has this many cores more than that


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
    gil_ms: float  #: the sampler's mean wait for the GIL per wake
    process: float  #: the trainer process's CPU, in cores
    cpus: int  #: the host's cores
    estimate: float  #: the speed-up with the prep in processes


def gil(fx: Facts, stall: float) -> Gil | None:
    """The evidence of Python-bound prep in threads sharing one GIL: ≥ ``min_threads`` loader
    threads, preparing ≥ ``prep_share`` of their time, ≥ ``min_busy`` of them at work at once,
    the GIL contended (the sampler waited ≥ ``min_gil_wait_ms`` for it per wake, its run-queue
    wait left out: a busy host's threads wait for a CPU instead), the process's CPU ≤
    ``max_process_cores`` on a host with ≥ ``min_more_cores`` cores more; else None.

    The estimate: in processes the prep gets a core each, up to the threads at work and the
    cores other processes leave, against the process's CPU now; at most the whole wait gone."""
    prep = fx.loader.thread_prep_share or 0.0
    busy, gil_ms = fx.loader.thread_busy, fx.loader.thread_gil_wait_ms
    threads = fx.loader.loader_threads
    process = (fx.procs.main_cpu_pct or 0.0) / 100.0
    cpus = fx.host.logical_cores or fx.host.physical_cores or 0
    if (
        threads < THREADS.min_threads
        or prep < THREADS.prep_share
        or busy is None
        or busy < THREADS.min_busy
        or gil_ms is None
        or gil_ms < THREADS.min_gil_wait_ms
        or not fx.procs.main_cpu_pct
        or process > THREADS.max_process_cores
        or cpus - process < THREADS.min_more_cores
    ):
        return None
    free = cpus - others_taking_cores(fx)
    gain = min(float(threads), busy, max(free, process)) / max(process, 0.1)
    est = max(1.0, min(stall_cap(stall), gain))
    cores = fx.loader.thread_cpu_cores or 0.0
    return Gil(busy, cores, gil_ms, round(process, 2), cpus, round(est, 2))


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
    "thread_gil_wait_ms",
    "thread_wait_share",
    "main_cpu_pct",
    "host_cpu_median_pct",
    "logical_cores",
    "others_cpu_cores",
    "niced_others_cpu_cores",
)


def rule_thread_loader(data: RunData, fx: Facts) -> list[Finding]:
    """input_bound.fetch / input_bound.prep / input_bound.gil for a thread loader: fires when
    the training thread's data wait is on loader threads (:func:`thread_stall`). The loader
    threads' samples decide: reading more than preparing is fetch; preparing with the GIL's
    evidence (:func:`gil`) is gil; else prep."""
    stall = thread_stall(fx)
    if stall is None:
        return _gil_on_the_training_thread(fx)
    fetch, prep = fx.loader.thread_fetch_share or 0.0, fx.loader.thread_prep_share or 0.0
    threads = fx.loader.loader_threads
    g = gil(fx, stall)
    kind = Kind.INPUT_GIL if g else Kind.INPUT_FETCH if fetch > prep else Kind.INPUT_PREP
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
        spare = spare_cores(fx)
        ev.update(process_cores=g.process)
        if spare is not None:
            ev["spare_cores"] = round(spare, 2)
        summary = (
            f"{head}: {g.busy:.1f} threads at work at once got {g.cores:.2f} core(s) between "
            f"them, the process {g.process:.2f} of the host's {g.cpus}, and each wake of the "
            f"sampler waited {g.gil_ms:.1f} ms for the GIL: Python-bound prep in threads "
            "shares one GIL, so more threads cannot help."
        )
        rule += (
            f"; {g.busy:.1f} at work at once ≥ {THREADS.min_busy:g}; GIL wait {g.gil_ms:.1f} ms "
            f"a wake ≥ {THREADS.min_gil_wait_ms:g} ms; process {g.process:.2f} ≤ "
            f"{THREADS.max_process_cores:g} core(s) of {g.cpus}"
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


def _gil_on_the_training_thread(fx: Facts) -> list[Finding]:
    """input_bound.gil where the training thread waits little for data: loader threads
    preparing in Python hold the GIL that the training thread's own step needs, so the step
    runs slower instead (each of its Python calls waits its turn for the GIL) and the loader
    keeps up with a slowed training. The same evidence as :func:`gil`, measured on the training
    thread's samples (probe or sampled stacks); the gain is not estimated: the step's share
    spent waiting for the GIL is not measured, only the sampler's own wait."""
    if fx.steps.stall_source not in ("probe", "stacks") or not fx.loader.loader_threads:
        return []
    g = gil(fx, fx.steps.stall_fraction or 0.0)
    if g is None:
        return []
    ev = fx.evidence(*_EVIDENCE)
    ev.update(process_cores=g.process)
    stall = fx.steps.stall_fraction or 0.0
    return [
        Finding(
            kind=Kind.INPUT_GIL,
            severity="warning",
            confidence=0.7,
            summary=(
                f"The loader threads hold the GIL the training thread needs: it waited for "
                f"data only {stall:.0%} of the time, but {g.busy:.1f} loader threads preparing "
                f"in Python at once got {g.cores:.2f} core(s) of the process's {g.process:.2f}, "
                f"and each wake of the sampler waited {g.gil_ms:.1f} ms for the GIL: every "
                "Python call of the training step waits its turn, so the steps run slower."
            ),
            evidence=ev,
            fixes=_fixes(Kind.INPUT_GIL, fx.loader.loader_threads, None),
            rule=(
                f"data wait {stall:.0%} < {STALL_WARN:.0%}; {fx.loader.loader_threads} loader "
                f"threads, {g.busy:.1f} at work at once ≥ {THREADS.min_busy:g}; GIL wait "
                f"{g.gil_ms:.1f} ms a wake ≥ {THREADS.min_gil_wait_ms:g} ms; process "
                f"{g.process:.2f} ≤ {THREADS.max_process_cores:g} core(s) of {g.cpus}"
            ),
        )
    ]


def _fixes(kind: Kind, threads: int, est: float | None) -> list[Fix]:
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
