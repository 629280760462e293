"""The ``gpu`` source: NVIDIA GPUs through NVML (``nvidia-ml-py``), in-process.

Every NVML call goes through one lazily initialised entry point, :class:`Nvml` (the nvitop
pattern): the first call runs ``nvmlInit``; a driver or library that is missing becomes one
:class:`~stallscope.errors.SourceUnavailable` with a one-line reason, remembered and raised
again without retrying; "not supported"/"N/A" answers become ``None``; a GPU that falls off the
bus (``NVML_ERROR_GPU_IS_LOST``, ``NVML_ERROR_UNKNOWN``...) is reported gone once and the other
GPUs go on. The NVML backend is a constructor argument (default: the real ``pynvml`` module), so
tests run this exact code against :class:`~stallscope.testing.nvml_replay.NvmlReplay`.

The package's rooms: :mod:`~stallscope.sources.gpu.nvml` (the NVML entry),
:mod:`~stallscope.sources.gpu.reading` (what one reading holds), :mod:`~stallscope.sources.gpu.
health` (XIDs, remapped rows, retired pages), :mod:`~stallscope.sources.gpu.gpm` (GPM),
:mod:`~stallscope.sources.gpu.slow` (the helper thread's slow values),
:mod:`~stallscope.sources.gpu.processes` (the processes on a GPU) and
:mod:`~stallscope.sources.gpu.source` (:class:`GpuSource`, which reads them all).

One reading per GPU is a :class:`GpuReading`; the payload of :meth:`GpuSource.sample` is the
list of their :meth:`~GpuReading.as_dict` -- the ``gpu`` part of ``snapshot --json``
(docs/architecture.md) plus ``sm_clock_max_mhz``, ``throttle_mask``, the GPM fields and
``processes``. Field meanings, NVML calls and ``nvidia-smi`` equivalents: docs/gpu-metrics.md.
"""

from stallscope.sources.gpu.health import APP_XIDS, XID_MEANINGS, health_parts
from stallscope.sources.gpu.nvml import THROTTLE_REASONS, GpuLost, Nvml, decode_throttle
from stallscope.sources.gpu.reading import GpuProcess, GpuReading, MigInstance
from stallscope.sources.gpu.source import GpuSource, mig_profile

__all__ = [
    "APP_XIDS",
    "THROTTLE_REASONS",
    "XID_MEANINGS",
    "GpuLost",
    "GpuProcess",
    "GpuReading",
    "GpuSource",
    "MigInstance",
    "Nvml",
    "decode_throttle",
    "health_parts",
    "mig_profile",
]
