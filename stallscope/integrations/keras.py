"""Keras callback: the step probe for ``model.fit`` with one line of user code::

    from stallscope.integrations.keras import StallscopeCallback
    model.fit(dataset, epochs=..., callbacks=[StallscopeCallback()])

Keras 3 on the TensorFlow backend fetches each batch inside its compiled train function (and
``steps_per_execution`` runs several steps per call), so batch hooks cannot tell input wait from
compute. At ``on_train_begin`` the callback swaps ``model.train_function`` for one that times
each ``get_next()`` inside the graph (:func:`stallscope.probe.keras.instrument`; how and where it
is approximate: docs/probe.md). The pipeline's shape (map parallelism, prefetch, cache,
interleave, files read) is read off the dataset the first call iterates. When the train function
is not Keras 3's (another backend, a future Keras), the callback says so once and times whole
train calls instead: input wait then shows as compute.

The callback overrides no batch hook, so Keras keeps dispatching batch callbacks
asynchronously. At each epoch's end the probe's figures for the epoch join the epoch's ``logs``
(``stallscope_data_wait_share``, ``stallscope_step_ms``): ``History``, ``CSVLogger`` and
``TensorBoard`` record them when they come after this callback in ``callbacks=[...]``
(``log=False`` turns that off).

Importing this module imports Keras (the package is optional: ``pip install
stallscope[tensorflow]``, or ``stallscope[tensorflow-cpu]`` without a GPU).
"""

from __future__ import annotations

import sys
from typing import Any

import keras

from stallscope.integrations import LogFigures, StepHooks, safe_hook
from stallscope.probe.keras import (
    TimedTrainFunction,
    dataset_config,
    get_tf_probe,
    instrument,
    is_tf_dataset,
)
from stallscope.probe.notices import warn

__all__ = ["StallscopeCallback"]


class StallscopeCallback(keras.callbacks.Callback):
    """Records every training step of ``model.fit`` with the stallscope probe (see the module
    docstring). ``rank`` overrides ``$RANK``."""

    def __init__(self, rank: int | None = None, log: bool = True) -> None:
        super().__init__()
        self._core = StepHooks(rank)
        self._log = LogFigures() if log else None
        self._broken = False
        self._graph = False  # True: each step's input wait is timed inside the graph
        self.pending_dataset = True
        self.epoch = 0
        self.samples: int | None = None
        self._fit_dataset: Any = None  # the dataset fit() was given, when it can be found

    # what the timed train function reads and calls
    def describe(self, dataset: Any) -> None:
        self.pending_dataset = False
        p = self._core.probe
        if not is_tf_dataset(dataset):
            # a tf.distribute iterator holds per-replica clones (rebatched, auto-sharded, with
            # a prefetch the user never wrote): describe what the user passed to fit()
            dataset = self._fit_dataset
        if dataset is None or p is None:
            return
        try:
            cfg = dataset_config(dataset)
        except Exception as exc:  # an odd dataset: the steps are still timed
            warn(f"cannot read the tf.data pipeline: {exc!r}")
            return
        size = cfg.get("batch_size")
        self.samples = size if isinstance(size, int) and size > 0 else None
        p.update_config({"loader": cfg})

    @safe_hook
    def on_train_begin(self, logs: Any = None) -> None:
        self._fit_dataset = _fit_dataset()
        self._core.probe = get_tf_probe(self._core.rank)
        p = self._core.probe
        if p is None:
            return
        self._graph = instrument(self.model, p, self)
        if not self._graph:
            warn(
                "this Keras does not fetch batches the way Keras 3 on TensorFlow does: "
                "timing whole train calls only (input wait is counted as compute)"
            )

    @safe_hook
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = int(epoch)
        self._core.begin_epoch(None, self.epoch)

    def _drain(self) -> None:
        fn = getattr(self.model, "train_function", None)
        if isinstance(fn, TimedTrainFunction):
            fn.drain()

    @safe_hook
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._drain()
        p = self._core.probe
        if self._log is not None and p is not None and isinstance(logs, dict):
            logs.update({f"stallscope_{k}": v for k, v in self._log.take(p).items()})

    @safe_hook
    def on_test_end(self, logs: Any = None) -> None:
        self._core.idle()  # validation is not data wait

    @safe_hook
    def on_train_end(self, logs: Any = None) -> None:
        self._fit_dataset = None  # the user's dataset is theirs again
        self._drain()
        self._core.finish()


def _fit_dataset() -> Any:
    """The tf.data dataset ``model.fit`` was given, or None: Keras 3 keeps it only in the data
    adapter of fit's local ``epoch_iterator`` (looked up in the calling frames), and the
    iterator of a multi-replica ``tf.distribute`` strategy does not lead back to it."""
    frame = sys._getframe(1)
    for _ in range(16):
        adapter = getattr(frame.f_locals.get("epoch_iterator"), "data_adapter", None)
        ds = getattr(adapter, "_dataset", None)
        if is_tf_dataset(ds):
            return ds
        if frame.f_back is None:
            break
        frame = frame.f_back
    return None
