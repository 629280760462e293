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

__all__ = ["DERIVED", "Deriver", "trainer_gpu_memory"]

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
        used = sum(float(p.get("used_mib") or 0) for p in g.get("processes") or []
                   if str(p.get("pid")) in pids)
        out.append(Point("gpu.trainer_mem_mib", f"gpu{g.get('index', 0)}", used))
    return out


#: every deriver, run in this order after the sources
DERIVED: tuple[Deriver, ...] = (trainer_gpu_memory,)
