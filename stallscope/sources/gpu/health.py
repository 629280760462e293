"""A GPU's health: XID critical errors (NVML events, waited on by the source's XID thread),
remapped rows (Ampere+) and retired pages (before Ampere), and the words that say what needs a
person."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from stallscope.sources.gpu.nvml import GpuLost, Nvml, handle_key
from stallscope.sources.gpu.reading import GpuState

__all__ = [
    "APP_XIDS",
    "EVENT_WAIT_MS",
    "GROWING",
    "XID_MEANINGS",
    "XidEvents",
    "health_changes",
    "health_parts",
    "remapped_rows",
    "retired_pages",
]

log = logging.getLogger(__name__)

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
    48: (
        "double-bit ECC error in GPU memory",
        "drain the node and reset the GPU; replace it if it comes back",
    ),
    63: (
        "a row remap or page retirement was recorded after an ECC error",
        "reset the GPU when the jobs on it end, so the remap takes effect",
    ),
    64: (
        "a row remap or page retirement failed to be recorded",
        "drain the node and reset the GPU; replace it if this repeats",
    ),
    74: (
        "NVLink error",
        "drain the node and reset the GPUs; check the NVLink bridge or "
        "baseboard, and replace the GPU if it repeats",
    ),
    79: (
        "the GPU has fallen off the bus",
        "drain the node and reboot it; check power and the "
        "PCIe slot, and replace the GPU if it repeats",
    ),
    92: ("high single-bit ECC error rate", "watch it; replace the GPU if the rate keeps up"),
    94: (
        "contained ECC error (one application was stopped)",
        "reset the GPU when convenient, so the bad row is remapped",
    ),
    95: (
        "uncontained ECC error (every application on the GPU was stopped)",
        "drain the node and reset the GPU; replace it if it repeats",
    ),
    119: (
        "GSP RPC timeout (the GPU's system processor did not answer)",
        "drain the node and reset the GPU or reboot; update the driver if it repeats",
    ),
    120: (
        "GSP error",
        "drain the node and reset the GPU or reboot; update the driver if it repeats",
    ),
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
    parts.extend(h.get("grew") or ())  # "2 rows remapped after uncorrectable ECC errors"
    return parts


#: NVML utilization from which a GPU counts as loaded: an idle GPU's link drops to a low PCIe
#: generation to save power, which is no event
PCIE_LOAD_PCT = 30
#: counters whose growth during the run is a health event: (reading field, what grew)
GROWING = (
    ("remapped_rows_uncorrectable", "row{s} remapped after uncorrectable ECC errors"),
    ("remapped_rows_correctable", "row{s} remapped after correctable ECC errors"),
    ("ecc_errors", "new uncorrected ECC error{s}"),
    ("retired_pages", "page{s} retired for ECC errors"),
)
#: flags whose turning on is a health event: (reading field, what it means)
_FLAGS = (
    ("row_remap_pending", "a row remap waits for a GPU reset"),
    ("row_remap_failed", "a row remap failed: the GPU's memory can no longer hide bad rows"),
    ("retired_pages_pending", "a page retirement waits for a GPU reset"),
)


def health_changes(seen: dict[str, Any], r: Any) -> list[str]:
    """What changed in one GPU's health since its previous reading, in words, one event each
    (``GPU 3: 2 rows remapped after uncorrectable ECC errors (5 in all)``): counters that grew
    (remapped rows, uncorrected ECC errors, retired pages), flags that turned on (a remap
    pending or failed, a page retirement pending), and a PCIe link that trained below its
    maximum width, or its maximum generation under load. ``seen`` keeps what the previous
    reading said (the GPU's :attr:`GpuState.health_seen`, updated here); the first reading is
    the baseline, never an event."""
    first = not seen
    out: list[str] = []
    gpu = f"GPU {r.index}"
    for key, what in GROWING:
        now, before = getattr(r, key, None), seen.get(key)
        if now is None:
            continue
        if not first and before is not None and now > before:
            n = now - before
            out.append(f"{gpu}: {n} {what.format(s='' if n == 1 else 's')} ({now} in all)")
            seen["grew"] = True  # a health problem from now on (gpu.health_problem)
        seen[key] = now
    for key, what in _FLAGS:
        now = getattr(r, key, None)
        if now is None:
            continue
        if not first and now and not seen.get(key):
            out.append(f"{gpu}: {what}")
        seen[key] = now
    width, wmax = getattr(r, "pcie_width", None), getattr(r, "pcie_width_max", None)
    gen, gmax = getattr(r, "pcie_gen", None), getattr(r, "pcie_gen_max", None)
    loaded = (getattr(r, "util_pct", None) or 0) >= PCIE_LOAD_PCT
    if width is not None and wmax is not None:
        low = width < wmax
        if not first and low and not seen.get("pcie_width_low"):
            out.append(f"{gpu}: PCIe link trained at x{width} (its maximum x{wmax})")
        seen["pcie_width_low"] = low
    if gen is not None and gmax is not None and loaded:  # idle: a low generation saves power
        low = gen < gmax
        if not first and low and seen.get("pcie_gen_low") is False:
            out.append(f"{gpu}: PCIe link at Gen{gen} under load (its maximum Gen{gmax})")
        seen["pcie_gen_low"] = low
    seen["_read"] = True
    return out


def remapped_rows(
    nvml: Nvml, gpu: GpuState
) -> tuple[int | None, int | None, int | None, int | None]:
    """(correctable, uncorrectable, pending, failed) remapped rows (0.004 ms; Ampere+)."""
    if not gpu.rows_supported:
        return (None, None, None, None)
    rows = nvml.call("nvmlDeviceGetRemappedRows", gpu.handle)
    if rows is None:
        gpu.rows_supported = False  # asked once; retired pages then (helper thread)
        return (None, None, None, None)
    corr, unc, pending, failed = (int(x) for x in rows)
    return corr, unc, int(bool(pending)), int(bool(failed))


def retired_pages(nvml: Nvml, gpu: GpuState) -> dict[str, int | None]:
    """``retired_pages`` (single- and double-bit causes together) and ``retired_pages_pending``
    of a GPU before Ampere, where pages are retired instead of rows remapped (read on the
    helper thread)."""
    b, h, call = nvml.backend, gpu.handle, nvml.call
    pages = [
        call("nvmlDeviceGetRetiredPages", h, cause)
        for cause in (
            b.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            b.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
    ]
    known = [p for p in pages if p is not None]
    pending = call("nvmlDeviceGetRetiredPagesPendingStatus", h)
    return {
        "retired_pages": sum(len(p) for p in known) if known else None,
        "retired_pages_pending": None if pending is None else int(bool(pending)),
    }


class XidEvents:
    """XID critical-error events of the GPUs that report them, through one NVML event set: each
    XID (those of APP_XIDS left out) counted on its GPU's :class:`GpuState`, logged and told to
    ``emit`` as a ``gpu_xid`` event. :meth:`loop` is the source's XID thread."""

    def __init__(self, nvml: Nvml, emit: Callable[[str, str], None]) -> None:
        self.nvml = nvml
        self.emit = emit
        self.event_set: Any = None
        #: event-set key of each GPU's handle -> the GPU
        self._by_handle: dict[Any, GpuState] = {}

    @property
    def on(self) -> bool:
        """Some GPU reports XID events (its count is then a number, else None)."""
        return self.event_set is not None

    def start(self, gpus: list[GpuState]) -> None:
        """Register every GPU that can report them for XID critical-error events."""
        b, call = self.nvml.backend, self.nvml.call
        xid = getattr(b, "nvmlEventTypeXidCriticalError", None)
        if xid is None or self.event_set is not None:
            return
        try:
            event_set = call("nvmlEventSetCreate")
        except GpuLost:
            event_set = None
        if event_set is None:
            return
        for gpu in gpus:
            try:
                types = call("nvmlDeviceGetSupportedEventTypes", gpu.handle)
                if types is None or not int(types) & int(xid):
                    continue
                # its success is None as "not supported" is for call(): ask the backend itself
                b.nvmlDeviceRegisterEvents(gpu.handle, xid, event_set)
            except (GpuLost, b.NVMLError) as exc:
                log.debug("GPU %s: no XID events (%s)", gpu.index, exc)
                continue
            self._by_handle[handle_key(gpu.handle)] = gpu
        if self._by_handle:
            self.event_set = event_set
        else:
            call("nvmlEventSetFree", event_set)

    def loop(self, stop: threading.Event, say_once: Callable[[str, str], None]) -> None:
        """Wait for events until ``stop``; an error is said once (``say_once``), never ends it."""
        while not stop.is_set():
            try:
                if not self.poll(EVENT_WAIT_MS):
                    continue
            except Exception as exc:  # never stop sampling: say it once, wait, go on
                say_once("xid", f"GPU XID events: {type(exc).__name__}: {exc}")
                stop.wait(1.0)

    def poll(self, timeout_ms: int = 0) -> bool:
        """Wait up to ``timeout_ms`` for one NVML event and count it; True if one came."""
        if self.event_set is None:
            return False
        b = self.nvml.backend
        try:
            data = b.nvmlEventSetWait(self.event_set, timeout_ms)
        except b.NVMLError as exc:
            if exc.value == getattr(b, "NVML_ERROR_TIMEOUT", 10):
                return False
            raise
        code = int(getattr(data, "eventData", 0))
        gpu = self._by_handle.get(handle_key(getattr(data, "device", None)))
        if gpu is None or code in APP_XIDS:
            log.debug("XID %s on %s not counted", code, gpu.index if gpu else "?")
            return True
        gpu.xids = {**gpu.xids, code: gpu.xids.get(code, 0) + 1}
        gpu.xid_last = code
        meaning, todo = XID_MEANINGS.get(
            code, ("see NVIDIA's XID catalog", "drain the node if it repeats")
        )
        msg = f"GPU {gpu.index}: XID {code}: {meaning}; {todo}"
        seen = sum(gpu.xids.values())
        if seen > 1:  # each XID is an event of its own (the collector drops a repeated message)
            msg += f" (XID number {seen} on this GPU)"
        log.warning(msg)
        self.emit("gpu_xid", msg)
        return True

    def close(self) -> None:
        """Free the event set (after the XID thread stopped)."""
        if self.event_set is not None:
            try:
                self.nvml.call("nvmlEventSetFree", self.event_set)
            except GpuLost:
                pass
            self.event_set = None
        self._by_handle = {}
