"""The one entry point for NVML calls (:class:`Nvml`, the nvitop pattern) and what reads
NVML's answers: "not supported"/"N/A" become ``None``, a GPU that falls off the bus raises
:class:`GpuLost`, the clock event ("throttle") reason bits decoded."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

from stallscope.errors import SourceUnavailable

__all__ = [
    "MIB",
    "THROTTLE_REASONS",
    "GpuLost",
    "Nvml",
    "decode_throttle",
    "field_value",
    "handle_key",
    "num",
    "to_int",
    "to_text",
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


def num(value: Any, scale: float = 1.0) -> float | None:
    """An NVML number times ``scale``, to 3 decimals; None stays None."""
    return None if value is None else round(float(value) * scale, 3)


def to_int(value: Any) -> int | None:
    """An NVML number as an int; None stays None."""
    return None if value is None else int(value)


def field_value(b: Any, fv: Any) -> float | int | None:
    """The number in one ``nvmlFieldValue_t`` (by its ``valueType``), None on its error."""
    if int(getattr(fv, "nvmlReturn", 1)) != int(b.NVML_SUCCESS):
        return None
    u = fv.value
    kind = int(getattr(fv, "valueType", 3))
    attr = {
        0: "dVal",
        1: "uiVal",
        2: "ulVal",
        3: "ullVal",
        4: "sllVal",
        5: "siVal",
        6: "usVal",
    }.get(kind, "ullVal")
    value = getattr(u, attr, None)
    return None if value is None else value


def handle_key(handle: Any) -> Any:
    """What identifies a device handle in event data: the pointer's address (pynvml gives a new
    ctypes object each time), or the handle itself (a replay's)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def to_text(value: Any) -> str | None:
    """An NVML string (bytes in older nvidia-ml-py) as text; None stays None."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return None if value is None else str(value)
