"""What the ``gpu`` source reads: one :class:`GpuReading` per GPU at one moment (its
processes and MIG instances with it), and :class:`GpuState`, what the source keeps per GPU
between samples."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["GpuProcess", "GpuReading", "GpuState", "MigInstance"]


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on the GPU (``nvidia-smi --query-compute-apps=pid,
    used_memory``, plus graphics processes)."""

    pid: int
    used_mib: int | None  #: MiB of GPU memory; None where NVML cannot tell (MIG, WDDM)
    #: its share of the SMs and of memory bandwidth since the previous sample (nvidia-smi pmon
    #: sm %, mem %; NVML's per-process utilization samples); 0 when it ran nothing in that
    #: time, None where NVML keeps no per-process samples (MIG, older drivers)
    sm_pct: float | None = None
    mem_util_pct: float | None = None


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance: dcgm-exporter's ``GPU_I_ID`` and ``GPU_I_PROFILE``, its MIG
    device UUID and its share of the framebuffer (compute instances of one GPU instance share
    it, so it is read once per GPU instance)."""

    gpu_instance_id: int
    profile: str | None  #: ``3g.40gb`` (the GPU instance's profile, compute-instance prefix cut)
    uuid: str | None  #: ``MIG-...`` of its first MIG device
    mem_used_mib: int | None
    mem_total_mib: int | None


@dataclass(frozen=True)
class GpuReading:
    """One NVIDIA GPU at one moment. ``None`` = NVML has no such value on this GPU/driver."""

    index: int
    """NVML device index (``nvidia-smi --query-gpu=index``; ignores CUDA_VISIBLE_DEVICES)."""
    name: str | None
    """Product name (``name``)."""
    uuid: str | None
    """GPU UUID (``uuid``)."""
    pci_bus_id: str | None
    """PCI bus id, ``00000000:3B:00.0`` (``pci.bus_id``; dcgm-exporter's ``pci_bus_id``)."""
    util_pct: float | None
    """% of the last sample period (1/6 s to 1 s) in which *any* kernel ran
    (``utilization.gpu``). Not how full the SMs were: see sm_active_pct. None under MIG."""
    mem_util_pct: float | None
    """% of the sample period device memory was read or written (``utilization.memory``)."""
    mem_used_mib: int | None
    """Device memory in use, MiB, excluding driver-reserved memory (``memory.used``)."""
    mem_total_mib: int | None
    """Device memory total, MiB (``memory.total``)."""
    temp_c: float | None
    """GPU core temperature, °C (``temperature.gpu``)."""
    power_w: float | None
    """Board power draw, W; a 1 s average on Ampere+ except GA100 (``power.draw``)."""
    power_limit_w: float | None
    """Enforced power limit, W (``enforced.power.limit``)."""
    sm_clock_mhz: int | None
    """Current SM clock, MHz (``clocks.sm`` / ``clocks.current.sm``)."""
    sm_clock_max_mhz: int | None
    """Maximum SM clock, MHz (``clocks.max.sm``)."""
    throttle: list[str] | None
    """Active clock event reasons, decoded (``clocks_event_reasons.*`` = Active)."""
    throttle_mask: int | None
    """The same as a bitmask (``clocks_event_reasons.active``)."""
    pcie_gen: int | None
    """Current PCIe link generation (``pcie.link.gen.current``); drops at idle to save power."""
    pcie_gen_max: int | None
    """Max PCIe generation of this GPU in this slot (``pcie.link.gen.max``)."""
    pcie_width: int | None
    """Current PCIe link width, lanes (``pcie.link.width.current``)."""
    pcie_width_max: int | None
    """Max PCIe link width, lanes (``pcie.link.width.max``)."""
    pcie_rx_kb_s: int | None
    """PCIe receive (host to GPU) throughput, KiB/s (``nvidia-smi dmon -s t`` rxpci,
    ``nvidia-smi -q`` "Rx Throughput"): from GPM over the sample's interval on Hopper+, else
    NVML's 20-ms window read on the helper thread (pcie_from)."""
    pcie_tx_kb_s: int | None
    """PCIe transmit (GPU to host) throughput, KB/s (``dmon -s t`` txpci, -q "Tx
    Throughput")."""
    ecc_errors: int | None
    """Uncorrected ECC errors since the driver loaded (``ecc.errors.uncorrected.volatile
    .total``); None where ECC is off or not supported (GeForce)."""
    sm_active_pct: float | None = None
    """GPM, Hopper+: % of SM time with at least one warp resident, over the interval since the
    previous sample (DCGM PROF_SM_ACTIVE; no nvidia-smi field)."""
    sm_occupancy_pct: float | None = None
    """GPM, Hopper+: resident warps as % of the maximum, over the interval (DCGM
    PROF_SM_OCCUPANCY)."""
    tensor_active_pct: float | None = None
    """GPM, Hopper+: % of time the tensor cores were busy, over the interval (DCGM
    PROF_PIPE_TENSOR_ACTIVE)."""
    mem_temp_c: float | None = None
    """HBM memory temperature, °C (``temperature.memory``; DCGM_FI_DEV_MEMORY_TEMP); None where
    the board has no memory sensor."""
    energy_j: float | None = None
    """Energy the GPU used since the driver loaded, J (``nvmlDeviceGetTotalEnergyConsumption``;
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION); read every SLOW_READ_S s, off ``sample()``."""
    pcie_replays: int | None = None
    """PCIe replays since the driver loaded (``nvidia-smi -q`` "Replays Since Reset";
    DCGM_FI_DEV_PCIE_REPLAY_COUNTER): a link that retransmits; read every SLOW_READ_S s."""
    remapped_rows_correctable: int | None = None
    """Rows remapped after correctable ECC errors (``remapped_rows.correctable``, Ampere+)."""
    remapped_rows_uncorrectable: int | None = None
    """Rows remapped after uncorrectable ECC errors (``remapped_rows.uncorrectable``)."""
    row_remap_pending: int | None = None
    """1 while a row remap waits for a GPU reset (``remapped_rows.pending``)."""
    row_remap_failed: int | None = None
    """1 once a row remap failed (``remapped_rows.failure``): replace the GPU."""
    retired_pages: int | None = None
    """Pages retired for ECC errors, single- and double-bit (``retired_pages.sbe`` + ``.dbe``);
    GPUs before Ampere, where rows are not remapped."""
    retired_pages_pending: int | None = None
    """1 while a page retirement waits for a reset (``retired_pages.pending``)."""
    xid_count: int | None = None
    """XID errors on this GPU since the source opened, those the NVIDIA device plugin treats
    as application errors left out (APP_XIDS); None where NVML gives no XID events here."""
    xid_last: int | None = None
    """The last such XID code, 0 if none (DCGM_FI_DEV_XID_ERRORS' value)."""
    xid_errors: dict[str, int] | None = None
    """Those XIDs counted per code (``{"79": 1}``)."""
    health_problem: int | None = None
    """1 when the GPU needs a person: an XID above, a pending or failed row remap, or a pending
    page retirement; else 0."""
    pcie_from: str | None = None
    """Where the PCIe rates come from: ``"gpm"`` (Hopper+, read with the sample) or
    ``"throughput"`` (``nvmlDeviceGetPcieThroughput`` on the helper thread, up to
    PCIE_FALLBACK_S old)."""
    processes: list[GpuProcess] | None = field(default=None)
    """Compute and graphics processes on this GPU (``nvidia-smi --query-compute-apps``)."""
    mig: list[MigInstance] | None = field(default=None)
    """In MIG mode, each GPU instance with its profile and framebuffer (``nvidia-smi`` "MIG
    devices"); None when the GPU is not in MIG mode."""

    def as_dict(self) -> dict[str, Any]:
        """The ``snapshot --json`` shape: every field, processes and MIG instances as dicts of
        their own fields (:class:`GpuProcess`: pid, used_mib, sm_pct, mem_util_pct)."""
        return asdict(self)


@dataclass
class GpuState:
    """What the source keeps per GPU between samples."""

    index: int
    handle: Any
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    sm_clock_max_mhz: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, spare]
    gpm_taken_at: float | None = None  # when the previous sample was taken
    #: the newest per-process utilization sample seen (NVML's microsecond clock): the next
    #: call asks only for samples after it
    proc_util_ts: int = 0
    #: in MIG mode: (GPU instance id, profile, MIG UUID, a MIG device handle) per GPU instance
    migs: list[tuple[int, str | None, str | None, Any]] | None = None
    ecc_on: bool = False  #: ECC enabled (read once: a change needs a reset)
    #: whether GPM gives the PCIe rates (None until the first GPM metrics tell)
    pcie_gpm: bool | None = None
    #: values the helper thread reads (energy, replays, retired pages, PCIe fallback), by
    #: GpuReading field; replaced whole, so a reader never sees half an update
    slow: dict[str, Any] = field(default_factory=dict)
    #: XID code -> count, from the event thread
    xids: dict[int, int] = field(default_factory=dict)
    xid_last: int = 0
    rows_supported: bool = True  #: remapped rows answer here (Ampere+)
    #: what the previous reading said of the GPU's health (:func:`~stallscope.sources.gpu.
    #: health.health_changes`: a change is told as an event)
    health_seen: dict[str, Any] = field(default_factory=dict)


#: the facts of a GPU that do not change during a run (its entity's attributes)
