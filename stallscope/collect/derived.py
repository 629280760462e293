"""Metrics computed from several sources' readings at once (``derived=True`` in
:mod:`stallscope.metrics`). Each deriver takes the sample's readings by source name and returns
points; the collector runs them all, in order, after the sources. A new cross-source metric is a
function here and a line in the vocabulary, nothing else."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from stallscope.metrics import Point

if TYPE_CHECKING:
    from stallscope.sources.base import Reading

__all__ = ["DERIVED", "Deriver", "gpu_throttle_serious", "shm_used_pct", "trainer_gpu_memory"]

Deriver = Callable[[Mapping[str, "Reading"]], list[Point]]


def trainer_gpu_memory(readings: Mapping[str, Reading]) -> list[Point]:
    """Per GPU, the memory the trainer's processes hold: tells the diagnosis which GPUs this run
    uses (a node's other GPUs, idle or busy with other jobs, must not count). Unknown (no
    points) without a trainer tree."""
    gpu, procs = readings.get("gpu"), readings.get("procs")
    if gpu is None or procs is None or not gpu.payload:
        return []
    pids = procs.payload
    out = []
    for g in gpu.payload:
        used = sum(
            float(p.get("used_mib") or 0)
            for p in g.get("processes") or []
            if str(p.get("pid")) in pids
        )
        out.append(Point("gpu.trainer_mem_mib", f"gpu{g.get('index', 0)}", used))
    return out


#: throttle reasons that mean heat or a hardware power brake (not the normal power cap)
SERIOUS_THROTTLE = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


def gpu_throttle_serious(readings: Mapping[str, Reading]) -> list[Point]:
    """Per GPU, 1 while a thermal or hardware power-brake reason holds its clocks down."""
    gpu = readings.get("gpu")
    if gpu is None or not gpu.payload:
        return []
    return [
        Point(
            "gpu.throttle_serious",
            f"gpu{g.get('index', 0)}",
            1.0 if SERIOUS_THROTTLE & set(g.get("throttle") or ()) else 0.0,
        )
        for g in gpu.payload
    ]


def shm_used_pct(readings: Mapping[str, Reading]) -> list[Point]:
    """/dev/shm used as a share of its size (what an alert threshold needs)."""
    host = readings.get("host")
    if host is None:
        return []
    used, total = host.payload.get("shm_used_mib"), host.payload.get("shm_total_mib")
    if not isinstance(used, (int, float)) or not isinstance(total, (int, float)) or total <= 0:
        return []
    return [Point("host.shm_used_pct", "", round(100.0 * used / total, 2))]


#: every deriver, run in this order after the sources
DERIVED: tuple[Deriver, ...] = (trainer_gpu_memory, gpu_throttle_serious, shm_used_pct)
