"""Process roles, inferred in one place: which of a run's processes is the trainer ("main"),
which are its DataLoader workers, and which only launched it.

The sampler knows only the tree's root; the whole run (the probe's pid, DataLoader workers'
names and parents, launcher names) says more. The session records the result at the end of a
run, and every reader (summary, diagnosis, report) asks :meth:`RunData.roles`, which calls this.
"""

from __future__ import annotations

from typing import Any

from stallscope.sources.procs import LAUNCHERS, TORCH_WORKER

__all__ = ["infer_roles"]


def infer_roles(procs: list[dict[str, Any]], probe_pids: set[str] | None = None) -> dict[str, str]:
    """pid -> role ("main", "worker", "launcher") for a recorded process tree.

    ``procs`` are the store's procs entities (``entity`` = pid, ``attrs`` with ``name``,
    ``ppid`` and the sampler's own ``role``, where the tree's root is "main"). The trainer
    processes ("main") are, in order of evidence: the pids the in-trainer probe reported; the
    parents of PyTorch DataLoader workers (named ``pt_data_worker``); else the root, unless the
    root is a launcher (a shell, ``torchrun``...), in which case its children. A trainer's
    sibling under the same launcher with the same command line is another rank, and a trainer
    too (its workers may not have been seen by their name: a rank starved of CPU renames them
    late, after the sampler first saw them). Descendants of a
    main are workers; its ancestors are launchers."""
    by_pid = {str(p["entity"]): p.get("attrs") or {} for p in procs}
    parent = {pid: str(a.get("ppid")) for pid, a in by_pid.items()}
    mains = {p for p in (probe_pids or set()) if p in by_pid}
    if not mains:
        mains = {
            parent[pid]
            for pid, a in by_pid.items()
            if a.get("name") == TORCH_WORKER and parent.get(pid) in by_pid
        }
    if mains:
        mains |= _sibling_ranks(by_pid, parent, mains)
    if not mains:
        roots = [pid for pid, a in by_pid.items() if a.get("role") == "main"] or [
            pid for pid in by_pid if parent.get(pid) not in by_pid
        ]
        for root in roots:
            kids = [pid for pid in by_pid if parent.get(pid) == root]
            if by_pid[root].get("name") in LAUNCHERS and kids:
                mains.update(kids)
            else:
                mains.add(root)

    def ancestors(pid: str) -> list[str]:
        out, seen = [], set()
        while pid in parent and parent[pid] in by_pid and pid not in seen:
            seen.add(pid)
            pid = parent[pid]
            out.append(pid)
        return out

    roles: dict[str, str] = {}
    for pid in by_pid:
        if pid in mains:
            roles[pid] = "main"
        elif any(a in mains for a in ancestors(pid)):
            roles[pid] = "worker"
        else:
            roles[pid] = "launcher"
    return roles


def _sibling_ranks(
    by_pid: dict[str, dict[str, Any]], parent: dict[str, str], mains: set[str]
) -> set[str]:
    """The processes that share a trainer's launcher parent and its command line: its other
    ranks (torchrun starts every rank with one command line; a DataLoader worker, forked with
    its trainer's command line, has the trainer for parent, no launcher)."""
    launched = {
        (parent[m], by_pid[m].get("cmdline"))
        for m in mains
        if by_pid.get(parent.get(m, ""), {}).get("name") in LAUNCHERS and by_pid[m].get("cmdline")
    }
    return {pid for pid, a in by_pid.items() if (parent.get(pid), a.get("cmdline")) in launched}
