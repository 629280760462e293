"""The processes on a GPU (``nvidia-smi --query-compute-apps``, graphics processes too) with
their memory and their share of the SMs and memory bandwidth (``nvidia-smi pmon``)."""

from __future__ import annotations

from stallscope.sources.gpu.nvml import MIB, Nvml
from stallscope.sources.gpu.reading import GpuProcess, GpuState

__all__ = ["process_util", "processes"]


def processes(nvml: Nvml, gpu: GpuState) -> list[GpuProcess] | None:
    """Each process with a context on the GPU, by pid; None where NVML lists none at all."""
    h = gpu.handle
    compute = nvml.call("nvmlDeviceGetComputeRunningProcesses", h)
    graphics = nvml.call("nvmlDeviceGetGraphicsRunningProcesses", h)
    if compute is None and graphics is None:
        return None
    by_pid: dict[int, int | None] = {}
    for proc in [*(compute or []), *(graphics or [])]:
        pid = int(proc.pid)
        used = proc.usedGpuMemory
        mib = None if used is None else int(used) // MIB
        old = by_pid.get(pid)
        # a C+G process is in both lists: keep the one answer that has a number
        by_pid[pid] = mib if old is None else old
    # per-process utilization costs 2.7 ms a call on a busy H200 (none idle): the helper
    # thread reads it every PCIE_FALLBACK_S s; the sampling thread only the first time
    if by_pid and "proc_util" not in gpu.slow:
        gpu.slow = {**gpu.slow, "proc_util": process_util(nvml, gpu)}
    util = gpu.slow.get("proc_util") if by_pid else None
    return [
        GpuProcess(
            pid, by_pid[pid], *(util.get(pid, (0.0, 0.0)) if util is not None else (None, None))
        )
        for pid in sorted(by_pid)
    ]


def process_util(nvml: Nvml, gpu: GpuState) -> dict[int, tuple[float, float]] | None:
    """pid -> (sm %, memory %) from NVML's per-process samples since the previous read (the
    newest per pid); {} when NVML has none since then (every process idle); None where it
    keeps none at all (MIG, an older driver)."""
    samples = nvml.call_found("nvmlDeviceGetProcessUtilization", gpu.handle, gpu.proc_util_ts)
    if samples is None:
        return None
    out: dict[int, tuple[int, float, float]] = {}
    for smp in samples:
        ts = int(getattr(smp, "timeStamp", 0) or 0)
        pid = int(smp.pid)
        if pid in out and out[pid][0] >= ts:
            continue
        out[pid] = (ts, float(smp.smUtil), float(smp.memUtil))
        gpu.proc_util_ts = max(gpu.proc_util_ts, ts)
    return {pid: (sm, mem) for pid, (_ts, sm, mem) in out.items()}
