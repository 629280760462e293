"""The sampled stacks of the trainings on this node, for the agent's ``/metrics``.

A training under ``stallscope run`` samples its own training thread and appends the records to
its run directory (``<run>/stacks/``, :mod:`stallscope.sources.stacks`). For each run the agent
follows (:class:`~stallscope.agent.steps.StepFollower`), this source reads the records written
since its previous sample, read-only, and exports each trainer process's phase shares over that
interval (``stallscope_stacks_*_ratio``) with the labels of the process series: ``pid``, ``run``,
``rank``, ``role="main"``. The agent itself attaches to nothing: it costs the trainings nothing
and needs no ptrace rights.

Over the same 10 s it exports what the records' ``threads`` part says of each trainer's loader
threads (:mod:`stallscope.sources.stacks.threads`): how many worked, their thread-seconds
fetching, preparing and idle, their CPU, the training thread's wait on them, and the sampler's
wait for the GIL over its wakes (``stallscope_stacks_loader_*``, ``stallscope_stacks_gil_*``),
the facts of ``input_bound.gil`` read back by ``diagnose --prometheus``. And it reads the runs'
DataLoader workers' batch costs (:class:`~stallscope.agent.trainfetches.LoaderCosts`), which
the exposition turns into ``stallscope_loader_batch_seconds``, and the batches each trainer took
as its records time them (``wait_b``, ``step_b``: :mod:`stallscope.sources.stacks.batches`),
summed since the agent began following the run: ``stallscope_stacks_batch_wait_seconds`` and
``stallscope_stacks_batch_step_seconds``, the spread of an unmodified trainer's waits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallscope.agent.trainfetches import LoaderCosts, TrainerCosts
from stallscope.metrics import Point
from stallscope.sources.base import Source
from stallscope.sources.stacks.aggregate import RecordTail
from stallscope.sources.stacks.fetches import add_counts, bucket_mid_s, histogram
from stallscope.sources.stacks.source import WINDOW_S, StacksSource
from stallscope.sources.stacks.threads import LOADER_PHASES

if TYPE_CHECKING:
    from stallscope.agent.steps import StepFollower

__all__ = ["TrainerStacks", "loader_threads_part"]


def _num(v: Any) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    return float(v) if ok and math.isfinite(v) and 0 <= v < 1e7 else None


def loader_threads_part(part: Any) -> dict[str, float] | None:
    """A record's ``threads`` part as the agent's ``stacks.loader_*`` / ``stacks.gil_*``
    keys (None: no such part, or no loader thread in it); what is not a number counts 0, as
    the run's own reading does (:func:`stallscope.analysis.threads.thread_loader`)."""
    if not isinstance(part, Mapping):
        return None
    n = part.get("n")
    if type(n) is not int or not 0 < n < 1 << 20:
        return None
    s = part.get("s")
    out = {"loader_threads": float(n)}
    for p in LOADER_PHASES:
        out[f"loader_{p}_s"] = (_num(s.get(p)) if isinstance(s, Mapping) else None) or 0.0
    out["loader_cpu_s"] = _num(part.get("cpu_s")) or 0.0
    out["loader_wait_s"] = _num(part.get("wait_s")) or 0.0
    wakes = part.get("wakes")
    if "gil_s" in part and type(wakes) is int and 0 < wakes < 1 << 20:
        out["gil_wait_s"] = _num(part.get("gil_s")) or 0.0
        out["gil_wakes"] = float(wakes)
    return out


class _ThreadsTail(RecordTail):
    """The run's record tail that also keeps each record's loader-thread part."""

    def __init__(self, folder: Path, owner: int | None) -> None:
        super().__init__(folder, owner=owner)
        #: (record time, pid, its loader-thread keys) of the last WINDOW_S seconds
        self.recent: list[tuple[float, str, dict[str, float]]] = []
        #: pid -> (its rank, the batches it took: waits, steps; bucket -> batches) so far
        self.timed: dict[str, tuple[int | None, dict[int, int], dict[int, int]]] = {}

    def read_new(self) -> dict[Path, list[dict[str, Any]]]:
        got = super().read_new()
        for recs in got.values():
            for rec in recs:
                part = loader_threads_part(rec.get("threads"))
                if part is not None:
                    self.recent.append((float(rec["ts"]), str(rec["pid"]), part))
                self._add_timed(rec)
        return got

    def _add_timed(self, rec: Mapping[str, Any]) -> None:
        """A record's timed batches (both histograms, or neither) into its trainer's."""
        waits, steps = histogram(rec.get("wait_b")), histogram(rec.get("step_b"))
        if not waits or steps is None:
            return
        rank = rec.get("rank")
        pid = str(rec["pid"])
        had = self.timed.get(pid)
        if had is None:
            ok = type(rank) is int and 0 <= rank < 1 << 20
            had = self.timed[pid] = (rank if ok else None, {}, {})
        add_counts(had[1], waits)
        add_counts(had[2], steps)

    def window(self, now: float) -> dict[str, dict[str, float]]:
        """pid -> its loader threads over the last WINDOW_S seconds (the most threads at
        once, the seconds summed), as the phase shares are."""
        horizon = now - WINDOW_S
        self.recent = [r for r in self.recent if r[0] >= horizon]
        out: dict[str, dict[str, float]] = {}
        for _ts, pid, part in self.recent:
            d = out.setdefault(pid, {})
            for k, v in part.items():
                d[k] = max(d.get(k, 0.0), v) if k == "loader_threads" else d.get(k, 0.0) + v
        return {pid: {k: round(v, 5) for k, v in d.items()} for pid, d in out.items()}


class _RunStacks(StacksSource):
    """A run's :class:`StacksSource` whose tail keeps the records' loader-thread parts."""

    def __init__(self, run_dir: Path, owner: int | None) -> None:
        super().__init__(run_dir, owner=owner)
        self.threads = _ThreadsTail(self.folder, owner)
        self._tail = self.threads


class TrainerStacks(Source):
    """Phase shares of the trainer processes of the runs ``follower`` follows."""

    name = "stacks"
    transient_entities = True

    def __init__(self, follower: StepFollower) -> None:
        self.follower = follower
        self._runs: dict[str, tuple[Path, _RunStacks]] = {}
        self._attrs: dict[str, dict[str, Any]] = {}
        #: the runs' DataLoader workers' batch costs (the exposition's histogram)
        self.loader = LoaderCosts()

    def sample(self, now: float) -> dict[str, Any]:
        dirs = self.follower.run_dirs()
        for run_id in [r for r in self._runs if r not in dirs]:
            del self._runs[run_id]
        out: dict[str, Any] = {}
        attrs: dict[str, dict[str, Any]] = {}
        ranks: dict[str, dict[int, int]] = {}  #: run id -> trainer pid -> rank its records say
        for run_id, (run_dir, uid) in sorted(dirs.items()):
            had = self._runs.get(run_id)
            if had is None or had[0] != run_dir:
                # read as the run's owner: files of theirs only, never a link (safefile)
                had = self._runs[run_id] = (run_dir, _RunStacks(run_dir, uid))
            src = had[1]
            payload = src.sample(now)
            threads = src.threads.window(now)
            for pid, shares in payload.items():
                out[pid] = {**shares, **threads.get(pid, {})}
                a: dict[str, Any] = {"run": run_id, "role": "main"}
                rank = src.entities({pid: shares})[pid].get("rank")
                if rank is not None:
                    a["rank"] = rank
                    ranks.setdefault(run_id, {})[int(pid)] = rank
                attrs[pid] = a
        self._attrs = attrs
        self.loader.set_timed(
            [
                (
                    TrainerCosts(run_id, int(pid), rank, w, _sum_s(w)),
                    TrainerCosts(run_id, int(pid), rank, st, _sum_s(st)),
                )
                for run_id, (_dir, src) in sorted(self._runs.items())
                for pid, (rank, w, st) in sorted(src.threads.timed.items())
            ]
        )
        # the workers' batch costs, per trainer: the probes' ranks, else the records'
        trainers = {
            run_id: (root, {**ranks.get(run_id, {}), **probes})
            for run_id, (root, probes) in self.follower.trainers().items()
        }
        for note in self.loader.update(dirs, trainers):
            self.emit("note", note)
        return out

    def points(self, payload: dict[str, Any]) -> list[Point]:
        return [
            Point(f"stacks.{k}", pid, float(v)) for pid, d in payload.items() for k, v in d.items()
        ]

    def entities(self, payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {pid: self._attrs[pid] for pid in payload if pid in self._attrs}


def _sum_s(counts: Mapping[int, int]) -> float:
    """A histogram's sum, from its buckets' middles (the records keep no exact sums)."""
    return round(sum(bucket_mid_s(k) * c for k, c in counts.items()), 6)
