"""The busiest processes beside a run: who took the cores the training waited for.

Two scans of every process's CPU time, at the start of a run and at its end (psutil, a few tens
of milliseconds each): the processes outside the training's tree that used the most CPU in
between, as ``meta.json`` ``busy_others``. The ``cpu_contention`` finding names them instead of
telling the user to run ``ps``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["MIN_CORES", "busiest_others", "cpu_snapshot"]

#: a process beside the run is named when it kept at least this share of a core busy
MIN_CORES = 0.05

#: pid -> (CPU seconds, name, create time, CPU seconds of its reaped children, nice value)
Snapshot = dict[int, tuple[Any, ...]]  # (a 3-tuple: no children's time; a 4-tuple: no nice)


def cpu_snapshot() -> Snapshot:
    """Every process's CPU seconds (user + system), name, start time, the CPU its reaped
    children used (the kernel adds an exited child's time to the parent that waited for it:
    short-lived processes a shell or a job runner starts show there), and its nice value,
    now."""
    import psutil

    out: Snapshot = {}
    for p in psutil.process_iter(["cpu_times", "name", "create_time", "nice"]):
        info = p.info
        t = info.get("cpu_times")
        if t is None or info.get("create_time") is None:
            continue  # gone, or not ours to read
        kids = float(getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0))
        nice = info.get("nice")
        out[p.pid] = (
            float(t.user + t.system),
            str(info.get("name") or "?"),
            float(info["create_time"]),
            kids,
            nice if type(nice) is int else 0,
        )
    return out


def busiest_others(
    before: Snapshot,
    after: Snapshot,
    seconds: float,
    exclude: Iterable[int],
    started: float,
    n: int = 5,
) -> list[dict[str, Any]]:
    """Who used the CPU between the snapshots (``seconds`` apart), outside ``exclude``: the
    ``n`` busiest processes, each with what its short-lived children used (``{"pid", "name",
    "cores"}``, and ``"children_cores"`` when those count), then the rest taken together by
    name (``"pid"`` the busiest of them, ``"processes"`` how many), every entry at least
    :data:`MIN_CORES`, all of them busiest first. A process started after ``started`` (the
    first snapshot's wall time) counts all its CPU. One at a lower priority (nice > 0) says
    its ``"nice"`` (processes of a name are taken together per nice value). What these do not
    hold came from processes that came and went without a parent here to reap them: the
    caller names that remainder."""
    if seconds <= 0:
        return []
    skip = set(exclude)
    used: list[tuple[float, float, int, str, int]] = []  # (own + reaped, reaped, pid, name, nice)
    for pid, now in after.items():
        if pid in skip:
            continue
        cpu, name, created = now[0], now[1], now[2]
        kids = now[3] if len(now) > 3 else 0.0  # snapshots without children's time: none
        nice = now[4] if len(now) > 4 else 0
        old = before.get(pid)
        if old is not None and abs(old[2] - created) < 0.01:
            own, reaped = cpu - old[0], kids - (old[3] if len(old) > 3 else 0.0)
        elif created >= started:
            own, reaped = cpu, kids  # started during the run
        else:
            continue
        own, reaped = max(0.0, own), max(0.0, reaped)
        if own + reaped > 0:
            used.append((own + reaped, reaped, pid, name, nice))
    used.sort(reverse=True)
    out: list[dict[str, Any]] = []
    for total, reaped, pid, name, nice in used[:n]:
        if total / seconds < MIN_CORES:
            break
        e: dict[str, Any] = {"pid": pid, "name": name, "cores": round(total / seconds, 2)}
        if reaped / seconds >= MIN_CORES:
            e["children_cores"] = round(reaped / seconds, 2)
        if nice:
            e["nice"] = nice
        out.append(e)
    # the rest, each too small or past the n busiest, by name: eight python processes at 0.2
    # cores each are 1.6 cores no single one of them shows
    groups: dict[tuple[str, int], list[tuple[float, float, int, str, int]]] = {}
    for row in used[len(out) :]:
        groups.setdefault((row[3], row[4]), []).append(row)
    rest = []
    for (name, nice), rows in groups.items():
        total = sum(r[0] for r in rows)
        if total / seconds >= MIN_CORES:
            e = {
                "pid": rows[0][2],
                "name": name,
                "cores": round(total / seconds, 2),
                "processes": len(rows),
            }
            reaped = sum(r[1] for r in rows)
            if reaped / seconds >= MIN_CORES:
                e["children_cores"] = round(reaped / seconds, 2)
            if nice:
                e["nice"] = nice
            rest.append(e)
    rest.sort(key=lambda e: -e["cores"])
    # busiest first, whole list: eight small ones of a name together can outrank the last of
    # the n busiest (0.1 cores against 0.05)
    return sorted(out + rest[:n], key=lambda e: -e["cores"])
