"""The in-process sampler: a thread inside the trainer that samples its main thread's stack.

``stallscope run`` puts ``stallscope/inject/sitecustomize.py`` on
the trainer's ``PYTHONPATH``; Python imports it at start-up in every Python process of the run,
and it calls :func:`start` when ``STALLSCOPE_RUN_DIR`` and ``STALLSCOPE_STACKS_HZ`` are set. No
ptrace is needed (Ubuntu's ``ptrace_scope=1`` refuses a sampler that is the trainer's sibling),
and nothing in the training changes: the thread reads ``sys._current_frames()`` ``rate_hz``
times a second and appends one record per second to ``<run>/stacks/<pid>.jsonl``
(:mod:`~stallscope.sources.stacks.aggregate`).

Each sample holds the GIL for the few microseconds it takes to walk the frames; its weight is
the time since the previous sample, so a sample that waited for the GIL (the training thread
in a long C call) still stands for all the time it waited. A process that turns out not to be
a trainer (torchrun's launcher, a multiprocessing child) stops its thread after the first
samples and writes nothing; one that has not started training after a minute is sampled
twice a second until it does, and nothing is written for it before it does. An error stops
sampling, with one line on stderr; it never reaches the trainer. A hook that fails to install
(DDP's communication timing, the DataLoader's batch count) is given up, said once, and
sampling goes on.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from stallscope.errors import warn
from stallscope.sources.stacks import batches, fetches
from stallscope.sources.stacks.aggregate import (
    MAX_WEIGHT_S,
    MEMO_SIZE,
    Tally,
    append_record,
    rank_from_env,
    stacks_dir,
)
from stallscope.sources.stacks.phases import Frame
from stallscope.sources.stacks.threads import ThreadTally, loader_phase, waits_on_thread

__all__ = ["DEFAULT_RATE_HZ", "InProcSampler", "rate_from_env", "stack_key", "start", "walk"]

#: samples per second of the training thread
DEFAULT_RATE_HZ = 40.0
#: a process that has not started training after this long (a helper such as wandb's service
#: or TensorBoard, or a trainer still downloading its data) is sampled every SLOW_PERIOD_S
SLOW_AFTER_S = 60.0
SLOW_PERIOD_S = 0.5
#: frames walked per sample at most (innermost first)
MAX_DEPTH = 64
#: the training thread in ``queue.get`` / ``Future.result`` waits for data when a loader
#: thread worked this recently (s): a thread loader (:mod:`.threads`)
LOADER_RECENT_S = 2.0
#: other Python threads sampled at most (a process with hundreds of threads costs no more)
MAX_THREADS = 32
#: the other threads are sampled at most this often (s): half the default rate, half the cost
THREADS_PERIOD_S = 0.045

_started: list[InProcSampler] = []


def stack_key(frame: FrameType | None, depth: int = MAX_DEPTH) -> tuple[Any, ...]:
    """What identifies a stack for the memos: the innermost line and every frame's code
    object, innermost first (cheap: no strings built)."""
    if frame is None:
        return ()
    key: list[Any] = [frame.f_lineno or 0]
    while frame is not None and len(key) <= depth:
        key.append(frame.f_code)
        frame = frame.f_back
    return tuple(key)


def walk(frame: FrameType | None, depth: int = MAX_DEPTH) -> list[Frame]:
    """The frames innermost first."""
    frames: list[Frame] = []
    while frame is not None and len(frames) < depth:
        code = frame.f_code
        frames.append(Frame(code.co_filename, code.co_name, frame.f_lineno or 0))
        frame = frame.f_back
    return frames


class InProcSampler:
    """Samples the main thread of this process into ``<run_dir>/stacks/``."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        rate_hz: float = DEFAULT_RATE_HZ,
        flush_s: float = 1.0,
    ) -> None:
        self.folder = stacks_dir(run_dir)
        self.rate_hz = max(1.0, min(float(rate_hz), 1000.0))
        self.flush_s = flush_s
        self.tally = Tally(os.getpid(), rank_from_env(os.environ), "inproc", self.rate_hz)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._main = threading.main_thread().ident or 0
        #: the communication clock once installed (sources/comm.py), and its total last seen
        self._comm: Any = None
        self._comm_seen = 0.0
        #: the DataLoader batch counts (:mod:`.batches`) written so far
        self._counted = (0, 0)
        #: the batches' wait and step histograms (:mod:`.batches`) written so far
        self._timed: tuple[dict[int, int], dict[int, int]] = ({}, {})
        #: the hooks not installed yet (:meth:`_install_hooks`)
        self._hooks = ["comm", "batches", "fetches"]
        #: the process's other Python threads: loader threads (:mod:`.threads`)
        self.threads = ThreadTally()
        #: stack key -> loader phase (None: no loader's) / waits on a thread
        self._loader_memo: dict[tuple[Any, ...], str | None] = {}
        self._waits_memo: dict[tuple[Any, ...], bool] = {}
        self._threads_at = 0.0  #: when the other threads were last sampled (monotonic)
        self._thread = threading.Thread(target=self._loop, name="stallscope-stacks", daemon=True)

    def start(self) -> None:
        from stallscope import forksafe  # the trainer forks workers beside this thread

        forksafe.install()
        self._thread.start()
        atexit.register(self.stop)

    def _loop(self) -> None:
        period = 1.0 / self.rate_hz
        memo: dict[tuple[Any, ...], list[Frame]] = {}
        last = time.monotonic()
        next_flush = last + self.flush_s
        slow_after = last + SLOW_AFTER_S
        self.threads.own = threading.get_native_id()
        try:
            while True:
                timeout = period if self.tally.started or last < slow_after else SLOW_PERIOD_S
                slept = time.monotonic()
                if self._stop.wait(timeout):
                    break
                # woken late: waiting for a CPU, or for the GIL (:meth:`ThreadTally.woke`)
                self.threads.woke(time.monotonic() - slept - timeout)
                if self._hooks:
                    self._install_hooks()  # dict lookups a sample until DDP and the loader are in
                current = sys._current_frames()
                frame = current.get(self._main)
                if frame is None:
                    break
                key = stack_key(frame)
                frames = memo.get(key)
                if frames is None:
                    frames = walk(frame)
                    if len(memo) < MEMO_SIZE:
                        memo[key] = frames
                del frame
                now = time.monotonic()
                self._sample(current, frames, key, now - last, now)
                del current
                last = now
                if self.tally.idle:
                    return
                if now >= next_flush:
                    self._comm_time()
                    self.flush()
                    next_flush = now + self.flush_s
        except Exception as exc:  # never the trainer's problem: stop sampling, said once
            warn(f"stack sampling in pid {os.getpid()} stopped: {type(exc).__name__}: {exc}")

    def _sample(
        self,
        current: dict[int, FrameType],
        frames: list[Frame],
        key: tuple[Any, ...],
        weight: float,
        now: float,
    ) -> None:
        """Count one sample: the training thread's (``frames``), and the other Python threads'
        (``current``) as loader threads; the training thread waiting on a thread counts as
        waiting for data while a loader thread works (:data:`LOADER_RECENT_S`)."""
        weight = min(max(weight, 0.0), MAX_WEIGHT_S)
        if self.tally.started and now - self._threads_at >= THREADS_PERIOD_S:
            # the other threads every THREADS_PERIOD_S, each sample standing for the time since
            since = now - self._threads_at if self._threads_at else weight  # first: one wake
            self._sample_threads(current, min(since, MAX_WEIGHT_S), now)
            self._threads_at = now
        loader_wait: bool | None = False
        if self.threads.working(now, LOADER_RECENT_S):
            loader_wait = self._waits_memo.get(key)
            if loader_wait is None:
                loader_wait = waits_on_thread(frames)
                if len(self._waits_memo) < MEMO_SIZE:
                    self._waits_memo[key] = loader_wait
        with self._lock:
            self.tally.add(frames, weight, key, loader_wait=bool(loader_wait))
            if self.tally.loader_wait:
                self.threads.wait_s += weight

    def _sample_threads(self, current: dict[int, FrameType], weight: float, now: float) -> None:
        """The other Python threads but this one: each sample's loader phase (memoized by
        stack), none for a thread of stallscope's or the DataLoader's own."""
        own = self._thread.ident
        seen = 0
        for ident, frame in current.items():
            if ident == self._main or ident == own or not self.threads.wanted(ident):
                continue
            seen += 1
            if seen > MAX_THREADS:
                break
            key = stack_key(frame)
            if key in self._loader_memo:
                phase = self._loader_memo[key]
            else:
                phase = loader_phase(walk(frame))
                if len(self._loader_memo) < MEMO_SIZE:
                    self._loader_memo[key] = phase
            if phase is not None:
                with self._lock:
                    self.threads.add(ident, phase, weight, now)

    def _install_hooks(self) -> None:
        """The communication timing once the trainer is distributed (sources/comm.py, which
        tries again itself when its import meets the trainer's half-way) and the DataLoader's
        batch count and each batch's cost in the workers once torch's DataLoader is imported
        (:mod:`.batches`, :mod:`.fetches`). A hook that raises
        is given up, said once: never a reason to stop sampling."""
        for name in tuple(self._hooks):
            try:
                from stallscope.sources import comm

                if name == "comm":
                    done = comm.install_if_distributed()
                else:
                    done = (batches if name == "batches" else fetches).install()
                if done and name == "comm":
                    self._comm = comm.CLOCK
                    self._comm_seen = comm.CLOCK.total_s
            except Exception as exc:
                warn(f"pid {os.getpid()}: {name} hook not installed: {type(exc).__name__}: {exc}")
                done = True
            if done:
                self._hooks.remove(name)

    def _comm_time(self) -> None:
        """Once the trainer has a process group (DDP), its collectives are timed
        (sources/comm.py); then, each window, the seconds they waited count as ``comm`` rather
        than ``compute`` (where the stacks see the all-reduce wait: inside backward's C++)."""
        if not self._comm:
            return
        total = self._comm.total_s
        waited, self._comm_seen = total - self._comm_seen, total
        if waited > 0:
            with self._lock:
                self.tally.reassign("compute", "comm", waited)

    def flush(self, final: bool = False) -> None:
        total = (batches.COUNTS[0], batches.COUNTS[1])
        with self._lock:
            self.tally.count(total[0] - self._counted[0], total[1] - self._counted[1])
            self._counted = total
            timed = (dict(batches.WAITS), dict(batches.STEPS))
            self.tally.time_batches(*(_since(now, was) for now, was in zip(timed, self._timed)))
            self._timed = timed
            rec = self.tally.record(time.time(), final)
            threads = self.threads.record()
            if rec is not None and threads is not None:
                rec["threads"] = threads
        if rec is not None and not self.tally.idle:
            try:
                append_record(self.folder, rec)
            except OSError as exc:  # the run directory is gone or full: stop, said once
                if final or not self._stop.is_set():
                    warn(f"stack sampling in pid {os.getpid()} stopped: {exc}")
                self._stop.set()

    def stop(self) -> None:
        """Stop and write the last window (at interpreter exit too)."""
        if self._stop.is_set() or os.getpid() != self.tally.pid:
            return  # a forked child exiting: the records are its parent's to write
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=1.0)
        self.flush(final=True)


def rate_from_env() -> float:
    """``$STALLSCOPE_STACKS_HZ`` (``stallscope run --stack-rate``), between 1 and 1000 as that
    option; :data:`DEFAULT_RATE_HZ` when unset or bad (said once: ``inf`` would spin the
    sampler's thread, ``0`` divide by zero)."""
    from stallscope.envvars import env_number

    return env_number(
        "STALLSCOPE_STACKS_HZ", float, 1, 1000, DEFAULT_RATE_HZ, kind="samples a second"
    )


def start(run_dir: str | os.PathLike[str], rate_hz: float = DEFAULT_RATE_HZ) -> InProcSampler:
    """Start sampling this process (once; a second call returns the first sampler)."""
    if _started and _started[0].tally.pid == os.getpid():
        return _started[0]
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"no run directory {run_dir}")
    sampler = InProcSampler(run_dir, rate_hz)
    _started[:] = [sampler]
    sampler.start()
    return sampler


def _since(now: dict[int, int], was: dict[int, int]) -> dict[int, int]:
    """The counts of histogram ``now`` added since ``was`` (bucket -> batches)."""
    return {k: c - was.get(k, 0) for k, c in now.items() if c > was.get(k, 0)}
