"""The PyTorch adapter of the step probe: ``h2d``, CUDA-event timing and PyTorch's view.

Everything torch-specific lives here, on top of the framework-free core
(:mod:`stallscope.probe.recorder`, :mod:`stallscope.probe.watch`): a DataLoader iterator's worker
pids, torch.distributed's rank, torch/CUDA versions, the CUDA-event :class:`CudaTimer`, and
copies to the device (:func:`h2d`). It never imports torch: it only uses a torch the trainer
already imported (``sys.modules``), so watching a plain list works without torch installed and the
probe never initializes CUDA itself. It registers itself as the default adapter of
:func:`~stallscope.probe.watch.watch`: every loader no other adapter claims gets its recorder.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from stallscope.probe.device import DeviceTimer, EventLike, EventTimer
from stallscope.probe.loaders import loader_config, plain_value
from stallscope.probe.notices import warn
from stallscope.probe.recorder import (
    Recorder,
    env_rank,
    machine_config,
    obtain,
    probe_enabled,
)
from stallscope.probe.watch import Adapter, default_probe, register_adapter

__all__ = [
    "CudaTimer",
    "Probe",
    "detect_rank",
    "get_probe",
    "h2d",
]

T = TypeVar("T")


def _worker_pids(it: Any) -> list[int] | None:
    """Pids of a DataLoader iterator's worker processes (None when it has none)."""
    workers = getattr(it, "_workers", None)
    if not workers:
        return None
    return [int(w.pid) for w in workers if getattr(w, "pid", None) is not None]


# --- rank ----------------------------------------------------------------------------------------
def detect_rank() -> int:
    """torch.distributed's rank when it is initialized, else ``$RANK``, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except (RuntimeError, ValueError) as exc:
            warn(f"cannot read the torch.distributed rank ({exc}); using $RANK")
    return env_rank()


# --- CUDA events ---------------------------------------------------------------------------------
class CudaTimer:
    """The :class:`~stallscope.probe.recorder.DeviceTimer` of ``torch.cuda``: timing events
    (``record()`` enqueues a marker; nothing here ever synchronizes). Ready only once the trainer
    has initialized CUDA: the probe never initializes it."""

    name = "CUDA"

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda

    @classmethod
    def detect(cls) -> CudaTimer | None:
        """A timer when the trainer's torch has a usable CUDA, else None."""
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None) if torch is not None else None
        try:
            if cuda is not None and cuda.is_available():
                return cls(cuda)
        except RuntimeError as exc:
            warn(f"CUDA unusable ({exc}); GPU step timing is off")
        return None

    def ready(self) -> bool:
        return bool(self._cuda.is_initialized())

    def event(self) -> EventLike:
        ev: EventLike = self._cuda.Event(enable_timing=True)
        return ev


# --- the probe -----------------------------------------------------------------------------------
class Probe(Recorder):
    """The recorder with PyTorch's view: DataLoader configuration and worker pids, the
    torch.distributed rank, torch/CUDA versions, CUDA-event step timing when CUDA is in use.

    Normally made by :func:`get_probe` on first use; tests build one directly and may inject
    ``events`` (a factory of :class:`EventLike` objects) to exercise the CUDA path without a GPU.
    """

    def __init__(
        self,
        *,
        rank: int | None = None,
        events: Callable[[], EventLike] | None = None,
        **options: Any,
    ) -> None:
        """``options``: :class:`~stallscope.probe.recorder.Recorder`'s (``run_dir``,
        ``capacity``, ``flush_interval``, ``collect_interval``, ``register_atexit``,
        ``group_s``), declared there once; the timer is PyTorch's (CUDA events, or
        ``events``)."""
        timer: DeviceTimer | None = (
            EventTimer(events, "CUDA") if events is not None else CudaTimer.detect()
        )
        super().__init__(rank=detect_rank() if rank is None else rank, timer=timer, **options)

    def describe_loader(self, loader: Any) -> dict[str, Any] | None:
        return loader_config(loader)

    def worker_pids(self, it: Any) -> list[int] | None:
        return _worker_pids(it)

    def machine_config(self) -> dict[str, Any]:
        cfg = machine_config()
        torch = sys.modules.get("torch")
        if torch is not None:
            cfg["torch"] = str(getattr(torch, "__version__", None))
            cuda = getattr(torch, "cuda", None)
            cfg["cuda_available"] = bool(cuda is not None and cuda.is_available())
            cfg["cuda_version"] = plain_value(
                getattr(getattr(torch, "version", None), "cuda", None)
            )
        return cfg


# --- module-level front --------------------------------------------------------------------------
def _make_probe(rank: int) -> Recorder:
    return Probe(rank=rank)


def get_probe(rank: int | None = None) -> Recorder | None:
    """The probe of this process (and rank), made on first use; None when turned off
    (``STALLSCOPE_PROBE=0``) or when it cannot start (the reason is printed once)."""
    if not probe_enabled():
        return None
    return obtain(detect_rank() if rank is None else int(rank), _make_probe)


# --- host-to-device copies -----------------------------------------------------------------------
def _move(obj: Any, device: Any, non_blocking: bool) -> Any:
    if hasattr(obj, "to") and hasattr(obj, "shape"):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        moved = {k: _move(v, device, non_blocking) for k, v in obj.items()}
        try:
            return type(obj)(moved)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict
            return moved
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_move(v, device, non_blocking) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(v, device, non_blocking) for v in obj)
    return obj


def _is_cuda(device: Any) -> bool:
    t = getattr(device, "type", None)
    if t is None:
        t = str(device).split(":", 1)[0]
    return t == "cuda"


def h2d(batch: T, device: Any, non_blocking: bool = True) -> T:
    """Move the tensors in ``batch`` (nested lists, tuples, dicts) to ``device`` and record the
    copy time with the current step, like ``batch.to(device, non_blocking=True)``.

    To a CUDA device, the time comes from CUDA events around the copies (a ``non_blocking`` copy
    returns before it is done, so host clocks would say ~0); elsewhere from host clocks. For
    copies that overlap compute, pin the memory (``pin_memory=True``)."""
    p = default_probe()
    if p is None or not p.active:
        return _move(batch, device, non_blocking)
    if _is_cuda(device) and p.gpu_ready():
        dev = p.device
        try:
            a = dev.event()
            a.record()
        except Exception as exc:
            dev.record_failed(exc)
            return _move(batch, device, non_blocking)
        out = _move(batch, device, non_blocking)
        try:
            b = dev.event()
            b.record()
        except Exception as exc:  # the copy is done (queued): only its time is lost
            dev.release(a)
            dev.record_failed(exc)
            return out
        p.note_h2d_events(a, b)
        return out
    t0 = time.perf_counter()
    out = _move(batch, device, non_blocking)
    p.note_h2d(time.perf_counter() - t0)
    return out


register_adapter(Adapter("pytorch", None, get_probe))
