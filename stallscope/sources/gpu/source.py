"""The ``gpu`` source: NVIDIA GPUs through NVML (``nvidia-ml-py``), in-process.

Every NVML call goes through one lazily initialised entry point, :class:`Nvml` (the nvitop
pattern): the first call runs ``nvmlInit``; a driver or library that is missing becomes one
:class:`~stallscope.errors.SourceUnavailable` with a one-line reason, remembered and raised
again without retrying; "not supported"/"N/A" answers become ``None``; a GPU that falls off the
bus (``NVML_ERROR_GPU_IS_LOST``, ``NVML_ERROR_UNKNOWN``...) is reported gone once and the other
GPUs go on. The NVML backend is a constructor argument (default: the real ``pynvml`` module), so
tests run this exact code against :class:`~stallscope.testing.nvml_replay.NvmlReplay`.

One reading per GPU is a :class:`GpuReading`; the payload of :meth:`GpuSource.sample` is the
list of their :meth:`~GpuReading.as_dict` -- the ``gpu`` part of ``snapshot --json``
(docs/architecture.md) plus ``sm_clock_max_mhz``, ``throttle_mask``, the GPM fields and
``processes``. Field meanings, NVML calls and ``nvidia-smi`` equivalents: docs/gpu-metrics.md.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from stallscope.errors import SourceUnavailable
from stallscope.metrics import Point
from stallscope.sources.base import Source, numeric_points
from stallscope.sources.owner import OwnerCache

__all__ = [
    "THROTTLE_REASONS",
    "GpuLost",
    "GpuProcess",
    "GpuReading",
    "GpuSource",
    "Nvml",
    "decode_throttle",
]

log = logging.getLogger(__name__)

MIB = 1024 * 1024

#: Clock event ("throttle") reason bits, as NVML defines them (``nvmlClocksEventReason*`` /
#: ``nvmlClocksThrottleReason*``), with the names stallscope reports, in bit order.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),  # nothing to do: clocks are low on purpose
    (0x002, "applications_clocks"),  # clocks pinned by nvidia-smi -ac / application clocks
    (0x004, "sw_power_cap"),  # the power limit (power_limit_w) holds clocks down
    (0x008, "hw_slowdown"),  # hardware slowdown (thermal or power brake): serious
    (0x010, "sync_boost"),  # held to the clocks of other GPUs in a sync-boost group
    (0x020, "sw_thermal"),  # driver slows down to stay under its temperature target
    (0x040, "hw_thermal"),  # hardware thermal slowdown: the GPU is too hot
    (0x080, "hw_power_brake"),  # an external power brake signal (the PSU) asserted
    (0x100, "display_clocks"),  # clocks set by the display
    (0x200, "board_limit"),  # ThrottleReason only (older API)
    (0x400, "reliability"),  # ThrottleReason only (older API)
)

# NVML answers that mean "this GPU/driver does not have this value": the field becomes None
_NA_ERRORS = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_DATA",
    "NVML_ERROR_DEPRECATED",
    "NVML_ERROR_NOT_READY",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
)
# NVML answers that mean the GPU itself is gone (fell off the bus, needs a reset)
_LOST_ERRORS = (
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_UNKNOWN",
    "NVML_ERROR_RESET_REQUIRED",
    "NVML_ERROR_GPU_NOT_FOUND",
)
# why nvmlInit failed, as a line a user can act on
_INIT_REASONS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "no NVIDIA driver (libnvidia-ml.so not found)",
    "NVML_ERROR_DRIVER_NOT_LOADED": "NVIDIA driver not loaded (nvmlInit: Driver Not Loaded)",
    "NVML_ERROR_NO_PERMISSION": "no permission to use the NVIDIA driver (nvmlInit: "
    "Insufficient Permissions)",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "NVIDIA driver and libnvidia-ml.so versions differ "
    "(reload the driver or reboot)",
    "NVML_ERROR_FUNCTION_NOT_FOUND": "libnvidia-ml.so is too old for nvidia-ml-py "
    "(nvmlInit: Function Not Found)",
}
# GPM metrics (Hopper+), the DCGM profiling fields they match, and where they go
_GPM_METRICS = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),  # DCGM PROF_SM_ACTIVE
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),  # DCGM PROF_SM_OCCUPANCY
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),  # DCGM PROF_PIPE_TENSOR_ACTIVE
)
#: GPM's PCIe traffic (MiB/s), read with the metrics above: NVML's non-blocking PCIe rate
_GPM_PCIE = (("pcie_tx_mib_s", "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
             ("pcie_rx_mib_s", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"))
#: NVML computes GPM metrics from samples at least this far apart (its refresh rate).
GPM_MIN_INTERVAL_S = 0.1
#: seconds between reads of the values too slow for every sample, on the source's helper
#: thread: the energy counter (3.2 ms a call on an H200), the PCIe replay counter (0.18 ms),
#: retired pages (GPUs before Ampere)
SLOW_READ_S = 10.0
#: seconds between ``nvmlDeviceGetPcieThroughput`` reads on the helper thread, for GPUs without
#: GPM: each call waits out NVML's 20-ms window, so it never runs inside ``sample()``
PCIE_FALLBACK_S = 2.0
#: how long one wait for NVML events lasts (the XID thread checks for close between waits)
EVENT_WAIT_MS = 250
#: XID codes the NVIDIA device plugin treats as errors of the application, not of the GPU
#: (its ``DP_DISABLE_HEALTHCHECKS`` default skip list): a graphics engine exception (13), an
#: MMU fault (31), a stopped or killed channel (43, 45), a video decoder exception (68), a
#: context-switch timeout (109). A crashing program raises them on a healthy GPU; they are not
#: counted.
APP_XIDS = frozenset({13, 31, 43, 45, 68, 109})
#: what the common XIDs mean and what to do (NVIDIA's XID catalog, shortened)
XID_MEANINGS: dict[int, tuple[str, str]] = {
    48: ("double-bit ECC error in GPU memory",
         "drain the node and reset the GPU; replace it if it comes back"),
    63: ("a row remap or page retirement was recorded after an ECC error",
         "reset the GPU when the jobs on it end, so the remap takes effect"),
    64: ("a row remap or page retirement failed to be recorded",
         "drain the node and reset the GPU; replace it if this repeats"),
    74: ("NVLink error", "drain the node and reset the GPUs; check the NVLink bridge or "
         "baseboard, and replace the GPU if it repeats"),
    79: ("the GPU has fallen off the bus", "drain the node and reboot it; check power and the "
         "PCIe slot, and replace the GPU if it repeats"),
    92: ("high single-bit ECC error rate", "watch it; replace the GPU if the rate keeps up"),
    94: ("contained ECC error (one application was stopped)",
         "reset the GPU when convenient, so the bad row is remapped"),
    95: ("uncontained ECC error (every application on the GPU was stopped)",
         "drain the node and reset the GPU; replace it if it repeats"),
    119: ("GSP RPC timeout (the GPU's system processor did not answer)",
          "drain the node and reset the GPU or reboot; update the driver if it repeats"),
    120: ("GSP error", "drain the node and reset the GPU or reboot; update the driver if it "
          "repeats"),
}


def health_parts(h: Any) -> list[str]:
    """What needs a person on one GPU, in words, from a reading (or a run's summary of one):
    ``["1 XID (last 79: the GPU has fallen off the bus)", "a row remap waits for a reset"]``."""
    parts = []
    if h.get("xid_count"):
        code = h.get("xid_last") or 0
        meaning = XID_MEANINGS.get(int(code), ("",))[0] if code else ""
        parts.append(f"{h['xid_count']} XID (last {code}{': ' + meaning if meaning else ''})")
    if h.get("row_remap_failed"):
        parts.append("a row remap failed")
    if h.get("row_remap_pending"):
        parts.append("a row remap waits for a reset")
    if h.get("retired_pages_pending"):
        parts.append("a page retirement waits for a reset")
    return parts


class GpuLost(Exception):
    """Internal: an NVML call said the GPU is gone. Caught per GPU by :class:`GpuSource`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_throttle(mask: int) -> list[str]:
    """Names of the active clock event reasons in ``mask``, in bit order; bits NVML has not
    defined come out as ``"unknown_0x..."``.

    ``nvidia-smi --query-gpu=clocks_event_reasons.active`` prints the same mask in hex."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_0x{bit:x}")
            rest &= ~bit
        bit <<= 1
    return names


class Nvml:
    """The one entry point for NVML calls.

    ``backend`` is anything that answers pynvml's function names (the ``pynvml`` module
    itself, or a replay); ``None`` imports ``pynvml`` on first use. Nothing happens until the
    first call: then ``nvmlInit`` runs once, and its failure is kept as a
    :class:`SourceUnavailable` that every later call raises again without retrying.
    """

    def __init__(self, backend: Any | None = None) -> None:
        self._backend: Any = backend
        self._lock = threading.Lock()
        self._started = False
        self._failure: SourceUnavailable | None = None
        self._codes: dict[str, int] = {}
        self._warned: set[tuple[str, int]] = set()
        #: told (kind, message) of NVML errors worth a run event; the source sets it
        self.on_event: Callable[[str, str], None] | None = None

    @property
    def backend(self) -> Any:
        """The backend module/object (after :meth:`start`)."""
        self.start()
        return self._backend

    def start(self) -> None:
        """Initialise NVML if not done yet; raise SourceUnavailable(reason) if it cannot be."""
        if self._started:
            return
        with self._lock:
            if self._started:
                return
            if self._failure is not None:
                raise self._failure
            try:
                if self._backend is None:
                    try:
                        import pynvml
                    except ImportError as exc:
                        raise SourceUnavailable(
                            "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
                        ) from exc
                    self._backend = pynvml
                b = self._backend
                self._codes = {
                    name: int(getattr(b, name))
                    for name in (*_NA_ERRORS, *_LOST_ERRORS, *_INIT_REASONS)
                    if hasattr(b, name)
                }
                try:
                    b.nvmlInit()
                except b.NVMLError as exc:
                    raise SourceUnavailable(self._init_reason(exc)) from exc
                except OSError as exc:  # the library exists but cannot be loaded
                    raise SourceUnavailable(f"cannot load libnvidia-ml.so ({exc})") from exc
            except SourceUnavailable as exc:
                self._failure = exc
                raise
            self._started = True

    def _init_reason(self, exc: Any) -> str:
        for name, reason in _INIT_REASONS.items():
            if self._codes.get(name) == exc.value:
                return reason
        return f"NVML failed to start (nvmlInit: {exc})"

    def _is(self, exc: Any, names: tuple[str, ...]) -> bool:
        return any(self._codes.get(n) == exc.value for n in names)

    def required(self, fn: str, *args: Any) -> Any:
        """Call ``fn``; any NVML error makes the whole source unavailable (for calls without
        which nothing works, e.g. ``nvmlDeviceGetCount``)."""
        self.start()
        b = self._backend
        try:
            return getattr(b, fn)(*args)
        except b.NVMLError as exc:
            raise SourceUnavailable(f"NVML {fn} failed: {exc}") from exc

    def call(self, fn: str, *args: Any) -> Any | None:
        """Call ``fn(*args)`` for one GPU.

        Returns the value, or ``None`` where NVML says the value does not exist here (not
        supported, N/A, function absent from this driver). Raises :class:`GpuLost` where it
        says the GPU is gone. Any other NVML error (no permission, timeout...) is logged once
        per function and error, and also gives ``None``: one odd field never stops a sample.
        """
        self.start()
        b = self._backend
        func = getattr(b, fn, None)
        if func is None:  # an older nvidia-ml-py without this function
            return None
        try:
            return func(*args)
        except b.NVMLError as exc:
            if self._is(exc, _NA_ERRORS):
                return None
            if self._is(exc, _LOST_ERRORS):
                raise GpuLost(f"{exc} ({fn})") from exc
            key = (fn, int(exc.value))
            if key not in self._warned:
                self._warned.add(key)
                msg = f"NVML {fn} failed: {exc}; reporting it as unavailable"
                log.warning(msg)
                if self.on_event is not None:
                    self.on_event("error", msg)
            return None

    def call_found(self, fn: str, *args: Any) -> Any | None:
        """:meth:`call` for a function whose "nothing found" answer means an empty list
        (``NVML_ERROR_NOT_FOUND``: no per-process samples since the given time): [] then, None
        where the value does not exist here at all."""
        b = self._backend
        func = getattr(b, fn, None)
        if func is None:
            return None
        self.start()
        try:
            return func(*args)
        except b.NVMLError as exc:
            if self._is(exc, ("NVML_ERROR_NOT_FOUND",)):
                return []
        return self.call(fn, *args)  # any other error: as call() says it

    def shutdown(self) -> None:
        """Undo :meth:`start` (NVML counts inits; other users in the process are unaffected)."""
        with self._lock:
            if not self._started:
                return
            self._started = False
            b = self._backend
            try:
                b.nvmlShutdown()
            except b.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)


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


def _num(value: Any, scale: float = 1.0) -> float | None:
    return None if value is None else round(float(value) * scale, 3)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _field_value(b: Any, fv: Any) -> float | int | None:
    """The number in one ``nvmlFieldValue_t`` (by its ``valueType``), None on its error."""
    if int(getattr(fv, "nvmlReturn", 1)) != int(b.NVML_SUCCESS):
        return None
    u = fv.value
    kind = int(getattr(fv, "valueType", 3))
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
            6: "usVal"}.get(kind, "ullVal")
    value = getattr(u, attr, None)
    return None if value is None else value


def _handle_key(handle: Any) -> Any:
    """What identifies a device handle in event data: the pointer's address (pynvml gives a new
    ctypes object each time), or the handle itself (a replay's)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return None if value is None else str(value)


@dataclass
class _Gpu:
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


#: the facts of a GPU that do not change during a run (its entity's attributes)
#: (metric, field of a GPU instance of the payload) for each MIG GPU instance
_MIG_POINTS = (("gpu.mig_mem_used_mib", "mem_used_mib"),
               ("gpu.mig_mem_total_mib", "mem_total_mib"))


def _row_points(entity: str, row: dict[str, Any], fields: tuple[tuple[str, str], ...]
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
_PROC_POINTS = (("gpu.proc_mem_mib", "used_mib"), ("gpu.proc_sm_pct", "sm_pct"),
                ("gpu.proc_mem_util_pct", "mem_util_pct"))
_FIXED = ("name", "uuid", "pci_bus_id", "pcie_gen_max", "pcie_width_max", "mem_total_mib",
          "sm_clock_max_mhz")


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
        self._event_set: Any = None
        #: event-set key of each GPU's handle -> the GPU (for XID events)
        self._by_handle: dict[Any, _Gpu] = {}
        self._gpus: list[_Gpu] | None = None
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
        gpus: list[_Gpu] = []
        for index in range(count):
            try:
                handle = self.nvml.call("nvmlDeviceGetHandleByIndex", index)
                if handle is None:
                    raise GpuLost("NVML gives no handle for it")
                gpu = _Gpu(index, handle)
                self._read_fixed(gpu)
            except GpuLost as exc:
                self._mark_lost(index, None, exc.reason)
                continue
            gpus.append(gpu)
        self._gpus = gpus
        for gpu in gpus:
            self._start_gpm(gpu)
        self.read_slow(force=True)  # at open, so the first sample has them; later off sample()
        self._start_events()
        if self._background:
            self._stop.clear()
            self._spawn(self._slow_loop, "stallscope-gpu-slow")
            if self._event_set is not None:
                self._spawn(self._event_loop, "stallscope-gpu-xid")

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
                out[f"gpu{g.get('index', 0)}:{pid}"] = {**fixed, "pid": pid,
                                                        **self._owners.owner(pid).attrs()}
            for mig in g.get("mig") or ():
                out[f"gpu{g.get('index', 0)}/gi{mig['gpu_instance_id']}"] = {
                    **fixed, "mig_profile": mig.get("profile"), "mig_uuid": mig.get("uuid")}
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
                out.append(self._read(gpu))
            except GpuLost as exc:
                self._gpus.remove(gpu)
                self._free_gpm(gpu)
                self._mark_lost(gpu.index, gpu, exc.reason)
        return out

    def close(self) -> None:
        """Stop the helper threads, free GPM buffers and the event set, release NVML."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2 * EVENT_WAIT_MS / 1e3 + 1.0)
        self._threads = []
        if self._event_set is not None:
            try:
                self.nvml.call("nvmlEventSetFree", self._event_set)
            except GpuLost:
                pass
            self._event_set = None
        self._by_handle = {}
        for gpu in self._gpus or []:
            self._free_gpm(gpu)
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
    def _read_fixed(self, gpu: _Gpu) -> None:
        b, h, call = self.nvml.backend, gpu.handle, self.nvml.call
        gpu.name = _text(call("nvmlDeviceGetName", h))
        gpu.uuid = _text(call("nvmlDeviceGetUUID", h))
        pci = call("nvmlDeviceGetPciInfo", h)
        gpu.pci_bus_id = _text(getattr(pci, "busId", None)) or None
        gpu.sm_clock_max_mhz = _int(call("nvmlDeviceGetMaxClockInfo", h, b.NVML_CLOCK_SM))
        gpu.pcie_gen_max = _int(call("nvmlDeviceGetMaxPcieLinkGeneration", h))
        gpu.pcie_width_max = _int(call("nvmlDeviceGetMaxPcieLinkWidth", h))
        mode = call("nvmlDeviceGetEccMode", h)  # 0.16 ms; changing it needs a reset
        gpu.ecc_on = mode is not None and int(mode[0]) == int(b.NVML_FEATURE_ENABLED)
        gpu.migs = self._mig_instances(gpu)

    def _mig_instances(self, gpu: _Gpu) -> list[tuple[int, str | None, str | None, Any]] | None:
        """The GPU instances of a GPU in MIG mode (fixed until the mode or layout changes,
        which needs the GPU idle and a reset); None otherwise."""
        call = self.nvml.call
        mode = call("nvmlDeviceGetMigMode", gpu.handle)
        if mode is None or not int(mode[0]):
            return None
        out: dict[int, tuple[int, str | None, str | None, Any]] = {}
        for i in range(_int(call("nvmlDeviceGetMaxMigDeviceCount", gpu.handle)) or 0):
            mh = call("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, i)
            if mh is None:
                continue  # an empty slot
            gi = _int(call("nvmlDeviceGetGpuInstanceId", mh))
            if gi is None or gi in out:
                continue  # another compute instance of a GPU instance already listed
            out[gi] = (gi, mig_profile(_text(call("nvmlDeviceGetName", mh))),
                       _text(call("nvmlDeviceGetUUID", mh)), mh)
        return [out[gi] for gi in sorted(out)]

    def _read(self, gpu: _Gpu) -> GpuReading:
        b, h, call = self.nvml.backend, gpu.handle, self.nvml.call

        util = call("nvmlDeviceGetUtilizationRates", h)
        mem = self._memory(h)

        mask = call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if mask is None:  # drivers before 535 only have the old name
            mask = call("nvmlDeviceGetCurrentClocksThrottleReasons", h)

        ecc: int | None = None
        if gpu.ecc_on:
            ecc = _int(call("nvmlDeviceGetTotalEccErrors", h,
                            b.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, b.NVML_VOLATILE_ECC))

        gpm = self._gpm(gpu)
        slow = gpu.slow
        if gpu.pcie_gpm:
            rx, tx = gpm.get("pcie_rx_mib_s"), gpm.get("pcie_tx_mib_s")
            rx_kb = None if rx is None else round(rx * 1024)
            tx_kb = None if tx is None else round(tx * 1024)
            pcie_from: str | None = "gpm"
        else:
            rx_kb, tx_kb = slow.get("pcie_rx_kb_s"), slow.get("pcie_tx_kb_s")
            pcie_from = "throughput" if rx_kb is not None or tx_kb is not None else None
        rows = self._rows(gpu)
        xid_count = sum(gpu.xids.values()) if self._event_set is not None else None
        problem = [xid_count, rows[2], rows[3], slow.get("retired_pages_pending")]
        known = [v for v in problem if v is not None]
        return GpuReading(
            index=gpu.index,
            name=gpu.name,
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            util_pct=_num(getattr(util, "gpu", None)),
            mem_util_pct=_num(getattr(util, "memory", None)),
            mem_used_mib=None if mem is None else int(mem.used) // MIB,
            mem_total_mib=None if mem is None else int(mem.total) // MIB,
            temp_c=_num(call("nvmlDeviceGetTemperature", h, b.NVML_TEMPERATURE_GPU)),
            power_w=_num(call("nvmlDeviceGetPowerUsage", h), 1e-3),
            power_limit_w=_num(call("nvmlDeviceGetEnforcedPowerLimit", h), 1e-3),
            sm_clock_mhz=_int(call("nvmlDeviceGetClockInfo", h, b.NVML_CLOCK_SM)),
            sm_clock_max_mhz=gpu.sm_clock_max_mhz,
            throttle=None if mask is None else decode_throttle(int(mask)),
            throttle_mask=_int(mask),
            pcie_gen=_int(call("nvmlDeviceGetCurrPcieLinkGeneration", h)),
            pcie_gen_max=gpu.pcie_gen_max,
            pcie_width=_int(call("nvmlDeviceGetCurrPcieLinkWidth", h)),
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
            xid_errors=({str(k): v for k, v in sorted(gpu.xids.items())}
                        if xid_count is not None else None),
            health_problem=(1 if any(known) else 0) if known else None,
            pcie_from=pcie_from,
            processes=self._processes(gpu),
            mig=self._mig_readings(gpu),
        )

    def _mig_readings(self, gpu: _Gpu) -> list[MigInstance] | None:
        if gpu.migs is None:
            return None
        out = []
        for gi, profile, uuid, mh in gpu.migs:
            mem = self._memory(mh)
            out.append(MigInstance(gi, profile, uuid,
                                   None if mem is None else int(mem.used) // MIB,
                                   None if mem is None else int(mem.total) // MIB))
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

    def _mem_temp(self, gpu: _Gpu) -> float | None:
        """HBM temperature through a field value (0.005 ms on an H200); None without a sensor."""
        b = self.nvml.backend
        fid = getattr(b, "NVML_FI_DEV_MEMORY_TEMP", None)
        if fid is None:
            return None
        values = self.nvml.call("nvmlDeviceGetFieldValues", gpu.handle, [fid])
        value = _field_value(b, values[0]) if values else None
        # 0 °C is taken as "no sensor": a working GPU's memory is never that cold
        return None if not value else round(float(value), 3)

    def _rows(self, gpu: _Gpu) -> tuple[int | None, int | None, int | None, int | None]:
        """(correctable, uncorrectable, pending, failed) remapped rows (0.004 ms; Ampere+)."""
        if not gpu.rows_supported:
            return (None, None, None, None)
        rows = self.nvml.call("nvmlDeviceGetRemappedRows", gpu.handle)
        if rows is None:
            gpu.rows_supported = False  # asked once; retired pages then (helper thread)
            return (None, None, None, None)
        corr, unc, pending, failed = (int(x) for x in rows)
        return corr, unc, int(bool(pending)), int(bool(failed))

    # -- the helper thread: values too slow for every sample --------------------------------
    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _slow_loop(self) -> None:
        last_slow = self._clock()
        while not self._stop.wait(PCIE_FALLBACK_S):
            try:
                now = self._clock()
                slow = now - last_slow >= SLOW_READ_S
                if slow:
                    last_slow = now
                self.read_slow(force=slow)
            except Exception as exc:  # a bug here must never stop sampling: say it once
                self._say_once("slow", f"GPU helper thread: {type(exc).__name__}: {exc}")

    def read_slow(self, *, force: bool = True) -> None:
        """Read what is too slow for every sample: the PCIe fallback (GPUs without GPM) always;
        with ``force``, also the energy counter, PCIe replays and retired pages. Runs on the
        helper thread (and once at open)."""
        b = self.nvml.backend
        for gpu in list(self._gpus or []):
            try:
                new = dict(gpu.slow)
                if not gpu.pcie_gpm and not (gpu.pcie_gpm is None and gpu.gpm_samples):
                    call = self.nvml.call
                    new["pcie_rx_kb_s"] = _int(call("nvmlDeviceGetPcieThroughput", gpu.handle,
                                                    b.NVML_PCIE_UTIL_RX_BYTES))
                    new["pcie_tx_kb_s"] = _int(call("nvmlDeviceGetPcieThroughput", gpu.handle,
                                                    b.NVML_PCIE_UTIL_TX_BYTES))
                if force:
                    new.update(self._slow_values(gpu))
                if "proc_util" in new:  # processes were seen: keep their shares fresh
                    new["proc_util"] = self._process_util(gpu)
                gpu.slow = new
            except GpuLost:
                continue  # the next regular read reports the loss

    def _slow_values(self, gpu: _Gpu) -> dict[str, Any]:
        b, h, call = self.nvml.backend, gpu.handle, self.nvml.call
        energy = call("nvmlDeviceGetTotalEnergyConsumption", h)  # mJ since the driver loaded
        out: dict[str, Any] = {
            "energy_j": None if energy is None else round(int(energy) / 1e3, 3),
            "pcie_replays": _int(call("nvmlDeviceGetPcieReplayCounter", h)),
        }
        if not gpu.rows_supported:  # before Ampere: pages are retired instead
            pages = [call("nvmlDeviceGetRetiredPages", h, cause) for cause in (
                b.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                b.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)]
            known = [p for p in pages if p is not None]
            out["retired_pages"] = sum(len(p) for p in known) if known else None
            pending = call("nvmlDeviceGetRetiredPagesPendingStatus", h)
            out["retired_pages_pending"] = None if pending is None else int(bool(pending))
        return out

    # -- XID events -------------------------------------------------------------------------
    def _start_events(self) -> None:
        """Register every GPU that can report them for XID critical-error events."""
        b, call = self.nvml.backend, self.nvml.call
        xid = getattr(b, "nvmlEventTypeXidCriticalError", None)
        if xid is None or self._event_set is not None:
            return
        try:
            event_set = call("nvmlEventSetCreate")
        except GpuLost:
            event_set = None
        if event_set is None:
            return
        for gpu in self._gpus or []:
            try:
                types = call("nvmlDeviceGetSupportedEventTypes", gpu.handle)
                if types is None or not int(types) & int(xid):
                    continue
                # its success is None as "not supported" is for call(): ask the backend itself
                b.nvmlDeviceRegisterEvents(gpu.handle, xid, event_set)
            except (GpuLost, b.NVMLError) as exc:
                log.debug("GPU %s: no XID events (%s)", gpu.index, exc)
                continue
            self._by_handle[_handle_key(gpu.handle)] = gpu
        if self._by_handle:
            self._event_set = event_set
        else:
            call("nvmlEventSetFree", event_set)

    def _event_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.poll_events(EVENT_WAIT_MS):
                    continue
            except Exception as exc:  # never stop sampling: say it once, wait, go on
                self._say_once("xid", f"GPU XID events: {type(exc).__name__}: {exc}")
                self._stop.wait(1.0)

    def poll_events(self, timeout_ms: int = 0) -> bool:
        """Wait up to ``timeout_ms`` for one NVML event and count it; True if one came."""
        if self._event_set is None:
            return False
        b = self.nvml.backend
        try:
            data = b.nvmlEventSetWait(self._event_set, timeout_ms)
        except b.NVMLError as exc:
            if exc.value == getattr(b, "NVML_ERROR_TIMEOUT", 10):
                return False
            raise
        code = int(getattr(data, "eventData", 0))
        gpu = self._by_handle.get(_handle_key(getattr(data, "device", None)))
        if gpu is None or code in APP_XIDS:
            log.debug("XID %s on %s not counted", code, gpu.index if gpu else "?")
            return True
        gpu.xids = {**gpu.xids, code: gpu.xids.get(code, 0) + 1}
        gpu.xid_last = code
        meaning, todo = XID_MEANINGS.get(code, ("see NVIDIA's XID catalog", "drain the node "
                                                "if it repeats"))
        msg = f"GPU {gpu.index}: XID {code}: {meaning}; {todo}"
        log.warning(msg)
        self.emit("gpu_xid", msg)
        return True

    def _say_once(self, key: str, msg: str) -> None:
        if key in self._said:
            return
        self._said.add(key)
        log.warning(msg)
        self.emit("error", msg)

    def _processes(self, gpu: _Gpu) -> list[GpuProcess] | None:
        h = gpu.handle
        compute = self.nvml.call("nvmlDeviceGetComputeRunningProcesses", h)
        graphics = self.nvml.call("nvmlDeviceGetGraphicsRunningProcesses", h)
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
            gpu.slow = {**gpu.slow, "proc_util": self._process_util(gpu)}
        util = gpu.slow.get("proc_util") if by_pid else None
        return [GpuProcess(pid, by_pid[pid],
                           *(util.get(pid, (0.0, 0.0)) if util is not None else (None, None)))
                for pid in sorted(by_pid)]

    def _process_util(self, gpu: _Gpu) -> dict[int, tuple[float, float]] | None:
        """pid -> (sm %, memory %) from NVML's per-process samples since the previous read (the
        newest per pid); {} when NVML has none since then (every process idle); None where it
        keeps none at all (MIG, an older driver)."""
        samples = self.nvml.call_found("nvmlDeviceGetProcessUtilization", gpu.handle,
                                       gpu.proc_util_ts)
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

    # -- GPM (Hopper+) --------------------------------------------------------------------
    def _start_gpm(self, gpu: _Gpu) -> None:
        """Allocate two sample buffers and take the first sample, if the GPU supports GPM."""
        if not self._want_gpm:
            return
        call = self.nvml.call
        try:
            support = call("nvmlGpmQueryDeviceSupport", gpu.handle)
            if support is None or not int(getattr(support, "isSupportedDevice", 0)):
                return
            samples = [call("nvmlGpmSampleAlloc"), call("nvmlGpmSampleAlloc")]
            gpu.gpm_samples = [s for s in samples if s is not None]
            if len(gpu.gpm_samples) < 2:
                self._free_gpm(gpu)
                return
            if call("nvmlGpmSampleGet", gpu.handle, gpu.gpm_samples[0]) is None:
                self._free_gpm(gpu)
                return
            gpu.gpm_taken_at = self._clock()
        except GpuLost:
            self._free_gpm(gpu)  # the next regular read reports the loss

    def _gpm(self, gpu: _Gpu) -> dict[str, float | None]:
        """GPM metrics over the interval since the previous sample of this GPU, then keep the
        new sample as the next previous one. Empty where GPM is off or unsupported."""
        if len(gpu.gpm_samples) < 2 or gpu.gpm_taken_at is None:
            return {}
        now = self._clock()
        if now - gpu.gpm_taken_at < GPM_MIN_INTERVAL_S:
            return {}  # too soon for NVML to have new counters; keep the older sample
        b, call = self.nvml.backend, self.nvml.call
        previous, spare = gpu.gpm_samples
        if call("nvmlGpmSampleGet", gpu.handle, spare) is None:
            self._free_gpm(gpu)
            return {}
        gpu.gpm_samples = [spare, previous]
        gpu.gpm_taken_at = now
        metrics = _GPM_METRICS + (_GPM_PCIE if gpu.pcie_gpm is not False else ())
        request = b.c_nvmlGpmMetricsGet_t()
        request.version = b.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        request.sample1 = previous
        request.sample2 = spare
        for i, (_, metric) in enumerate(metrics):
            request.metrics[i].metricId = getattr(b, metric)
        if call("nvmlGpmMetricsGet", request) is None:
            return {}
        out: dict[str, float | None] = {}
        for i, (key, _) in enumerate(metrics):
            metric = request.metrics[i]
            ok = int(metric.nvmlReturn) == int(b.NVML_SUCCESS)
            out[key] = round(float(metric.value), 3) if ok else None
        if gpu.pcie_gpm is None:  # the first answer decides: GPM's PCIe rates, or the fallback
            gpu.pcie_gpm = all(out.get(k) is not None for k, _ in _GPM_PCIE)
        return out

    def _free_gpm(self, gpu: _Gpu) -> None:
        samples, gpu.gpm_samples, gpu.gpm_taken_at = gpu.gpm_samples, [], None
        gpu.pcie_gpm = False
        for sample in samples:
            try:
                self.nvml.call("nvmlGpmSampleFree", sample)
            except GpuLost:
                continue  # the buffer is host memory; a lost GPU does not matter here

    def _mark_lost(self, index: int, gpu: _Gpu | None, reason: str) -> None:
        if index in self.lost:
            return
        self.lost[index] = reason
        what = f"GPU {index}"
        if gpu is not None and (gpu.name or gpu.uuid):
            what += f" ({', '.join(x for x in (gpu.name, gpu.uuid) if x)})"
        msg = f"{what} is gone: {reason}; the other GPUs are still sampled"
        log.warning(msg)
        self.emit("gpu_lost", msg)
