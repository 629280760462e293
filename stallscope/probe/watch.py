"""The framework-free core of the step probe: the step loop of a watched loader and ``watch``.

:class:`Watched` times every step of any iterable: data wait (host time blocked in ``next()``)
and the step's own host time, the sample count, and device markers when the recorder's device
clock is ready. Its hot loop talks to the recorder through the small public state made for it
(:class:`~stallscope.probe.buffer.StepState`, :class:`~stallscope.probe.buffer.StepBuffer`,
:class:`~stallscope.probe.device.DeviceClock`, the alert queue), bound once per epoch: two
``perf_counter`` reads per step, and one tuple appended per record. A step at least
:data:`~stallscope.probe.buffer.GROUP_S` long is a record of its own; shorter ones are summed
into records that span it (the writer's cost per record would otherwise be a large share of a
short step), with one batch in :data:`~stallscope.probe.buffer.SIZE_EVERY` counted.

:func:`watch` picks which adapter's recorder times a loader (:class:`Adapter`): each framework's
adapter registers itself when imported (:mod:`stallscope.probe` imports them all); the one that
claims the loader (TensorFlow: a ``tf.data.Dataset``) gets it, the default one (PyTorch) gets
every other iterable. This module never imports a training framework: adapters import it.
"""

from __future__ import annotations

import random
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

from stallscope.probe.buffer import SAMPLE_EVERY, SAMPLED_STEP_S, SIZE_EVERY
from stallscope.probe.device import Pairs
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
#: an epoch begun: the loader's iterator, the epoch (None: the probe cannot watch this loader),
#: whether the device times steps, and when the first batch was asked for (Watched._begin)
_Begun = tuple[Iterator[T], int | None, bool, float]
#: what an epoch's step loops share: the recorder, the loader's iterator, the epoch, and the
#: autotune's accumulator (its samples, data wait, first wait)
_Loop = tuple[Recorder, Iterator[T], int, list[Any]]


# --- the step loop -------------------------------------------------------------------------------
class Watched(Generic[T]):
    """An iterable that times every batch of ``loader`` (see the package docstring).

    Attributes it does not have (``sampler``, ``dataset``, ``batch_size``...) come from the
    wrapped loader, and ``len()`` is the loader's, so it can stand in for it."""

    def __init__(self, loader: Iterable[T], probe: Recorder | None, tuner: Any = None) -> None:
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
        """The epoch's iterator: the loader's own when the probe is off; else the step loop,
        whose epoch begins at its first ``next()`` (an ``iter()`` never iterated begins none).
        ``__iter__`` itself is a plain function: each level of generators a batch passes
        through costs it ~30 ns."""
        p = self.probe
        if p is None or not p.active:
            return iter(self.loader)
        if self.tuner is None:
            return self._steps(p)
        return self._tuned(p, self.tuner)

    def _begin(self, p: Recorder) -> _Begun[T]:
        """The epoch begun: (the loader's iterator, the epoch's number, None when the probe
        cannot watch it (said on stderr), whether the device clock is ready, when it was
        asked)."""
        perf = time.perf_counter
        t_req = perf()
        it = iter(self.loader)
        try:
            epoch = p.begin_epoch(self.loader, it, iter_s=perf() - t_req)
            return it, epoch, p.device.ready(), t_req
        except Exception as exc:  # never stop the trainer: fall back to plain iteration
            warn(f"probe disabled for this loader: {exc!r}")
            return it, None, False, t_req

    def _tuned(self, p: Recorder, tuner: Any) -> Iterator[T]:
        """The step loop under the loader autotune, which sets the loader up before the epoch
        and may have to take back the configuration it set."""
        _tuner_call(p, tuner.before_epoch)
        before = p.state.step  # the step count moves with each batch the loader hands over
        begun = None
        try:
            begun = self._begin(p)  # (iter() may fail: workers that cannot start)
            yield from self._steps(p, begun)
        except Exception as exc:
            # the configuration autotune set before this epoch failed before its first batch
            # (a dataset that cannot run in workers, or whose exception torch cannot rebuild
            # there): back to the one that worked, this same epoch, said once
            if (
                (begun is not None and begun[1] is None)
                or p.state.step != before
                or not tuner.revert(exc)
            ):
                raise
            if begun is None:  # iter() failed: the epoch begins now
                yield from self._steps(p)
                return
            t_req = time.perf_counter()  # (iter() starts the workers: their start-up is wait)
            yield from self._steps(p, (iter(self.loader), begun[1], begun[2], t_req))

    def _steps(self, p: Recorder, begun: _Begun[T] | None = None) -> Iterator[T]:
        """The epoch's step loop (see the module docstring), the epoch ``begun`` now unless
        given: a step at least the recorder's ``group_s`` long is a record of its own, and so
        are the epoch's first step and each device-timed one; shorter steps are summed, a record
        per ``group_s``. What only a record needs (copies, collectives, alert callbacks) is
        looked at once a record."""
        it, epoch, gpu, t_req = begun or self._begin(p)
        if epoch is None:  # the probe cannot watch this loader
            yield from it
            return
        perf, t_start = time.perf_counter, t_req
        state, due, dev = p.state, p.alerts.due, p.device  # bound per epoch
        group_s, every = p.group_s, SIZE_EVERY
        maybe_gpu = dev.timer is not None and not gpu
        sizer: Callable[[Any], int | None] | None = None
        cur = first = state.step
        timed, lone, fast = False, True, False  # lone: the epoch's first step, a record alone
        acc: list[Any] = [0, 0.0, 0.0]  # the epoch's samples, data wait, first wait (autotune)
        loop: _Loop[T] = (p, it, epoch, acc)
        t_got = mean_s = 0.0
        ev0 = marks = batch = None
        pairs = Pairs(perf(), cur)  # which steps the device times (device.py)
        # the record under way: its start, steps, data waits, host times, and the batches
        # counted in it (g_k, with g_s samples)
        g_t0, g_n, g_wait, g_host, g_k, g_s = t_req, 0, 0.0, 0.0, 0, 0
        try:
            while True:  # next(), never a for loop: that would call iter(it) again
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t_got = perf()
                cur = state.step = cur + 1
                if maybe_gpu and dev.ready():
                    gpu, maybe_gpu = True, False
                if gpu and pairs.due():
                    if g_n:  # a device-timed step is a record of its own: end the one under way
                        _record(p, acc, cur - 1, g_t0, g_n, g_wait, g_host, g_k, g_s, epoch, None)
                        g_t0, g_n, g_wait, g_host, g_k, g_s = t_req, 0, 0.0, 0.0, 0, 0
                    ev0 = _mark(dev)
                    gpu = maybe_gpu = timed = ev0 is not None  # a failed record: timing off
                if not g_n % every:  # one batch in SIZE_EVERY of a record is counted
                    sizer, k = _count(batch, sizer)
                    if k is not None:
                        g_k, g_s = g_k + 1, g_s + k
                g_wait += t_got - t_req
                yield batch
                t_req = perf()
                g_host += t_req - t_got
                g_n += 1
                if timed or lone or t_req - g_t0 >= group_s:
                    if timed:
                        marks = _end_marks(dev, ev0)
                        gpu = maybe_gpu = marks is not None
                        pairs.timed(t_req, cur)
                    elif not lone:  # (lone or timed: one step of any length; else one step
                        # alone is at least group_s long, never sampled)
                        fast = g_n > 1 and (mean_s := (t_req - g_t0) / g_n) < SAMPLED_STEP_S
                    _record(p, acc, cur, g_t0, g_n, g_wait, g_host, g_k, g_s, epoch, marks)
                    timed = lone = False
                    marks = None
                    if due:  # alerts for callbacks (stallscope.on_alert): run them between steps
                        p.run_due()
                        t_req = perf()
                    g_t0, g_n, g_wait, g_host, g_k, g_s = t_req, 0, 0.0, 0.0, 0, 0
                    if fast and (not gpu or pairs.left > 2 * SAMPLE_EVERY):
                        out, cur, t_req, sizer, until = yield from self._sampled(
                            loop, cur, t_req, sizer, pairs.left if gpu else -1, mean_s
                        )
                        g_t0, pairs.left = t_req, max(0, until) if gpu else pairs.left
                        if out:
                            break
        finally:
            if g_n or t_got > t_req:  # (t_got later: the loop body broke out or raised)
                group = (g_t0, g_n, g_wait, g_host, g_k, g_s)
                ev = ev0 if timed and gpu else None
                _last_record(p, acc, cur, group, epoch, t_got, t_req, ev, sizer, batch)
            self._epoch_end(p, state.step - first, t_start, acc)

    def _sampled(
        self, loop: _Loop[T], cur: int, t_end: float, sizer: Any, until: int, step_s: float
    ) -> Generator[T, None, tuple[bool, int, float, Any, int]]:
        """Steps under :data:`~stallscope.probe.buffer.SAMPLED_STEP_S`, a record per ``group_s``;
        one in about ``SAMPLE_EVERY``, at random gaps, is timed in full (the step before it
        reads its own end), the others only counted. A record ends with a timed step (wall time
        exact); its wait is its steps times their mean wait (any excess carried on). Untimed
        last steps end at the last reading plus their mean step, never after the clock.
        ``until``: steps before a device pair is due (-1: none). Returns (the loader ran out,
        the last step, when it ended, the sizer, steps before the pair) (docs/probe.md)."""
        p, it, epoch, acc = loop
        perf = time.perf_counter
        state, due, dev, group_s = p.state, p.alerts.due, p.device, p.group_s
        wake = dev.timer is not None and not dev.timing  # device timing may start meanwhile
        g_t0, base, entry = t_end, cur, cur  # the record's start, the step before its first
        # since when, and from which step, untimed steps' mean is taken (the stretch's start,
        # or the end of alert callbacks); the step whose end was read last
        t_in, n_in, n_read = t_end, cur, cur
        g_n = g_k = g_s = p_k = p_s = 0  # p_: the last record's batches counted, samples
        batch: Any = None
        w_s, j = 0.0, 0  # the timed steps' waits, and how many
        mean_w = carry = 0.0  # the last record's mean wait; the wait beyond a record's time
        gi = cur & _GAP_MASK
        left = _GAPS[gi]
        try:
            while True:  # (next(): some loaders' __iter__ starts the epoch over)
                try:
                    batch = next(it)
                except StopIteration:
                    break
                cur = state.step = cur + 1
                if left > 1:  # untimed: counted, no clock read
                    left -= 1
                    yield batch
                    g_n += 1
                    continue
                if left:  # the step before a timed one: its end is that one's request
                    left = 0
                    yield batch
                    t_end, n_read = perf(), cur
                    g_n += 1
                    continue
                t_got = perf()
                sizer, k = _count(batch, sizer)
                if k is not None:
                    g_k, g_s = g_k + 1, g_s + k
                yield batch
                t = perf()
                g_n += 1
                w_s, j, t_end, n_read = w_s + t_got - t_end, j + 1, t, cur
                gi = (gi + 1) & _GAP_MASK
                left = _GAPS[gi] if until < 0 else min(_GAPS[gi], until - (cur - entry) - 1)
                paired = 0 <= until <= cur - entry
                if t_end - g_t0 >= group_s or due or paired:
                    span, n, mean_w = t_end - g_t0, g_n, w_s / j
                    wait = max(0.0, min(span, n * mean_w + carry))
                    carry += n * mean_w - wait
                    _record(p, acc, cur, g_t0, n, wait, span - wait, g_k, g_s, epoch, None)
                    p_k, p_s = g_k, g_s  # (the next record's batches may all go uncounted)
                    g_t0, base, g_n, g_k, g_s, w_s, j = t_end, cur, 0, 0, 0, 0.0, 0
                    if due:  # alerts for callbacks (stallscope.on_alert): between steps
                        p.run_due()
                        t_end = g_t0 = t_in = perf()
                        n_in = cur
                    if span >= SAMPLED_STEP_S * n or paired or (wake and dev.ready()):
                        return False, cur, t_end, sizer, until - (cur - entry)
            return True, cur, t_end, sizer, until - (cur - entry)  # (untimed last steps: below)
        finally:
            if cur > base + g_n:  # the loop body broke out or raised: its step ends now
                t_end, g_n, n_read = perf(), g_n + 1, cur
            elif n_read < cur:  # the loader ran out (or raised) after untimed steps
                t_end = _ends(perf(), t_end, cur - n_read, t_in, n_read - n_in, step_s)
            if g_n:
                span = t_end - g_t0
                wait = max(0.0, min(span, g_n * (w_s / j if j else mean_w) + carry))
                if left != _GAPS[gi] and sizer is not None and (g_k or p_k):  # the last batch
                    g_s, g_k = _with_last(g_s if g_k else p_s, g_k or p_k, g_n, sizer, batch)
                _record(p, acc, cur, g_t0, g_n, wait, span - wait, g_k, g_s, epoch, None)

    def _epoch_end(self, p: Recorder, steps: int, t_start: float, acc: list[Any]) -> None:
        """The epoch ended (or the loop left it): when, the autotune's turn (``acc``: its
        samples, data wait and first step's wait), a flush soon."""
        p.state.last_end = end = time.perf_counter()
        tuner = self.tuner
        if tuner is not None:
            samples, waited, first_wait = acc
            _tuner_call(
                p, lambda: tuner.after_epoch(steps, end - t_start, waited, samples, first_wait)
            )
            p.update_config({"autotune": tuner.summary()})
        p.epoch_done()


def _count(
    batch: Any, sizer: Callable[[Any], int | None] | None
) -> tuple[Callable[[Any], int | None] | None, int | None]:
    """(the loader's sizer, decided on its first batch; ``batch``'s samples, None when they
    cannot be counted: an odd batch is never an error)."""
    try:
        if sizer is None:
            sizer = sizer_for(batch)
        return sizer, sizer(batch)
    except Exception:
        return sizer, None


def _with_last(
    s: int, k: int, n: int, sizer: Callable[[Any], int | None], batch: Any
) -> tuple[int, int]:
    """A record's (samples, batches counted) once its last batch, uncounted so far (often a
    short one), is counted as it is: ``n`` batches, the others at the mean of ``k`` counted
    batches of ``s`` samples (its own, or the record's before when none of its own was)."""
    last = _count(batch, sizer)[1]
    return (s, k) if last is None else (round(s * (n - 1) / k) + last, n)


def _ends(now: float, t_read: float, k: int, t_in: float, read: int, step_s: float) -> float:
    """When ``k`` untimed steps after a reading at ``t_read`` ended: that reading plus ``k``
    mean steps (over the ``read`` steps since ``t_in``, else ``step_s``), never after ``now``."""
    per = (t_read - t_in) / read if read > 0 else step_s
    return min(now, t_read + k * per)


def _mark(dev: Any) -> Any:
    """A device event recorded now (the start of a timed step); None when recording failed
    (said once; device timing is then off)."""
    try:
        ev = dev.event()
        ev.record()
        return ev
    except Exception as exc:  # device trouble is the trainer's to report
        dev.record_failed(exc)
        return None


def _end_marks(dev: Any, ev0: Any) -> Any:
    """A timed step's device marks (start, end; its copies come with the record), its end
    recorded now; None when recording failed."""
    ev1 = _mark(dev)
    return None if ev1 is None else (ev0, ev1, None)


def _last_record(
    p: Recorder,
    acc: list[Any],
    cur: int,
    group: tuple[float, int, float, float, int, int],
    epoch: int,
    t_got: float,
    t_req: float,
    ev0: Any,
    sizer: Callable[[Any], int | None] | None,
    batch: Any,
) -> None:
    """The epoch's last record, added to ``acc``. When the last batch came after the last
    request (``t_got`` > ``t_req``), the loop body broke out or raised, and that step ends now;
    else the epoch's last batch, often a short one, is counted as it is when it was not yet.
    ``group``: the record under way (its start, steps, data wait, host time, batches counted and
    their samples)."""
    t0, n, wait, host, k, s = group
    marks = None
    try:
        if t_got > t_req:
            host += time.perf_counter() - t_got
            n += 1
            if ev0 is not None:
                marks = _end_marks(p.device, ev0)
        elif (n - 1) % SIZE_EVERY and sizer is not None and k:
            s, k = _with_last(s, k, n, sizer, batch)
        _record(p, acc, cur, t0, n, wait, host, k, s, epoch, marks)
    except Exception as exc:
        warn(f"probe could not record the last steps: {exc!r}")


def _record(
    p: Recorder,
    acc: list[Any],
    step: int,
    t0: float,
    n: int,
    wait: float,
    host: float,
    k: int,
    s: int,
    epoch: int,
    marks: Any,
) -> None:
    """Hand over the record of ``n`` steps up to ``step`` that began at ``t0`` (``k`` of their
    batches counted, ``s`` samples in those; ``marks``: a device-timed step's start and end
    events), with the copies and collectives noted since the last record, and add its samples
    and wait to the epoch's ``acc`` (the first record's wait, the workers' start-up, kept
    apart). A full buffer drops it and counts its steps."""
    samples = (s if k >= n else round(s * n / k)) if k else None
    state, buf = p.state, p.buffer
    h2d, evs = state.take_h2d()  # host-timed copies add up; device-timed ones: a timed step's
    if marks is not None:
        marks = (marks[0], marks[1], evs)
    elif evs:
        Pairs.drop_copies(evs, p.device)
    comm = COMM.take() if COMM.used else None  # collectives (sources/comm.py) add up too
    queue = buf.queue
    if len(queue) < buf.capacity:  # a RawStep: StepRecord's fields in a bare tuple
        (queue if marks is None else buf.timed).append(
            (step, t0 + wait, wait, host, samples, epoch, h2d, marks, n)
        )
        if comm is not None:
            p.comm_of[step] = comm
    else:
        buf.dropped += n
    acc[0] += samples or 0
    acc[1] += wait
    if not acc[2]:
        acc[2] = wait


#: the gaps between fully timed steps of a sampled record (uniform, 0 to 2 x SAMPLE_EVERY - 2:
#: one step in SAMPLE_EVERY timed), fixed once so a run is reproducible
_GAP_MASK = 4095
_GAPS = (lambda rng: tuple(rng.randrange(2 * SAMPLE_EVERY - 1) for _ in range(4096)))(
    random.Random(20261128)
)


def _tuner_call(p: Recorder, fn: Callable[[], None]) -> None:
    """Run a step of the loader autotune; what goes wrong stops it, never the training."""
    try:
        fn()
    except Exception as exc:
        p.notices.say("autotune", f"loader autotune stopped: {exc!r}")


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


def watch(loader: Iterable[T], *, rank: int | None = None, autotune: bool = False) -> Watched[T]:
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
            probe.notices.say(
                "autotune",
                f"autotune=True needs a PyTorch DataLoader; "
                f"{type(loader).__name__} is watched without it",
            )
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


def step(
    samples: int | None = None, *, epoch: int | None = None, rank: int | None = None
) -> StepTimer | _NullStep:
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
