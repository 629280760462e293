"""The values too slow for every sample, read on the source's helper thread: NVML's 20-ms PCIe
window (GPUs without GPM's PCIe rates) every PCIE_FALLBACK_S s; the energy counter, PCIe
replays and retired pages every SLOW_READ_S s; per-process utilization. A GPU's values are
replaced whole (:attr:`GpuState.slow`), so a sample never sees half an update."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from stallscope.sources.gpu.health import retired_pages
from stallscope.sources.gpu.nvml import GpuLost, Nvml, to_int
from stallscope.sources.gpu.processes import process_util
from stallscope.sources.gpu.reading import GpuState

__all__ = ["PCIE_FALLBACK_S", "SLOW_READ_S", "read_slow", "slow_loop"]

#: seconds between reads of the values too slow for every sample, on the source's helper
#: thread: the energy counter (3.2 ms a call on an H200), the PCIe replay counter (0.18 ms),
#: retired pages (GPUs before Ampere)
SLOW_READ_S = 10.0
#: seconds between ``nvmlDeviceGetPcieThroughput`` reads on the helper thread, for GPUs without
#: GPM: each call waits out NVML's 20-ms window, so it never runs inside ``sample()``
PCIE_FALLBACK_S = 2.0


def slow_loop(
    stop: threading.Event,
    clock: Callable[[], float],
    read: Callable[[bool], None],
    say_once: Callable[[str, str], None],
) -> None:
    """The helper thread: ``read(force)`` every PCIE_FALLBACK_S s until ``stop``, ``force``
    once SLOW_READ_S s have passed; an error is said once (``say_once``), never ends it."""
    last_slow = clock()
    while not stop.wait(PCIE_FALLBACK_S):
        try:
            now = clock()
            slow = now - last_slow >= SLOW_READ_S
            if slow:
                last_slow = now
            read(slow)
        except Exception as exc:  # a bug here must never stop sampling: say it once
            say_once("slow", f"GPU helper thread: {type(exc).__name__}: {exc}")


def read_slow(nvml: Nvml, gpus: list[GpuState], *, force: bool = True) -> None:
    """Read what is too slow for every sample: the PCIe fallback (GPUs without GPM) always;
    with ``force``, also the energy counter, PCIe replays and retired pages."""
    b = nvml.backend
    for gpu in gpus:
        try:
            new = dict(gpu.slow)
            if not gpu.pcie_gpm and not (gpu.pcie_gpm is None and gpu.gpm_samples):
                call = nvml.call
                new["pcie_rx_kb_s"] = to_int(
                    call("nvmlDeviceGetPcieThroughput", gpu.handle, b.NVML_PCIE_UTIL_RX_BYTES)
                )
                new["pcie_tx_kb_s"] = to_int(
                    call("nvmlDeviceGetPcieThroughput", gpu.handle, b.NVML_PCIE_UTIL_TX_BYTES)
                )
            if force:
                new.update(slow_values(nvml, gpu))
            if "proc_util" in new:  # processes were seen: keep their shares fresh
                new["proc_util"] = process_util(nvml, gpu)
            gpu.slow = new
        except GpuLost:
            continue  # the next regular read reports the loss


def slow_values(nvml: Nvml, gpu: GpuState) -> dict[str, Any]:
    """The energy counter (J), PCIe replays and, before Ampere, retired pages of one GPU."""
    h, call = gpu.handle, nvml.call
    energy = call("nvmlDeviceGetTotalEnergyConsumption", h)  # mJ since the driver loaded
    out: dict[str, Any] = {
        "energy_j": None if energy is None else round(int(energy) / 1e3, 3),
        "pcie_replays": to_int(call("nvmlDeviceGetPcieReplayCounter", h)),
    }
    if not gpu.rows_supported:  # before Ampere: pages are retired instead
        out.update(retired_pages(nvml, gpu))
    return out
