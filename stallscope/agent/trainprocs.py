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

With ``worker_series="rank"`` (the agent's config) the DataLoader workers of each trainer are
one entity, ``<trainer pid>/workers``: its gauges and rates are the workers' sums (the main
thread's active share their mean), ``processes`` says how many it sums, and its counters carry
the workers that exited (so CPU seconds and bytes never go down when a new epoch starts new
workers). An 8-rank training with 8 workers each then exports 8 worker series per metric
instead of 64 (``benchmarks/bench_series.py --worker-series rank``).

A run that ends, or whose trainer is gone, drops out at the next sample: its processes stop
appearing (no stale series). Reading another user's ``/proc/PID/io`` needs CAP_SYS_PTRACE; without
it the read-bytes series are left out and the run says so once.
"""

from __future__ import annotations

from collections import defaultdict
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

#: fields of a process record that are a mean over a rank's workers, not their sum
_MEAN_FIELDS = frozenset({"main_thread_active_pct"})
#: fields that identify, not measure
_ID_FIELDS = frozenset({"ppid", "pid"})


class TrainerProcs(Source):
    """The process trees of the runs ``follower`` follows (see the module docstring)."""

    name = "procs"
    transient_entities = True

    def __init__(
        self,
        follower: StepFollower,
        proc_root: str = "/proc",
        kubelet: Any = None,
        worker_series: str = "process",
    ) -> None:
        if worker_series not in ("process", "rank"):
            raise ValueError(f"worker_series must be 'process' or 'rank', got {worker_series!r}")
        self.follower = follower
        self.worker_series = worker_series
        self.proc_root = proc_root
        #: whose job each process is (pod or Slurm job; names from ``kubelet``, a
        #: :class:`~stallscope.sources.podresources.PodResources`, when given)
        self.owners = OwnerCache(proc_root, kubelet)
        #: run id -> (root pid, its sampler)
        self._trees: dict[str, tuple[int, ProcsSource]] = {}
        self._attrs: dict[str, dict[str, Any]] = {}  #: pid -> labels of the latest sample
        #: worker_series "rank": pid -> its group entity in the latest sample
        self._member_of: dict[str, str] = {}
        #: (counter, pid) -> (group, latest value) of the members counted so far
        self._member_counts: dict[tuple[str, str], tuple[str, float]] = {}
        #: (counter, group) -> the final values of the group's members that exited
        self._retired: defaultdict[tuple[str, str], float] = defaultdict(float)

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
            now_attrs = {
                pid: {**(known.get(pid) or {}), "ppid": rec.get("ppid")}
                for pid, rec in payload.items()
            }
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
        if self.worker_series == "rank":
            out, attrs = self._by_rank(out, attrs)
        self._attrs = attrs
        for src_events in (s.drain_events() for _r, s in self._trees.values()):
            for kind, message in src_events:
                self.emit(kind, message)
        return out

    def points(self, payload: dict[str, Any]) -> list[Point]:
        return procs_points(payload)

    def entities(self, payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {pid: self._attrs[pid] for pid in payload if pid in self._attrs}

    def _by_rank(
        self, out: dict[str, Any], attrs: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The workers of each trainer summed into one entity (``worker_series="rank"``)."""
        parent = {pid: str(a.get("ppid")) for pid, a in attrs.items()}
        mains = {pid for pid, a in attrs.items() if a.get("role") == "main"}
        members: defaultdict[str, list[str]] = defaultdict(list)
        for pid, a in attrs.items():
            if a.get("role") != "worker":
                continue
            main = _ancestor_in(pid, parent, mains)
            if main is not None:
                members[f"{main}/workers"].append(pid)
        self._member_of = {pid: g for g, pids in members.items() for pid in pids}
        # a trainer that is gone takes its exited workers' counts with it
        for key in [k for k in self._retired if k[1].split("/")[0] not in mains]:
            del self._retired[key]
        new_out = {pid: rec for pid, rec in out.items() if pid not in self._member_of}
        new_attrs = {pid: a for pid, a in attrs.items() if pid not in self._member_of}
        for group, pids in members.items():
            main = group.split("/")[0]
            recs = [out[p] for p in pids if p in out]
            rec: dict[str, Any] = {"role": "worker", "processes": len(pids)}
            for key in sorted({k for r in recs for k in r}):
                vals = [r[key] for r in recs if _number(r.get(key))]
                if key in _ID_FIELDS or not vals:
                    continue
                total = float(sum(vals))
                rec[key] = round(total / len(vals) if key in _MEAN_FIELDS else total, 3)
            new_out[group] = rec
            m = attrs.get(main, {})
            a = {"run": m.get("run"), "role": "worker", "name": "workers", "ppid": main}
            if m.get("rank") is not None:
                a["rank"] = m["rank"]
            a.update({k: m[k] for k in ("namespace", "pod", "container", "hpc_job") if k in m})
            new_attrs[group] = a
        return new_out, new_attrs

    def counters(self) -> list[Counter]:
        out: list[Counter] = []
        for _root, src in self._trees.values():
            out.extend(src.counters())
        if self.worker_series != "rank":
            return out
        kept: list[Counter] = []
        sums: defaultdict[tuple[str, str], float] = defaultdict(float)
        seen: set[tuple[str, str]] = set()
        for name, ent, value in out:
            group = self._member_of.get(ent)
            if group is None:
                kept.append((name, ent, value))
                continue
            sums[(name, group)] += value
            self._member_counts[(name, ent)] = (group, value)
            seen.add((name, ent))
        for key in [k for k in self._member_counts if k not in seen]:
            group, last = self._member_counts.pop(key)  # an exited worker: its count stays
            self._retired[(key[0], group)] += last
        for (name, group), value in sorted(sums.items()):
            kept.append((name, group, value + self._retired.get((name, group), 0.0)))
        return kept


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _ancestor_in(pid: str, parent: dict[str, str], wanted: set[str]) -> str | None:
    """``pid``'s nearest ancestor in ``wanted`` (None if none)."""
    seen: set[str] = {pid}
    nxt = parent.get(pid)
    while nxt is not None and nxt not in seen:
        if nxt in wanted:
            return nxt
        seen.add(nxt)
        nxt = parent.get(nxt)
    return None


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
