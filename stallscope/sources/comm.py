"""How long each step waited in collective communication, with no code in the trainer.

Under DistributedDataParallel every rank's step ends in the gradient all-reduce, which finishes
only when the slowest rank has handed in its gradients: the fast ranks' GPUs (or CPUs) sit in
the collective, and their step time looks like compute. This module measures that wait per step
so the diagnosis can split a step into data wait + compute + communication wait:

* **DDP's gradient all-reduce.** On a DDP model's first forward pass the probe registers a
  communication hook that does what DDP does without one (``allreduce_hook``: divide by the
  world size, all-reduce the bucket) and notes when each bucket was handed in and when its
  all-reduce finished. A hook the trainer registers itself is wrapped the same way instead, so
  its compression (fp16, PowerSGD...) is kept. The step's communication wait is the time from
  the last bucket handed in (the end of the backward pass's own work) to the last all-reduce
  done: the time the backward pass blocked for its peers and the network.
  The wait is closed when ``torch.autograd.backward`` (``loss.backward()``) returns.
* **Blocking ``torch.distributed`` calls** (``all_reduce``, ``broadcast``, ``barrier``, ...,
  called with ``async_op=False``): their whole duration.

Nothing is patched until the trainer has a torch.distributed process group
(:func:`install_if_distributed`: the probe checks at each epoch's and step's start, before the
first forward pass; a training that is not distributed is left exactly as it is). Both add to
one :class:`CommClock` per process that the probe takes at each step's end
(:meth:`CommClock.take`); without a probe, the in-process stack sampler of ``stallscope run``
makes the same check at each sample and moves the measured seconds from the stacks'
``compute`` (the backward's C++ frames, where the wait happens) to ``comm``
(:mod:`stallscope.sources.stacks.inproc`).
A step costs one attribute read while nothing is timed.
``STALLSCOPE_COMM=0`` in the trainer's environment turns all of this off.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from stallscope.errors import warn

__all__ = ["CLOCK", "COLLECTIVES", "CommClock", "install", "install_if_distributed"]


#: the blocking collectives of ``torch.distributed`` that are timed (those present)
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
)


class CommClock:
    """The communication wait of this process (see the module docstring): per step for the
    probe (:meth:`take`), and in all (``total_s``) for the in-process stack sampler, which has no
    steps. ``used`` turns true once anything was timed, so steps before (or without)
    collectives pay nothing."""

    __slots__ = (
        "_called",
        "_done",
        "_lock",
        "_step_s",
        "_stepped",
        "blocked_s",
        "depth",
        "total_s",
        "used",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.used = False
        self.blocked_s = 0.0  #: blocking torch.distributed calls since the last take
        self.depth = 0  #: nesting of timed calls (a collective calling another is timed once)
        self._called: float | None = None  #: latest bucket handed to the all-reduce
        self._done: float | None = None  #: latest bucket all-reduce finished (another thread)
        self._step_s = 0.0  #: backward passes' waits finished since the last take
        self._stepped = False  #: a backward with buckets finished since the last take
        self.total_s = 0.0  #: every wait so far (DDP's and blocking calls')

    def bucket_called(self, t: float) -> None:
        with self._lock:
            self.used = True
            if self._called is None or t > self._called:
                self._called = t

    def bucket_done(self, t: float) -> None:
        with self._lock:
            if self._done is None or t > self._done:
                self._done = t

    def add_blocked(self, seconds: float) -> None:
        with self._lock:
            self.used = True
            self.blocked_s += seconds
            self.total_s += seconds

    def finish_backward(self) -> None:
        """A backward pass returned: its buckets are all reduced; its wait is the time from
        the last bucket handed in to the last all-reduce done."""
        with self._lock:
            self._finish()

    def _finish(self) -> None:
        called, done = self._called, self._done
        if called is None:
            return
        self._called = self._done = None
        wait = done - called if done is not None and done > called else 0.0
        self._step_s += wait
        self.total_s += wait
        self._stepped = True

    def take(self) -> float | None:
        """The step's communication wait in seconds (and start the next step's); None when the
        step had no collective."""
        with self._lock:
            self._finish()  # a backward not seen returning (torch.autograd.grad, compiled)
            if not self._stepped and not self.blocked_s:
                return None
            wait = self._step_s + self.blocked_s
            self._step_s = self.blocked_s = 0.0
            self._stepped = False
        return wait


#: this process's clock (one training loop per process)
CLOCK = CommClock()
_installed = False
#: imports that failed half-way in :func:`install` (another thread importing the same module),
#: and how many are tried before giving up
_import_failures = [0]
IMPORT_TRIES = 20
_install_lock = threading.Lock()


def _timed_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        clock = CLOCK
        if kwargs.get("async_op") or clock.depth:
            return fn(*args, **kwargs)  # the caller waits on the work later: not blocking here
        clock.depth += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.depth -= 1
            clock.add_blocked(time.perf_counter() - t0)

    timed.__stallscope_timed__ = True  # type: ignore[attr-defined]
    return timed


def timed_hook(inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A DDP communication hook doing what ``inner`` does, noting when each bucket is handed in
    and when its future completes."""

    def hook(state: Any, bucket: Any) -> Any:
        CLOCK.bucket_called(time.perf_counter())
        fut = inner(state, bucket)

        def done(f: Any) -> Any:
            CLOCK.bucket_done(time.perf_counter())
            return f.value()

        return fut.then(done)

    hook.__name__ = getattr(inner, "__name__", "hook")
    hook.__qualname__ = getattr(inner, "__qualname__", "hook")
    try:  # DDP checks the hook's annotations: it has the inner hook's
        hook.__signature__ = inspect.signature(inner)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    return hook


def install() -> None:
    """Patch ``torch.distributed``'s blocking collectives and DDP (once per process; a no-op
    without torch.distributed). Never raises: what cannot be patched is said once."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        _installed = True
        if os.environ.get("STALLSCOPE_COMM", "1").strip().lower() in ("0", "false", "no", "off"):
            return  # turned off: DDP and torch.distributed as they are
        try:
            import torch.distributed as dist
        except Exception:
            return
        if not dist.is_available():
            return
        try:
            for name in COLLECTIVES:
                fn = getattr(dist, name, None)
                if fn is not None and not getattr(fn, "__stallscope_timed__", False):
                    setattr(dist, name, _timed_call(fn))
            _patch_ddp()
        except ImportError as exc:
            # torch.nn.parallel half-imported by the trainer's thread as this one (the stack
            # sampler's, or the probe's) got there: try again at the next call, a few times
            _import_failures[0] += 1
            if _import_failures[0] < IMPORT_TRIES:
                _installed = False
            else:
                warn(f"communication time not measured: {exc!r}")
        except Exception as exc:  # a torch we do not know: steps go on without comm times
            warn(f"communication time not measured: {exc!r}")


def install_if_distributed() -> bool:
    """:func:`install` once the process has a torch.distributed process group (what DDP
    needs, created before the model is wrapped and the first batch is asked for): a training
    that is not distributed is left exactly as it is. True once installed (or turned off);
    never while torch's own import is under way on another thread."""
    if _installed:
        return True
    torch = sys.modules.get("torch")
    dist = sys.modules.get("torch.distributed")
    if (
        torch is None
        or dist is None
        or getattr(getattr(torch, "__spec__", None), "_initializing", False)
    ):
        return False
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return False
    except Exception:  # a torch without these: nothing to time
        return False
    install()
    return _installed  # (False: an import met another thread's half-way; asked again later)


def _patch_backward() -> None:
    """``torch.autograd.backward`` (what ``loss.backward()`` calls) ends the wait of DDP's
    buckets: all are reduced when it returns."""
    import torch.autograd as autograd

    backward = autograd.backward
    if getattr(backward, "__stallscope_timed__", False):
        return

    @functools.wraps(backward)
    def timed_backward(*args: Any, **kwargs: Any) -> Any:
        try:
            return backward(*args, **kwargs)
        finally:
            CLOCK.finish_backward()

    timed_backward.__stallscope_timed__ = True  # type: ignore[attr-defined]
    autograd.backward = timed_backward


def _patch_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    _patch_backward()

    if getattr(DDP, "__stallscope_timed__", False):
        return
    register = DDP.register_comm_hook
    forward = DDP.forward

    @functools.wraps(register)
    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        self.__dict__["_stallscope_hook"] = True
        return register(self, state, timed_hook(hook))

    @functools.wraps(forward)
    def timed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get("_stallscope_hook"):
            self.__dict__["_stallscope_hook"] = True
            try:
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                    allreduce_hook,
                )

                register(self, self.process_group, timed_hook(allreduce_hook))
            except Exception as exc:  # DDP as the trainer set it up, without comm times
                warn(f"communication time of DDP not measured: {exc!r}")
        return forward(self, *args, **kwargs)

    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    DDP.forward = timed_forward  # type: ignore[method-assign]
    DDP.__stallscope_timed__ = True  # type: ignore[attr-defined]
