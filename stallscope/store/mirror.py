"""A probe's steps, copied from the run it writes to into another run: ``run --pid`` on a trainer
that already has a standalone probe (``stallscope.watch`` without ``stallscope run``).

That trainer's probe writes its steps into its own run (``mode: "probe"`` in ``meta.json``);
the attached ``stallscope run --pid`` makes another run, with the machine's series and the
trainer's sampled stacks. :func:`probe_run_of` finds the probe's run; :class:`StepMirror` copies
its new steps (and its probes' rows) into the attached run at every call, so the diagnosis,
``top`` and the alert engine of the attached run see the probe's measurements. Reads go through
a read-only connection, by primary key (rank, step) after the last copied: cheap at any length.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from stallscope.errors import StallscopeError
from stallscope.store.db import (
    RunStore,
    StepRow,
    comm_column,
    n_column,
    packed_steps_after,
    step_ranks,
    steps_after,
)
from stallscope.store.index import indexed_runs
from stallscope.store.rundir import read_meta, run_state

__all__ = ["StepMirror", "probe_run_of"]

_COLS = "rank, step, ts, wait_s, host_s, h2d_s, gpu_busy_s, gpu_idle_s, samples, epoch"


def probe_run_of(pid: int, started: float) -> Path | None:
    """The running run a standalone probe inside process ``pid`` writes to (its trainer, or one
    of its ranks), begun after the process started; None if there is none."""
    for run_dir in reversed(indexed_runs()):
        try:
            meta = read_meta(run_dir)
        except (StallscopeError, OSError, ValueError):
            continue
        if meta.get("mode") != "probe" or run_state(meta) != "running":
            continue
        start = meta.get("start")
        if isinstance(start, (int, float)) and start < started - 5.0:
            continue  # an older process's run that happened to have this pid
        if meta.get("pid") == pid or pid in _probe_pids(run_dir / "run.db"):
            return run_dir
    return None


def _probe_pids(db_path: Path) -> set[int]:
    try:
        store = RunStore(db_path, readonly=True)
    except StallscopeError:
        return set()
    try:
        return {int(p["pid"]) for p in store.probes() if isinstance(p.get("pid"), int)}
    except sqlite3.Error:
        return set()
    finally:
        store.close()


class StepMirror:
    """Copies the steps of ``source`` (a run.db a probe writes) into the run.db ``dest`` (see
    the module docstring)."""

    def __init__(self, source: Path, dest: Path) -> None:
        self.source = source
        #: its own connection to the destination's run.db (the collector's thread writes
        #: through another; SQLite's WAL lets them take turns)
        self.dest = RunStore(dest)
        self.copied = 0
        self._last: dict[int, int] = {}  #: rank -> the last step copied
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is None:
            try:
                self._conn = sqlite3.connect(
                    f"file:{self.source}?mode=ro", uri=True, timeout=1.0, check_same_thread=False
                )
            except sqlite3.Error:
                return None
        return self._conn

    def copy(self) -> int:
        """Copy the steps written since the last call; returns how many (0 when the source
        cannot be read now: the next call tries again)."""
        conn = self._connect()
        if conn is None:
            return 0
        try:
            conn.execute("BEGIN")  # the packed rows and the rows: one snapshot
            where, args = steps_after(self._last, step_ranks(conn))
            # rows the probe's own collector packed before they were copied (attached late)
            packed = packed_steps_after(conn, self._last)
            rows = conn.execute(
                f"SELECT {_COLS}, {comm_column(conn)}, {n_column(conn)} FROM steps"
                + (f" WHERE {where}" if where else "")
                + " ORDER BY rank, step",
                args,
            ).fetchall()
            probes = conn.execute("SELECT rank, pid, config, steps, dropped FROM probes").fetchall()
        except sqlite3.Error:
            return 0  # no steps table yet, or busy
        finally:
            if conn.in_transaction:
                conn.rollback()
        good = [
            StepRow(*r)
            for r in rows
            if isinstance(r[0], int)
            and isinstance(r[1], int)
            and all(isinstance(x, (int, float)) for x in r[2:5])
            and isinstance(r[11], int)
            and r[11] >= 1
        ]
        good = packed + good  # packed rows are readable by construction
        try:
            if good:
                self.dest.add_steps(good)
            for rank, pid, config, steps, dropped in probes:
                if not all(isinstance(x, int) for x in (rank, pid, steps, dropped)):
                    continue
                try:
                    cfg = json.loads(config) if isinstance(config, str) else {}
                except ValueError:
                    cfg = {}
                self.dest.set_probe(rank, pid, cfg if isinstance(cfg, dict) else {}, steps, dropped)
        except sqlite3.Error:
            return 0  # the destination is busy or full: the same rows again next time
        for s in good:
            self._last[s.rank] = max(self._last.get(s.rank, -1), s.step)
        self.copied += len(good)
        return len(good)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.dest.close()
