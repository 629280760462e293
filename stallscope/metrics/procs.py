"""The trainer's process tree (htop / iotop / pidstat -d)."""

from __future__ import annotations

from stallscope.metrics.base import _M, Metric

PROCS: tuple[Metric, ...] = (
    # --- procs: the trainer's process tree (htop / iotop / pidstat -d) ---------------------------
    _M(
        "procs",
        "cpu_pct",
        "%",
        "CPU use of one process, 100 = one core (htop CPU%)",
        "gauge",
        "stallscope_proc_cpu_ratio",
        0.01,
    ),
    _M(
        "procs",
        "main_thread_active_pct",
        "%",
        "share of time the process's main thread ran "
        "or was ready to run (/proc/PID/task/PID/schedstat run + run-queue time): in a "
        "trainer, the time its training loop works rather than waits, CPU contention aside",
        "gauge",
        "stallscope_proc_main_thread_active_ratio",
        0.01,
    ),
    _M(
        "procs",
        "rss_mib",
        "MiB",
        "resident memory (htop RES)",
        "gauge",
        "stallscope_proc_resident_memory_bytes",
        1048576.0,
    ),
    _M(
        "procs",
        "read_kb_s",
        "kB/s",
        "bytes read from storage (iotop DISK READ, /proc/PID/io read_bytes)",
        "rate",
        "stallscope_proc_read_bytes_per_second",
        1024.0,
    ),
    _M(
        "procs",
        "write_kb_s",
        "kB/s",
        "bytes written to storage (/proc/PID/io write_bytes)",
        "rate",
        "stallscope_proc_write_bytes_per_second",
        1024.0,
    ),
    _M(
        "procs",
        "rchar_kb_s",
        "kB/s",
        "bytes read incl. page cache (/proc/PID/io rchar)",
        "rate",
        "stallscope_proc_read_chars_per_second",
        1024.0,
    ),
    _M(
        "procs",
        "d_state",
        "",
        "1 if the process was in state D (waiting on I/O) at the sample",
        "gauge",
        "stallscope_proc_io_wait_state",
    ),
    _M(
        "procs",
        "runq_wait_pct",
        "%",
        "time runnable but waiting for a CPU (/proc/PID/schedstat)",
        "gauge",
        "stallscope_proc_runqueue_wait_ratio",
        0.01,
    ),
    _M(
        "procs",
        "blkio_wait_pct",
        "%",
        "time blocked on block I/O (delayacct_blkio_ticks)",
        "gauge",
        "stallscope_proc_blkio_wait_ratio",
        0.01,
    ),
    _M("procs", "threads", "", "threads (htop NLWP)", "gauge", "stallscope_proc_threads"),
    _M(
        "procs",
        "processes",
        "",
        "processes the series sums: a rank's DataLoader workers "
        'when the agent\'s worker_series is "rank" (pid "<trainer pid>/workers"); absent on '
        "the series of one process",
        "gauge",
        "stallscope_proc_processes",
    ),
)
