"""The step probe: runs inside the trainer and times every training step.

``stallscope.watch(loader)`` wraps any iterable (a PyTorch ``DataLoader`` above all) and records,
per step (all times in seconds, the ``steps`` table of the run store):

``wait_s``
    host time blocked in ``next(loader)`` (data wait); the first step of an epoch also counts
    ``iter(loader)``, which is where non-persistent DataLoader workers are (re)started.
``host_s``
    host time from the batch handed to the step to the next request (compute, logging...).
``h2d_s``
    host-to-device copy time, when the copy goes through :func:`h2d`.
``gpu_busy_s`` / ``gpu_idle_s``
    on CUDA: GPU time between two CUDA events recorded when the batch is handed over and at the
    step's end, and the GPU-side gap between the previous step's end event and this step's start
    event (the GPU's real idle time, which host wait overstates while queued kernels still run).
``samples``, ``epoch``
    batch size (dim 0 of the first tensor, else ``len(batch)``) and the pass over a watched
    iterable the step belongs to (every ``for`` over a wrapper starts a new epoch).

This is D4 of the brief ("time each batch's load interval, time forward+backward with CUDA
events") done for every step without slowing the step: the training thread only reads
``time.perf_counter`` and calls ``Event.record()``; it never calls ``synchronize()``. Events are
read by a background thread once ``Event.query()`` says they completed. Records go into a bounded
buffer; the background thread writes them to the run store once per ``flush_interval`` (and at
exit); when the buffer is full, records are dropped and counted, never waited for. Nothing the
probe does raises into the trainer: failures are counted and reported once on stderr and as an
event in the run.

Where it reports: into ``$STALLSCOPE_RUN_DIR/run.db`` under ``stallscope run``; otherwise
(standalone) it makes a run directory under ``$STALLSCOPE_OUT`` (default ``./stallscope-runs``),
writes ``meta.json`` and samples the machine itself with a background collector.
``STALLSCOPE_PROBE=0`` turns the probe off (``watch`` then returns the loader unchanged).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from stallscope.collect import Collector
    from stallscope.store import RunStore, StepRow

__all__ = [
    "EventLike",
    "Probe",
    "StepTimer",
    "Watched",
    "batch_size_of",
    "get_probe",
    "h2d",
    "loader_config",
    "reset",
    "step",
    "watch",
]

T = TypeVar("T")

#: steps the buffer holds between flushes before records are dropped (about 1 min at 1 kHz)
DEFAULT_CAPACITY = 65536
#: seconds between writes of the buffer to the run store
DEFAULT_FLUSH_S = 1.0
#: seconds between machine samples of the standalone collector (env STALLSCOPE_INTERVAL)
DEFAULT_COLLECT_S = 5.0
#: epoch records kept in the probe's configuration
MAX_EPOCHS_KEPT = 10000
#: seconds ``close()`` waits (polling ``query()``, never synchronizing) for outstanding events
CLOSE_WAIT_S = 2.0


class EventLike(Protocol):
    """What the probe needs of ``torch.cuda.Event(enable_timing=True)``."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds from this event to ``end_event``."""
        ...


# One step as the training thread hands it over (a tuple: cheapest to build):
# (step, t_got_perf, wait_s, host_s, samples, epoch, h2d_host_s, gpu)
# gpu is None or (start_event, end_event, ((h2d_start, h2d_end), ...) or None)
_Rec = tuple[int, float, float, float, "int | None", int, "float | None", Any]


def _warn(msg: str) -> None:
    try:
        sys.stderr.write(f"stallscope: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed at shutdown: nothing left to tell
        return


# --- what a batch holds --------------------------------------------------------------------------
def _no_size(_b: Any) -> int | None:
    return None


def _sizer(batch: Any) -> Callable[[Any], int | None]:
    """A function giving the sample count of batches shaped like ``batch`` (decided once per
    epoch: batches of one loader share a structure)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            return _no_size
        return lambda b: b.shape[0]  # torch.Size items are ints already
    if isinstance(batch, (list, tuple)):
        if batch and getattr(batch[0], "shape", None) is not None and len(batch[0].shape):
            return lambda b: b[0].shape[0]
        if batch and isinstance(batch[0], Mapping):
            inner = _sizer(batch[0])
            if inner is not _no_size:
                return lambda b: inner(b[0])
        return len
    if isinstance(batch, Mapping):
        for k, v in batch.items():
            s = getattr(v, "shape", None)
            if s is not None and len(s):
                return _key_sizer(k)
        return _no_size
    if hasattr(batch, "__len__") and not isinstance(batch, (str, bytes)):
        return len
    return _no_size


def _key_sizer(key: Any) -> Callable[[Any], int | None]:
    return lambda b: b[key].shape[0]


def batch_size_of(batch: Any) -> int | None:
    """Samples in ``batch``: dim 0 of its first tensor, else ``len(batch)``, else None."""
    try:
        return _sizer(batch)(batch)
    except (TypeError, IndexError, KeyError, AttributeError):
        return None


# --- loader configuration ------------------------------------------------------------------------
def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)


def loader_config(loader: Any) -> dict[str, Any]:
    """The DataLoader knobs that decide input throughput (brief D2), read off ``loader``.

    Works on any iterable: what it does not have is left out. ``dataset_len`` is None for
    unsized (iterable) datasets."""
    cfg: dict[str, Any] = {"loader_type": f"{type(loader).__module__}.{type(loader).__qualname__}"}
    for key in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                "batch_size", "drop_last", "timeout", "in_order"):
        if hasattr(loader, key):
            cfg[key] = _plain(getattr(loader, key))
    if cfg.get("batch_size") is None:
        bs = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if bs is not None:
            cfg["batch_size"] = _plain(bs)
    sampler = getattr(loader, "sampler", None)
    if sampler is not None:
        cfg["sampler_type"] = type(sampler).__name__
    ds = getattr(loader, "dataset", None)
    target = ds if ds is not None else loader
    if ds is not None:
        cfg["dataset_type"] = f"{type(ds).__module__}.{type(ds).__qualname__}"
    try:
        cfg["dataset_len" if ds is not None else "len"] = len(target)
    except TypeError:  # iterable-style dataset / generator: no length
        cfg["dataset_len" if ds is not None else "len"] = None
    except Exception as exc:  # a user __len__ that fails: keep the reason, the probe goes on
        cfg["dataset_len_error"] = f"{type(exc).__name__}: {exc}"
    if hasattr(loader, "num_workers"):
        ctx = getattr(loader, "multiprocessing_context", None)
        method: Any = None
        if ctx is not None:
            get = getattr(ctx, "get_start_method", None)
            method = get() if callable(get) else str(ctx)
        else:
            tmp = sys.modules.get("torch.multiprocessing")
            if tmp is not None:
                method = tmp.get_start_method(allow_none=True)
            if method is None:
                import multiprocessing

                method = multiprocessing.get_start_method(allow_none=True)
        cfg["start_method"] = _plain(method)
    return cfg


def _machine_config() -> dict[str, Any]:
    from stallscope import __version__

    cfg: dict[str, Any] = {"host": socket.gethostname(), "python": sys.version.split()[0],
                           "stallscope": __version__, "logical_cores": os.cpu_count()}
    try:
        import psutil

        cfg["physical_cores"] = psutil.cpu_count(logical=False)
    except ImportError:
        cfg["physical_cores"] = None
    torch = sys.modules.get("torch")
    if torch is not None:
        cfg["torch"] = str(getattr(torch, "__version__", None))
        cuda = getattr(torch, "cuda", None)
        cfg["cuda_available"] = bool(cuda is not None and cuda.is_available())
        cfg["cuda_version"] = _plain(getattr(getattr(torch, "version", None), "cuda", None))
    return cfg


def _worker_pids(it: Any) -> list[int] | None:
    workers = getattr(it, "_workers", None)
    if not workers:
        return None
    return [int(w.pid) for w in workers if getattr(w, "pid", None) is not None]


# --- rank ----------------------------------------------------------------------------------------
def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        return None


def detect_rank() -> int:
    """torch.distributed's rank when it is initialized, else ``$RANK``, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except (RuntimeError, ValueError) as exc:
            _warn(f"cannot read the torch.distributed rank ({exc}); using $RANK")
    r = _env_int("RANK")
    return r if r is not None else 0


# --- the probe -----------------------------------------------------------------------------------
class Probe:
    """Per-process (per-rank) recorder of training steps.

    Normally made by :func:`get_probe` on first use; tests build one directly and may inject
    ``events`` (a factory of :class:`EventLike` objects) to exercise the CUDA path without a GPU.
    """

    def __init__(
        self,
        *,
        rank: int | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval: float = DEFAULT_FLUSH_S,
        collect_interval: float | None = None,
        events: Callable[[], EventLike] | None = None,
        register_atexit: bool = True,
    ) -> None:
        self.pid = os.getpid()
        self.rank = detect_rank() if rank is None else int(rank)
        self.capacity = max(1, int(capacity))
        self.flush_interval = flush_interval
        self.active = True
        # where to write: explicit dir, stallscope run's dir, or a standalone run of our own
        env_dir = os.environ.get("STALLSCOPE_RUN_DIR")
        self.standalone = run_dir is None and not env_dir
        self.run_dir: Path | None = Path(run_dir) if run_dir is not None else (
            Path(env_dir) if env_dir else None)
        self.collect_interval = collect_interval if collect_interval is not None else \
            _interval_from_env()
        # training-thread state (only that thread writes these)
        self._perf0 = time.perf_counter()
        self._wall0 = time.time()
        self._step = -1
        self.epoch = -1
        self._last_end: float | None = None  # perf time the previous step ended (step())
        self._h2d_s: float | None = None
        self._h2d_ev: list[tuple[EventLike, EventLike]] | None = None
        # handed over to the flusher
        self._buf: deque[_Rec] = deque()
        self.dropped = 0
        # CUDA timing
        self._events = events
        self._cuda: Any = None
        if events is None:
            torch = sys.modules.get("torch")
            cuda = getattr(torch, "cuda", None) if torch is not None else None
            try:
                if cuda is not None and cuda.is_available():
                    self._cuda = cuda
            except RuntimeError as exc:
                _warn(f"CUDA unusable ({exc}); GPU step timing is off")
        self._free_events: list[EventLike] = []
        # flusher state
        self.config: dict[str, Any] = {"rank": self.rank, "pid": self.pid, "epochs": []}
        self._cfg_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: deque[_Rec] = deque()  # steps waiting for their CUDA events
        self._last_end_ev: EventLike | None = None
        self.written = 0
        self.lost = 0  # records that could not be written
        self.gpu_unread = 0  # steps whose CUDA events never completed in time
        self._said: set[str] = set()
        self._notes: list[tuple[float, str]] = []
        self._said_drop = 0
        self._store: RunStore | None = None
        self._collector: Collector | None = None
        self._meta: dict[str, Any] | None = None
        self._collector_store: RunStore | None = None
        self._exit_code = 0
        self._prev_excepthook: Any = None
        self._standalone_pending: tuple[Path, int, dict[str, Any]] | None = None
        self._ready = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        if self.standalone:
            # here, not on the writer thread: a crash in the first step must still be seen
            self._install_excepthook()
        self._thread = threading.Thread(target=self._loop, name=f"stallscope-probe-{self.rank}",
                                        daemon=True)
        self._thread.start()
        if register_atexit:
            atexit.register(self._atexit)

    # --- clocks ----------------------------------------------------------------------------------
    def wall(self, t_perf: float) -> float:
        """Wall-clock time (``time.time()`` scale) of a ``perf_counter`` reading."""
        return self._wall0 + (t_perf - self._perf0)

    # --- GPU events (training thread) ------------------------------------------------------------
    def gpu_ready(self) -> bool:
        """True once CUDA step timing can be used: events injected, or CUDA available *and*
        initialized by the trainer (the probe never initializes CUDA itself)."""
        if self._events is not None:
            return True
        cuda = self._cuda
        if cuda is None:
            return False
        try:
            if not cuda.is_initialized():
                return False
            self._events = lambda: cuda.Event(enable_timing=True)
            return True
        except RuntimeError as exc:
            self._cuda = None
            self._say("cuda", f"CUDA step timing off: {exc}")
            return False

    def _event(self) -> EventLike:
        free = self._free_events
        if free:
            return free.pop()
        assert self._events is not None
        return self._events()

    def _release(self, ev: EventLike | None) -> None:
        if ev is not None and len(self._free_events) < 4096:
            self._free_events.append(ev)

    # --- records (training thread) ---------------------------------------------------------------
    def _push(self, rec: _Rec) -> None:
        if len(self._buf) < self.capacity:
            self._buf.append(rec)
        else:
            self.dropped += 1

    def _take_h2d(self) -> tuple[float | None, tuple[tuple[EventLike, EventLike], ...] | None]:
        h, evs = self._h2d_s, self._h2d_ev
        if h is not None:
            self._h2d_s = None
        if evs is not None:
            self._h2d_ev = None
            return h, tuple(evs)
        return h, None

    def begin_epoch(self, loader: Any = None, it: Any = None, *, epoch: int | None = None,
                    iter_s: float | None = None) -> int:
        """Start a new epoch (a new pass over a watched loader); returns its number."""
        self.epoch = self.epoch + 1 if epoch is None else int(epoch)
        try:
            rec: dict[str, Any] = {"epoch": self.epoch, "ts": time.time()}
            if iter_s is not None:
                rec["iter_s"] = iter_s
            pids = _worker_pids(it) if it is not None else None
            if pids is not None:
                rec["worker_pids"] = pids
            with self._cfg_lock:
                if loader is not None and "loader" not in self.config:
                    self.config["loader"] = loader_config(loader)
                if pids is not None:
                    self.config["worker_pids"] = pids
                eps = self.config["epochs"]
                eps.append(rec)
                if len(eps) > MAX_EPOCHS_KEPT:
                    del eps[0]
        except Exception as exc:  # reading an odd loader must not stop training: say it once
            self._say("config", f"cannot read the loader configuration: {exc!r}")
        return self.epoch

    def begin_step(self, samples: int | None = None, epoch: int | None = None) -> StepTimer:
        """Start a step by hand (what :func:`step` and the callbacks use)."""
        return StepTimer(self, samples, epoch).start()

    def mark_idle(self) -> None:
        """Forget the time since the last step ended: what ran since (evaluation, checkpoint)
        was not waiting for data."""
        self._last_end = time.perf_counter()

    def epoch_done(self) -> None:
        """Wake the writer (a wrapper was exhausted): a flush soon, off the training thread."""
        self._wake.set()

    # --- writer thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            machine = _machine_config()
            with self._cfg_lock:
                self.config.update(machine)
        except Exception as exc:  # facts about the machine are a nicety, not a reason to stop
            self._say("machine", f"cannot read the machine configuration: {exc!r}")
        try:
            self._open()
        except Exception as exc:  # no run directory: training goes on, records are counted lost
            self._say("open", f"cannot write step records to {self.run_dir or 'a new run'}: "
                      f"{exc}; training continues without them")
        finally:
            self._ready.set()
        if self._standalone_pending is not None:
            try:
                self._start_collector(*self._standalone_pending)
            except Exception as exc:  # the steps are still recorded; say why the rest is not
                self._say("collector", f"machine sampling not started: {exc}")
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.flush()
            except Exception as exc:  # a bug here must not end the writer: say it, go on
                self._say("flush", f"probe writer error: {exc!r}")

    def _open(self) -> None:
        from stallscope.store import RunStore

        if self.standalone:
            self._open_standalone()
        assert self.run_dir is not None
        self._store = RunStore(self.run_dir / "run.db")

    def _open_standalone(self) -> None:
        from stallscope.store import DEFAULT_OUT, base_meta, new_run_dir, write_meta

        out = os.environ.get("STALLSCOPE_OUT") or DEFAULT_OUT
        label = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"
        lead, root_pid, run_dir = True, os.getpid(), None
        world = _env_int("LOCAL_WORLD_SIZE") or _env_int("WORLD_SIZE") or 1
        if world > 1:
            # ranks launched together (torchrun) share one run directory named after their
            # launcher; the node's local rank 0 samples the machine for all of them
            run_dir, root_pid = _shared_run_dir(Path(out), label)
            lead = (_env_int("LOCAL_RANK") or 0) == 0
        if run_dir is None:
            run_dir = new_run_dir(out, label)
        self.run_dir = run_dir
        if not lead:
            return
        meta = base_meta(list(sys.argv), start=self._wall0,
                         interval_s=self.collect_interval, mode="probe", pid=root_pid)
        write_meta(run_dir, meta)
        self._meta = meta
        self._standalone_pending = (run_dir, root_pid, meta)  # sampled once the store is open

    def _start_collector(self, run_dir: Path, root_pid: int, meta: dict[str, Any]) -> None:
        from stallscope.collect import Collector, StoreSink
        from stallscope.sources import SOURCE_NAMES, open_sources
        from stallscope.store import RunStore, write_meta

        sources, unavailable = open_sources(SOURCE_NAMES)
        procs, more = open_sources(("procs",), root_pid=root_pid)
        unavailable.update(more)
        meta["unavailable"] = unavailable
        write_meta(run_dir, meta)
        self._collector_store = RunStore(run_dir / "run.db")
        self._collector = Collector(sources + procs, [StoreSink(self._collector_store)],
                                    interval=self.collect_interval, unavailable=unavailable)
        self._collector.start()

    def _install_excepthook(self) -> None:
        prev = sys.excepthook
        self._prev_excepthook = prev

        def hook(tp: type[BaseException], value: BaseException,
                 tb: TracebackType | None) -> None:
            self._exit_code = 1  # an uncaught exception ends the process with status 1
            prev(tp, value, tb)

        sys.excepthook = hook

    def flush(self) -> int:
        """Write what the buffer holds (and GPU timings that completed); returns rows written.

        Runs on the writer thread (and once more at exit); safe to call from tests."""
        self._ready.wait(30.0)
        with self._flush_lock:
            return self._flush_locked(final=False)

    def _flush_locked(self, *, final: bool) -> int:
        buf = self._buf
        rows: list[StepRow] = []
        from stallscope.store import StepRow

        rank, wall0, perf0 = self.rank, self._wall0, self._perf0
        n = len(buf)
        for _ in range(n):
            rec = buf.popleft()
            if rec[7] is not None:
                self._pending.append(rec)
                continue
            rows.append(StepRow(rank, rec[0], wall0 + (rec[1] - perf0), rec[2], rec[3], rec[6],
                                None, None, rec[4], rec[5]))
        rows.extend(self._gpu_rows(final))
        dropped_now = self.dropped
        if self._store is None:
            self.lost += len(rows)
            return 0
        try:
            if rows:
                self._store.add_steps(rows)
            self.written += len(rows)
            while self._notes:
                ts, note = self._notes.pop(0)
                self._store.add_event(ts, "probe", "error", note)
            if dropped_now > self._said_drop:
                if self._said_drop == 0 or final:
                    self._store.add_event(
                        time.time(), "probe", "dropped",
                        f"rank {rank}: probe buffer full ({self.capacity} steps), "
                        f"{dropped_now} step records dropped so far")
                self._said_drop = dropped_now
            with self._cfg_lock:
                cfg = dict(self.config)
                cfg["epochs"] = list(cfg["epochs"])
            cfg.update(lost=self.lost, gpu_unread=self.gpu_unread,
                       gpu_timing=self._events is not None, capacity=self.capacity)
            self._store.set_probe(rank, self.pid, cfg, self.written, dropped_now)
        except Exception as exc:  # disk full, locked too long, read-only: count, say once
            self.lost += len(rows)
            self._say("write", f"cannot write step records to {self.run_dir}: {exc}; "
                      "training continues")
            return 0
        return len(rows)

    def _gpu_rows(self, final: bool) -> list[StepRow]:
        """Rows whose CUDA events completed (in order: the GPU runs a stream in order)."""
        from stallscope.store import StepRow

        out: list[StepRow] = []
        pending = self._pending
        rank, wall0, perf0 = self.rank, self._wall0, self._perf0
        while pending:
            rec = pending[0]
            start, end, h2d_evs = rec[7]
            busy = idle = None
            h2d = rec[6]
            try:
                done = end.query() and all(b.query() for _, b in h2d_evs or ())
            except Exception as exc:  # a broken event: report once, give up on its timing
                self._say("cuda", f"CUDA event query failed: {exc}")
                done = None
            if done is False and len(pending) <= self.capacity and not final:
                break
            pending.popleft()
            if done:
                try:
                    busy = start.elapsed_time(end) / 1e3
                    if self._last_end_ev is not None:
                        idle = max(0.0, self._last_end_ev.elapsed_time(start) / 1e3)
                    if h2d_evs:
                        h2d = (h2d or 0.0) + sum(a.elapsed_time(b) for a, b in h2d_evs) / 1e3
                except Exception as exc:
                    self._say("cuda", f"CUDA elapsed_time failed: {exc}")
                    busy = idle = None
                self._release(self._last_end_ev)
                self._last_end_ev = end
                self._release(start)
                for a, b in h2d_evs or ():
                    self._release(a)
                    self._release(b)
            else:
                self.gpu_unread += 1
                self._last_end_ev = None
            out.append(StepRow(rank, rec[0], wall0 + (rec[1] - perf0), rec[2], rec[3], h2d,
                               busy, idle, rec[4], rec[5]))
        return out

    def _say(self, key: str, msg: str) -> None:
        """Tell once: stderr now, the run's events at the next flush (never I/O on the
        training thread beyond the one stderr line)."""
        if key in self._said:
            return
        self._said.add(key)
        _warn(msg)
        if key not in ("write", "open"):
            self._notes.append((time.time(), f"rank {self.rank}: {msg}"))

    # --- shutdown --------------------------------------------------------------------------------
    def _atexit(self) -> None:
        if os.getpid() == self.pid:  # not in forked DataLoader workers
            self.close()

    def close(self) -> None:
        """Stop the writer, wait briefly for outstanding CUDA events (polling ``query()``), write
        everything, stop the standalone collector and finish ``meta.json``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.active = False
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._flush_lock:
            self._flush_locked(final=False)
            while self._pending and time.monotonic() < deadline:
                time.sleep(0.01)
                self._flush_locked(final=False)
            self._flush_locked(final=True)
        try:
            self._finish()
        except Exception as exc:  # at exit: tell, never raise
            _warn(f"could not finish the run in {self.run_dir}: {exc}")

    def _finish(self) -> None:
        if self._collector is not None:
            self._collector.stop()
            if self._collector_store is not None:
                self._collector_store.close()
        if self._meta is not None and self.run_dir is not None:
            from stallscope.store import write_meta

            meta = self._meta
            meta["end"] = time.time()
            meta["exit_code"] = self._exit_code
            meta["samples"] = self._collector.samples if self._collector is not None else 0
            with self._cfg_lock:
                meta["loader"] = self.config.get("loader")
            meta["probe"] = {"steps": self.written, "dropped": self.dropped, "lost": self.lost}
            write_meta(self.run_dir, meta)
        if self._prev_excepthook is not None:
            sys.excepthook = self._prev_excepthook
        if self._store is not None:
            self._store.close()
            self._store = None

    def stats(self) -> dict[str, Any]:
        """Counts so far: steps taken, written, dropped (buffer full), lost (write failed)."""
        return {"steps": self._step + 1, "written": self.written, "dropped": self.dropped,
                "lost": self.lost, "gpu_unread": self.gpu_unread, "run_dir": str(self.run_dir)}

    def __repr__(self) -> str:
        return f"<Probe rank={self.rank} run_dir={self.run_dir} steps={self._step + 1}>"


def _interval_from_env() -> float:
    v = os.environ.get("STALLSCOPE_INTERVAL")
    if not v:
        return DEFAULT_COLLECT_S
    try:
        f = float(v)
        if f > 0:
            return f
    except ValueError:
        pass
    _warn(f"STALLSCOPE_INTERVAL={v!r} is not a positive number of seconds; using "
          f"{DEFAULT_COLLECT_S:g}")
    return DEFAULT_COLLECT_S


def _shared_run_dir(out: Path, label: str) -> tuple[Path | None, int]:
    """The run directory all ranks started by one launcher agree on: named after the launcher
    (parent) process's start time and pid. Returns (dir, launcher pid)."""
    import psutil

    ppid = os.getppid()
    try:
        started = psutil.Process(ppid).create_time()
    except psutil.Error:
        return None, os.getpid()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    path = out / f"{stamp}-{label}-ddp{ppid}"
    path.mkdir(parents=True, exist_ok=True)
    return path, ppid


# --- stepping by hand ----------------------------------------------------------------------------
class StepTimer:
    """One step timed by hand: data wait = time since the previous step ended, host time = the
    block itself. A context manager (``with stallscope.step(): ...``) or ``start()``/``stop()``."""

    __slots__ = ("_epoch", "_ev0", "_n", "_p", "_step", "_t0", "_wait")

    def __init__(self, probe: Probe, samples: int | None = None, epoch: int | None = None) -> None:
        self._p = probe
        self._n = samples
        self._epoch = epoch
        self._t0 = 0.0
        self._wait = 0.0
        self._step = -1
        self._ev0: EventLike | None = None

    def start(self) -> StepTimer:
        p = self._p
        t0 = time.perf_counter()
        self._t0 = t0
        self._wait = t0 - p._last_end if p._last_end is not None else 0.0
        if not p.active:
            return self
        p._step += 1
        self._step = p._step
        if self._epoch is None:
            self._epoch = max(p.epoch, 0)
        if p._events is not None or (p._cuda is not None and p.gpu_ready()):
            try:
                ev = p._event()
                ev.record()
                self._ev0 = ev
            except Exception as exc:
                p._say("cuda", f"CUDA event record failed, GPU step timing off: {exc}")
        return self

    def stop(self) -> None:
        p = self._p
        t1 = time.perf_counter()
        p._last_end = t1
        if not p.active or self._step < 0:
            return
        h2d, h2d_evs = p._take_h2d()
        gpu = None
        if self._ev0 is not None:
            try:
                ev1 = p._event()
                ev1.record()
                gpu = (self._ev0, ev1, h2d_evs)
            except Exception as exc:
                p._say("cuda", f"CUDA event record failed, GPU step timing off: {exc}")
        p._push((self._step, self._t0, self._wait, t1 - self._t0, self._n,
                 self._epoch if self._epoch is not None else 0, h2d, gpu))

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, tp: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --- wrapping a loader ---------------------------------------------------------------------------
class Watched(Generic[T]):
    """An iterable that times every batch of ``loader`` (see the module docstring).

    Attributes it does not have (``sampler``, ``dataset``, ``batch_size``...) come from the
    wrapped loader, and ``len()`` is the loader's, so it can stand in for it."""

    def __init__(self, loader: Iterable[T], probe: Probe | None) -> None:
        self.loader = loader
        self.probe = probe

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "probe"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[T]:
        p = self.probe
        if p is None or not p.active:
            yield from self.loader
            return
        perf = time.perf_counter
        t_req = perf()
        it = iter(self.loader)
        try:
            epoch = p.begin_epoch(self.loader, it, iter_s=perf() - t_req)
            gpu = p.gpu_ready()
            maybe_gpu = p._cuda is not None and not gpu
        except Exception as exc:  # never stop the trainer: fall back to plain iteration
            _warn(f"probe disabled for this loader: {exc!r}")
            yield from it
            return
        buf = p._buf
        cap = p.capacity
        sizer: Callable[[Any], int | None] | None = None
        open_step = False
        cur = 0
        t_got = wait = 0.0
        n: int | None = None
        ev0: Any = None
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t_got = perf()
                cur = p._step = p._step + 1
                if maybe_gpu and p.gpu_ready():
                    gpu, maybe_gpu = True, False
                if gpu:
                    try:
                        ev0 = p._event()
                        ev0.record()
                    except Exception as exc:  # CUDA trouble is the trainer's to report
                        gpu = maybe_gpu = False
                        p._say("cuda", f"CUDA event record failed, GPU step timing off: {exc}")
                # (try blocks cost nothing in CPython 3.11+ until something raises)
                try:
                    if sizer is None:
                        sizer = _sizer(batch)
                    n = sizer(batch)
                except Exception:  # an odd batch: no sample count, never an error
                    n = None
                wait = t_got - t_req
                open_step = True
                yield batch
                t_req = perf()
                open_step = False
                h2d = p._h2d_s
                if h2d is not None:
                    p._h2d_s = None
                g: Any = None
                if gpu:
                    evl = p._h2d_ev
                    evs = None
                    if evl is not None:
                        p._h2d_ev = None
                        evs = tuple(evl)
                    try:
                        ev1 = p._event()
                        ev1.record()
                        g = (ev0, ev1, evs)
                    except Exception as exc:
                        gpu = maybe_gpu = False
                        p._say("cuda", f"CUDA event record failed, GPU step timing off: {exc}")
                if len(buf) < cap:
                    buf.append((cur, t_got, wait, t_req - t_got, n, epoch, h2d, g))
                else:
                    p.dropped += 1
        finally:
            if open_step:  # the loop body broke out or raised: the step ends now
                t_end = perf()
                try:
                    h2d, h2d_evs = p._take_h2d()
                    g = None
                    if gpu:
                        ev1 = p._event()
                        ev1.record()
                        g = (ev0, ev1, h2d_evs)
                    p._push((cur, t_got, wait, t_end - t_got, n, epoch, h2d, g))
                except Exception as exc:
                    _warn(f"probe could not record the last step: {exc!r}")
            p._last_end = perf()
            p.epoch_done()


# --- module-level front --------------------------------------------------------------------------
_probes: dict[int, Probe] = {}
_lock = threading.Lock()


def _enabled() -> bool:
    return os.environ.get("STALLSCOPE_PROBE", "1").strip().lower() not in ("0", "false", "no",
                                                                           "off")


def get_probe(rank: int | None = None) -> Probe | None:
    """The probe of this process (and rank), made on first use; None when turned off
    (``STALLSCOPE_PROBE=0``) or when it cannot start (the reason is printed once)."""
    if not _enabled():
        return None
    r = detect_rank() if rank is None else int(rank)
    p = _probes.get(r)
    if p is not None and p.pid == os.getpid() and not p._closed:
        return p
    with _lock:
        p = _probes.get(r)
        if p is None or p.pid != os.getpid() or p._closed:
            try:
                p = Probe(rank=r)
            except Exception as exc:  # never crash the trainer
                _warn(f"step probe not started: {exc!r}")
                return None
            _probes[r] = p
        return p


def _default_probe() -> Probe | None:
    if len(_probes) == 1:
        p = next(iter(_probes.values()))
        if p.pid == os.getpid() and not p._closed:
            return p
    return get_probe()


def reset() -> None:
    """Close every probe of this process (writes what they hold). For tests and notebooks."""
    with _lock:
        probes = list(_probes.values())
        _probes.clear()
    for p in probes:
        if p.pid == os.getpid():
            p.close()


def watch(loader: Iterable[T], *, rank: int | None = None) -> Watched[T]:
    """Wrap ``loader`` so every step is timed: ``for batch in stallscope.watch(loader): ...``.

    Each ``for`` over the wrapper is one epoch. ``rank`` defaults to torch.distributed's rank,
    else ``$RANK``, else 0."""
    return Watched(loader, get_probe(rank))


def step(samples: int | None = None, *, epoch: int | None = None,
         rank: int | None = None) -> StepTimer | _NullStep:
    """Time one step of a loop that does not iterate a loader::

        with stallscope.step(samples=len(x)):
            train_one_batch(x)

    The data wait of a step is the time since the previous step ended."""
    p = get_probe(rank) if rank is not None else _default_probe()
    if p is None:
        return _NULL_STEP
    return StepTimer(p, samples, epoch).start()


class _NullStep:
    def __enter__(self) -> _NullStep:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def stop(self) -> None:
        return None


_NULL_STEP = _NullStep()


def _move(obj: Any, device: Any, non_blocking: bool) -> Any:
    if hasattr(obj, "to") and hasattr(obj, "shape"):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        moved = {k: _move(v, device, non_blocking) for k, v in obj.items()}
        try:
            return type(obj)(moved)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict
            return moved
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_move(v, device, non_blocking) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(v, device, non_blocking) for v in obj)
    return obj


def _is_cuda(device: Any) -> bool:
    t = getattr(device, "type", None)
    if t is None:
        t = str(device).split(":", 1)[0]
    return t == "cuda"


def h2d(batch: T, device: Any, non_blocking: bool = True) -> T:
    """Move the tensors in ``batch`` (nested lists, tuples, dicts) to ``device`` and record the
    copy time with the current step, like ``batch.to(device, non_blocking=True)``.

    To a CUDA device, the time comes from CUDA events around the copies (a ``non_blocking`` copy
    returns before it is done, so host clocks would say ~0); elsewhere from host clocks. For
    copies that overlap compute, pin the memory (``pin_memory=True``)."""
    p = _default_probe()
    if p is None or not p.active:
        return _move(batch, device, non_blocking)
    if _is_cuda(device) and p.gpu_ready():
        try:
            a = p._event()
            a.record()
        except Exception as exc:
            p._say("cuda", f"CUDA event record failed: {exc}")
            return _move(batch, device, non_blocking)
        out = _move(batch, device, non_blocking)
        b = p._event()
        b.record()
        if p._h2d_ev is None:
            p._h2d_ev = []
        p._h2d_ev.append((a, b))
        return out
    t0 = time.perf_counter()
    out = _move(batch, device, non_blocking)
    dt = time.perf_counter() - t0
    p._h2d_s = dt if p._h2d_s is None else p._h2d_s + dt
    return out

