"""Replay and record NVML readings, so the gpu source can be tested without a GPU.

A *replay document* (JSON, ``format: stallscope-nvml-replay/1``) holds, per GPU, what each
NVML function the gpu source calls returned -- or the NVML error it raised::

    {"format": "stallscope-nvml-replay/1",
     "provenance": {"kind": "derived-from-nvidia-smi" | "recorded-nvml", ...},
     "system": {"nvmlDeviceGetCount": 1, "nvmlSystemGetDriverVersion": "590.48.01"},
     "devices": [{
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",             # plain return value
        "nvmlDeviceGetUtilizationRates": {"gpu": 100, "memory": 10},  # struct -> attributes
        "nvmlDeviceGetClockInfo": {"NVML_CLOCK_SM": 1980},        # per argument (see ARG_PREFIXES)
        "nvmlDeviceGetEccMode": {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"},  # NVML error
        "nvmlGpmMetricsGet": [{"NVML_GPM_METRIC_SM_UTIL": 97.5}, ...],  # one per call
        "nvmlDeviceGetFieldValues": {"NVML_FI_DEV_MEMORY_TEMP": 36},  # by field id name
        "costs_ms": {"nvmlDeviceGetPcieThroughput": 20.95, ...},  # median wall ms per call
        ...}],
     "xid_events": [{"gpu": 0, "xid": 79}]}  # optional: events the first waits deliver

Recorded documents carry each call's median cost (``costs_ms``); :attr:`NvmlReplay.spent_ms`
adds up the recorded cost of the calls each thread made, so a test without a GPU can tell how
long a reading would take on the GPU that was recorded, and fail when a blocking call comes back.

:class:`NvmlReplay` answers the same function names as ``pynvml`` (so the gpu source runs its
one real code path against it), raising ``pynvml.NVMLError`` with the recorded code;
:class:`NvmlRecorder` wraps the real ``pynvml`` module and writes such a document from whatever
the gpu source calls (``tests/fixtures/record_nvml.py``). Everything that is not an ``nvml*``
function (constants, ctypes structs, ``NVMLError``) is passed through from ``pynvml``.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

__all__ = [
    "ARG_PREFIXES",
    "FORMAT",
    "NvmlRecorder",
    "NvmlReplay",
    "ReplayHandle",
    "ReplayMissing",
    "arg_key",
    "error_code",
    "error_name",
]

FORMAT = "stallscope-nvml-replay/1"

#: For NVML functions that take arguments after the device handle: the pynvml constant-name
#: prefixes of each argument, so a call is stored under a readable key such as
#: ``"NVML_MEMORY_ERROR_TYPE_UNCORRECTED,NVML_VOLATILE_ECC"``.
ARG_PREFIXES: dict[str, tuple[tuple[str, ...], ...]] = {
    "nvmlDeviceGetClockInfo": (("NVML_CLOCK_",),),
    "nvmlDeviceGetMaxClockInfo": (("NVML_CLOCK_",),),
    "nvmlDeviceGetTemperature": (("NVML_TEMPERATURE_",),),
    "nvmlDeviceGetPcieThroughput": (("NVML_PCIE_UTIL_",),),
    "nvmlDeviceGetTotalEccErrors": (
        ("NVML_MEMORY_ERROR_TYPE_",),
        ("NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"),
    ),
    "nvmlDeviceGetMemoryInfo": (("nvmlMemory_v",),),
    "nvmlDeviceGetRetiredPages": (("NVML_PAGE_RETIREMENT_CAUSE_",),),
}

#: calls whose wall time is a wait by design, never a cost (recorded without one)
_WAITS = frozenset({"nvmlEventSetWait", "nvmlEventSetWait_v2"})
_FIELD_TYPES = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

_ERROR = "nvml_error"


class ReplayMissing(LookupError):
    """The replay document has no answer for a call: the fixture is incomplete (a test bug,
    never turned into "not supported")."""


@dataclass(frozen=True)
class ReplayHandle:
    """The device handle :class:`NvmlReplay` gives out (pynvml gives a ctypes pointer); with
    ``mig``, the handle of MIG device ``mig`` of GPU ``index`` (its answers are the GPU's
    ``"mig_devices"[mig]`` in the document)."""

    index: int
    mig: int | None = None


def error_name(code: int) -> str:
    """``3`` -> ``"NVML_ERROR_NOT_SUPPORTED"`` (``"NVML_ERROR_<code>"`` if unknown)."""
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return name
    return f"NVML_ERROR_{code}"


def error_code(name: str) -> int:
    """``"NVML_ERROR_NOT_SUPPORTED"`` -> ``3``."""
    value = getattr(pynvml, name, None)
    if not isinstance(value, int):
        raise ValueError(f"unknown NVML error name {name!r}")
    return value


def _const_name(value: Any, prefixes: tuple[str, ...]) -> str:
    """The pynvml constant with this value among ``prefixes``; the shortest name wins where
    several share it (``NVML_CLOCK_SM`` over ``NVML_CLOCK_ID_APP_CLOCK_TARGET``)."""
    if isinstance(value, int) and prefixes:
        names = [
            name
            for name in dir(pynvml)
            if name.startswith(prefixes)
            and not name.endswith("_COUNT")
            and getattr(pynvml, name) == value
        ]
        if names:
            return min(names, key=lambda n: (len(n), n))
    return str(value)


def arg_key(fn: str, args: tuple[Any, ...]) -> str | None:
    """The key a call's extra arguments are stored under, or None for a function stored as a
    plain value (no arguments after the handle)."""
    prefixes = ARG_PREFIXES.get(fn)
    if prefixes is None:
        return None
    return ",".join(
        _const_name(a, prefixes[i] if i < len(prefixes) else ()) for i, a in enumerate(args)
    )


def _address(sample: Any) -> int:
    """A GPM sample buffer's address: the identity NVML itself uses (it survives being copied
    into ``nvmlGpmMetricsGet_t.sample1``)."""
    return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)


def _to_python(value: Any) -> Any:
    """Turn a JSON value into what pynvml returns: dicts become attribute objects."""
    if isinstance(value, dict):
        return types.SimpleNamespace(**{k: _to_python(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_to_python(v) for v in value]
    return value


def _to_json(value: Any) -> Any:
    """Turn what pynvml returned into JSON: ctypes structs become dicts of their fields."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        out: dict[str, Any] = {}
        for field in fields:
            name = field[0]
            item = getattr(value, name)
            if isinstance(item, (ctypes.Array, ctypes._Pointer)):
                continue
            out[name] = _to_json(item)
        return out
    if hasattr(value, "__dict__"):  # pynvml's nvmlFriendlyObject, SimpleNamespace
        return {k: _to_json(v) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def _fields_json(values: Any) -> dict[str, Any]:
    """``nvmlDeviceGetFieldValues``' answers by field name: the number, or the NVML error."""
    out: dict[str, Any] = {}
    for fv in values:
        name = _const_name(int(fv.fieldId), ("NVML_FI_DEV_",))
        if int(fv.nvmlReturn) != pynvml.NVML_SUCCESS:
            out[name] = {_ERROR: error_name(int(fv.nvmlReturn))}
        else:
            out[name] = getattr(fv.value, _FIELD_TYPES.get(int(fv.valueType), "ullVal"))
    return out


class NvmlReplay:
    """A stand-in for the ``pynvml`` module that answers from a replay document.

    Tests can make a GPU fail from now on with :meth:`fail`; :attr:`calls` lists every
    function called, in order.
    """

    def __init__(self, doc: Mapping[str, Any], *, init_error: int | None = None) -> None:
        if doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document (format={doc.get('format')!r})")
        self.doc = doc
        self.devices: list[dict[str, Any]] = [dict(d) for d in doc["devices"]]
        self.calls: list[str] = []
        self.init_error = init_error
        self.initialized = 0
        self._failures: dict[int, tuple[int, frozenset[str] | None]] = {}
        self._samples: dict[int, tuple[int, int]] = {}  # address -> (gpu index, sequence)
        self._next_sample = 0x1000
        self._sequence = 0
        self._gpm_gets: dict[int, int] = {}
        self.live_samples: set[int] = set()
        #: (GPU, older sample's sequence number, newer one's) per nvmlGpmMetricsGet call
        self.gpm_pairs: list[tuple[int, int, int]] = []
        #: recorded milliseconds of the calls made, per thread (threading.get_ident())
        self.spent_ms: dict[int, float] = {}
        self._events: list[tuple[int, int]] = [
            (int(e["gpu"]), int(e["xid"])) for e in doc.get("xid_events", ())
        ]
        self._event_cond = threading.Condition()
        self._event_sets = 0

    # -- building -------------------------------------------------------------------------
    @classmethod
    def load(cls, *paths: str | Path) -> NvmlReplay:
        """Replay one document, or several as one machine (their GPUs in the given order)."""
        docs = [json.loads(Path(p).read_text()) for p in paths]
        if len(docs) == 1:
            return cls(docs[0])
        merged: dict[str, Any] = {
            "format": FORMAT,
            "provenance": {"kind": "merged", "parts": [d.get("provenance") for d in docs]},
            "system": dict(docs[0].get("system", {})),
            "devices": [dev for d in docs for dev in d["devices"]],
        }
        merged["system"]["nvmlDeviceGetCount"] = len(merged["devices"])
        return cls(merged)

    def xid(self, index: int, code: int) -> None:
        """Deliver an XID critical-error event of GPU ``index`` to the next wait."""
        with self._event_cond:
            self._events.append((index, code))
            self._event_cond.notify_all()

    def spent(self) -> float:
        """Recorded milliseconds of this thread's calls so far."""
        return self.spent_ms.get(threading.get_ident(), 0.0)

    def fail(self, index: int, code: int, functions: set[str] | None = None) -> None:
        """From now on, calls on GPU ``index`` (all, or only ``functions``) raise ``code``."""
        self._failures[index] = (code, frozenset(functions) if functions else None)

    # -- pynvml surface -------------------------------------------------------------------
    NVMLError = pynvml.NVMLError

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)  # AttributeError for names pynvml does not have either
        if name.startswith("nvml") and callable(real) and not isinstance(real, type):
            return lambda *args: self._device_call(name, args)
        return real

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        if self.initialized <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check_init("nvmlDeviceGetCount")
        return int(self.doc.get("system", {}).get("nvmlDeviceGetCount", len(self.devices)))

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init("nvmlSystemGetDriverVersion")
        return str(self.doc.get("system", {}).get("nvmlSystemGetDriverVersion", ""))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ReplayHandle:
        self._check_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._raise_failure(index, "nvmlDeviceGetHandleByIndex")
        return ReplayHandle(index)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: ReplayHandle, index: int) -> ReplayHandle:
        """MIG device ``index`` of a GPU in MIG mode: the document's ``mig_devices`` (NVML
        answers NOT_FOUND for an empty slot, as for one past the instances that exist)."""
        self._check_init("nvmlDeviceGetMigDeviceHandleByIndex")
        self._raise_failure(handle.index, "nvmlDeviceGetMigDeviceHandleByIndex")
        migs = self.devices[handle.index].get("mig_devices")
        if migs is None:
            raise ReplayMissing(f"GPU {handle.index}: the replay has no mig_devices")
        if not 0 <= index < len(migs) or migs[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ReplayHandle(handle.index, index)

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check_init("nvmlGpmSampleAlloc")
        address = self._next_sample
        self._next_sample += 0x10
        self.live_samples.add(address)
        # an opaque pointer with a unique address, never dereferenced
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._check_init("nvmlGpmSampleFree")
        address = _address(sample)
        if address not in self.live_samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.live_samples.discard(address)

    def nvmlGpmSampleGet(self, handle: ReplayHandle, sample: Any) -> Any:
        self._answer("nvmlGpmSampleGet", handle, ())  # raises if the document says so
        if not self._gpm_supported(handle.index):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        address = _address(sample)
        if address not in self.live_samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._sequence += 1
        self._samples[address] = (handle.index, self._sequence)
        return sample

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        self._check_init("nvmlGpmMetricsGet")
        first = self._samples.get(_address(metrics_get.sample1))
        second = self._samples.get(_address(metrics_get.sample2))
        if (
            metrics_get.version != pynvml.NVML_GPM_METRICS_GET_VERSION
            or first is None
            or second is None
            or first[0] != second[0]
            or first[1] >= second[1]
        ):
            # NVML wants two filled samples of one GPU, older first
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        index = first[0]
        self._spend("nvmlGpmMetricsGet", index)
        self._raise_failure(index, "nvmlGpmMetricsGet")
        self.gpm_pairs.append((index, first[1], second[1]))
        readings = self.devices[index].get("nvmlGpmMetricsGet")
        if not readings:
            raise ReplayMissing(f"GPU {index}: no nvmlGpmMetricsGet readings in the replay")
        n = self._gpm_gets.get(index, 0)
        self._gpm_gets[index] = n + 1
        reading = readings[min(n, len(readings) - 1)]
        for i in range(metrics_get.numMetrics):
            metric = metrics_get.metrics[i]
            value = reading.get(_const_name(metric.metricId, ("NVML_GPM_METRIC_",)))
            if value is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif isinstance(value, dict):
                metric.nvmlReturn = error_code(value[_ERROR])
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = float(value)
        return metrics_get

    def nvmlEventSetCreate(self) -> Any:
        self._check_init("nvmlEventSetCreate")
        self._event_sets += 1
        return types.SimpleNamespace(event_set=self._event_sets)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._check_init("nvmlEventSetFree")

    def nvmlDeviceRegisterEvents(
        self, handle: ReplayHandle, event_types: int, event_set: Any
    ) -> None:
        """Succeeds where the document's supported event types include them."""
        supported = self._answer("nvmlDeviceGetSupportedEventTypes", handle, ())
        if not int(supported) & int(event_types):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        """The next XID queued (the document's ``xid_events``, then :meth:`xid`), else NVML's
        timeout once ``timeout_ms`` passed."""
        self._check_init("nvmlEventSetWait")
        with self._event_cond:
            if not self._events:
                self._event_cond.wait(timeout_ms / 1e3)
            if not self._events:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            index, code = self._events.pop(0)
        return types.SimpleNamespace(
            device=ReplayHandle(index),
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=code,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )

    nvmlEventSetWait_v2 = nvmlEventSetWait

    def nvmlDeviceGetFieldValues(self, handle: ReplayHandle, field_ids: list[Any]) -> Any:
        """One ``nvmlFieldValue_t``-shaped answer per field id, from the document's
        ``nvmlDeviceGetFieldValues`` (by field name; a missing one is not supported)."""
        answers = self._answer("nvmlDeviceGetFieldValues", handle, ())
        out = []
        for fid in field_ids:
            fid = fid[0] if isinstance(fid, tuple) else fid
            value = getattr(answers, _const_name(fid, ("NVML_FI_DEV_",)), None)
            if value is None or isinstance(value, types.SimpleNamespace):
                code = (
                    error_code(getattr(value, _ERROR))
                    if value is not None
                    else pynvml.NVML_ERROR_NOT_SUPPORTED
                )
                out.append(
                    types.SimpleNamespace(
                        fieldId=fid,
                        scopeId=0,
                        nvmlReturn=code,
                        valueType=3,
                        value=types.SimpleNamespace(),
                    )
                )
                continue
            kind = 0 if isinstance(value, float) else 3
            union = types.SimpleNamespace(**{a: value for a in _FIELD_TYPES.values()})
            out.append(
                types.SimpleNamespace(
                    fieldId=fid, scopeId=0, nvmlReturn=0, valueType=kind, value=union
                )
            )
        return out

    # -- internals ------------------------------------------------------------------------
    def _spend(self, name: str, index: int | None) -> None:
        costs = (self.devices[index] if index is not None else self.doc).get("costs_ms")
        if costs and name in costs:
            tid = threading.get_ident()
            self.spent_ms[tid] = self.spent_ms.get(tid, 0.0) + float(costs[name])

    def _check_init(self, name: str) -> None:
        self.calls.append(name)
        if self.initialized <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _raise_failure(self, index: int, name: str) -> None:
        failure = self._failures.get(index)
        if failure is not None and (failure[1] is None or name in failure[1]):
            raise pynvml.NVMLError(failure[0])

    def _gpm_supported(self, index: int) -> bool:
        support = self.devices[index].get("nvmlGpmQueryDeviceSupport")
        return isinstance(support, dict) and bool(support.get("isSupportedDevice"))

    def _device_call(self, name: str, args: tuple[Any, ...]) -> Any:
        if not args or not isinstance(args[0], ReplayHandle):
            raise ReplayMissing(f"{name}{args!r}: only per-device calls are replayed")
        return self._answer(name, args[0], args[1:])

    def _answer(self, name: str, handle: ReplayHandle, args: tuple[Any, ...]) -> Any:
        self._check_init(name)
        self._spend(name, handle.index)
        self._raise_failure(handle.index, name)
        device = self.devices[handle.index]
        if handle.mig is not None:
            device = device["mig_devices"][handle.mig]
        if name not in device:
            if name == "nvmlGpmSampleGet":
                return None  # not recorded: whether it works follows nvmlGpmQueryDeviceSupport
            raise ReplayMissing(f"GPU {handle.index}: the replay has no answer for {name}")
        value = device[name]
        key = arg_key(name, args)
        if key is not None and not (isinstance(value, dict) and _ERROR in value):
            if key not in value:
                raise ReplayMissing(f"GPU {handle.index}: the replay has no {name}({key})")
            value = value[key]
        if isinstance(value, dict) and _ERROR in value:
            raise pynvml.NVMLError(error_code(value[_ERROR]))
        return _to_python(value)


class NvmlRecorder:
    """Wraps the real ``pynvml`` module; every ``nvml*`` call the gpu source makes goes through
    and its answer (or NVML error) is written into :meth:`document`."""

    NVMLError = pynvml.NVMLError

    def __init__(self, real: Any = pynvml) -> None:
        self._real = real
        self.system: dict[str, Any] = {}
        self.devices: dict[int, dict[str, Any]] = {}
        self._handles: list[tuple[Any, int]] = []
        self._migs: list[tuple[Any, int, int]] = []  #: (MIG device handle, GPU, MIG index)
        self._samples: dict[int, int] = {}  # address -> gpu index
        #: (GPU index or None for system calls, function) -> wall milliseconds of each call
        self.costs: dict[tuple[int | None, str], list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._real, name)
        if not (name.startswith("nvml") and callable(real) and not isinstance(real, type)):
            return real
        return self._wrap(name, real)

    def document(self, provenance: Mapping[str, Any]) -> dict[str, Any]:
        """The replay document of everything recorded so far."""
        count = self.system.get("nvmlDeviceGetCount", len(self.devices))
        devices = [dict(self.devices.get(i, {})) for i in range(int(count))]
        for (index, name), times in sorted(self.costs.items(), key=lambda kv: str(kv[0])):
            if index is not None and 0 <= index < len(devices):
                devices[index].setdefault("costs_ms", {})[name] = round(statistics.median(times), 4)
        return {
            "format": FORMAT,
            "provenance": dict(provenance),
            "system": dict(self.system),
            "devices": devices,
        }

    def _index(self, handle: Any) -> int | None:
        for known, index in self._handles:
            if known is handle:
                return index
        return None

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                result = real(*args)
            except pynvml.NVMLError as exc:
                self._cost(name, args, t0)
                self._store(name, args, {_ERROR: error_name(exc.value)})
                raise
            self._cost(name, args, t0)
            if name == "nvmlDeviceGetHandleByIndex":
                self._handles.append((result, int(args[0])))
                self.devices.setdefault(int(args[0]), {})
            elif name == "nvmlDeviceGetMigDeviceHandleByIndex":
                index = self._index(args[0])
                if index is not None:  # its answers go to the GPU's mig_devices[i]
                    self._migs.append((result, index, int(args[1])))
                    self._mig_slot(index, int(args[1]))
            elif name == "nvmlGpmSampleGet":
                index = self._index(args[0])
                if index is not None:
                    self._samples[_address(args[1])] = index
            elif name == "nvmlGpmMetricsGet":
                self._store_gpm(result)
            elif name == "nvmlDeviceGetFieldValues":
                index = self._index(args[0])
                if index is not None:  # merged: each call may ask for other fields
                    self.devices.setdefault(index, {}).setdefault(name, {}).update(
                        _fields_json(result)
                    )
            elif name not in ("nvmlGpmSampleAlloc", "nvmlGpmSampleFree"):
                self._store(name, args, _to_json(result))
            return result

        return call

    def _cost(self, name: str, args: tuple[Any, ...], t0: float) -> None:
        if name in _WAITS:
            return
        ms = (time.perf_counter() - t0) * 1e3
        index = self._index(args[0]) if args else None
        if name == "nvmlGpmMetricsGet":
            index = self._samples.get(_address(args[0].sample2))
        self.costs.setdefault((index, name), []).append(ms)

    def _mig_slot(self, index: int, mig: int) -> dict[str, Any]:
        migs = self.devices.setdefault(index, {}).setdefault("mig_devices", [])
        while len(migs) <= mig:
            migs.append(None)
        if migs[mig] is None:
            migs[mig] = {}
        slot: dict[str, Any] = migs[mig]
        return slot

    def _store(self, name: str, args: tuple[Any, ...], value: Any) -> None:
        if name == "nvmlDeviceGetMigDeviceHandleByIndex":
            index = self._index(args[0]) if args else None
            if index is not None:  # an empty slot: its None stays (the replay says NOT_FOUND)
                self.devices.setdefault(index, {}).setdefault("mig_devices", [])
            return
        for handle, index, mig in self._migs:
            if args and args[0] is handle:
                self._store_in(self._mig_slot(index, mig), name, args, value)
                return
        index = self._index(args[0]) if args else None
        if index is None:
            if name not in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetHandleByIndex"):
                self.system[name] = value
            return
        device = self.devices.setdefault(index, {})
        if name in ("nvmlGpmSampleGet", "nvmlGpmMetricsGet"):
            device[name] = value
            return
        self._store_in(device, name, args, value)

    @staticmethod
    def _store_in(device: dict[str, Any], name: str, args: tuple[Any, ...], value: Any) -> None:
        """One answer filed under the device's function, by argument where it takes any."""
        key = arg_key(name, args[1:])
        if key is None or (isinstance(value, dict) and _ERROR in value and not args[1:]):
            device[name] = value
        else:
            slot = device.setdefault(name, {})
            if _ERROR in slot:  # an earlier whole-function error; keep per-argument answers
                slot.clear()
            slot[key] = value

    def _store_gpm(self, metrics_get: Any) -> None:
        index = self._samples.get(_address(metrics_get.sample2))
        if index is None:
            return
        reading: dict[str, Any] = {}
        for i in range(metrics_get.numMetrics):
            metric = metrics_get.metrics[i]
            name = _const_name(metric.metricId, ("NVML_GPM_METRIC_",))
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                reading[name] = float(metric.value)
            else:
                reading[name] = {_ERROR: error_name(metric.nvmlReturn)}
        self.devices.setdefault(index, {}).setdefault("nvmlGpmMetricsGet", []).append(reading)
