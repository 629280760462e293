"""The trainer's loader threads: what its other Python threads do while the training thread
waits for them.

Loaders built on threads (a ``ThreadPoolExecutor`` prefetching batches into a queue, MONAI's
``ThreadDataLoader``, torchdata's nodes, a streaming dataset's reader) hand batches to the
training thread through a queue or a future: the training thread is then seen in ``queue.get``
or ``Future.result`` (:func:`waits_on_thread`), and what the loading costs is on the other
threads. The in-process sampler (:mod:`.inproc`) samples them too, each sample classified by
:func:`loader_phase`:

- ``fetch``: reading (a file's ``read``, ``np.fromfile``, a memmap, a socket, HTTP, object
  stores: :data:`FETCH`, or the thread's own line: :data:`FETCH_LINE`);
- ``prep``: any other work (decoding, transforms, the loader's own Python);
- ``idle``: waiting for work or for room in the queue (:data:`IDLE`; ``time.sleep``).

The DataLoader's pin-memory thread, stallscope's threads and a few others' are no loader
threads (None: :data:`NOT_LOADER`). :class:`ThreadTally` sums each window per phase and reads
the threads' CPU time off their per-thread CPU clocks (no GIL released, ~1 µs a thread, once
a window), written as the record's ``threads`` (:mod:`.aggregate`): ``{"n": threads that
worked, "s": {"fetch", "prep", "idle"}, "cpu_s": their CPU seconds, "wait_s": the training
thread's seconds waiting on them, "gil_s": the sampler's own wait for the GIL over its
"wakes"}``.
Python-bound prep in several threads shares one GIL: busy by their stacks, the threads get
about one core between them, and the GIL is contended. The sampler measures that on itself:
each of its wakes takes the GIL, at once when it is free (reads, NumPy, torch release it), after
up to the switch interval (5 ms) or more when threads run Python; its lateness waking, less its
own run-queue wait (``/proc/self/task/<tid>/schedstat``: a busy host), is its wait for the GIL
(docs/diagnosis.md "input_bound.gil").
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from typing import Any

from stallscope.sources.stacks.phases import Frame, Row, bare

__all__ = [
    "FETCH",
    "FETCH_LINE",
    "IDLE",
    "LOADER_PHASES",
    "NOT_LOADER",
    "WAITS",
    "ThreadTally",
    "loader_phase",
    "thread_cpu_s",
    "thread_runq_s",
    "threads_part",
    "waits_on_thread",
]

#: what a loader thread's sample can be
LOADER_PHASES = ("fetch", "prep", "idle")

#: reading: files, memmaps, sockets, HTTP, object stores (path fragment; functions, empty: any)
FETCH: tuple[Row, ...] = tuple(
    Row("fetch", path, frozenset(funcs))
    for path, funcs in (
        ("socket.py", ()),
        ("ssl.py", ()),
        ("selectors.py", ()),
        ("http/client.py", ()),
        ("urllib/request.py", ()),
        ("urllib3/", ()),
        ("requests/", ()),
        ("aiohttp/", ()),
        ("fsspec/", ()),
        ("s3fs/", ()),
        ("gcsfs/", ()),
        ("botocore/", ()),
        ("huggingface_hub/", ()),
        ("_pyio.py", ("read", "readinto", "readall")),
        ("shutil.py", ("copyfileobj",)),
        ("numpy/core/memmap.py", ()),
        ("numpy/_core/memmap.py", ()),
        ("numpy/lib/npyio.py", ("load",)),
        ("numpy/lib/_npyio_impl.py", ("load",)),
        ("numpy/lib/format.py", ("read_array",)),
        ("numpy/lib/_format_impl.py", ("read_array",)),
        ("h5py/", ()),
    )
)
#: a loader thread's own line that reads (its C call has no frame): ``fh.read()``,
#: ``np.fromfile(...)``, ``sock.recv(...)``
FETCH_LINE = re.compile(
    r"\.(read|readinto|readline|readlines|recv|recv_into|pread)\(|"
    r"\b(fromfile|urlopen|pread)\(|\bnp\.load\(|\bopen\("
)
#: waiting: for work (a pool's queue), for room in the queue, on a lock or an event
IDLE: tuple[Row, ...] = tuple(
    Row("idle", path, frozenset(funcs))
    for path, funcs in (
        ("threading.py", ("wait", "acquire", "join", "_wait_for_tstate_lock")),
        ("queue.py", ("get", "put")),
        ("concurrent/futures/thread.py", ("_worker",)),
        ("multiprocessing/queues.py", ("get", "put")),
        ("multiprocessing/pool.py", ("worker", "_handle_workers", "_handle_tasks")),
        ("multiprocessing/connection.py", ()),
    )
)
_SLEEP_LINE = re.compile(r"\bsleep\(")
#: frames of threads that are no loader threads: the DataLoader's pin-memory thread (its worker
#: processes are measured as processes; a thread iterating a DataLoader, MONAI's
#: ThreadDataLoader's, is a loader thread), stallscope's, experiment trackers', loggers', test
#: harnesses' and debuggers'
NOT_LOADER = (
    "/torch/utils/data/_utils/pin_memory.py",
    "/stallscope/",
    "/wandb/",
    "/tensorboard/",
    "/torch/utils/tensorboard/",
    "/tensorboardX/",
    "/mlflow/",
    "/comet_ml/",
    "/clearml/",
    "/neptune/",
    "/torch/distributed/",
    "/logging/handlers.py",
    "/multiprocessing/queues.py",  # a multiprocessing queue's feeder thread (a DataLoader's)
    # a harness's or a debugger's threads: pytest-xdist's channel reader (execnet), debugpy's
    # and PyCharm's (pydevd), a Jupyter kernel's
    "/execnet/",
    "/_pydevd_bundle/",
    "/debugpy/",
    "/ipykernel/",
)
#: stallscope's own wrappers on a loader's calls (the DataLoader's ``__next__``, :mod:`.batches`;
#: a worker's fetch, :mod:`.fetches`): see-through, never what makes a thread stallscope's (a
#: thread iterating a DataLoader runs them: MONAI's ThreadDataLoader's buffer thread read as no
#: loader's while they did)
HOOKS = ("/stallscope/sources/stacks/batches.py", "/stallscope/sources/stacks/fetches.py")
#: the training thread waiting on another thread for its batch: a queue, a future, a thread
#: pool's results, MONAI's thread buffer
WAITS: tuple[Row, ...] = tuple(
    Row("data", path, frozenset(funcs))
    for path, funcs in (
        ("queue.py", ("get",)),
        ("concurrent/futures/_base.py", ("result", "as_completed", "wait", "_result_or_cancel")),
        ("multiprocessing/pool.py", ("next", "get", "wait", "__next__")),
        ("monai/data/thread_buffer.py", ()),
    )
)


def _norm(path: str) -> str:
    return "/" + path.replace("\\", "/").lstrip("/")


def _hit(rows: Sequence[Row], frame: Frame) -> bool:
    path = _norm(frame.file)
    name = bare(frame.func)
    return any("/" + r.path in path and (not r.funcs or name in r.funcs) for r in rows)


def _line(frame: Frame) -> str:
    import linecache

    text = linecache.getline(frame.file, frame.line) if frame.line > 0 else ""
    return text.split("#", 1)[0]


def loader_phase(frames: Sequence[Frame]) -> str | None:
    """``fetch``, ``prep`` or ``idle`` for one sample of a thread other than the training
    thread (frames innermost first); None for a thread that is no loader's (:data:`NOT_LOADER`)
    or holds no frame."""
    if not frames:
        return None
    for f in frames:
        path = _norm(f.file)
        if any(frag in path for frag in NOT_LOADER) and not any(h in path for h in HOOKS):
            return None
    if _hit(IDLE, frames[0]):
        return "idle"
    code = _line(frames[0])
    if _SLEEP_LINE.search(code):
        return "idle"
    if FETCH_LINE.search(code):
        return "fetch"
    if any(_hit(FETCH, f) for f in frames):
        return "fetch"
    return "prep"


#: a DataLoader's own frames: its wait is on its worker processes (or on its pin-memory thread,
#: which hands their batches on), whatever queue it waits in
DATALOADER = "/torch/utils/data/"


def waits_on_thread(frames: Sequence[Frame]) -> bool:
    """The training thread waits on another thread for its batch (:data:`WAITS`), not inside a
    DataLoader (:data:`DATALOADER`). Inside a thread loader the phase tables know (torchdata's
    nodes: their ``ParallelMapper`` on threads, their ``Prefetcher``), it is a wait on threads
    too: the tables say it is data, this says on what."""
    if not any(_hit(WAITS, f) for f in frames[:8]):
        return False
    return not any(DATALOADER in _norm(f.file) for f in frames)


def thread_cpu_s(native_id: int) -> float | None:
    """A thread's CPU seconds from its per-thread CPU clock (Linux: the clock id of thread
    ``native_id``, ``CPUCLOCK_SCHED``); None once it has exited or where there is no such
    clock."""
    try:
        return time.clock_gettime(((~native_id) << 3) | 6)
    except (OSError, OverflowError, ValueError, AttributeError):
        return None


def thread_runq_s(native_id: int) -> float | None:
    """Seconds thread ``native_id`` of this process waited in the run queue (ready, no CPU
    free: ``/proc/self/task/<tid>/schedstat``'s second field); None where it cannot be read
    (an exited thread, a kernel without schedstat)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as fh:
            return int(fh.read(256).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class ThreadTally:
    """One process's loader threads since the last record (see the module docstring)."""

    def __init__(self) -> None:
        #: thread ident -> seconds per loader phase in this window
        self.seconds: dict[int, list[float]] = {}
        #: thread ident -> its native id (None: not a threading.Thread), or -1: not a loader's
        self._native: dict[int, int | None] = {}
        #: native id -> CPU seconds at the last record
        self._cpu_seen: dict[int, float] = {}
        #: the sampler thread's native id, its lateness waking (s) and wakes in this window,
        #: and its run-queue wait at the last record
        self.own = 0
        self.late_s = 0.0
        self.wakes = 0
        self._own_runq: float | None = None
        #: the training thread's seconds waiting on the loader threads in this window
        self.wait_s = 0.0
        #: when a loader thread was last seen working (time.monotonic())
        self.last_work = -1e9

    def wanted(self, ident: int) -> bool:
        """Whether thread ``ident`` may be a loader's (not stallscope's by its name)."""
        native = self._native.get(ident, 0)
        if native == 0:
            th: Any = threading._active.get(ident)  # type: ignore[attr-defined]
            name = str(getattr(th, "name", ""))
            native = -1 if name.startswith("stallscope") else getattr(th, "native_id", None)
            self._native[ident] = native
        return native != -1

    def add(self, ident: int, phase: str, weight_s: float, now: float) -> None:
        """Count one sample of thread ``ident`` in ``phase`` (:data:`LOADER_PHASES`)."""
        row = self.seconds.get(ident)
        if row is None:
            row = self.seconds[ident] = [0.0, 0.0, 0.0]
        row[LOADER_PHASES.index(phase)] += weight_s
        if phase != "idle":
            self.last_work = now

    def working(self, now: float, within_s: float) -> bool:
        """A loader thread worked in the last ``within_s`` seconds."""
        return now - self.last_work <= within_s

    def woke(self, late_s: float) -> None:
        """The sampler thread woke ``late_s`` after its timeout: in the run queue (its
        schedstat tells) or waiting for the GIL (the rest)."""
        self.late_s += max(0.0, late_s)
        self.wakes += 1

    def _gil_wait(self) -> float | None:
        """The sampler's seconds waiting for the GIL since the last record: its lateness less
        its run-queue wait; None where schedstat cannot be read."""
        runq = thread_runq_s(self.own) if self.own else None
        if runq is None:
            return None
        last, self._own_runq = self._own_runq, runq
        if last is None:
            return None  # the first record: no run-queue wait to take off yet
        return max(0.0, self.late_s - max(0.0, runq - last))

    def record(self) -> dict[str, Any] | None:
        """The window's part of the record (None: no loader thread worked), and a fresh window.
        A thread that only waited is left out: an idle pool thread is no loader. ``gil_s``:
        the sampler's own wait for the GIL over its ``wakes`` (each wake takes the GIL: a
        free one at once, a contended one after up to the switch interval, 5 ms, or more)."""
        busy = {k: v for k, v in self.seconds.items() if v[0] + v[1] > 0}
        cpu = 0.0
        for ident in self.seconds:  # every thread seen: an idle one's clock moves on too
            native = self._native.get(ident)
            if native is None or native <= 0:
                continue  # no threading.Thread: no native id to read its clock by
            now = thread_cpu_s(native)
            if now is None:
                continue
            if ident in busy:  # a thread first seen now: its CPU since it started
                cpu += max(0.0, now - self._cpu_seen.get(native, 0.0))
            self._cpu_seen[native] = now
        gil, wakes = self._gil_wait(), self.wakes
        self.late_s, self.wakes = 0.0, 0
        wait, self.wait_s = self.wait_s, 0.0
        self.seconds = {}
        rec = threads_part(busy, cpu, wait)
        if rec is None:
            return None
        if gil is not None and wakes:
            rec["gil_s"], rec["wakes"] = round(gil, 5), wakes
        return rec


def threads_part(
    busy: dict[int, list[float]], cpu_s: float, wait_s: float
) -> dict[str, Any] | None:
    """A record's ``threads`` part from the loader threads that worked (thread -> seconds per
    :data:`LOADER_PHASES`), their CPU and the training thread's wait on them; None when none
    worked. The in-process sampler adds its GIL measure; py-spy's rounds have none."""
    if not busy:
        return None
    sums = [sum(v[i] for v in busy.values()) for i in range(len(LOADER_PHASES))]
    return {
        "n": len(busy),
        "s": {p: round(x, 4) for p, x in zip(LOADER_PHASES, sums, strict=True)},
        "cpu_s": round(cpu_s, 4),
        "wait_s": round(wait_s, 4),
    }
