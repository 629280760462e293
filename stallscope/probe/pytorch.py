"""The PyTorch adapter of the step probe: ``watch``, ``h2d``, ``step`` and CUDA-event timing.

Everything torch-specific lives here, on top of the framework-free
:class:`~stallscope.probe.recorder.Recorder`: reading a ``DataLoader``'s knobs and worker pids,
torch.distributed's rank, torch/CUDA versions, and the CUDA-event :class:`CudaTimer`. It never
imports torch: it only uses a torch the trainer already imported (``sys.modules``), so watching a
plain list works without torch installed and the probe never initializes CUDA itself.

The hot loop of :class:`Watched` is written for speed (see the package docstring for what is
measured): two ``perf_counter`` reads and one tuple appended to the recorder's buffer per step.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from stallscope.probe.recorder import (
    DEFAULT_CAPACITY,
    DEFAULT_FLUSH_S,
    DeviceTimer,
    EventLike,
    EventTimer,
    Recorder,
    StepTimer,
    _warn,
    current,
    env_rank,
    machine_config,
    obtain,
    probe_enabled,
)

__all__ = [
    "CudaTimer",
    "Probe",
    "Watched",
    "batch_size_of",
    "detect_rank",
    "get_probe",
    "h2d",
    "loader_config",
    "step",
    "watch",
]

T = TypeVar("T")


# --- what a batch holds --------------------------------------------------------------------------
def _no_size(_b: Any) -> int | None:
    return None


def _sizer(batch: Any) -> Callable[[Any], int | None]:
    """A function giving the sample count of batches shaped like ``batch`` (decided once per
    epoch: batches of one loader share a structure)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            return _no_size
        return lambda b: b.shape[0]  # torch.Size items are ints already
    if isinstance(batch, (list, tuple)):
        if batch and getattr(batch[0], "shape", None) is not None and len(batch[0].shape):
            return lambda b: b[0].shape[0]
        if batch and isinstance(batch[0], Mapping):
            inner = _sizer(batch[0])
            if inner is not _no_size:
                return lambda b: inner(b[0])
        return len
    if isinstance(batch, Mapping):
        for k, v in batch.items():
            s = getattr(v, "shape", None)
            if s is not None and len(s):
                return _key_sizer(k)
        return _no_size
    if hasattr(batch, "__len__") and not isinstance(batch, (str, bytes)):
        return len
    return _no_size


def _key_sizer(key: Any) -> Callable[[Any], int | None]:
    return lambda b: b[key].shape[0]


def batch_size_of(batch: Any) -> int | None:
    """Samples in ``batch``: dim 0 of its first tensor, else ``len(batch)``, else None."""
    try:
        return _sizer(batch)(batch)
    except (TypeError, IndexError, KeyError, AttributeError):
        return None


# --- loader configuration ------------------------------------------------------------------------
def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)


def loader_config(loader: Any) -> dict[str, Any]:
    """The DataLoader knobs that decide input throughput (brief D2), read off ``loader``.

    Works on any iterable: what it does not have is left out. ``dataset_len`` is None for
    unsized (iterable) datasets."""
    cfg: dict[str, Any] = {"loader_type": f"{type(loader).__module__}.{type(loader).__qualname__}"}
    for key in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                "batch_size", "drop_last", "timeout", "in_order"):
        if hasattr(loader, key):
            cfg[key] = _plain(getattr(loader, key))
    if cfg.get("batch_size") is None:
        bs = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if bs is not None:
            cfg["batch_size"] = _plain(bs)
    sampler = getattr(loader, "sampler", None)
    if sampler is not None:
        cfg["sampler_type"] = type(sampler).__name__
    ds = getattr(loader, "dataset", None)
    target = ds if ds is not None else loader
    if ds is not None:
        cfg["dataset_type"] = f"{type(ds).__module__}.{type(ds).__qualname__}"
    try:
        cfg["dataset_len" if ds is not None else "len"] = len(target)
    except TypeError:  # iterable-style dataset / generator: no length
        cfg["dataset_len" if ds is not None else "len"] = None
    except Exception as exc:  # a user __len__ that fails: keep the reason, the probe goes on
        cfg["dataset_len_error"] = f"{type(exc).__name__}: {exc}"
    if hasattr(loader, "num_workers"):
        ctx = getattr(loader, "multiprocessing_context", None)
        method: Any = None
        if ctx is not None:
            get = getattr(ctx, "get_start_method", None)
            method = get() if callable(get) else str(ctx)
        else:
            tmp = sys.modules.get("torch.multiprocessing")
            if tmp is not None:
                method = tmp.get_start_method(allow_none=True)
            if method is None:
                import multiprocessing

                method = multiprocessing.get_start_method(allow_none=True)
        cfg["start_method"] = _plain(method)
    return cfg


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
            _warn(f"cannot read the torch.distributed rank ({exc}); using $RANK")
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
            _warn(f"CUDA unusable ({exc}); GPU step timing is off")
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
        run_dir: str | os.PathLike[str] | None = None,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval: float = DEFAULT_FLUSH_S,
        collect_interval: float | None = None,
        events: Callable[[], EventLike] | None = None,
        register_atexit: bool = True,
    ) -> None:
        timer: DeviceTimer | None = (EventTimer(events, "CUDA") if events is not None
                                     else CudaTimer.detect())
        super().__init__(rank=detect_rank() if rank is None else rank, run_dir=run_dir,
                         capacity=capacity, flush_interval=flush_interval,
                         collect_interval=collect_interval, timer=timer,
                         register_atexit=register_atexit)

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
            cfg["cuda_version"] = _plain(getattr(getattr(torch, "version", None), "cuda", None))
        return cfg


# --- wrapping a loader ---------------------------------------------------------------------------
class Watched(Generic[T]):
    """An iterable that times every batch of ``loader`` (see the package docstring).

    Attributes it does not have (``sampler``, ``dataset``, ``batch_size``...) come from the
    wrapped loader, and ``len()`` is the loader's, so it can stand in for it."""

    def __init__(self, loader: Iterable[T], probe: Recorder | None) -> None:
        self.loader = loader
        self.probe = probe

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "probe"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[T]:
        p = self.probe
        if p is None or not p.active:
            yield from self.loader
            return
        perf = time.perf_counter
        t_req = perf()
        it = iter(self.loader)
        try:
            epoch = p.begin_epoch(self.loader, it, iter_s=perf() - t_req)
            gpu = p.gpu_ready()
            maybe_gpu = p._timer is not None and not gpu
        except Exception as exc:  # never stop the trainer: fall back to plain iteration
            _warn(f"probe disabled for this loader: {exc!r}")
            yield from it
            return
        buf = p._buf
        cap = p.capacity
        sizer: Callable[[Any], int | None] | None = None
        open_step = False
        cur = 0
        t_got = wait = 0.0
        n: int | None = None
        ev0: Any = None
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t_got = perf()
                cur = p._step = p._step + 1
                if maybe_gpu and p.gpu_ready():
                    gpu, maybe_gpu = True, False
                if gpu:
                    try:
                        ev0 = p._event()
                        ev0.record()
                    except Exception as exc:  # CUDA trouble is the trainer's to report
                        gpu = maybe_gpu = False
                        p._say("cuda", f"CUDA event record failed, GPU step timing off: {exc}")
                # (try blocks cost nothing in CPython 3.11+ until something raises)
                try:
                    if sizer is None:
                        sizer = _sizer(batch)
                    n = sizer(batch)
                except Exception:  # an odd batch: no sample count, never an error
                    n = None
                wait = t_got - t_req
                open_step = True
                yield batch
                t_req = perf()
                open_step = False
                h2d = p._h2d_s
                if h2d is not None:
                    p._h2d_s = None
                g: Any = None
                if gpu:
                    evl = p._h2d_ev
                    evs = None
                    if evl is not None:
                        p._h2d_ev = None
                        evs = tuple(evl)
                    try:
                        ev1 = p._event()
                        ev1.record()
                        g = (ev0, ev1, evs)
                    except Exception as exc:
                        gpu = maybe_gpu = False
                        p._say("cuda", f"CUDA event record failed, GPU step timing off: {exc}")
                if len(buf) < cap:
                    # a RawStep: a bare tuple in StepRecord's field order (cheapest to build)
                    buf.append((cur, t_got, wait, t_req - t_got, n, epoch, h2d, g))
                else:
                    p.dropped += 1
                if p._due:  # alerts for callbacks (stallscope.on_alert): run them between steps
                    p.run_due()
                    t_req = perf()
        finally:
            if open_step:  # the loop body broke out or raised: the step ends now
                t_end = perf()
                try:
                    h2d, h2d_evs = p._take_h2d()
                    g = None
                    if gpu:
                        ev1 = p._event()
                        ev1.record()
                        g = (ev0, ev1, h2d_evs)
                    p._push((cur, t_got, wait, t_end - t_got, n, epoch, h2d, g))
                except Exception as exc:
                    _warn(f"probe could not record the last step: {exc!r}")
            p._last_end = perf()
            p.epoch_done()


# --- module-level front --------------------------------------------------------------------------
def _make_probe(rank: int) -> Recorder:
    return Probe(rank=rank)


def get_probe(rank: int | None = None) -> Recorder | None:
    """The probe of this process (and rank), made on first use; None when turned off
    (``STALLSCOPE_PROBE=0``) or when it cannot start (the reason is printed once)."""
    if not probe_enabled():
        return None
    return obtain(detect_rank() if rank is None else int(rank), _make_probe)


def _default_probe() -> Recorder | None:
    p = current()
    return p if p is not None else get_probe()


def watch(loader: Iterable[T], *, rank: int | None = None) -> Watched[T]:
    """Wrap ``loader`` so every step is timed: ``for batch in stallscope.watch(loader): ...``.

    Each ``for`` over the wrapper is one epoch. ``rank`` defaults to torch.distributed's rank,
    else ``$RANK``, else 0. A ``tf.data.Dataset`` (iterated eagerly in a custom loop) gets
    the TensorFlow adapter's recorder (:mod:`stallscope.probe.keras`)."""
    if "tensorflow" in sys.modules:
        from stallscope.probe.keras import is_tf_dataset, watch_dataset

        if is_tf_dataset(loader):
            return watch_dataset(loader, rank=rank)
    return Watched(loader, get_probe(rank))


def step(samples: int | None = None, *, epoch: int | None = None,
         rank: int | None = None) -> StepTimer | _NullStep:
    """Time one step of a loop that does not iterate a loader::

        with stallscope.step(samples=len(x)):
            train_one_batch(x)

    The data wait of a step is the time since the previous step ended."""
    p = get_probe(rank) if rank is not None else _default_probe()
    if p is None:
        return _NULL_STEP
    return StepTimer(p, samples, epoch).start()


class _NullStep:
    def __enter__(self) -> _NullStep:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def stop(self) -> None:
        return None


_NULL_STEP = _NullStep()


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
    p = _default_probe()
    if p is None or not p.active:
        return _move(batch, device, non_blocking)
    if _is_cuda(device) and p.gpu_ready():
        try:
            a = p._event()
            a.record()
        except Exception as exc:
            p._say("cuda", f"CUDA event record failed: {exc}")
            return _move(batch, device, non_blocking)
        out = _move(batch, device, non_blocking)
        b = p._event()
        b.record()
        p.note_h2d_events(a, b)
        return out
    t0 = time.perf_counter()
    out = _move(batch, device, non_blocking)
    p.note_h2d(time.perf_counter() - t0)
    return out
