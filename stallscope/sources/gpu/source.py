"""The ``gpu`` source (:class:`GpuSource`): finds the GPUs, reads one :class:`GpuReading` per
GPU per sample, runs the helper thread (slow values) and the XID thread, turns readings into
points and entities, and reports a GPU that is gone once."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from stallscope.errors import SourceUnavailable
from stallscope.metrics import Point
from stallscope.sources.base import Source, numeric_points
from stallscope.sources.gpu.gpm import free_gpm, read_gpm, start_gpm
from stallscope.sources.gpu.health import (
    EVENT_WAIT_MS,
    XidEvents,
    health_changes,
    remapped_rows,
)
from stallscope.sources.gpu.nvml import (
    MIB,
    GpuLost,
    Nvml,
    decode_throttle,
    field_value,
    num,
    to_int,
    to_text,
)
from stallscope.sources.gpu.processes import processes
from stallscope.sources.gpu.reading import GpuReading, GpuState, MigInstance
from stallscope.sources.gpu.slow import read_slow, slow_loop
from stallscope.sources.owner import OwnerCache

__all__ = ["GpuSource", "mig_profile"]

log = logging.getLogger(__name__)


_MIG_POINTS = (("gpu.mig_mem_used_mib", "mem_used_mib"), ("gpu.mig_mem_total_mib", "mem_total_mib"))


def _row_points(
    entity: str, row: dict[str, Any], fields: tuple[tuple[str, str], ...]
) -> list[Point]:
    """The points of one process or MIG instance of a GPU's payload: (metric, field) pairs."""
    return [Point(key, entity, float(row[f])) for key, f in fields if row.get(f) is not None]


def mig_profile(name: str | None) -> str | None:
    """``NVIDIA H200 MIG 1c.3g.71gb`` -> ``3g.71gb``: the GPU instance's profile in a MIG
    device's name (a compute-instance prefix ``Nc.`` cut), as dcgm-exporter's GPU_I_PROFILE."""
    if not name or " MIG " not in name:
        return None
    prof = name.rsplit(" MIG ", 1)[1].strip()
    return re.sub(r"^\d+c\.", "", prof) or None


#: (metric, field of a process of the payload) for each process on a GPU
_PROC_POINTS = (
    ("gpu.proc_mem_mib", "used_mib"),
    ("gpu.proc_sm_pct", "sm_pct"),
    ("gpu.proc_mem_util_pct", "mem_util_pct"),
)
_FIXED = (
    "name",
    "uuid",
    "pci_bus_id",
    "pcie_gen_max",
    "pcie_width_max",
    "mem_total_mib",
    "sm_clock_max_mhz",
)


class GpuSource(Source):
    """NVML readings of every NVIDIA GPU on this machine (``nvidia-smi --query-gpu``).

    ``backend``: anything answering pynvml's function names; default the real ``pynvml``.
    ``clock``: monotonic seconds, to space GPM samples. GPUs that vanish mid-run are listed in
    :attr:`lost` (index -> reason), logged once, and left out of later samples.
    """

    name = "gpu"

    def __init__(
        self,
        backend: Any | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        gpm: bool = True,
        background: bool = True,
    ) -> None:
        self.nvml = Nvml(backend)
        self.nvml.on_event = self.emit
        self._clock = clock
        self._want_gpm = gpm
        #: run the helper thread (slow values) and the XID event thread; tests without it call
        #: :meth:`read_slow` and :meth:`poll_events` themselves
        self._background = background
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._xids = XidEvents(self.nvml, self.emit)
        self._gpus: list[GpuState] | None = None
        self._unavailable: SourceUnavailable | None = None
        self.lost: dict[int, str] = {}
        #: whose job each process on a GPU is (pod or Slurm job, from its cgroup)
        self._owners = OwnerCache()
        self._said: set[str] = set()

    # -- Source seam ----------------------------------------------------------------------
    def open(self) -> None:
        """Start NVML, find the GPUs, read their fixed properties, take the first GPM sample.

        Raises SourceUnavailable("no NVIDIA driver (libnvidia-ml.so not found)") and the like.
        """
        if self._gpus is not None:
            return
        if self._unavailable is not None:
            raise self._unavailable  # said once; not retried
        self.nvml.start()
        try:
            count = int(self.nvml.required("nvmlDeviceGetCount"))
            if count == 0:
                raise SourceUnavailable("no NVIDIA GPU visible to NVML (0 devices)")
        except SourceUnavailable as exc:
            self._unavailable = exc
            self.nvml.shutdown()
            raise
        gpus: list[GpuState] = []
        for index in range(count):
            try:
                handle = self.nvml.call("nvmlDeviceGetHandleByIndex", index)
                if handle is None:
                    raise GpuLost("NVML gives no handle for it")
                gpu = GpuState(index, handle)
                self._read_fixed(gpu)
            except GpuLost as exc:
                self._mark_lost(index, None, exc.reason)
                continue
            gpus.append(gpu)
        self._gpus = gpus
        if self._want_gpm:
            for gpu in gpus:
                start_gpm(self.nvml, gpu, self._clock)
        self.read_slow(force=True)  # at open, so the first sample has them; later off sample()
        self._xids.start(gpus)
        if self._background:
            self._stop.clear()
            self._spawn(
                lambda: slow_loop(
                    self._stop,
                    self._clock,
                    lambda force: self.read_slow(force=force),
                    self._say_once,
                ),
                "stallscope-gpu-slow",
            )
            if self._xids.on:
                self._spawn(
                    lambda: self._xids.loop(self._stop, self._say_once), "stallscope-gpu-xid"
                )

    def sample(self, now: float) -> list[dict[str, Any]]:
        """One reading per GPU still present (``now`` is the collector's timestamp; GPM uses
        the monotonic clock)."""
        return [reading.as_dict() for reading in self.readings()]

    def points(self, payload: list[dict[str, Any]]) -> list[Point]:
        out: list[Point] = []
        for g in payload:
            out.extend(numeric_points(self.name, f"gpu{g.get('index', 0)}", g))
            gpu = f"gpu{g.get('index', 0)}"
            for proc in g.get("processes") or ():
                out.extend(_row_points(f"{gpu}:{proc['pid']}", proc, _PROC_POINTS))
            for mig in g.get("mig") or ():
                out.extend(_row_points(f"{gpu}/gi{mig['gpu_instance_id']}", mig, _MIG_POINTS))
        return out

    def entities(self, payload: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Each GPU (``gpuN``) with its fixed facts: name, UUID, PCI bus id, link maxima; each
        process on it (``gpuN:PID``) with the GPU's facts, its pid and whose job it is."""
        out: dict[str, dict[str, Any]] = {}
        for g in payload:
            fixed = {k: g.get(k) for k in _FIXED if k in g}
            out[f"gpu{g.get('index', 0)}"] = fixed
            for proc in g.get("processes") or ():
                pid = int(proc["pid"])
                out[f"gpu{g.get('index', 0)}:{pid}"] = {
                    **fixed,
                    "pid": pid,
                    **self._owners.owner(pid).attrs(),
                }
            for mig in g.get("mig") or ():
                out[f"gpu{g.get('index', 0)}/gi{mig['gpu_instance_id']}"] = {
                    **fixed,
                    "mig_profile": mig.get("profile"),
                    "mig_uuid": mig.get("uuid"),
                }
            for code in g.get("xid_errors") or ():
                out[f"gpu{g.get('index', 0)}/xid{code}"] = fixed
        return out

    def readings(self) -> list[GpuReading]:
        """Typed readings of the GPUs still present (same as :meth:`sample`, not as dicts)."""
        if self._gpus is None:
            self.open()
        assert self._gpus is not None
        out: list[GpuReading] = []
        for gpu in list(self._gpus):
            try:
                reading = self._read(gpu)
            except GpuLost as exc:
                self._gpus.remove(gpu)
                free_gpm(self.nvml, gpu)
                self._mark_lost(gpu.index, gpu, exc.reason)
                continue
            for msg in health_changes(gpu.health_seen, reading):
                log.warning(msg)
                self.emit("gpu_health", msg)
            if gpu.health_seen.get("grew") and reading.health_problem != 1:
                # ECC errors, remapped rows or retired pages grew during the run
                reading = dataclasses.replace(reading, health_problem=1)
            out.append(reading)
        return out

    def close(self) -> None:
        """Stop the helper threads, free GPM buffers and the event set, release NVML."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2 * EVENT_WAIT_MS / 1e3 + 1.0)
        self._threads = []
        self._xids.close()
        for gpu in self._gpus or []:
            free_gpm(self.nvml, gpu)
        self._gpus = None
        self.nvml.shutdown()

    def counters(self) -> list[tuple[str, str, float]]:
        """Raw counters for ``/metrics``: XIDs per GPU and code (``gpu<N>/xid<code>``), the
        energy counter (J) and PCIe replays per GPU, where NVML gives them."""
        out: list[tuple[str, str, float]] = []
        for gpu in self._gpus or []:
            entity = f"gpu{gpu.index}"
            for code, n in sorted(gpu.xids.items()):
                out.append(("gpu.xid_errors_total", f"{entity}/xid{code}", float(n)))
            slow = gpu.slow
            if slow.get("energy_j") is not None:
                out.append(("gpu.energy_joules_total", entity, float(slow["energy_j"])))
            if slow.get("pcie_replays") is not None:
                out.append(("gpu.pcie_replays_total", entity, float(slow["pcie_replays"])))
        return out

    # -- reading --------------------------------------------------------------------------
    def _read_fixed(self, gpu: GpuState) -> None:
        b, h, call = self.nvml.backend, gpu.handle, self.nvml.call
        gpu.name = to_text(call("nvmlDeviceGetName", h))
        gpu.uuid = to_text(call("nvmlDeviceGetUUID", h))
        pci = call("nvmlDeviceGetPciInfo", h)
        gpu.pci_bus_id = to_text(getattr(pci, "busId", None)) or None
        gpu.sm_clock_max_mhz = to_int(call("nvmlDeviceGetMaxClockInfo", h, b.NVML_CLOCK_SM))
        gpu.pcie_gen_max = to_int(call("nvmlDeviceGetMaxPcieLinkGeneration", h))
        gpu.pcie_width_max = to_int(call("nvmlDeviceGetMaxPcieLinkWidth", h))
        mode = call("nvmlDeviceGetEccMode", h)  # 0.16 ms; changing it needs a reset
        gpu.ecc_on = mode is not None and int(mode[0]) == int(b.NVML_FEATURE_ENABLED)
        gpu.migs = self._mig_instances(gpu)

    def _mig_instances(self, gpu: GpuState) -> list[tuple[int, str | None, str | None, Any]] | None:
        """The GPU instances of a GPU in MIG mode (fixed until the mode or layout changes,
        which needs the GPU idle and a reset); None otherwise."""
        call = self.nvml.call
        mode = call("nvmlDeviceGetMigMode", gpu.handle)
        if mode is None or not int(mode[0]):
            return None
        out: dict[int, tuple[int, str | None, str | None, Any]] = {}
        for i in range(to_int(call("nvmlDeviceGetMaxMigDeviceCount", gpu.handle)) or 0):
            mh = call("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, i)
            if mh is None:
                continue  # an empty slot
            gi = to_int(call("nvmlDeviceGetGpuInstanceId", mh))
            if gi is None or gi in out:
                continue  # another compute instance of a GPU instance already listed
            out[gi] = (
                gi,
                mig_profile(to_text(call("nvmlDeviceGetName", mh))),
                to_text(call("nvmlDeviceGetUUID", mh)),
                mh,
            )
        return [out[gi] for gi in sorted(out)]

    def _read(self, gpu: GpuState) -> GpuReading:
        b, h, call = self.nvml.backend, gpu.handle, self.nvml.call

        util = call("nvmlDeviceGetUtilizationRates", h)
        mem = self._memory(h)

        mask = call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if mask is None:  # drivers before 535 only have the old name
            mask = call("nvmlDeviceGetCurrentClocksThrottleReasons", h)

        ecc: int | None = None
        if gpu.ecc_on:
            ecc = to_int(
                call(
                    "nvmlDeviceGetTotalEccErrors",
                    h,
                    b.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    b.NVML_VOLATILE_ECC,
                )
            )

        gpm = read_gpm(self.nvml, gpu, self._clock)
        slow = gpu.slow
        if gpu.pcie_gpm:
            rx, tx = gpm.get("pcie_rx_mib_s"), gpm.get("pcie_tx_mib_s")
            rx_kb = None if rx is None else round(rx * 1024)
            tx_kb = None if tx is None else round(tx * 1024)
            pcie_from: str | None = "gpm"
        else:
            rx_kb, tx_kb = slow.get("pcie_rx_kb_s"), slow.get("pcie_tx_kb_s")
            pcie_from = "throughput" if rx_kb is not None or tx_kb is not None else None
        rows = remapped_rows(self.nvml, gpu)
        xid_count = sum(gpu.xids.values()) if self._xids.on else None
        problem = [xid_count, rows[2], rows[3], slow.get("retired_pages_pending")]
        known = [v for v in problem if v is not None]
        return GpuReading(
            index=gpu.index,
            name=gpu.name,
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            util_pct=num(getattr(util, "gpu", None)),
            mem_util_pct=num(getattr(util, "memory", None)),
            mem_used_mib=None if mem is None else int(mem.used) // MIB,
            mem_total_mib=None if mem is None else int(mem.total) // MIB,
            temp_c=num(call("nvmlDeviceGetTemperature", h, b.NVML_TEMPERATURE_GPU)),
            power_w=num(call("nvmlDeviceGetPowerUsage", h), 1e-3),
            power_limit_w=num(call("nvmlDeviceGetEnforcedPowerLimit", h), 1e-3),
            sm_clock_mhz=to_int(call("nvmlDeviceGetClockInfo", h, b.NVML_CLOCK_SM)),
            sm_clock_max_mhz=gpu.sm_clock_max_mhz,
            throttle=None if mask is None else decode_throttle(int(mask)),
            throttle_mask=to_int(mask),
            pcie_gen=to_int(call("nvmlDeviceGetCurrPcieLinkGeneration", h)),
            pcie_gen_max=gpu.pcie_gen_max,
            pcie_width=to_int(call("nvmlDeviceGetCurrPcieLinkWidth", h)),
            pcie_width_max=gpu.pcie_width_max,
            pcie_rx_kb_s=rx_kb,
            pcie_tx_kb_s=tx_kb,
            ecc_errors=ecc,
            sm_active_pct=gpm.get("sm_active_pct"),
            sm_occupancy_pct=gpm.get("sm_occupancy_pct"),
            tensor_active_pct=gpm.get("tensor_active_pct"),
            mem_temp_c=self._mem_temp(gpu),
            energy_j=slow.get("energy_j"),
            pcie_replays=slow.get("pcie_replays"),
            remapped_rows_correctable=rows[0],
            remapped_rows_uncorrectable=rows[1],
            row_remap_pending=rows[2],
            row_remap_failed=rows[3],
            retired_pages=slow.get("retired_pages"),
            retired_pages_pending=slow.get("retired_pages_pending"),
            xid_count=xid_count,
            xid_last=gpu.xid_last if xid_count is not None else None,
            xid_errors=(
                {str(k): v for k, v in sorted(gpu.xids.items())} if xid_count is not None else None
            ),
            health_problem=(1 if any(known) else 0) if known else None,
            pcie_from=pcie_from,
            processes=processes(self.nvml, gpu),
            mig=self._mig_readings(gpu),
        )

    def _mig_readings(self, gpu: GpuState) -> list[MigInstance] | None:
        if gpu.migs is None:
            return None
        out = []
        for gi, profile, uuid, mh in gpu.migs:
            mem = self._memory(mh)
            out.append(
                MigInstance(
                    gi,
                    profile,
                    uuid,
                    None if mem is None else int(mem.used) // MIB,
                    None if mem is None else int(mem.total) // MIB,
                )
            )
        return out

    def _memory(self, h: Any) -> Any | None:
        """``nvmlDeviceGetMemoryInfo`` v2 (used excludes reserved memory, as nvidia-smi's
        ``memory.used`` does), or v1 where the driver lacks v2."""
        b = self.nvml.backend
        version = getattr(b, "nvmlMemory_v2", None)
        mem = None
        if version is not None:
            mem = self.nvml.call("nvmlDeviceGetMemoryInfo", h, version)
        if mem is None:
            mem = self.nvml.call("nvmlDeviceGetMemoryInfo", h)
        return mem

    def _mem_temp(self, gpu: GpuState) -> float | None:
        """HBM temperature through a field value (0.005 ms on an H200); None without a sensor."""
        b = self.nvml.backend
        fid = getattr(b, "NVML_FI_DEV_MEMORY_TEMP", None)
        if fid is None:
            return None
        values = self.nvml.call("nvmlDeviceGetFieldValues", gpu.handle, [fid])
        value = field_value(b, values[0]) if values else None
        # 0 °C is taken as "no sensor": a working GPU's memory is never that cold
        return None if not value else round(float(value), 3)

    # -- the helper thread (slow values) and the XID thread ----------------------------------
    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def read_slow(self, *, force: bool = True) -> None:
        """Read what is too slow for every sample (:func:`~stallscope.sources.gpu.slow.
        read_slow`): the PCIe fallback always; with ``force``, also the energy counter, PCIe
        replays and retired pages. Runs on the helper thread (and once at open)."""
        read_slow(self.nvml, list(self._gpus or []), force=force)

    def poll_events(self, timeout_ms: int = 0) -> bool:
        """Wait up to ``timeout_ms`` for one NVML event and count it; True if one came."""
        return self._xids.poll(timeout_ms)

    def _say_once(self, key: str, msg: str) -> None:
        if key in self._said:
            return
        self._said.add(key)
        log.warning(msg)
        self.emit("error", msg)

    def _mark_lost(self, index: int, gpu: GpuState | None, reason: str) -> None:
        if index in self.lost:
            return
        self.lost[index] = reason
        what = f"GPU {index}"
        if gpu is not None and (gpu.name or gpu.uuid):
            what += f" ({', '.join(x for x in (gpu.name, gpu.uuid) if x)})"
        msg = f"{what} is gone: {reason}; the other GPUs are still sampled"
        log.warning(msg)
        self.emit("gpu_lost", msg)
