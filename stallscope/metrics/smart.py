"""SMART checks of the watched drives."""

from __future__ import annotations

from stallscope.metrics.base import _M, Metric

SMART: tuple[Metric, ...] = (
    # --- smart: SMART checks of the watched drives, every 10 min (sources/smart/source.py) --
    _M(
        "smart",
        "failing",
        "",
        "1 while the drive's SMART verdict is failing (stallscope disk; docs/disk-health.md)",
        "gauge",
        "stallscope_smart_failing",
        rollup="max",
        label="device",
    ),
    _M(
        "smart",
        "medium_growth",
        "",
        "growth of the medium-defect counters (SMART 5, 187, 197, "
        "198, NVMe media_errors, SAS grown defects) since the baseline check",
        "gauge",
        "stallscope_smart_medium_growth",
        rollup="max",
        label="device",
    ),
    _M(
        "smart",
        "reallocated",
        "",
        "reallocated sectors (smartctl -A ID 5 raw)",
        "gauge",
        "stallscope_smart_reallocated_sectors",
        rollup="max",
        label="device",
    ),
    _M(
        "smart",
        "pending",
        "",
        "pending sectors (smartctl -A ID 197 raw)",
        "gauge",
        "stallscope_smart_pending_sectors",
        rollup="max",
        label="device",
    ),
    _M(
        "smart",
        "nvme_used_pct",
        "%",
        "NVMe endurance used (smartctl -a percentage_used)",
        "gauge",
        "stallscope_smart_nvme_percentage_used_ratio",
        0.01,
        rollup="max",
        label="device",
    ),
    _M(
        "smart",
        "nvme_spare_pct",
        "%",
        "NVMe spare left (smartctl -a available_spare)",
        "gauge",
        "stallscope_smart_nvme_available_spare_ratio",
        0.01,
        label="device",
    ),
    _M(
        "smart",
        "days_left",
        "d",
        "days until a SMART value crosses its threshold at the current "
        "rate (line fitted through past checks; the soonest of reallocated/pending/uncorrectable, "
        "NVMe percentage_used and available_spare)",
        "gauge",
        "stallscope_smart_time_to_threshold_seconds",
        86400.0,
        label="device",
    ),
    _M(
        "procs",
        "d_threads",
        "",
        "the trainer's threads in state D at the sample "
        "(/proc/PID/task/*/stat): I/O waits of loader threads the main thread's state misses",
        "gauge",
        "stallscope_proc_io_wait_threads",
    ),
    _M(
        "procs",
        "tf_threads",
        "",
        "the trainer's threads TensorFlow named (tf_*): a TensorFlow trainer",
        "gauge",
        "stallscope_proc_tensorflow_threads",
    ),
)
