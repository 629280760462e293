"""One trial: build a DataLoader with one configuration, run it for a time window as a training
loop would (``next(batch)`` then the step), and measure what it delivered and what it cost.

The loop times ``next()`` the way the probe does (the data wait) and the step separately; a
sampler thread reads the CPU time, RSS and bytes read of this process and its DataLoader
workers (psutil) every 0.2 s."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from stallscope.sources.host import read_devices, swap_ins
from stallscope.sources.others import Snapshot, busiest_others, cpu_snapshot

#: a trial whose rate so far is below this share of the best one is cut short ("clearly slower")
CUT_SHARE = 0.6


class Overtime(KeyboardInterrupt):
    """Raised in the main thread when ``tune`` runs far past its budget: the dataset hangs in
    this process (at import, or in ``__getitem__`` of a ``num_workers=0`` trial). A
    KeyboardInterrupt, so the search stops as on Ctrl-C and keeps what it found."""


@dataclass
class Trial:
    """The outcome of one configuration."""

    config: dict[str, Any]
    status: str = "ok"  # ok | cut | failed | rejected | interrupted
    reason: str = ""
    samples_per_s: float | None = None
    data_wait_share: float | None = None
    #: CPU of this process and its workers, % of one core
    cpu_pct: float | None = None
    #: CPU of the DataLoader workers alone, % of one core per worker (None without workers)
    worker_cpu_pct: float | None = None
    #: RSS of this process and its workers together, MiB (peak of the samples)
    rss_mib: float | None = None
    #: the largest worker's RSS, MiB (what one more worker costs)
    worker_rss_mib: float | None = None
    #: seconds from iter(loader) to the first batch (worker start-up), paid every epoch
    #: unless persistent_workers
    startup_s: float | None = None
    #: CPU seconds spent per sample by the loading side (workers, or the trainer when 0)
    cpu_ms_per_sample: float | None = None
    read_mb_s: float | None = None
    #: bytes read from storage per sample, by the loading and the trainer together
    read_bytes_per_sample: float | None = None
    #: block devices (``major:minor``) whose read counters rose during the trial
    read_devices: list[str] = field(default_factory=list)
    #: the training step's mean time in this trial, ms (it slows when workers take its cores)
    step_ms: float | None = None
    #: bytes swapped in during the trial
    swap_in: int = 0
    #: the busiest processes outside this one and its workers during the trial, ``{"pid",
    #: "name", "cores"}`` (sources/others.py): another job's load lowers the trial's rate
    busy_others: list[dict[str, Any]] = field(default_factory=list)
    batches: int = 0
    samples: int = 0
    seconds: float = 0.0
    #: measurements averaged into the figures (close contenders are measured twice)
    repeats: int = 1

    def merge(self, again: Trial) -> None:
        """Average a second measurement of the same configuration into this one, each weighted
        by its measured seconds (a rate over both windows together)."""
        n = self.repeats
        wa, wb = (
            (self.seconds, again.seconds)
            if self.seconds > 0 and again.seconds > 0
            else (float(n), 1.0)
        )
        for name in (
            "samples_per_s",
            "data_wait_share",
            "cpu_pct",
            "worker_cpu_pct",
            "step_ms",
            "cpu_ms_per_sample",
            "read_mb_s",
            "read_bytes_per_sample",
        ):
            a, b = getattr(self, name), getattr(again, name)
            if a is not None and b is not None:
                setattr(self, name, (a * wa + b * wb) / (wa + wb))
        self.rss_mib = max(self.rss_mib or 0.0, again.rss_mib or 0.0) or None
        self.batches += again.batches
        self.samples += again.samples
        self.seconds += again.seconds
        self.swap_in += again.swap_in
        self.read_devices = sorted({*self.read_devices, *again.read_devices})
        self.repeats = n + 1

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return d


def batch_len(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor-like leaf."""
    if hasattr(batch, "shape") and getattr(batch, "shape", None):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        for v in batch.values():
            return batch_len(v)
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if hasattr(first, "shape") or isinstance(first, (list, tuple, dict)):
            return batch_len(first)
        return len(batch)
    return 1


@dataclass
class _Usage:
    """CPU, RSS and read bytes of the tree, sampled by a thread."""

    first: dict[int, tuple[float, int]] = field(default_factory=dict)
    last: dict[int, tuple[float, int]] = field(default_factory=dict)
    peak_rss: float = 0.0
    peak_worker_rss: float = 0.0
    #: bytes read by workers that ended (were reaped) during the trial: the kernel then adds
    #: their reads to this process's own counter, which would count them twice
    reaped_read: int = 0


class _Sampler(threading.Thread):
    def __init__(self, period: float = 0.2) -> None:
        super().__init__(daemon=True, name="stallscope-tune-sampler")
        self.period = period
        self.usage = _Usage()
        self._halt = threading.Event()
        self._me = psutil.Process(os.getpid())
        self._children: set[int] = set()

    def sample(self) -> None:
        u = self.usage
        rss = 0.0
        procs = [self._me]
        try:
            procs += self._me.children(recursive=True)
        except psutil.Error:
            pass
        for p in procs:
            try:
                with p.oneshot():
                    ct = p.cpu_times()
                    mem = p.memory_info().rss / 2**20
                    try:
                        rb = p.io_counters().read_bytes  # from storage, not the page cache
                    except (psutil.Error, AttributeError):
                        rb = 0
            except psutil.Error:
                continue
            cpu = ct.user + ct.system
            if p.pid not in u.first:
                # a worker born during the trial: count its CPU from zero
                u.first[p.pid] = (cpu, rb) if p.pid == self._me.pid else (0.0, 0)
            u.last[p.pid] = (cpu, rb)
            rss += mem
            if p.pid != self._me.pid:
                u.peak_worker_rss = max(u.peak_worker_rss, mem)
        u.peak_rss = max(u.peak_rss, rss)
        alive = {p.pid for p in procs}
        for pid in [p for p in self._children if p not in alive]:
            if pid in u.last and pid in u.first:  # a child listed once but never read: nothing
                u.reaped_read += u.last[pid][1] - u.first[pid][1]
            self._children.discard(pid)
        self._children |= alive - {self._me.pid}

    def run(self) -> None:
        while not self._halt.wait(self.period):
            self.sample()

    def stop(self) -> _Usage:
        self._halt.set()
        self.join(timeout=2)
        self.sample()
        return self.usage


def run_trial(
    make: Callable[..., Any],
    config: dict[str, Any],
    *,
    window_s: float,
    step_fn: Callable[[Any], Any] | None = None,
    best_rate: float | None = None,
    min_batches: int = 3,
) -> Trial:
    """Measure ``config`` for about ``window_s`` seconds after the first batch. A trial that is
    clearly slower than ``best_rate`` halfway through is cut short (status ``cut``)."""
    trial = Trial(config=dict(config))
    before = _host_before()
    sampler = _Sampler()
    sampler.start()
    it = None
    t_start = time.perf_counter()
    try:
        loader = make(**config)
        it = iter(loader)
        first = next(it)
        t_first = time.perf_counter()
        trial.startup_s = t_first - t_start
        if step_fn is not None:
            step_fn(first)
        # the measured window starts after the first step, so start-up is reported apart
        wait = step = 0.0
        samples = batches = 0
        t0 = time.perf_counter()
        while True:
            a = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                # a new epoch: its start-up counts, as in training. A persistent loader hands
                # back the same iterator (its workers kept); otherwise the old one's workers
                # stop when it is dropped
                it = iter(loader)
                batch = next(it)
            b = time.perf_counter()
            if step_fn is not None:
                step_fn(batch)
            c = time.perf_counter()
            wait += b - a
            step += c - b
            batches += 1
            samples += batch_len(batch)
            elapsed = c - t0
            if elapsed >= window_s and batches >= min_batches:
                break
            cut = _cut(samples, elapsed, best_rate, window_s) if batches >= min_batches else None
            if cut is not None:
                trial.status, trial.reason = "cut", cut
                break
        trial.seconds = elapsed
        trial.batches, trial.samples = batches, samples
        trial.samples_per_s = samples / elapsed if elapsed > 0 else None
        if step_fn is not None and batches:
            trial.data_wait_share = wait / (wait + step) if wait + step > 0 else None
            trial.step_ms = 1000.0 * step / batches
    except KeyboardInterrupt as exc:
        trial.status = "interrupted"
        trial.reason = str(exc) if isinstance(exc, Overtime) else "interrupted by Ctrl-C"
        raise
    except Exception as exc:
        trial.status = "failed"
        trial.reason = failure_text(exc)[:300]
    finally:
        usage = sampler.stop()  # before the workers end: see _Usage.reaped_read
        if it is not None:
            _shutdown(it)
        _account(trial, usage, time.perf_counter() - t_start)
        _host_after(trial, usage, before)
    return trial


def _cut(samples: int, elapsed: float, best_rate: float | None, window_s: float) -> str | None:
    """Why a trial is cut short: halfway through its window (a second at least) it is clearly
    slower than the best so far; None when it goes on."""
    if (
        best_rate
        and elapsed >= max(1.0, window_s / 2)
        and samples / elapsed < CUT_SHARE * best_rate
    ):
        return (
            f"{samples / elapsed:,.0f} samples/s after {elapsed:.1f} s, "
            f"under {CUT_SHARE:.0%} of the best so far: stopped early"
        )
    return None


#: the host's counters before a trial: swap-ins, reads per device, every process's CPU, when
_Before = tuple[int, dict[str, int], Snapshot, float]


def _host_before() -> _Before:
    return swap_ins(), read_devices(), cpu_snapshot(), time.time()


def _host_after(trial: Trial, usage: _Usage, before: _Before) -> None:
    """What the trial did to the host beside its own processes: the swap-ins, the devices
    read, and the other processes that were busy meanwhile."""
    swap0, disks0, others0, wall0 = before
    trial.swap_in = max(0, swap_ins() - swap0)
    disks1 = read_devices()
    trial.read_devices = sorted(d for d, n in disks1.items() if n > disks0.get(d, n))
    trial.busy_others = busiest_others(
        others0,
        cpu_snapshot(),
        time.time() - wall0,
        exclude={os.getpid(), *usage.last},
        started=wall0,
    )


def taking_others(t: Trial) -> list[dict[str, Any]]:
    """The busiest processes beside ``t`` but those at a lower priority than the trial's: they
    yield their cores to it (a nice-19 loop keeps about 1.5% of a core it shares with a nice-0
    worker), so beside them its rate is a quiet host's."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    return [b for b in t.busy_others if (b.get("nice") or 0) <= own]


def others_cores(t: Trial) -> float:
    """Cores the processes beside ``t`` took from it (:func:`taking_others` together)."""
    return sum(float(b.get("cores") or 0.0) for b in taking_others(t))


def failure_text(exc: BaseException) -> str:
    """One line for a failure. A worker's exception arrives wrapped ("Caught ValueError in
    DataLoader worker process 0." + the worker's traceback): its last line says what failed."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    if len(lines) > 1 and lines[0].startswith("Caught "):
        where = lines[0].removeprefix("Caught ").rstrip(".")
        return f"{where}: {lines[-1]}"
    return f"{type(exc).__name__}: {lines[0]}"


def _account(trial: Trial, u: _Usage, wall: float) -> None:
    cpu = sum(u.last[p][0] - u.first[p][0] for p in u.last)
    read = max(0, sum(u.last[p][1] - u.first[p][1] for p in u.last) - u.reaped_read)
    me = os.getpid()
    worker_cpu = sum(u.last[p][0] - u.first[p][0] for p in u.last if p != me)
    loading_cpu = worker_cpu if trial.config.get("num_workers", 0) > 0 else cpu
    if wall > 0:
        trial.cpu_pct = 100.0 * cpu / wall
        workers = int(trial.config.get("num_workers", 0) or 0)
        if workers:
            trial.worker_cpu_pct = 100.0 * worker_cpu / wall / workers
        trial.read_mb_s = read / wall / 1e6
    trial.rss_mib = u.peak_rss or None
    trial.worker_rss_mib = u.peak_worker_rss or None
    if trial.samples and trial.samples_per_s and wall > 0:
        # loading-side CPU per sample: the workers' CPU (the whole process's with no workers)
        # over the trial, spread over the samples produced at the measured rate
        trial.cpu_ms_per_sample = 1000.0 * loading_cpu / (trial.samples_per_s * wall)
        trial.read_bytes_per_sample = read / (trial.samples_per_s * wall)


def _shutdown(it: Any) -> None:
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        try:
            stop()
        except Exception:
            pass
