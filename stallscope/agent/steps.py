"""Step metrics of the trainings on this node, for the agent's ``/metrics``.

A probe (``stallscope.watch(loader)``, any rank) writes its step records into its run's
``run.db`` and every run directory is listed in the per-user run index
(:mod:`stallscope.store.index`). The agent follows the runs of that index that are going on
(:func:`~stallscope.store.rundir.run_state` says "running" and the trainer's process is alive):
on each scrape it reads the step rows written since the previous one (per rank, by step
number, through a read-only SQLite connection: WAL readers never block the probe's writer) and
adds them to running totals. Nothing flows from the trainer to the agent, so a trainer never
waits for the agent nor fails when it is absent or slow.

The totals become counters labelled ``run`` (the run id), ``rank``, the host label
(``Hostname``) and the owner labels of the run (``namespace``, ``pod``, ``container``, ``hpc_job``):
``stallscope_train_steps_total``, ``stallscope_train_step_seconds_total`` (wall time of the
steps: data wait plus the rest), ``stallscope_train_data_wait_seconds_total``,
``stallscope_train_samples_total`` (when the batch size is known),
``stallscope_train_comm_wait_seconds_total`` (when the probe timed collectives), and the gauge
``stallscope_train_last_step_timestamp_seconds`` (and ``..._first_step_...``, when the run
began: ``diagnose --prometheus`` spreads the steps before its first scrape from there).
Beside them, the histogram ``stallscope_train_step_data_wait_seconds`` of each step's data wait
(buckets :data:`WAIT_EDGES_S`): whether the wait comes in bursts on a few steps (slow samples
holding up the batches) or a little on every step, which the totals cannot tell.
``rate(wait) / rate(step)`` is the data-wait share over any window
(``deploy/prometheus/stallscope-recording.yml``).

A run that ends is read one last time and kept for :attr:`StepFollower.grace_s` (so the last
scrapes see its final totals), then dropped: no stale series. Runs that had ended before the
agent first saw them are never exported.
"""

from __future__ import annotations

import bisect
import glob
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope.errors import RunNotFound
from stallscope.safefile import owned_file
from stallscope.sources.owner import OWNER_KEYS, read_owner
from stallscope.store.db import (
    comm_column,
    n_column,
    packed_steps_after,
    step_ranks,
    steps_after,
)
from stallscope.store.index import indexed_runs
from stallscope.store.rundir import monitor_alive, read_meta, run_state

__all__ = [
    "STEP_METRICS",
    "WAIT_EDGES_S",
    "RankTotals",
    "StepFollower",
    "runs_of_indexes",
    "wait_bucket",
]

#: what the agent exports per rank of a followed run: (name as exposed, type, help)
STEP_METRICS: tuple[tuple[str, str, str], ...] = (
    (
        "stallscope_train_steps_total",
        "counter",
        "training steps the probe recorded (stallscope.watch), per run and rank",
    ),
    (
        "stallscope_train_step_seconds_total",
        "counter",
        "wall time of those steps: data wait plus compute and the rest, seconds",
    ),
    (
        "stallscope_train_data_wait_seconds_total",
        "counter",
        "time the training loop waited for its next batch (data wait), seconds",
    ),
    (
        "stallscope_train_samples_total",
        "counter",
        "samples in those steps (when the probe knows the batch size)",
    ),
    (
        "stallscope_train_comm_wait_seconds_total",
        "counter",
        "time those steps waited in collectives (DDP's gradient all-reduce, torch.distributed "
        "calls), part of the step's compute side, seconds (when the probe timed any)",
    ),
    (
        "stallscope_train_last_step_timestamp_seconds",
        "gauge",
        "Unix time the latest recorded step's batch was handed over",
    ),
    (
        "stallscope_train_first_step_timestamp_seconds",
        "gauge",
        "Unix time the run's first recorded step's batch was handed over (when the run began)",
    ),
    (
        "stallscope_train_step_data_wait_seconds",
        "histogram",
        "each step's data wait, seconds (a record of several short steps counts each at their "
        "mean); buckets ×2 apart, 0.1 ms to 105 s: whether the waits come in bursts "
        "(input_bound.head_of_line) or a little on every step",
    ),
)
#: the ``le`` bounds of ``stallscope_train_step_data_wait_seconds`` (and +Inf)
WAIT_EDGES_S: tuple[float, ...] = tuple(1e-4 * 2**i for i in range(21))

#: index files read per pattern of ``run_indexes`` (a user per index: more than any node has)
MAX_INDEXES = 4096

#: a step row the totals take (the store's own checks: finite, not negative)
_ROW_OK = (
    "typeof(rank)='integer' AND typeof(step)='integer' AND typeof(ts)='real' "
    "AND typeof(wait_s)='real' AND typeof(host_s)='real' AND wait_s >= 0 "
    "AND host_s >= 0 AND wait_s < 1e9 AND host_s < 1e9 AND ts < 1e15"
)


def runs_of_indexes(patterns: list[str]) -> Callable[[], list[Path]]:
    """The run directories of this user's index and of every index file matching ``patterns``
    (config ``run_indexes``: other users' indexes, or a shared one), each once."""

    def runs() -> list[Path]:
        # each index is read as its owner: only that user's run folders count (docs/agent.md,
        # "What the agent reads, and as whom")
        seen: dict[str, Path] = {str(d): d for d in indexed_runs(as_owner=True)}
        for pattern in patterns:
            for name in sorted(glob.glob(pattern))[:MAX_INDEXES]:
                for d in indexed_runs(Path(name), as_owner=True):
                    seen.setdefault(str(d), d)
        return list(seen.values())

    return runs


def wait_bucket(wait_s: float) -> int:
    """The index of the ``stallscope_train_step_data_wait_seconds`` bucket a step's wait falls
    in: the first bound ≥ it, ``len(WAIT_EDGES_S)`` for +Inf."""
    return bisect.bisect_left(WAIT_EDGES_S, wait_s)


@dataclass
class RankTotals:
    """One rank's totals since its run started."""

    steps: int = 0
    step_s: float = 0.0
    wait_s: float = 0.0
    samples: int = 0
    has_samples: bool = False
    comm_s: float = 0.0
    has_comm: bool = False
    #: steps per data-wait bucket (:data:`WAIT_EDGES_S`, +Inf last), not cumulative
    wait_counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_EDGES_S) + 1))
    last_step: int = -1  #: the read cursor: rows with a larger step number are new
    last_ts: float | None = None
    first_ts: float | None = None


@dataclass
class _Followed:
    run_dir: Path
    run_id: str
    #: who owns the run folder: every file of it the agent reads must be theirs, not a link
    uid: int | None = None
    ranks: dict[int, RankTotals] = field(default_factory=dict)
    conn: sqlite3.Connection | None = None
    ended_at: float | None = None  #: when the agent saw it end (agent clock)
    pid: int | None = None  #: the trainer's process (meta.json ``pid``): its tree's root
    start: float | None = None  #: the run's start (meta.json): a later process is not its own
    stamp: dict[str, Any] | None = None  #: meta.json ``pid_stamp``: the trainer's start ticks
    #: whose run it is (meta.json ``owner``, else read from the trainer's cgroup): the
    #: ``namespace``, ``pod``, ``container`` and ``hpc_job`` labels of its series
    owner: dict[str, str] = field(default_factory=dict)
    #: the job it belongs to on every node (its probes' ``job``: torchrun's rendezvous id, the
    #: Slurm job, the rendezvous endpoint); the run id when its probes name none
    job: str | None = None


class StepFollower:
    """Follows the running runs of the per-user index (see the module docstring).

    ``runs``: where the run directories come from (default: the index); ``clock``: the time
    for the grace period. Thread-safe: scrapes may come from several threads."""

    def __init__(
        self,
        runs: Callable[[], list[Path]] = indexed_runs,
        *,
        clock: Callable[[], float] = time.monotonic,
        grace_s: float = 300.0,
        rescan_s: float = 2.0,
    ) -> None:
        self.runs = runs
        self.clock = clock
        self.grace_s = grace_s
        self.rescan_s = rescan_s
        self._followed: dict[str, _Followed] = {}
        self._ignored: set[str] = set()  #: ended before we saw them, or not runs at all
        self._scanned_at: float | None = None
        self._lock = threading.Lock()

    def poll(self) -> dict[str, dict[int, RankTotals]]:
        """run id -> rank -> totals, after reading what was written since the last poll."""
        with self._lock:
            now = self.clock()
            if self._scanned_at is None or now - self._scanned_at >= self.rescan_s:
                self._scan(now)
                self._scanned_at = now
            out: dict[str, dict[int, RankTotals]] = {}
            for key, f in list(self._followed.items()):
                self._read(f)
                if f.ended_at is not None and now - f.ended_at > self.grace_s:
                    self._drop(key)
                    continue
                if f.ranks:
                    out[f.run_id] = {
                        r: RankTotals(**{**t.__dict__, "wait_counts": list(t.wait_counts)})
                        for r, t in f.ranks.items()
                    }
            return out

    def trainers(self) -> dict[str, tuple[int, dict[int, int]]]:
        """run id -> (the trainer's pid, pid -> rank of the probes that reported so far) for
        each followed run that has not ended (:class:`~stallscope.agent.trainprocs.
        TrainerProcs` samples their process trees)."""
        with self._lock:
            self._refresh()
            out: dict[str, tuple[int, dict[int, int]]] = {}
            for f in self._followed.values():
                if (
                    f.ended_at is not None
                    or f.pid is None
                    or not monitor_alive(f.pid, f.start, f.stamp)
                ):
                    continue  # ended, not started yet, or its trainer is gone
                out[f.run_id] = (f.pid, self._probe_pids(f))
            return out

    def owners(self) -> dict[str, dict[str, str]]:
        """run id -> its owner labels (pod or Slurm job; empty when none is known)."""
        with self._lock:
            return {f.run_id: dict(f.owner) for f in self._followed.values()}

    def jobs(self) -> dict[str, str]:
        """run id -> the training job it is part of on every node (``train_job``): what its
        probes name, else the run id itself."""
        with self._lock:
            out = {}
            for f in self._followed.values():
                if f.job is None:
                    f.job = self._job_of(f)
                out[f.run_id] = f.job or f.run_id
            return out

    def _job_of(self, f: _Followed) -> str | None:
        if not self._connect(f) or f.conn is None:
            return None
        try:
            rows = f.conn.execute("SELECT config FROM probes ORDER BY rank").fetchall()
        except sqlite3.Error:
            return None
        for (config,) in rows:
            try:
                job = json.loads(config).get("job") if isinstance(config, str) else None
            except (ValueError, AttributeError):
                continue
            if isinstance(job, str) and job and len(job) <= 128 and "\n" not in job:
                return job
        return None

    def run_dirs(self) -> dict[str, tuple[Path, int | None]]:
        """run id -> (run directory, the uid owning it) of each followed run that has not ended
        (the agent reads their sampled stacks as that user,
        :mod:`stallscope.agent.trainstacks`)."""
        with self._lock:
            self._refresh()
            return {
                f.run_id: (f.run_dir, f.uid) for f in self._followed.values() if f.ended_at is None
            }

    def close(self) -> None:
        with self._lock:
            for key in list(self._followed):
                self._drop(key)

    # --- inside the lock ------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Look for new runs when a rescan is due; drop the runs past their grace period."""
        now = self.clock()
        if self._scanned_at is None or now - self._scanned_at >= self.rescan_s:
            self._scan(now)
            self._scanned_at = now
        self._expire(now)

    def _expire(self, now: float) -> None:
        """Drop the runs that ended more than the grace period ago (their connection closes),
        also when nothing scrapes."""
        for key, f in list(self._followed.items()):
            if f.ended_at is not None and now - f.ended_at > self.grace_s:
                self._drop(key)

    def _scan(self, now: float) -> None:
        try:
            dirs = self.runs()
        except OSError:
            return
        for d in dirs:
            key = str(d)
            if key in self._ignored:
                continue
            f = self._followed.get(key)
            if f is not None and f.ended_at is not None:
                continue
            uid = f.uid if f is not None else _dir_owner(d)
            running = uid is not None and _is_running(d, uid)
            if f is None:
                if running:
                    f = self._followed[key] = _Followed(d, d.name, uid)
                    _know_trainer(f)
                else:
                    self._ignored.add(key)
            elif not running:
                f.ended_at = now
            elif f.pid is None:
                _know_trainer(f)  # meta.json is written before the trainer starts
        # a followed run whose directory left the index (deleted) ends too
        listed = {str(d) for d in dirs}
        for key, f in self._followed.items():
            if key not in listed and f.ended_at is None:
                f.ended_at = now

    def _connect(self, f: _Followed) -> bool:
        if f.conn is None:
            db = f.run_dir / "run.db"
            if f.uid is None or not _db_owned(db, f.uid):
                return False
            try:
                f.conn = sqlite3.connect(
                    f"file:{db}?mode=ro", uri=True, timeout=0.2, check_same_thread=False
                )
            except sqlite3.Error:
                return False
        return True

    def _probe_pids(self, f: _Followed) -> dict[int, int]:
        """pid -> rank from the run's ``probes`` table ({} before a probe reported)."""
        if not self._connect(f) or f.conn is None:
            return {}
        try:
            rows = f.conn.execute(
                "SELECT pid, rank FROM probes WHERE typeof(pid)='integer' "
                "AND typeof(rank)='integer'"
            ).fetchall()
        except sqlite3.Error:
            return {}
        return {int(pid): int(rank) for pid, rank in rows}

    def _read(self, f: _Followed) -> None:
        if not self._connect(f) or f.conn is None:
            return
        last = {r: t.last_step for r, t in f.ranks.items()}
        try:  # a run.db from before communication time has no comm_s
            f.conn.execute("BEGIN")  # the packed rows and the rows: one snapshot
            where, args = steps_after(last, step_ranks(f.conn))
            q = (
                f"SELECT rank, step, ts, wait_s, host_s, samples, {comm_column(f.conn)}, "
                f"{n_column(f.conn)} FROM steps WHERE ({_ROW_OK})"
                + (f" AND ({where})" if where else "")
                + " ORDER BY rank, step"
            )
            rows = f.conn.execute(q, args).fetchall()
            # rows packed before this follower read them (it began late, or paused)
            rows += [
                (r.rank, r.step, r.ts, r.wait_s, r.host_s, r.samples, r.comm_s, r.n)
                for r in packed_steps_after(f.conn, last)
                if 0 <= r.wait_s < 1e9 and 0 <= r.host_s < 1e9 and r.ts < 1e15
            ]
        except sqlite3.Error:
            return  # no steps table yet, or busy: the next scrape tries again
        finally:
            if f.conn.in_transaction:
                f.conn.rollback()
        for rank, step, ts, wait_s, host_s, samples, comm_s, n in rows:
            t = f.ranks.get(rank)
            if t is None:
                t = f.ranks[rank] = RankTotals()
            k = n if isinstance(n, int) and n >= 1 else 1
            t.steps += k
            t.wait_counts[wait_bucket(wait_s / k)] += k
            t.wait_s += wait_s
            t.step_s += wait_s + host_s
            if isinstance(samples, int) and samples > 0:
                t.samples += samples
                t.has_samples = True
            if isinstance(comm_s, float) and 0 <= comm_s <= host_s:
                t.comm_s += comm_s
                t.has_comm = True
            t.last_step = max(t.last_step, step)
            t.last_ts = ts if t.last_ts is None else max(t.last_ts, ts)
            t.first_ts = ts if t.first_ts is None else min(t.first_ts, ts)

    def _drop(self, key: str) -> None:
        f = self._followed.pop(key)
        self._ignored.add(key)
        if f.conn is not None:
            f.conn.close()


def _know_trainer(f: _Followed) -> None:
    """The trainer's pid, the run's start and the trainer's stamp, from meta.json."""
    try:
        meta = read_meta(f.run_dir, owner=f.uid)
    except RunNotFound:
        return
    pid, start, stamp = meta.get("pid"), meta.get("start"), meta.get("pid_stamp")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        f.pid = pid
    if isinstance(start, (int, float)) and not isinstance(start, bool):
        f.start = float(start)
    if isinstance(stamp, dict):
        f.stamp = stamp
    owner = meta.get("owner")
    if isinstance(owner, dict):
        f.owner = {k: str(owner[k]) for k in OWNER_KEYS if owner.get(k)}
    elif f.pid is not None:  # a standalone probe's run: its trainer's cgroup says
        f.owner = read_owner(f.pid).attrs()


def _dir_owner(run_dir: Path) -> int | None:
    """The uid owning the run folder (a folder, not a link), or None."""
    try:
        st = os.lstat(run_dir)
    except (OSError, ValueError):
        return None
    return st.st_uid if stat.S_ISDIR(st.st_mode) else None


def _db_owned(db: Path, uid: int) -> bool:
    """run.db and the WAL files beside it are regular files of ``uid``, not links (SQLite opens
    all three)."""
    if not owned_file(db, uid):
        return False
    for side in ("-wal", "-shm"):
        p = db.with_name(db.name + side)
        if os.path.lexists(p) and not owned_file(p, uid):
            return False
    return True


def _is_running(run_dir: Path, uid: int | None = None) -> bool:
    """The run has not ended and the process that writes it (the monitor of ``stallscope run``,
    or the trainer itself for a standalone probe) is alive."""
    try:
        meta = read_meta(run_dir, owner=uid)
    except RunNotFound:
        return False
    if run_state(meta) != "running":
        return False
    pid = meta.get("pid")
    if meta.get("monitor_pid") is None and isinstance(pid, int) and not isinstance(pid, bool):
        return monitor_alive(pid, meta.get("start"), meta.get("pid_stamp"))
    return True
