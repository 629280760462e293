"""The framework-free core of the step probe: the step loop of a watched loader and ``watch``.

:class:`Watched` times every step of any iterable: data wait (host time blocked in ``next()``)
and the step's own host time, the sample count, and device markers when the recorder's device
clock is ready. Its hot loop talks to the recorder through the small public state made for it
(:class:`~stallscope.probe.buffer.StepState`, :class:`~stallscope.probe.buffer.StepBuffer`,
:class:`~stallscope.probe.device.DeviceClock`, the alert queue), bound once per epoch: two
``perf_counter`` reads and one tuple appended per step.

:func:`watch` picks which adapter's recorder times a loader (:class:`Adapter`): each framework's
adapter registers itself when imported (:mod:`stallscope.probe` imports them all); the one that
claims the loader (TensorFlow: a ``tf.data.Dataset``) gets it, the default one (PyTorch) gets
every other iterable. This module never imports a training framework: adapters import it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

from stallscope.probe.device import timing_every
from stallscope.probe.loaders import sizer_for
from stallscope.probe.notices import warn
from stallscope.probe.recorder import Recorder, StepTimer, current, env_rank, obtain
from stallscope.sources.comm import CLOCK as COMM

__all__ = [
    "Adapter",
    "Watched",
    "adapter_for",
    "default_probe",
    "register_adapter",
    "step",
    "watch",
]

T = TypeVar("T")


# --- the step loop -------------------------------------------------------------------------------
class Watched(Generic[T]):
    """An iterable that times every batch of ``loader`` (see the package docstring).

    Attributes it does not have (``sampler``, ``dataset``, ``batch_size``...) come from the
    wrapped loader, and ``len()`` is the loader's, so it can stand in for it."""

    def __init__(self, loader: Iterable[T], probe: Recorder | None,
                 tuner: Any = None) -> None:
        self.loader = loader
        self.probe = probe
        #: the loader autotune (probe/autotune.py) when asked for: changes the loader between
        #: epochs from what each epoch measured
        self.tuner = tuner

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "probe", "tuner"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[T]:
        p = self.probe
        if p is None or not p.active:
            yield from self.loader
            return
        perf = time.perf_counter
        tuner = self.tuner
        if tuner is not None:
            _tuner_call(p, tuner.before_epoch)
        t_req = t_start = perf()
        it = iter(self.loader)
        try:
            epoch = p.begin_epoch(self.loader, it, iter_s=perf() - t_req)
            gpu = p.device.ready()
        except Exception as exc:  # never stop the trainer: fall back to plain iteration
            warn(f"probe disabled for this loader: {exc!r}")
            yield from it
            return
        before = p.state.step  # the step count moves with each batch the loader hands over
        try:
            yield from self._steps(p, it, epoch, gpu, t_req, t_start)
        except Exception as exc:
            # the configuration autotune set before this epoch failed before its first batch
            # (a dataset that cannot run in workers, or whose exception torch cannot rebuild
            # there): back to the one that worked, this same epoch, said once
            if tuner is None or p.state.step != before or not tuner.revert(exc):
                raise
            t_req = t_start = perf()
            yield from self._steps(p, iter(self.loader), epoch, gpu, t_req, t_start)

    def _steps(self, p: Recorder, it: Iterator[T], epoch: int, gpu: bool, t_req: float,
               t_start: float) -> Iterator[T]:
        """The epoch's step loop (see the module docstring)."""
        perf = time.perf_counter
        tuner = self.tuner
        state, buf, due, dev = p.state, p.buffer, p.alerts.due, p.device  # bound per epoch
        comm, comm_of = COMM, p.comm_of
        queue, timed_q, cap, event = buf.queue, buf.timed, buf.capacity, dev.event
        maybe_gpu = dev.timer is not None and not gpu
        sizer: Callable[[Any], int | None] | None = None
        cur = first = state.step
        nsamples, open_step = 0, False
        t_got = wait = waited = first_wait = 0.0
        n: int | None = None
        ev0: Any = None
        pairs, timed = Pairs(perf(), cur), False  # which steps the device times (device.py)
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t_got = perf()
                cur = state.step = state.step + 1
                if maybe_gpu and dev.ready():
                    gpu, maybe_gpu = True, False
                timed = gpu and pairs.due()
                if timed:
                    try:
                        ev0 = event()
                        ev0.record()
                    except Exception as exc:  # device trouble is the trainer's to report
                        gpu = maybe_gpu = timed = False
                        dev.record_failed(exc)
                try:  # (a try costs nothing in CPython 3.11+ until something raises)
                    if sizer is None:
                        sizer = sizer_for(batch)
                    n = sizer(batch)
                except Exception:  # an odd batch: no sample count, never an error
                    n = None
                wait = t_got - t_req
                first_wait = first_wait or wait  # the workers' start-up, for the autotune
                waited += wait
                nsamples += n or 0
                open_step = True
                yield batch
                t_req = perf()
                open_step = False
                h2d, state.h2d_s = state.h2d_s, None
                g: Any = None
                if gpu and not timed and state.h2d_events is not None:
                    pairs.drop_copies(state, dev)
                if timed and gpu:
                    try:
                        ev1 = event()
                        ev1.record()
                        g = (ev0, ev1, state.take_h2d()[1])
                    except Exception as exc:
                        gpu = maybe_gpu = False
                        dev.record_failed(exc)
                    pairs.timed(t_req, cur)
                if comm.used and (c := comm.take()) is not None and len(queue) < cap:
                    comm_of[cur] = c  # collectives (sources/comm.py); a dropped step's: none
                if len(queue) < cap:  # a RawStep: StepRecord's fields in a bare tuple
                    (queue if g is None else timed_q).append(
                        (cur, t_got, wait, t_req - t_got, n, epoch, h2d, g))
                else:
                    buf.dropped += 1
                if due:  # alerts for callbacks (stallscope.on_alert): run them between steps
                    p.run_due()
                    t_req = perf()
        finally:
            if open_step:  # the loop body broke out or raised: the step ends now
                _end_step_now(p, cur, t_got, wait, n, epoch, ev0 if gpu and timed else None)
            state.last_end = end = perf()
            if tuner is not None:
                _tuner_call(p, lambda: tuner.after_epoch(cur - first, end - t_start, waited,
                                                         nsamples, first_wait))
                p.update_config({"autotune": tuner.summary()})
            p.epoch_done()


class Pairs:
    """Which steps a watched loop times on the device: pairs of consecutive steps (the second
    gives the GPU's gap between steps), one pair in :func:`~stallscope.probe.device.
    timing_every` of the mean step since the last pair: every step from 22 ms up, so the
    events' cost stays under half a percent of a step at any step length (on an H200 timing
    every step took a 50.5-us launch-bound step to 97.7 us)."""

    __slots__ = ("left", "n_mark", "paired", "t_mark")

    def __init__(self, t: float, step: int) -> None:
        self.left = self.paired = 0
        self.t_mark, self.n_mark = t, step

    def due(self) -> bool:
        """Whether this step is timed (one call per step)."""
        if self.left > 0:
            self.left -= 1
            return False
        return True

    def timed(self, t: float, step: int) -> None:
        """A timed step ended at ``t``: after a pair, when the next one is due."""
        self.paired += 1
        if self.paired == 2:
            self.paired = 0
            self.left = timing_every((t - self.t_mark) / max(1, step - self.n_mark)) - 2
            self.t_mark, self.n_mark = t, step

    @staticmethod
    def drop_copies(state: Any, dev: Any) -> None:
        """An untimed step's device-timed copies (``stallscope.h2d``): give their events back."""
        for a, b in state.take_h2d()[1] or ():
            dev.release(a)
            dev.release(b)


def _tuner_call(p: Recorder, fn: Callable[[], None]) -> None:
    """Run a step of the loader autotune; what goes wrong stops it, never the training."""
    try:
        fn()
    except Exception as exc:
        p.notices.say("autotune", f"loader autotune stopped: {exc!r}")


def _end_step_now(p: Recorder, cur: int, t_got: float, wait: float, n: int | None, epoch: int,
                  ev0: Any) -> None:
    """Record the step a watched loop left under way (``ev0``: its start event, when timed on
    the device): it ends now."""
    t_end = time.perf_counter()
    try:
        h2d, h2d_evs = p.state.take_h2d()
        p.take_comm(cur)
        g = None
        if ev0 is not None:
            ev1 = p.device.event()
            ev1.record()
            g = (ev0, ev1, h2d_evs)
        p.buffer.push((cur, t_got, wait, t_end - t_got, n, epoch, h2d, g))
    except Exception as exc:
        warn(f"probe could not record the last step: {exc!r}")


# --- which adapter watches a loader --------------------------------------------------------------
class Adapter(NamedTuple):
    """How a framework's adapter plugs into :func:`watch` and :func:`step`."""

    name: str  #: the framework ("pytorch")
    #: True for the loaders this adapter handles; None for the default adapter (any loader
    #: no other adapter claims, and steps timed by hand)
    claims: Callable[[Any], bool] | None
    #: this process's recorder for a rank (None: the adapter's default rank), made on first
    #: use; None when the probe is off or cannot start
    probe: Callable[[int | None], Recorder | None]


def _plain_probe(rank: int | None) -> Recorder | None:
    return obtain(env_rank() if rank is None else int(rank), lambda r: Recorder(rank=r))


#: adapters that claim their loaders, in the order they registered
_claiming: list[Adapter] = []
#: the adapter for everything else (a bare recorder until an adapter takes over)
_default = Adapter("none", None, _plain_probe)


def register_adapter(adapter: Adapter) -> None:
    """Make ``adapter`` watch the loaders it claims (or, with ``claims`` None, be the default).
    Adapters call it when imported; registering one of the same name again replaces it."""
    global _default
    _claiming[:] = [a for a in _claiming if a.name != adapter.name]
    if adapter.claims is None:
        _default = adapter
    else:
        _claiming.append(adapter)


def adapter_for(loader: Any) -> Adapter:
    """The adapter that watches ``loader``."""
    for a in _claiming:
        if a.claims is not None and a.claims(loader):
            return a
    return _default


def watch(loader: Iterable[T], *, rank: int | None = None,
          autotune: bool = False) -> Watched[T]:
    """Wrap ``loader`` so every step is timed: ``for batch in stallscope.watch(loader): ...``.

    Each ``for`` over the wrapper is one epoch. ``rank`` defaults to the adapter's (PyTorch:
    torch.distributed's rank, else ``$RANK``, else 0). A ``tf.data.Dataset`` (iterated eagerly
    in a custom loop) gets the TensorFlow adapter's recorder (:mod:`stallscope.probe.keras`).

    ``autotune=True`` (a PyTorch ``DataLoader``): between epochs, set its ``num_workers`` and
    ``prefetch_factor`` from what each epoch measured, until it keeps up
    (:mod:`stallscope.probe.autotune`); each change is logged in the run."""
    probe = adapter_for(loader).probe(rank)
    tuner = None
    if autotune and probe is not None:
        if hasattr(loader, "num_workers") and hasattr(loader, "prefetch_factor"):
            tuner = _tuner_of(loader, probe)
        else:
            probe.notices.say("autotune", f"autotune=True needs a PyTorch DataLoader; "
                              f"{type(loader).__name__} is watched without it")
    return Watched(loader, probe, tuner)


#: one autotune per loader, however often it is watched (a ``watch(loader)`` per epoch)
_tuners: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _tuner_of(loader: Any, probe: Recorder) -> Any:
    """The autotune of ``loader`` (made on first use); None when it cannot have one. A
    wrapper that iterates a DataLoader of its own (accelerate's DataLoaderShard, which Hugging
    Face's Trainer hands its callbacks) is tuned through that inner loader."""
    inner = loader.__dict__.get("base_dataloader") if hasattr(loader, "__dict__") else None
    if inner is not None and hasattr(inner, "num_workers"):
        loader = inner
    try:
        tuner = _tuners.get(loader)
        if tuner is None:
            from stallscope.probe.autotune import OnlineTuner

            tuner = _tuners[loader] = OnlineTuner(loader, log=probe.tune_log)
        return tuner
    except Exception as exc:  # an odd loader (not weak-referenceable...): no autotune
        probe.notices.say("autotune", f"loader autotune could not start: {exc!r}")
        return None


def default_probe() -> Recorder | None:
    """The recorder of this process: the one live recorder when there is exactly one, else
    the default adapter's for its default rank (made on first use)."""
    p = current()
    return p if p is not None else _default.probe(None)


def step(samples: int | None = None, *, epoch: int | None = None,
         rank: int | None = None) -> StepTimer | _NullStep:
    """Time one step of a loop that does not iterate a loader::

        with stallscope.step(samples=len(x)):
            train_one_batch(x)

    The data wait of a step is the time since the previous step ended."""
    p = _default.probe(rank) if rank is not None else default_probe()
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
