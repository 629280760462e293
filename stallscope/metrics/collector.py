"""The collector's own cost."""

from __future__ import annotations

from stallscope.metrics.base import _M, Metric

COLLECTOR: tuple[Metric, ...] = (
    # --- the collector's own cost ---------------------------------------------------------------
    _M(
        "collector",
        "cpu_s",
        "s",
        "CPU seconds the collector spent on one sample",
        "gauge",
        "stallscope_collector_sample_cpu_seconds",
    ),
    _M(
        "collector",
        "wall_s",
        "s",
        "wall seconds one sample took",
        "gauge",
        "stallscope_collector_sample_wall_seconds",
    ),
)
