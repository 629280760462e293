"""What each batch cost the DataLoader workers of the trainings on this node, for the agent's
``/metrics``.

Under ``stallscope run`` every DataLoader worker times the batches it makes and appends a
histogram of their costs to ``<run>/fetches/<pid>.jsonl`` (:mod:`stallscope.sources.stacks.
fetches`). For each run the agent follows, :class:`LoaderCosts` reads what was appended since its
previous look, read-only and as the run's owner (regular files of theirs only, never a link, a
FIFO or another user's file: :mod:`stallscope.safefile`), each file from the offset it reached
and bounded per look, and adds each worker's batches to its trainer's (the record's ``ppid``;
else the worker's parent in ``/proc``; else the run's one trainer). Each trainer's batches are
exported as one Prometheus histogram, ``stallscope_loader_batch_seconds``, with the labels of its
stacks series (``pid`` the trainer's, ``role="main"``, ``run``, ``rank``, the host label). Its
buckets are the fetch histograms' own edges (``fetches.EDGES_S``: ×1.2 apart, 1 ms to 54 s), fixed,
so ``histogram_quantile`` works across trainers and nodes and ``diagnose --prometheus`` gets the
workers' histogram back bucket for bucket (:mod:`stallscope.analysis.promhist`).

A run that ends (the agent stops following it) is read once more, for what its workers wrote as
they left, and its totals stay exported :data:`GRACE_S` seconds, as its step totals do
(:class:`~stallscope.agent.steps.StepFollower`'s grace period): a scrape after the end still
sees the last batches; then its series go.

A line that is no such record (garbage, a line longer than :data:`MAX_LINE`), a file that is a
link, a FIFO or another user's, is skipped, and said once per file in the agent's log (a
``note`` of the ``stacks`` source); nothing stops the other files or the scrape.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stallscope.safefile import owned_dir, read_bounded
from stallscope.sources.stacks.fetches import (
    EDGES_S,
    FOLDER,
    K_LO,
    MAX_FILES,
    FetchRecord,
    le_text,
    parse_record,
)

__all__ = ["BATCH_TIME_HISTOGRAMS", "LOADER_HISTOGRAM", "LoaderCosts", "TrainerCosts"]

#: the histogram the agent exports: (name as exposed, type, help)
LOADER_HISTOGRAM = (
    "stallscope_loader_batch_seconds",
    "histogram",
    "what each batch cost the trainer's DataLoader workers (the samples read, transformed and "
    "collated: their fetch, timed inside the workers), seconds; buckets ×1.2 apart",
)
#: the histograms of the batches the trainer took, timed by the in-trainer sampler on the
#: DataLoader's ``__next__`` (:mod:`stallscope.sources.stacks.batches`; the stacks records'
#: ``wait_b``, ``step_b``): with no probe, the spread of the waits (``input_bound.head_of_line``)
BATCH_TIME_HISTOGRAMS = (
    (
        "stallscope_stacks_batch_wait_seconds",
        "histogram",
        "each batch's wait in the trainer's DataLoader __next__ (timed by the in-trainer sampler, "
        "each iterator's first batch left out), seconds; buckets ×1.2 apart",
    ),
    (
        "stallscope_stacks_batch_step_seconds",
        "histogram",
        "the time from one batch handed to the trainer to the next (a step), seconds; buckets "
        "×1.2 apart",
    ),
)
#: the most read of one file per look; of all the files of all runs per look
MAX_READ = 256 << 10
MAX_READ_PER_LOOK = 8 << 20
#: a line longer than this is no record of ours (one holds a few hundred bytes)
MAX_LINE = 64 << 10
#: the most trainers one run's series name (a file naming many parents cannot add more)
MAX_TRAINERS = 256
#: a record's counts beyond this are not a worker's (garbage)
_MAX_COUNT = 1 << 31
#: seconds an ended run's totals stay exported (the step totals' grace period)
GRACE_S = 300.0


@dataclass
class TrainerCosts:
    """One trainer's workers' batches since the agent began following its run."""

    run: str
    pid: int  #: the trainer's
    rank: int | None = None
    counts: dict[int, int] = field(default_factory=dict)  #: fetch bucket -> batches
    sum_s: float = 0.0

    def buckets(self) -> list[tuple[str, float]]:
        """The cumulative ``(le, count)`` of the exposition, ``+Inf`` last."""
        out, seen = [], 0
        for i, edge in enumerate(EDGES_S):
            k_top = K_LO + i - 1  # the highest fetch bucket under this bound
            seen = sum(c for k, c in self.counts.items() if k <= k_top)
            out.append((le_text(edge), float(seen)))
        out.append(("+Inf", float(sum(self.counts.values()))))
        return out


@dataclass
class _Tail:
    offset: int = 0
    skipping: bool = False  #: inside a line too long to keep: drop up to its end


@dataclass
class _Run:
    run_dir: Path
    uid: int
    tails: dict[str, _Tail] = field(default_factory=dict)
    costs: dict[int, TrainerCosts] = field(default_factory=dict)
    noted: set[str] = field(default_factory=set)  #: files (and the folder) said once
    #: the trainer's pid and its probes' ranks, as last known while the run was followed
    trainer: tuple[int, dict[int, int]] | None = None
    ended: float | None = None  #: when the agent stopped following it (its clock)


class LoaderCosts:
    """The trainers' batch costs of the runs the agent follows; :meth:`update` from the
    collector's thread (the agent's ``stacks`` source), :meth:`snapshot` from the scrapes'."""

    def __init__(
        self, proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.proc_root = proc_root
        self.clock = clock
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()
        self._snapshot: list[TrainerCosts] = []
        #: per trainer, the batches it took: (waits, steps), set by the stacks source
        self._timed: list[tuple[TrainerCosts, TrainerCosts]] = []

    def snapshot(self) -> list[TrainerCosts]:
        """Every trainer's totals as of the latest update (copies)."""
        with self._lock:
            return list(self._snapshot)

    def set_timed(self, timed: list[tuple[TrainerCosts, TrainerCosts]]) -> None:
        """The trainers' batch waits and steps (:data:`BATCH_TIME_HISTOGRAMS`), as read from
        their stacks records (from the collector's thread)."""
        with self._lock:
            self._timed = list(timed)

    def timed_snapshot(self) -> list[tuple[TrainerCosts, TrainerCosts]]:
        with self._lock:
            return list(self._timed)

    def update(
        self,
        dirs: dict[str, tuple[Path, int | None]],
        trainers: dict[str, tuple[int, dict[int, int]]],
    ) -> list[str]:
        """Read what the followed runs' (``dirs``: run id -> (folder, owner)) workers appended
        since the last update; ``trainers``: run id -> (the trainer's pid, pid -> rank of its
        probes). A run no longer in ``dirs`` is read once more and kept :data:`GRACE_S`. The
        notes to log (each once per file)."""
        notes: list[str] = []
        budget = MAX_READ_PER_LOOK
        now = self.clock()
        for run_id, gone in list(self._runs.items()):
            if run_id in dirs:
                continue
            if gone.ended is None:  # what its workers wrote as they left
                gone.ended = now
                budget = self._read_run(run_id, gone, gone.trainer, budget, notes)
            elif now - gone.ended > GRACE_S:
                del self._runs[run_id]
        for run_id, (run_dir, uid) in sorted(dirs.items()):
            if uid is None:
                continue
            run = self._runs.get(run_id)
            if run is None or run.run_dir != run_dir or run.ended is not None:
                run = self._runs[run_id] = _Run(run_dir, uid)
            run.trainer = trainers.get(run_id) or run.trainer
            budget = self._read_run(run_id, run, run.trainer, budget, notes)
        snap = [
            TrainerCosts(c.run, c.pid, c.rank, dict(c.counts), c.sum_s)
            for run in self._runs.values()
            for c in run.costs.values()
            if c.counts
        ]
        with self._lock:
            self._snapshot = sorted(snap, key=lambda c: (c.run, c.pid))
        return notes

    def _read_run(
        self,
        run_id: str,
        run: _Run,
        trainer: tuple[int, dict[int, int]] | None,
        budget: int,
        notes: list[str],
    ) -> int:
        folder = run.run_dir / FOLDER
        if not owned_dir(folder, run.uid):
            if os.path.lexists(folder) and FOLDER not in run.noted:
                run.noted.add(FOLDER)
                notes.append(f"skipped {folder}: a link, or not a folder of uid {run.uid}")
            return budget
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".jsonl"))[:MAX_FILES]
        except OSError:
            return budget
        for name in names:
            if budget <= 0:
                break  # the rest at the next look
            lines, used = self._new_lines(run, folder / name, name, min(MAX_READ, budget), notes)
            budget -= used
            bad = 0
            for line in lines:
                rec = parse_record(line) if len(line) <= MAX_LINE else None
                if rec is None or not self._add(run_id, run, trainer, rec):
                    bad += 1
            if bad and name not in run.noted:
                run.noted.add(name)
                notes.append(
                    f"skipped {bad} line(s) of {folder / name} that are no batch-cost record of "
                    "a DataLoader worker of this run"
                )
        return budget

    def _new_lines(
        self, run: _Run, path: Path, name: str, limit: int, notes: list[str]
    ) -> tuple[list[str], int]:
        """The whole lines appended to ``path`` since the last look (a line cut short is left
        for the next one; a line longer than ``limit`` is dropped), and the bytes read."""
        tail = run.tails.setdefault(name, _Tail())
        try:  # regular files of the run's owner only: never a link, a FIFO, /dev/zero
            chunk, _more = read_bounded(path, limit, owner=run.uid, offset=tail.offset)
        except OSError as exc:
            if name not in run.noted:
                run.noted.add(name)
                notes.append(f"skipped {path}: {exc.strerror or exc}")
            return [], 0
        data = chunk
        if tail.skipping:
            cut = data.find(b"\n")
            if cut < 0:
                tail.offset += len(chunk)
                return [], len(chunk)
            tail.skipping = False
            data = data[cut + 1 :]
        end = data.rfind(b"\n")
        if end < 0:
            if len(chunk) >= limit:  # one line longer than a whole read: no record of ours
                tail.offset += len(chunk)
                tail.skipping = True
                if name not in run.noted:
                    run.noted.add(name)
                    notes.append(f"skipped a line of {path} longer than {limit} bytes")
            return [], len(chunk)
        used = len(chunk) - len(data) + end + 1
        tail.offset += used
        return data[:end].decode("utf-8", "replace").splitlines(), len(chunk)

    def _add(
        self,
        run_id: str,
        run: _Run,
        trainer: tuple[int, dict[int, int]] | None,
        rec: FetchRecord,
    ) -> bool:
        """Add one record to its trainer's totals; False when it cannot be (no worker's)."""
        root, ranks = trainer if trainer is not None else (None, {})
        if rec.pid == root or rec.pid in ranks:
            return True  # a trainer's own batches (no workers): not the workers' costs
        if not 0 < rec.pid < 1 << 23:
            return False
        if any(c >= _MAX_COUNT for c in rec.counts.values()):
            return False
        parent = rec.ppid if rec.ppid is not None else self._ppid(rec.pid)
        if parent is None:  # exited before it was seen, and written without its parent
            known = set(ranks) or ({root} if root is not None else set())
            parent = next(iter(known)) if len(known) == 1 else None
        if parent is None or not 0 < parent < 1 << 23:
            return False
        costs = run.costs.get(parent)
        if costs is None:
            if len(run.costs) >= MAX_TRAINERS:
                return False
            costs = run.costs[parent] = TrainerCosts(run_id, parent)
        if costs.rank is None:
            costs.rank = ranks.get(parent)
        for k, c in rec.counts.items():
            costs.counts[k] = costs.counts.get(k, 0) + c
        costs.sum_s += rec.sum_s
        return True

    def _ppid(self, pid: int) -> int | None:
        """The parent of a live process (its ``/proc/PID/stat``), None once it is gone."""
        from stallscope.errors import ParseError
        from stallscope.sources.procs import parse_pid_stat

        try:
            with open(f"{self.proc_root}/{pid}/stat", encoding="utf-8", errors="replace") as fh:
                return parse_pid_stat(fh.read(4096)).ppid
        except (OSError, ValueError, ParseError):
            return None
