"""One-line integrations of the step probe with training frameworks.

- PyTorch Lightning: ``Trainer(callbacks=[stallscope.integrations.lightning.StallscopeCallback()])``
- Hugging Face: ``Trainer(..., callbacks=[stallscope.integrations.hf.StallscopeCallback()])``
- Keras 3 (TensorFlow backend):
  ``model.fit(..., callbacks=[stallscope.integrations.keras.StallscopeCallback()])``; it times
  each step's input wait inside the compiled train function (:mod:`stallscope.probe.keras`)
  instead of between hooks

Each module imports its framework only when imported itself. The callbacks time steps between
the framework's hooks with :class:`stallscope.probe.StepTimer` (data wait = time since the
previous step ended, minus evaluation/checkpoint/logging work the framework announces) and never
raise into the trainer: a failing hook is reported once on stderr and the probe goes quiet.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from stallscope.probe import Recorder, StepTimer, get_probe
from stallscope.probe.notices import warn

__all__ = ["LogFigures", "StepHooks", "safe_hook"]


class LogFigures:
    """What a framework's logger gets from the probe at each of its logging points: the steps
    recorded since the previous point (the probe writes what it holds first, a few
    milliseconds on the training thread at each logging point), as ``{name: value}``:
    ``data_wait_share`` (0-1), ``step_ms`` (mean), ``comm_share`` (0-1, DDP with communication
    timed). Empty when no step came in between."""

    def __init__(self) -> None:
        self._mark = [0, 0.0, 0.0, 0, 0.0]

    def take(self, probe: Recorder | None) -> dict[str, float]:
        if probe is None:
            return {}
        probe.flush()  # what the probe holds, written now: a logging point is rare
        now = list(probe.writer.sums)
        d = [a - b for a, b in zip(now, self._mark, strict=True)]
        self._mark = now
        n, wait, wall, n_comm, comm = d
        if n <= 0 or wall <= 0:
            return {}
        out = {"data_wait_share": round(wait / wall, 4), "step_ms": round(wall / n * 1000.0, 3)}
        if n_comm > 0:
            out["comm_share"] = round(comm / wall, 4)
        return out


F = TypeVar("F", bound=Callable[..., Any])


def safe_hook(fn: F) -> F:
    """Run a callback hook; if it fails, say so once and turn the callback off (the trainer
    goes on). The hook's owner needs a ``_broken`` attribute."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_broken", False):
            return None
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:  # the probe must never stop training: report once, go quiet
            self._broken = True
            warn(f"step probe callback turned off after {fn.__name__} failed: {exc!r}")
            return None

    return wrapper  # type: ignore[return-value]


class StepHooks:
    """What both callbacks do, framework-free: a probe, the open step, the epoch."""

    def __init__(self, rank: int | None = None, autotune: bool = False) -> None:
        self.rank = rank
        self.probe: Recorder | None = None
        self.epoch = -1
        self._timer: StepTimer | None = None
        #: the loader autotune (probe/autotune.py), when asked for and the loader allows it
        self.autotune = autotune
        self._tuner: Any = None
        #: this epoch's steps, data wait, wall (wait + the rest), first wait, samples
        self._tally: list[float] | None = None
        self._last_end = 0.0

    def start(self, rank: int | None) -> None:
        """Training starts: get this rank's probe (made on first use)."""
        self.probe = get_probe(self.rank if self.rank is not None else rank)

    def begin_epoch(self, loader: Any, epoch: int | None = None) -> None:
        """A new epoch, before the framework iterates ``loader``: with autotune, the last
        epoch's figures go to the tuner and its next configuration is applied now."""
        p = self.probe
        if p is None:
            return
        self._end_epoch()
        self.epoch = self.epoch + 1 if epoch is None else int(epoch)
        if (
            self.autotune
            and self._tuner is None
            and hasattr(loader, "num_workers")
            and hasattr(loader, "prefetch_factor")
        ):
            from stallscope.probe.watch import _tuner_of

            self._tuner = _tuner_of(loader, p)
            if self._tuner is None:
                self.autotune = False
        if self._tuner is not None:
            from stallscope.probe.watch import _tuner_call

            _tuner_call(p, self._tuner.before_epoch)
            self._tally = [0.0, 0.0, 0.0, 0.0, 0.0]
        p.begin_epoch(loader, epoch=self.epoch)
        p.mark_idle()  # end-of-epoch work (validation, checkpoints) is not data wait
        self._last_end = time.perf_counter()

    def begin_step(self, samples: int | None) -> None:
        p = self.probe
        if p is None:
            return
        if self._timer is not None:  # a step whose end hook never came (exception, skip)
            self._timer.stop()
        self._timer = p.begin_step(samples, max(self.epoch, 0))
        t = self._tally
        if t is not None:
            wait = time.perf_counter() - self._last_end
            if not t[0]:
                t[3] = wait
            t[0] += 1
            t[1] += wait
            t[4] += samples or 0

    def end_step(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
            if self._tally is not None:
                now = time.perf_counter()
                self._tally[2] += now - self._last_end  # the step's wait and the rest
                self._last_end = now

    def idle(self) -> None:
        """The framework did other work (evaluation, logging, saving) since the last step."""
        if self.probe is not None:
            self.probe.mark_idle()
        self._last_end = time.perf_counter()

    def finish(self) -> None:
        self.end_step()
        self._end_epoch()
        if self.probe is not None:
            self.probe.epoch_done()  # write soon, off the training thread

    def _end_epoch(self) -> None:
        """The epoch measured with autotune: its steps' time (data wait and the rest, idle
        time left out) to the tuner, its state to the run's configuration."""
        t, self._tally = self._tally, None
        if t is None or self._tuner is None or self.probe is None:
            return
        from stallscope.probe.watch import _tuner_call

        steps, wait, wall, first, samples = t
        tuner = self._tuner
        _tuner_call(
            self.probe, lambda: tuner.after_epoch(int(steps), wall, wait, int(samples), first)
        )
        self.probe.update_config({"autotune": tuner.summary()})
