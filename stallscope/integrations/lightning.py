"""PyTorch Lightning callback: the step probe with one line of user code::

    from stallscope.integrations.lightning import StallscopeCallback
    trainer = lightning.Trainer(..., callbacks=[StallscopeCallback()])

Per training batch it records data wait (from the end of the previous batch, or from the start of
the epoch, to ``on_train_batch_start``: Lightning fetches batches in that gap; its fetcher reads
one batch ahead, so a batch's load may show in the step before its own), host time
(``on_train_batch_start`` to ``on_train_batch_end``), samples (dim 0 of the batch's first tensor),
the epoch (``trainer.current_epoch``) and, on CUDA, GPU busy/idle time from CUDA events. The
loader configuration comes from ``trainer.train_dataloader``; the rank is ``trainer.global_rank``.
Validation and checkpointing between batches are not counted as data wait.

At the trainer's logging interval (``log_every_n_steps``) the probe's figures since the last
one go to the trainer's loggers through ``pl_module.log_dict``: ``stallscope/data_wait_share``,
``stallscope/step_ms`` and, under DDP, ``stallscope/comm_share`` (``log=False`` turns that off).

Lightning ships as ``lightning`` (``lightning.pytorch``) and as ``pytorch_lightning``; their
``Callback`` classes differ, so this module subclasses whichever is installed (``lightning``
first). ``PLStallscopeCallback`` is the ``pytorch_lightning`` one when both are installed.
"""

from __future__ import annotations

import importlib
from typing import Any

from stallscope.integrations import LogFigures, StepHooks, safe_hook
from stallscope.probe import batch_size_of


def _callback_base(module: str) -> Any:
    return importlib.import_module(module).Callback


try:
    _Callback: Any = _callback_base("lightning.pytorch")
except ImportError:  # only the older package name is installed
    _Callback = _callback_base("pytorch_lightning")

__all__ = ["PLStallscopeCallback", "StallscopeCallback"]


def _first_loader(loaders: Any) -> Any:
    """``trainer.train_dataloader`` may be one loader or a list/dict of them."""
    if isinstance(loaders, (list, tuple)) and loaders:
        return loaders[0]
    if isinstance(loaders, dict) and loaders:
        return next(iter(loaders.values()))
    return loaders


class _Hooks:
    """The hooks, independent of which Lightning package provides the base class."""

    def __init__(self, rank: int | None = None, log: bool = True, autotune: bool = False) -> None:
        super().__init__()
        self._core = StepHooks(rank, autotune)
        self._broken = False
        #: the probe's figures go to the trainer's loggers (``self.log``) at its logging
        #: interval (``log_every_n_steps``): ``stallscope/data_wait_share`` and the others of
        #: :class:`~stallscope.integrations.LogFigures`
        self._log = LogFigures() if log else None

    @safe_hook
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._core.start(int(getattr(trainer, "global_rank", 0)))

    @safe_hook
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._core.begin_epoch(
            _first_loader(getattr(trainer, "train_dataloader", None)),
            int(getattr(trainer, "current_epoch", 0)),
        )

    @safe_hook
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._core.begin_step(batch_size_of(batch))

    @safe_hook
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._core.end_step()
        every = int(getattr(trainer, "log_every_n_steps", 50) or 50)
        if self._log is not None and (batch_idx + 1) % every == 0:
            figures = self._log.take(self._core.probe)
            if figures:
                pl_module.log_dict(
                    {f"stallscope/{k}": v for k, v in figures.items()},
                    on_step=True,
                    on_epoch=False,
                    logger=True,
                    prog_bar=False,
                    batch_size=1,
                )

    @safe_hook
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._core.idle()

    @safe_hook
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._core.idle()

    @safe_hook
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._core.finish()

    @safe_hook
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._core.finish()


class StallscopeCallback(_Hooks, _Callback):
    """Records every training step with the stallscope probe (see the module docstring).

    ``rank`` overrides ``trainer.global_rank``. ``autotune=True`` sets the training
    DataLoader's ``num_workers`` and ``prefetch_factor`` between epochs
    (:mod:`stallscope.probe.autotune`; with ``reload_dataloaders_every_n_epochs`` the loader
    Lightning makes anew starts from the best found so far)."""


try:
    _PLCallback: Any = _callback_base("pytorch_lightning")
except ImportError:
    PLStallscopeCallback: Any = StallscopeCallback
else:
    if _PLCallback is _Callback:
        PLStallscopeCallback = StallscopeCallback
    else:

        class _PLStallscopeCallback(_Hooks, _PLCallback):
            """The same callback for ``pytorch_lightning.Trainer``."""

        PLStallscopeCallback = _PLStallscopeCallback
