"""The sampled stacks of the trainings on this node, for the agent's ``/metrics``.

A training under ``stallscope run`` samples its own training thread and appends the records to
its run directory (``<run>/stacks/``, :mod:`stallscope.sources.stacks`). For each run the agent
follows (:class:`~stallscope.agent.steps.StepFollower`), this source reads the records written
since its previous sample, read-only, and exports each trainer process's phase shares over that
interval (``stallscope_stacks_*_ratio``) with the labels of the process series: ``pid``, ``run``,
``rank``, ``role="main"``. The agent itself attaches to nothing: it costs the trainings nothing
and needs no ptrace rights.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallscope.metrics import Point
from stallscope.sources.base import Source
from stallscope.sources.stacks.source import StacksSource

if TYPE_CHECKING:
    from stallscope.agent.steps import StepFollower

__all__ = ["TrainerStacks"]


class TrainerStacks(Source):
    """Phase shares of the trainer processes of the runs ``follower`` follows."""

    name = "stacks"
    transient_entities = True

    def __init__(self, follower: StepFollower) -> None:
        self.follower = follower
        self._runs: dict[str, tuple[Path, StacksSource]] = {}
        self._attrs: dict[str, dict[str, Any]] = {}

    def sample(self, now: float) -> dict[str, Any]:
        dirs = self.follower.run_dirs()
        for run_id in [r for r in self._runs if r not in dirs]:
            del self._runs[run_id]
        out: dict[str, Any] = {}
        attrs: dict[str, dict[str, Any]] = {}
        for run_id, (run_dir, uid) in sorted(dirs.items()):
            had = self._runs.get(run_id)
            if had is None or had[0] != run_dir:
                # read as the run's owner: files of theirs only, never a link (safefile)
                had = self._runs[run_id] = (run_dir, StacksSource(run_dir, owner=uid))
            src = had[1]
            payload = src.sample(now)
            for pid, shares in payload.items():
                out[pid] = shares
                a: dict[str, Any] = {"run": run_id, "role": "main"}
                rank = src.entities({pid: shares})[pid].get("rank")
                if rank is not None:
                    a["rank"] = rank
                attrs[pid] = a
        self._attrs = attrs
        return out

    def points(self, payload: dict[str, Any]) -> list[Point]:
        return [
            Point(f"stacks.{k}", pid, float(v)) for pid, d in payload.items() for k, v in d.items()
        ]

    def entities(self, payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {pid: self._attrs[pid] for pid in payload if pid in self._attrs}
