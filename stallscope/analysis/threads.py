"""The trainer's loader threads, from the records' ``threads`` part (the in-process sampler:
:mod:`stallscope.sources.stacks.threads`): how many worked, their fetch / prep / idle shares,
how many worked at once, the CPU they got, and how much of the training thread's time was spent
waiting on them. Pure functions over the records of ``<run>/stacks/``; the facts
(:class:`~stallscope.analysis.facts.LoaderFacts`) hold the figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stallscope.analysis.stacks import ProcPhases
from stallscope.sources.stacks.threads import LOADER_PHASES

__all__ = ["ThreadLoader", "thread_facts", "thread_loader"]


@dataclass(frozen=True)
class ThreadLoader:
    """One trainer process's loader threads over the training."""

    pid: int
    threads: int  #: the most loader threads that worked in one window
    seconds: Mapping[str, float]  #: thread-seconds per loader phase (fetch, prep, idle)
    cpu_s: float  #: their CPU seconds
    wait_s: float  #: the training thread's seconds waiting on them
    #: the sampler's wait for the GIL (s) over its wakes (None: schedstat not read)
    gil_s: float | None
    wakes: int
    training_s: float  #: the training thread's sampled training seconds in those windows

    def share(self, phase: str) -> float:
        t = sum(self.seconds.values())
        return self.seconds.get(phase, 0.0) / t if t > 0 else 0.0

    @property
    def busy_s(self) -> float:
        """Thread-seconds fetching or preparing."""
        return self.seconds.get("fetch", 0.0) + self.seconds.get("prep", 0.0)


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else 0.0


def thread_loader(
    records: Iterable[Mapping[str, Any]], proc: ProcPhases, training_s: float
) -> ThreadLoader | None:
    """``proc``'s loader threads from its records (None: none worked). ``training_s``: its
    training thread's sampled seconds (:attr:`ProcPhases.total_s`)."""
    n = 0
    secs = dict.fromkeys(LOADER_PHASES, 0.0)
    cpu = wait = 0.0
    gil: float | None = None
    wakes = 0
    for rec in records:
        part = rec.get("threads")
        if rec.get("pid") != proc.pid or not isinstance(part, Mapping):
            continue
        count = part.get("n")
        if type(count) is int and 0 < count < 1 << 20:
            n = max(n, count)
        s = part.get("s")
        for p in LOADER_PHASES:
            secs[p] += _num(s.get(p)) if isinstance(s, Mapping) else 0.0
        cpu += _num(part.get("cpu_s"))
        wait += _num(part.get("wait_s"))
        w = part.get("wakes")
        if "gil_s" in part and type(w) is int and 0 < w < 1 << 20:
            gil = (gil or 0.0) + _num(part.get("gil_s"))
            wakes += w
    if not n or secs["fetch"] + secs["prep"] <= 0:
        return None
    return ThreadLoader(proc.pid, n, secs, cpu, wait, gil, wakes, training_s)


def thread_facts(sig: Any, records: Sequence[Mapping[str, Any]], procs: list[ProcPhases]) -> None:
    """The loader-thread facts of the trainer process whose training thread waited on its
    loader threads the most (``sig``: the facts' draft)."""
    best: ThreadLoader | None = None
    for p in procs:
        tl = thread_loader(records, p, p.total_s)
        if tl is not None and (best is None or tl.wait_s > best.wait_s):
            best = tl
    if best is None or best.training_s <= 0:
        return
    sig.loader_threads = best.threads
    sig.thread_fetch_share = round(best.share("fetch"), 3)
    sig.thread_prep_share = round(best.share("prep"), 3)
    sig.thread_idle_share = round(best.share("idle"), 3)
    sig.thread_busy = round(best.busy_s / best.training_s, 2)
    sig.thread_cpu_cores = round(best.cpu_s / best.training_s, 2)
    sig.thread_wait_share = round(min(1.0, best.wait_s / best.training_s), 3)
    if best.gil_s is not None and best.wakes:
        sig.thread_gil_wait_ms = round(1000.0 * best.gil_s / best.wakes, 2)
