"""The processes of the trainings on this node, for the agent's ``/metrics``.

The agent follows the running runs of the run index (:class:`~stallscope.agent.steps.
StepFollower`); this source samples each one's process tree (the trainer ``stallscope run``
started, or the trainer a standalone probe runs in: ``pid`` in ``meta.json``) with a
:class:`~stallscope.sources.procs.ProcsSource` per run, and gives every process the labels a
dashboard needs:

* ``run``: the run id;
* ``role``: ``main`` (a trainer: a rank), ``worker`` (a DataLoader worker or any other
  descendant of a trainer) or ``launcher`` (``torchrun``, a shell: what started the trainers),
  inferred as the run's own reports do (:func:`~stallscope.sources.roles.infer_roles`, with the
  pids the probes reported in ``run.db``);
* ``rank``: the rank whose probe runs in that process, or in the trainer a worker belongs to
  (left out when no probe said so);
* ``namespace``, ``pod``, ``container`` or ``hpc_job``: whose job it is
  (:mod:`stallscope.sources.owner`), where known.

A run that ends, or whose trainer is gone, drops out at the next sample: its processes stop
appearing (no stale series). Reading another user's ``/proc/PID/io`` needs CAP_SYS_PTRACE; without
it the read-bytes series are left out and the run says so once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stallscope.errors import SourceUnavailable
from stallscope.metrics import Point
from stallscope.sources.base import Counter, Source
from stallscope.sources.owner import OwnerCache
from stallscope.sources.procs import ProcsSource, procs_points
from stallscope.sources.roles import infer_roles

if TYPE_CHECKING:
    from stallscope.agent.steps import StepFollower

__all__ = ["TrainerProcs"]


class TrainerProcs(Source):
    """The process trees of the runs ``follower`` follows (see the module docstring)."""

    name = "procs"
    transient_entities = True

    def __init__(self, follower: StepFollower, proc_root: str = "/proc",
                 kubelet: Any = None) -> None:
        self.follower = follower
        self.proc_root = proc_root
        #: whose job each process is (pod or Slurm job; names from ``kubelet``, a
        #: :class:`~stallscope.sources.podresources.PodResources`, when given)
        self.owners = OwnerCache(proc_root, kubelet)
        #: run id -> (root pid, its sampler)
        self._trees: dict[str, tuple[int, ProcsSource]] = {}
        self._attrs: dict[str, dict[str, Any]] = {}  #: pid -> labels of the latest sample

    def close(self) -> None:
        for _root, src in self._trees.values():
            src.close()
        self._trees.clear()

    def _sync(self) -> dict[str, dict[int, int]]:
        """Open a sampler per new running run, close those of runs that ended; run id ->
        pid -> rank of its probes."""
        trainers = self.follower.trainers()
        for run_id in [r for r in self._trees if r not in trainers]:
            self._trees.pop(run_id)[1].close()
        for run_id, (root, _ranks) in trainers.items():
            had = self._trees.get(run_id)
            if had is not None and had[0] == root:
                continue
            if had is not None:
                had[1].close()
                del self._trees[run_id]
            src = ProcsSource(root, proc_root=self.proc_root)
            try:
                src.open()
            except SourceUnavailable:
                continue  # gone already: the follower sees the run end soon
            self._trees[run_id] = (root, src)
        return {run_id: ranks for run_id, (_root, ranks) in trainers.items()}

    def sample(self, now: float) -> dict[str, Any]:
        ranks_of = self._sync()
        out: dict[str, Any] = {}
        attrs: dict[str, dict[str, Any]] = {}
        for run_id, (_root, src) in sorted(self._trees.items()):
            payload = src.sample(now) or {}
            if not payload:
                continue
            pid_rank = ranks_of.get(run_id, {})
            known = src.entities(payload)
            # the parents as this sample read them (a pid reused by a new worker has a new one)
            now_attrs = {pid: {**(known.get(pid) or {}), "ppid": rec.get("ppid")}
                         for pid, rec in payload.items()}
            procs = [{"entity": pid, "attrs": a} for pid, a in now_attrs.items()]
            roles = infer_roles(procs, {str(p) for p in pid_rank})
            parent = {pid: str(a.get("ppid")) for pid, a in now_attrs.items()}
            rank_by_pid = {str(p): r for p, r in pid_rank.items()}
            for pid, rec in payload.items():
                a = dict(now_attrs[pid])
                a["run"] = run_id
                a["role"] = roles.get(pid, a.get("role", "worker"))
                rank = _rank_of(pid, parent, rank_by_pid)
                if rank is not None:
                    a["rank"] = rank
                if pid.isdigit():
                    a.update(self.owners.owner(int(pid)).attrs())
                attrs[pid] = a
                out[pid] = {**rec, "role": a["role"]}
        self._attrs = attrs
        for src_events in (s.drain_events() for _r, s in self._trees.values()):
            for kind, message in src_events:
                self.emit(kind, message)
        return out

    def points(self, payload: dict[str, Any]) -> list[Point]:
        return procs_points(payload)

    def entities(self, payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {pid: self._attrs[pid] for pid in payload if pid in self._attrs}

    def counters(self) -> list[Counter]:
        out: list[Counter] = []
        for _root, src in self._trees.values():
            out.extend(src.counters())
        return out


def _rank_of(pid: str, parent: dict[str, str], ranks: dict[str, int]) -> int | None:
    """The rank of ``pid``'s own probe, or of its nearest ancestor that runs one."""
    seen: set[str] = set()
    while pid not in seen:
        if pid in ranks:
            return ranks[pid]
        seen.add(pid)
        nxt = parent.get(pid)
        if nxt is None:
            return None
        pid = nxt
    return None
