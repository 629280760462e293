"""The training panel of ``stallscope top``: what a probe and the sampled stacks report, live.

A training watched by ``stallscope run`` (or by a standalone ``stallscope.watch``) writes its
steps into its run directory's ``run.db``. :class:`TrainingWatch` finds that run in the per-user
run index (a running run whose trainer is the watched process, or, without ``--pid``, the newest
running run), reads the steps that arrived since the last frame (by primary key: cheap at any
run length) and keeps the last :data:`WINDOW_S` seconds for the live figures: data-wait share,
steps/s and samples/s. The verdict is the run's diagnosis so far, recomputed off the drawing
thread every :data:`VERDICT_EVERY_S` seconds from what the run has recorded. The run's sampled
stacks (``<run>/stacks/``) give the training thread's share per phase over the same window;
with ``--pid`` and no run watching that process, ``top`` samples it with py-spy itself.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope.errors import StallscopeError
from stallscope.sources.stacks.aggregate import RecordTail, phase_seconds, stacks_dir
from stallscope.sources.stacks.phases import PHASES
from stallscope.sources.straggler import StragglerWatch
from stallscope.store.db import comm_column, n_column
from stallscope.store.index import indexed_runs
from stallscope.store.rundir import read_meta, run_state

#: seconds of steps the live figures cover
WINDOW_S = 10.0
#: seconds between two diagnoses of the run so far
VERDICT_EVERY_S = 15.0
#: seconds between two looks for a run when none was found yet
FIND_EVERY_S = 3.0


def _run_label(run_dir: Path) -> str:
    """The run id, with whose run it is on a shared node (``20261125-... (job 4242)``)."""
    from stallscope.sources.owner import describe

    try:
        owner = read_meta(run_dir).get("owner")
    except (StallscopeError, OSError, ValueError):
        owner = None
    who = describe(owner) if isinstance(owner, dict) else ""
    return f"{run_dir.name} ({who})" if who else run_dir.name


@dataclass
class TrainingView:
    """The panel's figures (None: not known yet)."""

    run_id: str
    steps: int = 0
    steps_s: float | None = None
    samples_s: float | None = None
    wait_share: float | None = None
    ranks: int = 0
    last_step_age_s: float | None = None
    verdict: str | None = None
    reason: str | None = None
    verdict_age_s: float | None = None
    #: the training thread's share per phase over the window, from its sampled stacks (the
    #: rank that waited most for data, with several), and that rank
    phases: dict[str, float] | None = None
    phase_rank: int | None = None
    #: why the stacks of a process ``top --pid`` follows cannot be sampled
    stack_note: str | None = None
    sampled_only: bool = False  #: no run watches the process: only its stacks (py-spy)
    #: under DDP with communication timed: the rank the others wait for in the all-reduce
    #: (sources/straggler.py) and how many points more of their step they wait than it does
    waited_for: dict[int, float] | None = None


def _tree(pid: int) -> set[int]:
    """``pid`` and its ancestors: a run's trainer is the watched process or one above it."""
    out = {pid}
    try:
        import psutil

        out.update(p.pid for p in psutil.Process(pid).parents())
    except Exception:  # the process may be gone or unreadable: the pid alone
        pass
    return out


def find_training_run(pid: int | None) -> Path | None:
    """The running run of the process ``pid`` (its trainer, or the ``stallscope run`` that
    watches it); without ``pid``, the newest running run."""
    wanted = _tree(pid) if pid is not None else None
    for run_dir in reversed(indexed_runs()):
        try:
            meta = read_meta(run_dir)
        except (StallscopeError, OSError, ValueError):
            continue
        if run_state(meta) != "running" or not (run_dir / "run.db").is_file():
            continue
        if wanted is None:
            return run_dir
        pids = {meta.get("pid"), meta.get("monitor_pid")}
        if wanted & {p for p in pids if isinstance(p, int)}:
            return run_dir
    return None


class TrainingWatch:
    """Follows one training's steps for the live view."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.run_dir: Path | None = None
        self._label = ""  #: the run id, and whose run it is
        self._db: sqlite3.Connection | None = None
        self._last: dict[int, int] = {}  # rank -> last step read
        #: ts, wait, host, samples, steps (of each row read)
        self._recent: deque[tuple[float, float, float, int, int]] = deque()
        self._total = 0
        self._next_find = 0.0
        self._verdict: tuple[str, str, float] | None = None
        self._next_verdict = 0.0
        self._busy = threading.Lock()
        self._tail: RecordTail | None = None
        self._phase_recent: deque[tuple[float, int, int | None, dict[str, float]]] = deque()
        self._sampler: Any = None  # py-spy on --pid when no run watches it
        self._stragglers = StragglerWatch()  # who the ranks wait for, frame by frame
        self._waited_for: dict[int, float] = {}
        self._sample_dir: tempfile.TemporaryDirectory[str] | None = None
        self._stack_note: str | None = None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def stop(self) -> None:
        """Close, and stop sampling a process this watch started to sample."""
        self.close()
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        if self._sample_dir is not None:
            self._sample_dir.cleanup()
            self._sample_dir = None

    def _open(self, now: float) -> bool:
        if now < self._next_find:
            return self._db is not None
        self._next_find = now + FIND_EVERY_S
        if self._db is not None and self._still_running():
            return True
        run_dir = find_training_run(self.pid)
        if run_dir is None or run_dir == self.run_dir:
            return self._db is not None  # the run that ended stays shown until another starts
        self._switch()
        try:
            self._db = sqlite3.connect(
                f"file:{run_dir / 'run.db'}?mode=ro", uri=True, timeout=0.5, check_same_thread=False
            )
        except sqlite3.Error:
            return False
        self.run_dir = run_dir
        self._label = _run_label(run_dir)
        self._tail = RecordTail(stacks_dir(run_dir))
        return True

    def _still_running(self) -> bool:
        """Whether the run followed is still going (checked every FIND_EVERY_S): once it has
        ended, the next look may find another run to follow."""
        assert self.run_dir is not None
        try:
            return run_state(read_meta(self.run_dir)) == "running"
        except (StallscopeError, OSError, ValueError):
            return False

    def _switch(self) -> None:
        """Forget the run followed so far (a new one was found)."""
        self.close()
        self._last.clear()
        self._recent.clear()
        self._total = 0
        self._ranks = 0
        self._verdict = None
        self._next_verdict = 0.0
        self._phase_recent.clear()

    def _sample_pid(self) -> bool:
        """No run watches ``--pid``: sample its stacks with py-spy here (once; a refusal is
        kept as the panel's note)."""
        if self.pid is None or self._stack_note is not None:
            return self._sampler is not None
        if self._sampler is None:
            from stallscope.errors import SourceUnavailable
            from stallscope.sources.stacks.pyspy import PySpySampler

            self._sample_dir = tempfile.TemporaryDirectory(prefix="stallscope-top-")
            folder = Path(self._sample_dir.name)
            sampler = PySpySampler(folder, [self.pid])
            try:
                sampler.start()
            except SourceUnavailable as exc:
                self._stack_note = str(exc)
                return False
            self._sampler = sampler
            self._tail = RecordTail(folder)
        return True

    def _read_phases(self, now: float) -> None:
        if self._tail is not None:
            for recs in self._tail.read_new().values():
                for rec in recs:
                    rank = rec.get("rank")
                    self._phase_recent.append(
                        (
                            float(rec["ts"]),
                            int(rec["pid"]),
                            rank if isinstance(rank, int) else None,
                            phase_seconds(rec),
                        )
                    )
        while self._phase_recent and self._phase_recent[0][0] < now - WINDOW_S:
            self._phase_recent.popleft()

    def _phases(self, v: TrainingView) -> None:
        """The window's phase shares of the process that waited most for data."""
        by_pid: dict[int, dict[str, float]] = {}
        rank_of: dict[int, int | None] = {}
        for _ts, pid, rank, secs in self._phase_recent:
            d = by_pid.setdefault(pid, {})
            rank_of[pid] = rank
            for k, x in secs.items():
                if k in PHASES:
                    d[k] = d.get(k, 0.0) + x
        shares = {
            pid: {k: x / sum(d.values()) for k, x in d.items()}
            for pid, d in by_pid.items()
            if sum(d.values()) > 0
        }
        if shares:
            pid = max(shares, key=lambda p: shares[p].get("data", 0.0))
            v.phases = shares[pid]
            v.phase_rank = rank_of[pid] if len(shares) > 1 else None

    def _read_new(self) -> None:
        assert self._db is not None
        rows: list[tuple[Any, ...]] = []
        try:
            comm, nc = comm_column(self._db), n_column(self._db)
            ranks = [r for (r,) in self._db.execute("SELECT rank FROM probes")]
            for rank in ranks:
                rows += self._db.execute(
                    f"SELECT rank, step, ts, wait_s, host_s, samples, {comm}, {nc} FROM steps "
                    "WHERE rank=? AND step>? ORDER BY step LIMIT 100000",
                    (rank, self._last.get(rank, -1)),
                ).fetchall()
        except sqlite3.Error:
            return  # the writer holds a lock, or the run is being removed: next frame
        timed: dict[int, list[float]] = {}  # rank -> [wall, comm, steps] of this frame's steps
        for rank, step, ts, wait, host, n, c, k in rows:
            if not all(isinstance(v, (int, float)) for v in (step, ts, wait, host)):
                continue
            k = k if isinstance(k, int) and k >= 1 else 1  # steps the row covers
            if isinstance(c, float):
                acc = timed.setdefault(rank, [0.0, 0.0, 0.0])
                acc[0] += wait + host
                acc[1] += c
                acc[2] += k
            self._last[rank] = max(self._last.get(rank, -1), int(step))
            self._recent.append(
                (float(ts), float(wait), float(host), int(n) if isinstance(n, int) else 0, k)
            )
            self._total += k
        self._ranks = len(self._last)
        shares = {r: a[1] / a[0] for r, a in timed.items() if a[2] >= 2 and a[0] > 0}
        if len(shares) >= 2:
            self._waited_for = self._stragglers.update(shares)

    _ranks = 0

    def view(self, now: float | None = None, *, wait: bool = False) -> TrainingView | None:
        """The panel's figures now, or None when no training with a probe was found.
        ``wait``: diagnose in this thread when a verdict is due (plain frames, no keys to
        keep answering), instead of in the background."""
        now = time.time() if now is None else now
        if not self._open(time.monotonic()):
            if not self._sample_pid():
                if self._stack_note is None:
                    return None
                return TrainingView(run_id=f"pid {self.pid}", stack_note=self._stack_note)
            v = TrainingView(
                run_id=f"pid {self.pid} (sampled by py-spy, no run)", sampled_only=True
            )
            self._read_phases(now)
            self._phases(v)
            return v
        assert self.run_dir is not None
        self._read_new()
        self._read_phases(now)
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent.popleft()
        v = TrainingView(
            run_id=self._label,
            steps=self._total,
            ranks=self._ranks,
            waited_for=dict(self._waited_for) or None,
        )
        if self._recent:
            recent = sorted(self._recent)
            waited = sum(r[1] for r in recent)
            busy = waited + sum(r[2] for r in recent)
            v.wait_share = waited / busy if busy > 0 else None
            span = max(now - recent[0][0], 1e-3)
            ranks = max(1, self._ranks)
            v.steps_s = sum(r[4] for r in recent) / span / ranks
            n = sum(r[3] for r in recent)
            v.samples_s = n / span if n else None
            v.last_step_age_s = max(0.0, now - recent[-1][0])
        self._phases(v)
        self._maybe_diagnose(wait)
        if self._verdict is not None:
            v.verdict, v.reason, at = self._verdict
            v.verdict_age_s = max(0.0, time.monotonic() - at)
        return v

    def _maybe_diagnose(self, wait: bool) -> None:
        if time.monotonic() < self._next_verdict or not self._busy.acquire(blocking=False):
            return
        self._next_verdict = time.monotonic() + VERDICT_EVERY_S
        if wait:
            self._diagnose()
            return
        threading.Thread(target=self._diagnose, name="stallscope-top-verdict", daemon=True).start()

    def _diagnose(self) -> None:
        try:
            from stallscope.analysis.diagnose import diagnose_run

            assert self.run_dir is not None
            doc = diagnose_run(self.run_dir)
            top = doc["findings"][0] if doc.get("findings") else {}
            self._verdict = (
                str(doc.get("verdict", "?")),
                str(top.get("summary", "")),
                time.monotonic(),
            )
        except Exception:  # a run too young to diagnose: try again later
            pass
        finally:
            self._busy.release()
