"""The framework-free step recorder: what every adapter (PyTorch today, Keras next) shares.

An adapter measures steps on the training thread and hands each one over as a bare tuple laid
out like :class:`StepRecord` (building a tuple is ~4x cheaper than building a NamedTuple, and the
training thread is where cost matters). The recorder keeps those in a bounded buffer (drops are
counted, never waited for); a background writer thread turns them into :class:`StepRecord` and
then into run-store rows once per ``flush_interval`` (and at exit). Nothing here raises into the
trainer: failures are counted and said once (stderr, and an event in the run).

Device (GPU) timing goes through :class:`DeviceTimer`, which the adapter supplies: the recorder
records markers on the training thread and reads them on the writer thread once they completed,
without ever knowing which device or framework they belong to. This module must never import a
training framework (not even lazily): adapters for other frameworks import it.

Where records go: ``$STALLSCOPE_RUN_DIR/run.db`` under ``stallscope run``, an explicit
``run_dir``, or a monitored session of the recorder's own (:mod:`stallscope.probe.standalone`).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

# the small helpers live in the lower module (standalone imports nothing of the recorder)
from stallscope.probe.standalone import _warn, env_int, interval_from_env

if TYPE_CHECKING:
    from stallscope.probe.standalone import StandaloneRun
    from stallscope.store import RunStore, StepRow

__all__ = [
    "CLOSE_WAIT_S",
    "DEFAULT_CAPACITY",
    "DEFAULT_FLUSH_S",
    "DeviceTimer",
    "EventLike",
    "EventTimer",
    "RawStep",
    "Recorder",
    "StepRecord",
    "StepTimer",
    "current",
    "env_int",
    "env_rank",
    "obtain",
    "probe_enabled",
    "reset",
]

#: steps the buffer holds between flushes before records are dropped (about 1 min at 1 kHz)
DEFAULT_CAPACITY = 65536
#: seconds between writes of the buffer to the run store
DEFAULT_FLUSH_S = 1.0
#: epoch records kept in the probe's configuration
MAX_EPOCHS_KEPT = 10000
#: seconds ``close()`` waits (polling ``query()``, never synchronizing) for outstanding events
CLOSE_WAIT_S = 2.0
#: device events kept for reuse (making one can cost a driver call)
MAX_FREE_EVENTS = 4096


# --- device timing: supplied by the adapter -------------------------------------------------------
class EventLike(Protocol):
    """A marker in the device's work stream (``torch.cuda.Event(enable_timing=True)`` obeys it).

    ``record()`` only enqueues it (never waits); ``query()`` says whether the device got there;
    ``elapsed_time`` is only asked once both events completed."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds from this event to ``end_event``."""
        ...


class DeviceTimer(Protocol):
    """How an adapter lends the recorder its device clock, so the recorder never knows which
    device (or framework) it times."""

    #: what the device is called in messages ("CUDA")
    name: str

    def ready(self) -> bool:
        """True once timing can be used. May stay False for a while (CUDA: until the trainer
        initializes it; the probe must never initialize a device itself); raising turns device
        timing off for good."""
        ...

    def event(self) -> EventLike:
        """A new, unrecorded event (the recorder pools and reuses them)."""
        ...


class EventTimer:
    """A :class:`DeviceTimer` from a bare event factory, always ready: for tests (fake events)
    and for frameworks whose device is ready as soon as events can be made."""

    __slots__ = ("event", "name")

    def __init__(self, events: Callable[[], EventLike], name: str = "device") -> None:
        self.event = events
        self.name = name

    def ready(self) -> bool:
        return True


#: device markers of one step: (start event, end event, ((h2d start, h2d end), ...) or None)
DeviceMarks = tuple[EventLike, EventLike, "tuple[tuple[EventLike, EventLike], ...] | None"]


# --- one step ------------------------------------------------------------------------------------
class StepRecord(NamedTuple):
    """One step as an adapter measured it. Hot paths hand over a :data:`RawStep` tuple in this
    field order instead (cheaper to build); the writer thread makes the typed record."""

    step: int  #: step number within this recorder (0, 1, ...)
    t_got: float  #: ``time.perf_counter()`` when the batch was handed to the step
    wait_s: float  #: host time blocked waiting for the batch (data wait)
    host_s: float  #: host time of the step itself
    samples: int | None  #: batch size, when known
    epoch: int  #: which pass over the data
    h2d_host_s: float | None  #: host-timed copy to the device, when the adapter timed one
    gpu: DeviceMarks | None  #: device markers, opaque to the adapter (read by the writer)


#: what the training thread hands over: a bare tuple in :class:`StepRecord`'s field order
RawStep = tuple[int, float, float, float, "int | None", int, "float | None", Any]

_to_record = StepRecord._make




def env_rank() -> int:
    """``$RANK``, else 0: the rank when no framework says otherwise."""
    r = env_int("RANK")
    return r if r is not None else 0


def machine_config() -> dict[str, Any]:
    """Facts about the machine every recorder reports (adapters add their framework's)."""
    from stallscope.version import __version__

    cfg: dict[str, Any] = {"host": socket.gethostname(), "python": sys.version.split()[0],
                           "stallscope": __version__, "logical_cores": os.cpu_count()}
    try:
        import psutil

        cfg["physical_cores"] = psutil.cpu_count(logical=False)
    except ImportError:
        cfg["physical_cores"] = None
    return cfg


# --- the recorder --------------------------------------------------------------------------------
class Recorder:
    """Per-process (per-rank) recorder of training steps, framework-free.

    Adapters subclass it to describe their loaders (:meth:`describe_loader`,
    :meth:`worker_pids`) and machine (:meth:`machine_config`), and pass a :class:`DeviceTimer`
    for device timing. Their hot loops may append :data:`RawStep` tuples to ``_buf`` directly
    (checking ``capacity``, counting ``dropped``) and consume ``_h2d_s``/``_h2d_ev``: that is this
    package's internal contract, kept because a method call per step would double the cost.
    """

    def __init__(
        self,
        *,
        rank: int | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval: float = DEFAULT_FLUSH_S,
        collect_interval: float | None = None,
        timer: DeviceTimer | None = None,
        register_atexit: bool = True,
    ) -> None:
        self.pid = os.getpid()
        self.rank = env_rank() if rank is None else int(rank)
        self.capacity = max(1, int(capacity))
        self.flush_interval = flush_interval
        self.active = True
        # where to write: explicit dir, stallscope run's dir, or a standalone run of our own
        env_dir = os.environ.get("STALLSCOPE_RUN_DIR")
        self.standalone = run_dir is None and not env_dir
        self.run_dir: Path | None = Path(run_dir) if run_dir is not None else (
            Path(env_dir) if env_dir else None)
        self.collect_interval = collect_interval if collect_interval is not None else \
            interval_from_env()
        # training-thread state (only that thread writes these)
        self._perf0 = time.perf_counter()
        self._wall0 = time.time()
        self._step = -1
        self.epoch = -1
        self._last_end: float | None = None  # perf time the previous step ended (step())
        self._h2d_s: float | None = None
        self._h2d_ev: list[tuple[EventLike, EventLike]] | None = None
        # handed over to the flusher
        self._buf: deque[RawStep] = deque()
        self.dropped = 0
        # alerts for training-side callbacks: the writer thread fills it, the training thread
        # empties it between steps (stallscope.on_alert; see probe/callbacks.py)
        self._due: deque[Any] = deque()
        self._inbox: Any = None
        # device timing: the adapter's timer; _timing once it said it is ready
        self._timer: DeviceTimer | None = timer
        self._timing = False
        self._free_events: list[EventLike] = []
        # flusher state
        self.config: dict[str, Any] = {"rank": self.rank, "pid": self.pid, "epochs": []}
        self._cfg_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: deque[StepRecord] = deque()  # steps waiting for their device events
        self._last_end_ev: EventLike | None = None
        self.written = 0
        self.lost = 0  # records that could not be written
        self.gpu_unread = 0  # steps whose device events never completed in time
        self._said: set[str] = set()
        self._notes: list[tuple[float, str]] = []
        self._said_drop = 0
        self._store: RunStore | None = None
        self._session: StandaloneRun | None = None
        self._exit_code = 0
        self._prev_excepthook: Any = None
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

    # --- what adapters describe ------------------------------------------------------------------
    def describe_loader(self, loader: Any) -> dict[str, Any] | None:
        """The loader's configuration (JSON-able), kept once under ``config["loader"]``."""
        return None

    def worker_pids(self, it: Any) -> list[int] | None:
        """Pids of the processes loading data for iterator ``it``, when the framework has any."""
        return None

    def machine_config(self) -> dict[str, Any]:
        """Facts about the machine (runs on the writer thread, once)."""
        return machine_config()

    # --- clocks ----------------------------------------------------------------------------------
    def wall(self, t_perf: float) -> float:
        """Wall-clock time (``time.time()`` scale) of a ``perf_counter`` reading."""
        return self._wall0 + (t_perf - self._perf0)

    # --- device events (training thread) ---------------------------------------------------------
    def gpu_ready(self) -> bool:
        """True once device step timing can be used (the adapter's timer says so)."""
        if self._timing:
            return True
        timer = self._timer
        if timer is None:
            return False
        try:
            self._timing = bool(timer.ready())
        except Exception as exc:
            self._timer = None
            self._say("cuda", f"{timer.name} step timing off: {exc}")
            return False
        return self._timing

    def _event(self) -> EventLike:
        free = self._free_events
        if free:
            return free.pop()
        assert self._timer is not None
        return self._timer.event()

    def _release(self, ev: EventLike | None) -> None:
        if ev is not None and len(self._free_events) < MAX_FREE_EVENTS:
            self._free_events.append(ev)

    def _device_name(self) -> str:
        t = self._timer
        return t.name if t is not None else "device"

    # --- records (training thread) ---------------------------------------------------------------
    def _push(self, rec: RawStep) -> None:
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

    def note_h2d(self, seconds: float) -> None:
        """Add a host-timed copy to the device to the current step."""
        self._h2d_s = seconds if self._h2d_s is None else self._h2d_s + seconds

    def note_h2d_events(self, start: EventLike, end: EventLike) -> None:
        """Add a device-timed copy (two recorded events around it) to the current step."""
        if self._h2d_ev is None:
            self._h2d_ev = []
        self._h2d_ev.append((start, end))

    def record(self, wait_s: float, host_s: float, *, samples: int | None = None,
               epoch: int | None = None, t_got: float | None = None,
               h2d_s: float | None = None) -> int:
        """Record one step an adapter timed itself (its framework reports the times); returns
        its step number, -1 when the recorder is closed. ``t_got`` (``perf_counter`` scale)
        defaults to ``host_s`` ago; host-timed copies noted since the last step are added."""
        if not self.active:
            return -1
        if t_got is None:
            t_got = time.perf_counter() - host_s
        n = self._step = self._step + 1
        h, _evs = self._take_h2d()  # device-timed copies need device marks: begin_step()
        if h2d_s is not None:
            h = h2d_s if h is None else h + h2d_s
        self._push((n, t_got, wait_s, host_s, samples,
                    max(self.epoch, 0) if epoch is None else epoch, h, None))
        if self._due:
            self.run_due()
        return n

    def begin_epoch(self, loader: Any = None, it: Any = None, *, epoch: int | None = None,
                    iter_s: float | None = None) -> int:
        """Start a new epoch (a new pass over a watched loader); returns its number."""
        self.epoch = self.epoch + 1 if epoch is None else int(epoch)
        try:
            rec: dict[str, Any] = {"epoch": self.epoch, "ts": time.time()}
            if iter_s is not None:
                rec["iter_s"] = iter_s
            pids = self.worker_pids(it) if it is not None else None
            if pids is not None:
                rec["worker_pids"] = pids
            with self._cfg_lock:
                if loader is not None and "loader" not in self.config:
                    cfg = self.describe_loader(loader)
                    if cfg is not None:
                        self.config["loader"] = cfg
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
        """Start a step by hand (what ``step()`` and the framework callbacks use)."""
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
            machine = self.machine_config()
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
        if self._session is not None:
            try:
                self._session.start_sampling()
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
            self.poll_alerts()

    # --- alerts for training-side callbacks ------------------------------------------------------
    def poll_alerts(self) -> None:
        """Writer thread: queue the alerts the engine published since the last look, for the
        training thread to run their callbacks between steps. Reads nothing unless a callback
        is registered."""
        from stallscope.probe import callbacks

        if not callbacks.registered():
            return
        if self._inbox is None:
            self._inbox = callbacks.AlertInbox()
        try:
            got = self._inbox.poll(self.run_dir)
        except OSError as exc:
            self._say("alerts", f"cannot read alerts from {self.run_dir}: {exc}")
            return
        self._due.extend(got)

    def run_due(self) -> None:
        """Training thread, between steps: run the callbacks of the alerts queued so far. The
        time they take is neither data wait nor step time."""
        from stallscope.probe.callbacks import run_callbacks

        due = self._due
        todo = [due.popleft() for _ in range(len(due))]
        try:
            run_callbacks(todo)
        finally:
            self._last_end = time.perf_counter()

    def _open(self) -> None:
        from stallscope.store import RunStore

        if self.standalone:
            from stallscope.probe.standalone import default_label, start_standalone

            session = start_standalone(default_label(), self.collect_interval,
                                       start=self._wall0)
            self.run_dir = session.run_dir
            self._session = session
        assert self.run_dir is not None
        self._store = RunStore(self.run_dir / "run.db")

    def _install_excepthook(self) -> None:
        prev = sys.excepthook
        self._prev_excepthook = prev

        def hook(tp: type[BaseException], value: BaseException,
                 tb: TracebackType | None) -> None:
            self._exit_code = 1  # an uncaught exception ends the process with status 1
            prev(tp, value, tb)

        sys.excepthook = hook

    def flush(self) -> int:
        """Write what the buffer holds (and device timings that completed); returns rows
        written. Runs on the writer thread (and once more at exit); safe to call from tests."""
        self._ready.wait(30.0)
        with self._flush_lock:
            return self._flush_locked(final=False)

    def _flush_locked(self, *, final: bool) -> int:
        from stallscope.store import StepRow

        buf = self._buf
        rows: list[StepRow] = []
        rank, wall0, perf0 = self.rank, self._wall0, self._perf0
        pending = self._pending
        for _ in range(len(buf)):
            rec = _to_record(buf.popleft())
            if rec.gpu is not None:
                pending.append(rec)
                continue
            rows.append(StepRow(rank, rec.step, wall0 + (rec.t_got - perf0), rec.wait_s,
                                rec.host_s, rec.h2d_host_s, None, None, rec.samples, rec.epoch))
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
            self._store.set_probe(rank, self.pid, self.stored_config(), self.written,
                                  dropped_now)
        except Exception as exc:  # disk full, locked too long, read-only: count, say once
            self.lost += len(rows)
            self._say("write", f"cannot write step records to {self.run_dir}: {exc}; "
                      "training continues")
            return 0
        return len(rows)

    def stored_config(self) -> dict[str, Any]:
        """The configuration as the run store keeps it (``probes.config``): loader, machine,
        epochs, and the recorder's own counters."""
        with self._cfg_lock:
            cfg = dict(self.config)
            cfg["epochs"] = list(cfg["epochs"])
        cfg.update(lost=self.lost, gpu_unread=self.gpu_unread, gpu_timing=self._timing,
                   capacity=self.capacity)
        return cfg

    def _gpu_rows(self, final: bool) -> list[StepRow]:
        """Rows whose device events completed (in order: a device runs a stream in order)."""
        from stallscope.store import StepRow

        out: list[StepRow] = []
        pending = self._pending
        rank, wall0, perf0 = self.rank, self._wall0, self._perf0
        name = self._device_name()
        while pending:
            rec = pending[0]
            assert rec.gpu is not None
            start, end, h2d_evs = rec.gpu
            busy = idle = None
            h2d = rec.h2d_host_s
            try:
                done = end.query() and all(b.query() for _, b in h2d_evs or ())
            except Exception as exc:  # a broken event: report once, give up on its timing
                self._say("cuda", f"{name} event query failed: {exc}")
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
                    self._say("cuda", f"{name} elapsed_time failed: {exc}")
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
            out.append(StepRow(rank, rec.step, wall0 + (rec.t_got - perf0), rec.wait_s,
                               rec.host_s, h2d, busy, idle, rec.samples, rec.epoch))
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
        """Stop the writer, wait briefly for outstanding device events (polling ``query()``),
        write everything and finish a standalone session. Idempotent."""
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
        try:
            if self._session is not None:
                self._session.finish(
                    self._exit_code,
                    {"steps": self.written, "dropped": self.dropped, "lost": self.lost},
                    self._loader_configs())
        finally:
            if self._prev_excepthook is not None:
                sys.excepthook = self._prev_excepthook
            if self._store is not None:
                self._store.close()
                self._store = None

    def _loader_configs(self) -> dict[str, Any]:
        """``meta.json``'s ``loader_config``, shaped as ``stallscope run`` writes it: every
        rank's stored configuration by str(rank) (ranks sharing this run that wrote so far),
        this recorder's own at least."""
        configs: dict[str, Any] = {}
        if self._store is not None:
            try:
                configs = {str(p["rank"]): p["config"] for p in self._store.probes()}
            except Exception as exc:  # the other ranks' views are a nicety: keep ours
                self._say("meta", f"cannot read the ranks' loader configurations: {exc}")
        configs.setdefault(str(self.rank), self.stored_config())
        return configs

    def stats(self) -> dict[str, Any]:
        """Counts so far: steps taken, written, dropped (buffer full), lost (write failed)."""
        return {"steps": self._step + 1, "written": self.written, "dropped": self.dropped,
                "lost": self.lost, "gpu_unread": self.gpu_unread, "run_dir": str(self.run_dir)}

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} rank={self.rank} run_dir={self.run_dir} "
                f"steps={self._step + 1}>")


# --- stepping by hand ----------------------------------------------------------------------------
class StepTimer:
    """One step timed by hand: data wait = time since the previous step ended, host time = the
    block itself. A context manager (``with stallscope.step(): ...``) or ``start()``/``stop()``.

    Framework-free (host clocks and the recorder's device timer): the framework callbacks of
    every adapter use it between their step hooks."""

    __slots__ = ("_epoch", "_ev0", "_n", "_p", "_step", "_t0", "_wait")

    def __init__(self, probe: Recorder, samples: int | None = None,
                 epoch: int | None = None) -> None:
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
        if p._timing or (p._timer is not None and p.gpu_ready()):
            try:
                ev = p._event()
                ev.record()
                self._ev0 = ev
            except Exception as exc:
                p._say("cuda", f"{p._device_name()} event record failed, GPU step timing off: "
                       f"{exc}")
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
                p._say("cuda", f"{p._device_name()} event record failed, GPU step timing off: "
                       f"{exc}")
        p._push((self._step, self._t0, self._wait, t1 - self._t0, self._n,
                 self._epoch if self._epoch is not None else 0, h2d, gpu))
        if p._due:
            p.run_due()

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, tp: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --- one recorder per process and rank -----------------------------------------------------------
_probes: dict[int, Recorder] = {}
_lock = threading.Lock()


def probe_enabled() -> bool:
    """False when ``STALLSCOPE_PROBE`` turns the probe off (0, false, no, off)."""
    return os.environ.get("STALLSCOPE_PROBE", "1").strip().lower() not in ("0", "false", "no",
                                                                           "off")


def obtain(rank: int, make: Callable[[int], Recorder]) -> Recorder | None:
    """This process's recorder for ``rank``, made by ``make(rank)`` on first use (whichever
    adapter asks first makes it; the others share it). None when the probe is turned off or
    cannot start (the reason is printed once)."""
    if not probe_enabled():
        return None
    p = _probes.get(rank)
    if p is not None and p.pid == os.getpid() and not p._closed:
        return p
    with _lock:
        p = _probes.get(rank)
        if p is None or p.pid != os.getpid() or p._closed:
            try:
                p = make(rank)
            except Exception as exc:  # never crash the trainer
                _warn(f"step probe not started: {exc!r}")
                return None
            _probes[rank] = p
        return p


def current() -> Recorder | None:
    """The one live recorder of this process, if there is exactly one (no rank to look up)."""
    if len(_probes) == 1:
        p = next(iter(_probes.values()))
        if p.pid == os.getpid() and not p._closed:
            return p
    return None


def reset() -> None:
    """Close every recorder of this process (writes what they hold). For tests and notebooks."""
    with _lock:
        probes = list(_probes.values())
        _probes.clear()
    for p in probes:
        if p.pid == os.getpid():
            p.close()

