"""A recorder's writer thread: step records from the buffer into the run store.

Once per flush interval (and when an epoch ends, and at exit) the writer takes the steps the
training thread handed over (:class:`~stallscope.probe.buffer.StepBuffer`), reads their device
events once they completed, and writes the rows, the probe's configuration and its counters to
``run.db``; it also looks for alerts the training thread's callbacks wait for. It owns where the
records go (an explicit run directory, ``stallscope run``'s, or a standalone run of its own,
:mod:`stallscope.probe.standalone`) and finishing that run at exit. Nothing here runs on the
training thread except making, starting, waking and closing the :class:`StepWriter`.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallscope import forksafe, textsafe
from stallscope.probe.buffer import RawStep, StepRecord
from stallscope.probe.notices import warn
from stallscope.probe.standalone import ExitStatus

if TYPE_CHECKING:
    from stallscope.probe.device import EventLike
    from stallscope.probe.recorder import Recorder
    from stallscope.probe.standalone import StandaloneRun
    from stallscope.store import RunStore
    from stallscope.store.db import StepValues

__all__ = ["CLOSE_WAIT_S", "DEFAULT_FLUSH_S", "StepWriter"]

#: a RawStep's wait_s, host_s and device marks (C-level getters: no Python call per row)
_WAIT, _HOST, _GPU = operator.itemgetter(2), operator.itemgetter(3), operator.itemgetter(7)
_N = operator.itemgetter(8)

#: seconds between writes of the buffer to the run store
DEFAULT_FLUSH_S = 1.0
#: seconds ``close()`` waits (polling ``query()``, never synchronizing) for outstanding events
CLOSE_WAIT_S = 2.0


class StepWriter:
    """The background thread of one recorder (``rec``): it reads ``rec``'s public state (buffer,
    device clock, notices, configuration) and never writes the training thread's.

    ``run_dir`` None means a standalone run of its own, made when the thread starts;
    ``written``, ``lost`` (steps whose records could not be written) and ``gpu_unread`` (steps
    whose device events never completed in time) are its counters, in steps (a record may hold
    several: :data:`~stallscope.probe.buffer.GROUP_S`)."""

    def __init__(
        self, rec: Recorder, run_dir: Path | None, *, flush_interval: float, collect_interval: float
    ) -> None:
        self._rec = rec
        self.run_dir = run_dir
        self.flush_interval = flush_interval
        self.collect_interval = collect_interval
        self.store: RunStore | None = None
        self._session: StandaloneRun | None = None
        # here, on the training thread: a crash in the first step must still be seen
        self._exit = ExitStatus() if run_dir is None else None
        self.written = 0
        self.lost = 0
        self.gpu_unread = 0
        #: every step handed over so far: [steps, wait s, step s, steps with comm, comm s]
        #: (the writer thread adds; the framework callbacks read deltas for their loggers)
        self.sums = [0, 0.0, 0.0, 0, 0.0]
        self._said_drop = 0
        self._pending: deque[StepRecord] = deque()  # steps waiting for their device events
        self._last_end_ev: EventLike | None = None
        self._last_end_step = -2
        self._lock = threading.Lock()
        self.ready = threading.Event()  #: set once the store is open (or could not be)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._loop, name=f"stallscope-probe-{rec.rank}", daemon=True
        )

    def start(self) -> None:
        """Start the thread (once the recorder is complete: the thread reads it). Its imports
        must not meet a fork of the training's workers (:mod:`stallscope.forksafe`)."""
        forksafe.install()
        self.thread.start()

    def wake(self) -> None:
        """Flush soon (an epoch ended), off the training thread."""
        self._wake.set()

    # --- the thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        rec = self._rec
        try:
            rec.update_config(rec.machine_config())
        except Exception as exc:  # facts about the machine are a nicety, not a reason to stop
            rec.notices.say("machine", f"cannot read the machine configuration: {exc!r}")
        try:
            self._open()
        except Exception as exc:  # no run directory: training goes on, records are counted lost
            where = textsafe.plain(self.run_dir, 200) if self.run_dir else "a new run"
            rec.notices.say(
                "open",
                f"cannot write step records to {where}: {exc}; training continues without them",
            )
        finally:
            self.ready.set()
        if self._session is not None:
            try:
                self._session.start_sampling()
            except Exception as exc:  # the steps are still recorded; say why the rest is not
                rec.notices.say("collector", f"machine sampling not started: {exc}")
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.flush()
            except Exception as exc:  # a bug here must not end the writer: say it, go on
                rec.notices.say("flush", f"probe writer error: {exc!r}")
            rec.poll_alerts()

    def _open(self) -> None:
        from stallscope.store import RunStore

        if self.run_dir is None:
            from stallscope.probe.standalone import default_label, start_standalone

            session = start_standalone(
                default_label(), self.collect_interval, start=self._rec.wall0
            )
            self.run_dir = session.run_dir
            self._session = session
        self.store = RunStore(self.run_dir / "run.db")

    # --- writing ---------------------------------------------------------------------------------
    def flush(self) -> int:
        """Write what the buffer holds (and device timings that completed); returns rows
        written. Runs on the writer thread (and once more at exit); safe to call from tests."""
        self.ready.wait(30.0)
        with self._lock:
            return self._flush_locked(final=False)

    def _flush_locked(self, *, final: bool) -> int:
        rec = self._rec
        queue, timed = rec.buffer.queue, rec.buffer.timed
        # this thread shares the trainer's interpreter: what it spends per row is taken from
        # the training thread's steps, so plain steps go to the store as handed over, in blocks
        plain = [queue.popleft() for _ in range(len(queue))]  # what is there now
        for _ in range(len(timed)):  # device-timed steps wait for their events
            self._pending.append(StepRecord._make(timed.popleft()))
        if any(map(_GPU, plain)):  # a hot loop that did not keep them apart (never in ours)
            for r in [r for r in plain if r[7] is not None]:
                self._pending.append(StepRecord._make(r))
            plain = [r for r in plain if r[7] is None]
        comm_of = rec.comm_of  # set before the step is queued (training thread)
        values: list[StepValues] = []
        if comm_of:  # distributed: the steps that waited in collectives carry their wait
            rank, base = rec.rank, rec.wall0 - rec.perf0
            rest = []
            for r in plain:
                if (c := comm_of.pop(r[0], None)) is not None:
                    values.append(
                        (rank, r[0], base + r[1], r[2], r[3], r[6], None, None, r[4], r[5], c, r[8])
                    )
                else:
                    rest.append(r)
            plain = rest
        values.extend(self._gpu_rows(final))
        sums = self.sums
        wait_sum = math.fsum(map(_WAIT, plain))
        steps = sum(map(_N, plain))
        sums[0] += steps
        sums[1] += wait_sum
        sums[2] += wait_sum + math.fsum(map(_HOST, plain))
        for row in values:
            steps += row[11]
            sums[0] += row[11]
            sums[1] += row[3]
            sums[2] += row[3] + row[4]
            if row[10] is not None:
                sums[3] += row[11]
                sums[4] += row[10]
        if self.store is None:
            self.lost += steps
            return 0
        return self._write(self.store, plain, values, steps, rec.buffer.dropped, final)

    def _write(
        self,
        store: RunStore,
        plain: list[RawStep],
        rows: list[StepValues],
        steps: int,
        dropped_now: int,
        final: bool,
    ) -> int:
        """Write the records (``steps`` steps in all); returns how many records."""
        rec = self._rec
        n = len(plain) + len(rows)
        try:
            if plain:
                store.add_step_block(rec.rank, rec.wall0 - rec.perf0, plain)
            if rows:
                store.add_step_values(rows)
            self.written += steps
            notes = rec.notices.unsent
            while notes:
                ts, note = notes.pop(0)
                store.add_event(ts, "probe", "error", note)
            tuned = rec.tune_events
            while tuned:
                ts, note = tuned.pop(0)
                store.add_event(ts, "probe", "autotune", note)
            if dropped_now > self._said_drop:
                if self._said_drop == 0 or final:
                    store.add_event(
                        time.time(),
                        "probe",
                        "dropped",
                        f"rank {rec.rank}: probe buffer full ({rec.buffer.capacity} step "
                        f"records), {dropped_now} steps dropped so far",
                    )
                self._said_drop = dropped_now
            store.set_probe(rec.rank, rec.pid, rec.stored_config(), self.written, dropped_now)
        except Exception as exc:  # disk full, locked too long, read-only: count, say once
            self.lost += steps
            where = textsafe.plain(self.run_dir, 200)
            rec.notices.say(
                "write", f"cannot write step records to {where}: {exc}; training continues"
            )
            return 0
        return n

    def _gpu_rows(self, final: bool) -> list[StepValues]:
        """Rows whose device events completed (in order: a device runs a stream in order)."""
        rec = self._rec
        out: list[StepValues] = []
        pending = self._pending
        rank, wall0, perf0 = rec.rank, rec.wall0, rec.perf0
        dev = rec.device
        name = dev.name
        while pending:
            r = pending[0]
            assert r.gpu is not None
            start, end, h2d_evs = r.gpu
            busy = idle = None
            h2d = r.h2d_host_s
            try:
                done = end.query() and all(b.query() for _, b in h2d_evs or ())
            except Exception as exc:  # a broken event: report once, give up on its timing
                rec.notices.say("cuda", f"{name} event query failed: {exc}")
                done = None
            if done is False and len(pending) <= rec.buffer.capacity and not final:
                break
            pending.popleft()
            if done:
                try:
                    busy = start.elapsed_time(end) / 1e3
                    # the GPU's gap before this step: only from the step just before it (the
                    # probe times short steps in pairs, every so many steps: device.py)
                    if self._last_end_ev is not None and r.step == self._last_end_step + 1:
                        idle = max(0.0, self._last_end_ev.elapsed_time(start) / 1e3)
                    if h2d_evs:
                        h2d = (h2d or 0.0) + sum(a.elapsed_time(b) for a, b in h2d_evs) / 1e3
                except Exception as exc:
                    rec.notices.say("cuda", f"{name} elapsed_time failed: {exc}")
                    busy = idle = None
                dev.release(self._last_end_ev)
                self._last_end_ev = end
                self._last_end_step = r.step
                dev.release(start)
                for a, b in h2d_evs or ():
                    dev.release(a)
                    dev.release(b)
            else:
                self.gpu_unread += 1
                self._last_end_ev = None
            comm_of = self._rec.comm_of
            out.append(
                (
                    rank,
                    r.step,
                    wall0 + (r.t_got - perf0),
                    r.wait_s,
                    r.host_s,
                    h2d,
                    busy,
                    idle,
                    r.samples,
                    r.epoch,
                    comm_of.pop(r.step, None) if comm_of else None,
                    r.n,
                )
            )
        return out

    # --- shutdown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the thread, wait briefly for outstanding device events (polling ``query()``),
        write everything and finish a standalone run. Call once."""
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout=30)
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._lock:
            self._flush_locked(final=False)
            while self._pending and time.monotonic() < deadline:
                time.sleep(0.01)
                self._flush_locked(final=False)
            self._flush_locked(final=True)
        try:
            self._finish()
        except Exception as exc:  # at exit: tell, never raise
            warn(f"could not finish the run in {textsafe.plain(self.run_dir, 200)}: {exc}")

    def _finish(self) -> None:
        try:
            if self._session is not None:
                self._session.finish(
                    self._exit.code if self._exit is not None else 0,
                    {"steps": self.written, "dropped": self._rec.buffer.dropped, "lost": self.lost},
                    self._loader_configs(),
                )
        finally:
            if self._exit is not None:
                self._exit.restore()
            if self.store is not None:
                self.store.close()
                self.store = None

    def _loader_configs(self) -> dict[str, Any]:
        """``meta.json``'s ``loader_config``, shaped as ``stallscope run`` writes it: every
        rank's stored configuration by str(rank) (ranks sharing this run that wrote so far),
        this recorder's own at least."""
        rec = self._rec
        configs: dict[str, Any] = {}
        if self.store is not None:
            try:
                configs = {str(p["rank"]): p["config"] for p in self.store.probes()}
            except Exception as exc:  # the other ranks' views are a nicety: keep ours
                rec.notices.say("meta", f"cannot read the ranks' loader configurations: {exc}")
        configs.setdefault(str(rec.rank), rec.stored_config())
        return configs
