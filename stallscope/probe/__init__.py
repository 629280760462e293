"""The step probe: runs inside the trainer and times every training step.

``stallscope.watch(loader)`` wraps any iterable (a PyTorch ``DataLoader`` above all) and records,
per step (all times in seconds, the ``steps`` table of the run store):

``wait_s``
    host time blocked in ``next(loader)`` (data wait); the first step of an epoch also counts
    ``iter(loader)``, which is where non-persistent DataLoader workers are (re)started.
``host_s``
    host time from the batch handed to the step to the next request (compute, logging...).
``h2d_s``
    host-to-device copy time, when the copy goes through :func:`h2d`.
``gpu_busy_s`` / ``gpu_idle_s``
    on CUDA: GPU time between two CUDA events recorded when the batch is handed over and at the
    step's end, and the GPU-side gap between the previous step's end event and this step's start
    event (the GPU's real idle time, which host wait overstates while queued kernels still run).
``samples``, ``epoch``
    batch size (dim 0 of the first tensor, else ``len(batch)``) and the pass over a watched
    iterable the step belongs to (every ``for`` over a wrapper starts a new epoch).

This is D4 of the brief ("time each batch's load interval, time forward+backward with CUDA
events") done for every step without slowing the step: the training thread only reads
``time.perf_counter`` and calls ``Event.record()``; it never calls ``synchronize()``. Events are
read by a background thread once ``Event.query()`` says they completed. Records go into a bounded
buffer; the background thread writes them to the run store once per ``flush_interval`` (and at
exit); when the buffer is full, records are dropped and counted, never waited for. Nothing the
probe does raises into the trainer: failures are counted and reported once on stderr and as an
event in the run.

Where it reports: into ``$STALLSCOPE_RUN_DIR/run.db`` under ``stallscope run``; otherwise
(standalone) it makes a run directory under ``$STALLSCOPE_OUT`` (default ``./stallscope-runs``),
writes ``meta.json`` and samples the machine itself with a background collector.
``STALLSCOPE_PROBE=0`` turns the probe off (``watch`` then returns the loader unchanged).

The package is split so that other frameworks reuse the recording without PyTorch; the core
never imports a framework, and the two adapters are leaves (they import the core, never each
other):

- :mod:`stallscope.probe.watch`: the framework-free step loop (:class:`Watched`) and
  :func:`watch`, which hands a loader to the adapter that claims it (a ``tf.data.Dataset``: the
  TensorFlow adapter; any other iterable: the PyTorch one), and :func:`step`.
- :mod:`stallscope.probe.recorder`: the framework-free :class:`Recorder` (close/atexit, the
  configuration, :class:`StepTimer`, one recorder per process and rank), made of small parts:
  :mod:`~stallscope.probe.buffer` (the training thread's state and the bounded hand-over of
  :class:`StepRecord` tuples), :mod:`~stallscope.probe.device` (the :class:`DeviceTimer`
  interface and the event pool), :mod:`~stallscope.probe.writer` (the writer thread),
  :mod:`~stallscope.probe.callbacks` (alerts for training-side callbacks) and
  :mod:`~stallscope.probe.notices` (what goes wrong, said once).
- :mod:`stallscope.probe.loaders`: batch sizes and the loader's knobs, read by duck typing.
- :mod:`stallscope.probe.pytorch`: the PyTorch adapter (:func:`h2d`, :class:`Probe`, worker
  pids, torch.distributed rank, CUDA events).
- :mod:`stallscope.probe.keras`: the TensorFlow adapter (:class:`TFProbe`, the tf.data pipeline's
  shape in :func:`dataset_config`, ``model.fit``'s timed train function); it imports TensorFlow
  only inside its functions.
- :mod:`stallscope.probe.standalone`: the monitored session the probe starts for itself when
  ``stallscope run`` is not watching.

This module imports both adapters (so that they register with :func:`watch`) and re-exports the
public names, so ``from stallscope.probe import watch`` and friends stay as they were.
"""

from __future__ import annotations

from stallscope.probe.buffer import DEFAULT_CAPACITY, RawStep, StepRecord
from stallscope.probe.device import DeviceTimer, EventLike, EventTimer
from stallscope.probe.keras import TFProbe, dataset_config
from stallscope.probe.loaders import batch_size_of, loader_config
from stallscope.probe.pytorch import CudaTimer, Probe, detect_rank, get_probe, h2d
from stallscope.probe.recorder import MAX_EPOCHS_KEPT, Recorder, StepTimer, reset
from stallscope.probe.recorder import _probes as _probes  # the registry tests inject into
from stallscope.probe.standalone import DEFAULT_COLLECT_S
from stallscope.probe.watch import Watched, step, watch
from stallscope.probe.writer import CLOSE_WAIT_S, DEFAULT_FLUSH_S

__all__ = [
    "CLOSE_WAIT_S",
    "DEFAULT_CAPACITY",
    "DEFAULT_COLLECT_S",
    "DEFAULT_FLUSH_S",
    "MAX_EPOCHS_KEPT",
    "CudaTimer",
    "DeviceTimer",
    "EventLike",
    "EventTimer",
    "Probe",
    "RawStep",
    "Recorder",
    "StepRecord",
    "StepTimer",
    "TFProbe",
    "Watched",
    "batch_size_of",
    "dataset_config",
    "detect_rank",
    "get_probe",
    "h2d",
    "loader_config",
    "reset",
    "step",
    "watch",
]
