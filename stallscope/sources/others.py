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

Snapshot = dict[int, tuple[float, str, float]]  #: pid -> (CPU seconds, name, create time)


def cpu_snapshot() -> Snapshot:
    """Every process's CPU seconds (user + system), name and start time, now."""
    import psutil

    out: Snapshot = {}
    for p in psutil.process_iter(["cpu_times", "name", "create_time"]):
        info = p.info
        t = info.get("cpu_times")
        if t is None or info.get("create_time") is None:
            continue  # gone, or not ours to read
        out[p.pid] = (float(t.user + t.system), str(info.get("name") or "?"),
                      float(info["create_time"]))
    return out


def busiest_others(before: Snapshot, after: Snapshot, seconds: float, exclude: Iterable[int],
                   started: float, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` processes not in ``exclude`` that used the most CPU between the snapshots
    (``seconds`` apart; a process started after ``started``, the first snapshot's wall time,
    counts all its CPU), each at least :data:`MIN_CORES`: ``{"pid", "name", "cores"}``."""
    if seconds <= 0:
        return []
    skip = set(exclude)
    used: list[tuple[float, int, str]] = []
    for pid, (cpu, name, created) in after.items():
        if pid in skip:
            continue
        old = before.get(pid)
        if old is not None and abs(old[2] - created) < 0.01:
            delta = cpu - old[0]  # the same process (not a reused pid)
        elif created >= started:
            delta = cpu  # started during the run
        else:
            continue
        if delta / seconds >= MIN_CORES:
            used.append((delta, pid, name))
    used.sort(reverse=True)
    return [{"pid": pid, "name": name, "cores": round(d / seconds, 2)}
            for d, pid, name in used[:n]]
