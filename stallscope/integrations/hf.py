"""Hugging Face ``transformers`` callback: the step probe with one line of user code::

    from stallscope.integrations.hf import StallscopeCallback
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[StallscopeCallback()])

A step here is one optimizer update (``on_step_begin`` .. ``on_step_end``; with gradient
accumulation it spans several micro-batches). The Trainer fetches a step's batches just before
``on_step_begin``, so data wait = time since the previous step ended (logging, evaluation and
saving, which the Trainer announces with ``on_log``/``on_evaluate``/``on_save``, are not counted);
host time = the step itself (accelerate's loader fetches one batch ahead, so a batch's load
may show in the step before its own; per-epoch sums are exact); samples =
``per_device_train_batch_size`` x ``gradient_accumulation_steps``; on CUDA, GPU busy/idle from
CUDA events. The loader configuration comes from the ``train_dataloader`` the Trainer passes to
its callbacks; the rank is ``args.process_index``.

At each training log (``logging_steps``) the probe's figures since the previous one join the
Trainer's ``logs``: ``stallscope/data_wait_share``, ``stallscope/step_ms`` and, under DDP,
``stallscope/comm_share``, so TensorBoard, W&B and the other ``report_to`` loggers get them
(the callback puts itself first among the Trainer's callbacks for that; ``log=False`` turns it
off).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from stallscope.integrations import LogFigures, StepHooks, safe_hook

__all__ = ["StallscopeCallback"]


def _first_in_line(me: Any) -> None:
    """Move this callback to the front of the Trainer's callbacks: the reporting callbacks
    (TensorBoard, W&B, ...) come before the user's, and each sees the ``logs`` dict as the
    callbacks before it left it. The handler is the caller of this hook (``call_event``)."""
    import inspect

    frame = inspect.currentframe()
    try:
        while frame is not None:
            handler = frame.f_locals.get("self")
            cbs = getattr(handler, "callbacks", None)
            if type(handler).__name__ == "CallbackHandler" and isinstance(cbs, list) and me in cbs:
                cbs.remove(me)
                cbs.insert(0, me)
                return
            frame = frame.f_back
    finally:
        del frame


class StallscopeCallback(TrainerCallback):
    """Records every training step with the stallscope probe (see the module docstring).

    ``rank`` overrides ``args.process_index``. ``autotune=True`` sets the training
    DataLoader's ``num_workers`` and ``prefetch_factor`` between epochs
    (:mod:`stallscope.probe.autotune`)."""

    def __init__(self, rank: int | None = None, log: bool = True, autotune: bool = False) -> None:
        self._core = StepHooks(rank, autotune)
        self._broken = False
        self._samples: int | None = None
        self._log = LogFigures() if log else None

    @safe_hook
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._log is not None:
            _first_in_line(self)
        self._core.start(int(getattr(args, "process_index", 0)))
        bs = getattr(args, "per_device_train_batch_size", None)
        acc = getattr(args, "gradient_accumulation_steps", 1) or 1
        self._samples = int(bs) * int(acc) if bs else None

    @safe_hook
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._core.begin_epoch(kwargs.get("train_dataloader"))

    @safe_hook
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._core.begin_step(self._samples)

    @safe_hook
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._core.end_step()

    @safe_hook
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        logs = kwargs.get("logs")
        if self._log is not None and isinstance(logs, dict) and "loss" in logs:
            # a training log (not an evaluation's): the probe's figures join it
            logs.update({f"stallscope/{k}": v for k, v in self._log.take(self._core.probe).items()})
        self._core.idle()

    @safe_hook
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._core.idle()

    @safe_hook
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._core.idle()

    @safe_hook
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._core.finish()
