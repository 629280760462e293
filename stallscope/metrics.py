"""The one metric vocabulary: every number stallscope records is declared here once.

Each :class:`Metric` names the source it comes from, its key in that source's payload (the
``snapshot --json`` key), its unit, whether it is a gauge or a rate derived from a counter, the
classic command it replaces, and the Prometheus name in base units with the factor that converts
to it. The run store, JSON output, the report, the agent's Prometheus exporter and the live
view all read this table instead of keeping their own lists.

Raw counters (kind ``"counter"``) are the cumulative kernel counters the rates are computed
from, kept because Prometheus users expect ``*_total`` counters and take ``rate()``
themselves. They are not in any ``sample()`` payload: a source hands them out through
``Source.counters()`` as ``(name, entity, value)``. Naming scheme:

* the key is the Prometheus name without ``stallscope_<source>_`` (``disk.read_bytes_total``
  is ``stallscope_disk_read_bytes_total``; procs use ``stallscope_proc_`` as their gauges do);
  every counter's Prometheus name, and only a counter's, ends in ``_total``;
* values are already in base units (seconds, bytes, plain counts), so ``prom_scale`` is 1;
* the entity is the value of one Prometheus label, named by :attr:`Metric.label` (set on every
  metric, by source in :data:`SOURCE_LABEL`; :mod:`stallscope.labels` spells it): the device
  for disk (``device``), the pid for procs (``pid``), and the CPU mode for
  ``host.cpu_seconds_total`` (``mode``: ``user``, ``nice``, ``system``, ``idle``,
  ``iowait``, ``irq``, ``softirq``, ``steal``, summed over all CPUs), so
  ``stallscope_host_cpu_seconds_total{mode="iowait"}`` reads like node_exporter's
  ``node_cpu_seconds_total``. Host counters without a label (swap, PSI) have entity "".
* names follow node_exporter where one exists (``node_disk_*``, ``node_cpu_seconds_total``,
  ``node_pressure_*``), and each help line names that equivalent and the ``/proc`` field.

:func:`by_source` lists the payload metrics (gauges and rates) unless asked for counters too,
so "the keys of a payload" stays what it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["METRICS", "SOURCE_LABEL", "Metric", "Point", "by_source", "lookup"]

#: gauge: a level; rate: per-second growth of a counter over one interval (in a payload);
#: counter: the raw cumulative counter itself (from ``Source.counters()``, never in a payload)
Kind = Literal["gauge", "rate", "counter"]


@dataclass(frozen=True)
class Metric:
    source: str  #: "disk", "gpu", "host", "procs", "collector"
    key: str  #: key in the source's payload, e.g. "r_await_ms"
    unit: str  #: human unit: "ms", "%", "kB/s", "MiB", "W", ...
    help: str  #: one line; names the classic equivalent
    kind: Kind = "gauge"
    prom: str = ""  #: Prometheus name (base units), "" = not exported
    prom_scale: float = 1.0  #: multiply the stored value by this to get the Prometheus unit
    #: what a downsampled bucket keeps for reading back: "mean", or "max" where a mean is not
    #: a value the metric can take (bitmasks, link generations)
    rollup: str = "mean"
    #: computed by the collector from several sources' payloads, not read by the source itself
    derived: bool = False
    #: the Prometheus label whose value is the entity: "device", "gpu", "pid", "cpu", "mode",
    #: "rank"; "" for a metric about the whole host (no entity). How each is spelled, both
    #: ways, is :data:`stallscope.labels.ENTITY_LABELS`
    label: str = ""

    @property
    def name(self) -> str:
        """Store name: ``<source>.<key>``."""
        return f"{self.source}.{self.key}"


class Point(NamedTuple):
    """One number: metric ``name`` (``source.key``) about ``entity`` (``vda``, ``gpu0``, a pid,
    ``cpu3``, ``""`` for the host as a whole), as sources produce it and sinks consume it."""

    name: str
    entity: str
    value: float


#: the entity label of each source's metrics (:mod:`stallscope.labels` holds how each is
#: spelled); a metric of another shape says its own (``host.cpu_core_pct``: ``cpu``)
SOURCE_LABEL = {
    "disk": "device",
    "gpu": "gpu",
    "procs": "pid",
    "smart": "device",
    "probe": "rank",
    "stacks": "pid",
    "host": "",
    "collector": "",
}


def _M(
    source: str,
    key: str,
    unit: str,
    help: str,
    kind: Kind = "gauge",
    prom: str = "",
    prom_scale: float = 1.0,
    *,
    rollup: str = "mean",
    derived: bool = False,
    label: str | None = None,
) -> Metric:
    return Metric(
        source,
        key,
        unit,
        help,
        kind,
        prom,
        prom_scale,
        rollup,
        derived,
        SOURCE_LABEL[source] if label is None else label,
    )


METRICS: tuple[Metric, ...] = (
    # --- disk: exactly sysstat's `iostat -x` columns -------------------------------------------
    _M(
        "disk",
        "r_s",
        "1/s",
        "reads completed per second (iostat -x r/s)",
        "rate",
        "stallscope_disk_reads_per_second",
    ),
    _M(
        "disk",
        "w_s",
        "1/s",
        "writes completed per second (iostat -x w/s)",
        "rate",
        "stallscope_disk_writes_per_second",
    ),
    _M(
        "disk",
        "rkb_s",
        "kB/s",
        "data read per second (iostat -x rkB/s)",
        "rate",
        "stallscope_disk_read_bytes_per_second",
        1024.0,
    ),
    _M(
        "disk",
        "wkb_s",
        "kB/s",
        "data written per second (iostat -x wkB/s)",
        "rate",
        "stallscope_disk_write_bytes_per_second",
        1024.0,
    ),
    _M(
        "disk",
        "rrqm_s",
        "1/s",
        "read requests merged per second (iostat -x rrqm/s)",
        "rate",
        "stallscope_disk_read_merges_per_second",
    ),
    _M(
        "disk",
        "wrqm_s",
        "1/s",
        "write requests merged per second (iostat -x wrqm/s)",
        "rate",
        "stallscope_disk_write_merges_per_second",
    ),
    _M(
        "disk",
        "r_await_ms",
        "ms",
        "mean read latency incl. queueing (iostat -x r_await)",
        "gauge",
        "stallscope_disk_read_await_seconds",
        1e-3,
    ),
    _M(
        "disk",
        "w_await_ms",
        "ms",
        "mean write latency incl. queueing (iostat -x w_await)",
        "gauge",
        "stallscope_disk_write_await_seconds",
        1e-3,
    ),
    _M(
        "disk",
        "aqu_sz",
        "",
        "average queue length (iostat -x aqu-sz)",
        "gauge",
        "stallscope_disk_queue_length",
    ),
    _M(
        "disk",
        "rareq_kb",
        "kB",
        "average read request size (iostat -x rareq-sz)",
        "gauge",
        "stallscope_disk_read_request_bytes",
        1024.0,
    ),
    _M(
        "disk",
        "wareq_kb",
        "kB",
        "average write request size (iostat -x wareq-sz)",
        "gauge",
        "stallscope_disk_write_request_bytes",
        1024.0,
    ),
    _M(
        "disk",
        "util_pct",
        "%",
        "share of time the device had I/O in flight (iostat -x %util)",
        "gauge",
        "stallscope_disk_busy_ratio",
        0.01,
    ),
    # --- gpu: NVML, named after nvidia-smi --query-gpu fields ----------------------------------
    _M(
        "gpu",
        "util_pct",
        "%",
        "time a kernel ran (nvidia-smi utilization.gpu)",
        "gauge",
        "stallscope_gpu_utilization_ratio",
        0.01,
    ),
    _M(
        "gpu",
        "mem_util_pct",
        "%",
        "time memory was read/written (utilization.memory)",
        "gauge",
        "stallscope_gpu_memory_utilization_ratio",
        0.01,
    ),
    _M(
        "gpu",
        "mem_used_mib",
        "MiB",
        "framebuffer memory used (memory.used)",
        "gauge",
        "stallscope_gpu_memory_used_bytes",
        1048576.0,
    ),
    _M(
        "gpu",
        "mem_total_mib",
        "MiB",
        "framebuffer memory total (memory.total)",
        "gauge",
        "stallscope_gpu_memory_total_bytes",
        1048576.0,
    ),
    _M(
        "gpu",
        "temp_c",
        "°C",
        "GPU core temperature (temperature.gpu)",
        "gauge",
        "stallscope_gpu_temperature_celsius",
    ),
    _M("gpu", "power_w", "W", "power draw (power.draw)", "gauge", "stallscope_gpu_power_watts"),
    _M(
        "gpu",
        "power_limit_w",
        "W",
        "enforced power limit (enforced.power.limit)",
        "gauge",
        "stallscope_gpu_power_limit_watts",
    ),
    _M(
        "gpu",
        "sm_clock_mhz",
        "MHz",
        "SM clock (clocks.sm)",
        "gauge",
        "stallscope_gpu_sm_clock_hertz",
        1e6,
    ),
    _M(
        "gpu",
        "sm_clock_max_mhz",
        "MHz",
        "max SM clock (clocks.max.sm)",
        "gauge",
        "stallscope_gpu_sm_clock_max_hertz",
        1e6,
    ),
    _M(
        "gpu",
        "throttle_mask",
        "",
        "clock event reasons bitmask (clocks_event_reasons.active)",
        "gauge",
        "stallscope_gpu_throttle_reasons",
        rollup="max",
    ),
    _M(
        "gpu",
        "pcie_gen",
        "",
        "current PCIe generation (pcie.link.gen.current)",
        "gauge",
        "stallscope_gpu_pcie_link_generation",
        rollup="max",
    ),
    _M(
        "gpu",
        "pcie_gen_max",
        "",
        "max PCIe generation (pcie.link.gen.max)",
        "gauge",
        "stallscope_gpu_pcie_link_generation_max",
        rollup="max",
    ),
    _M(
        "gpu",
        "pcie_width",
        "lanes",
        "current PCIe width (pcie.link.width.current)",
        "gauge",
        "stallscope_gpu_pcie_link_width",
        rollup="max",
    ),
    _M(
        "gpu",
        "pcie_width_max",
        "lanes",
        "max PCIe width (pcie.link.width.max)",
        "gauge",
        "stallscope_gpu_pcie_link_width_max",
        rollup="max",
    ),
    _M(
        "gpu",
        "pcie_rx_kb_s",
        "kB/s",
        "PCIe receive throughput (nvidia-smi dmon rxpci)",
        "gauge",
        "stallscope_gpu_pcie_rx_bytes_per_second",
        1024.0,
    ),
    _M(
        "gpu",
        "pcie_tx_kb_s",
        "kB/s",
        "PCIe transmit throughput (nvidia-smi dmon txpci)",
        "gauge",
        "stallscope_gpu_pcie_tx_bytes_per_second",
        1024.0,
    ),
    _M(
        "gpu",
        "ecc_errors",
        "",
        "volatile uncorrected ECC errors (ecc.errors.uncorrected.volatile.total)",
        "gauge",
        "stallscope_gpu_ecc_uncorrected_errors",
    ),
    _M(
        "gpu",
        "trainer_mem_mib",
        "MiB",
        "GPU memory held by the trainer's processes "
        "(nvidia-smi --query-compute-apps=pid,used_memory for the trainer's pids)",
        "gauge",
        "stallscope_gpu_trainer_memory_used_bytes",
        1048576.0,
        derived=True,
    ),
    # one process on one GPU (entity ``gpu<N>:<pid>``): GPU use per process, whoever owns it
    _M(
        "gpu",
        "proc_mem_mib",
        "MiB",
        "GPU memory one process holds on this GPU (nvidia-smi --query-compute-apps used_memory)",
        "gauge",
        "stallscope_gpu_process_memory_used_bytes",
        1048576.0,
        label="gpu_pid",
    ),
    _M(
        "gpu",
        "proc_sm_pct",
        "%",
        "share of the GPU's SMs one process used since the previous "
        "sample (nvidia-smi pmon sm; none under MIG)",
        "gauge",
        "stallscope_gpu_process_sm_utilization_ratio",
        0.01,
        label="gpu_pid",
    ),
    _M(
        "gpu",
        "proc_mem_util_pct",
        "%",
        "share of the GPU's memory bandwidth one process used "
        "since the previous sample (nvidia-smi pmon mem; none under MIG)",
        "gauge",
        "stallscope_gpu_process_memory_utilization_ratio",
        0.01,
        label="gpu_pid",
    ),
    # one MIG GPU instance (entity ``gpu<N>/gi<ID>``), labelled as dcgm-exporter labels them
    _M(
        "gpu",
        "mig_mem_used_mib",
        "MiB",
        "framebuffer used in one MIG GPU instance (nvidia-smi MIG devices, Memory-Usage)",
        "gauge",
        "stallscope_gpu_mig_memory_used_bytes",
        1048576.0,
        label="gpu_mig",
    ),
    _M(
        "gpu",
        "mig_mem_total_mib",
        "MiB",
        "framebuffer of one MIG GPU instance",
        "gauge",
        "stallscope_gpu_mig_memory_total_bytes",
        1048576.0,
        label="gpu_mig",
    ),
    _M(
        "gpu",
        "throttle_serious",
        "",
        "1 while the clocks are held down for heat or a hardware "
        "power brake (hw_slowdown, sw_thermal, hw_thermal, hw_power_brake in "
        "clocks_event_reasons.active), else 0",
        "gauge",
        "stallscope_gpu_throttle_serious",
        rollup="max",
        derived=True,
    ),
    _M(
        "gpu",
        "sm_active_pct",
        "%",
        "GPM SM activity, Hopper+ (DCGM PROF_SM_ACTIVE)",
        "gauge",
        "stallscope_gpu_sm_active_ratio",
        0.01,
    ),
    _M(
        "gpu",
        "sm_occupancy_pct",
        "%",
        "GPM SM occupancy, Hopper+ (DCGM PROF_SM_OCCUPANCY)",
        "gauge",
        "stallscope_gpu_sm_occupancy_ratio",
        0.01,
    ),
    _M(
        "gpu",
        "tensor_active_pct",
        "%",
        "GPM tensor pipe activity, Hopper+ (DCGM PROF_PIPE_TENSOR_ACTIVE)",
        "gauge",
        "stallscope_gpu_tensor_active_ratio",
        0.01,
    ),
    # GPU health (issue 38): dcgm-exporter's defaults we lacked, nvidia-smi's names in brackets
    _M(
        "gpu",
        "mem_temp_c",
        "°C",
        "HBM memory temperature (temperature.memory; DCGM_FI_DEV_MEMORY_TEMP)",
        "gauge",
        "stallscope_gpu_memory_temperature_celsius",
    ),
    _M(
        "gpu",
        "energy_j",
        "J",
        "energy used since the driver loaded (nvmlDeviceGetTotalEnergy"
        "Consumption; exported as the counter gpu.energy_joules_total)",
        "gauge",
        rollup="max",
    ),
    _M(
        "gpu",
        "pcie_replays",
        "",
        "PCIe replays since the driver loaded (nvidia-smi -q Replays "
        "Since Reset; exported as gpu.pcie_replays_total)",
        "gauge",
        rollup="max",
    ),
    _M(
        "gpu",
        "remapped_rows_correctable",
        "",
        "rows remapped after correctable ECC errors "
        "(remapped_rows.correctable; DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS)",
        "gauge",
        "stallscope_gpu_remapped_rows_correctable",
        rollup="max",
    ),
    _M(
        "gpu",
        "remapped_rows_uncorrectable",
        "",
        "rows remapped after uncorrectable ECC errors "
        "(remapped_rows.uncorrectable; DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS)",
        "gauge",
        "stallscope_gpu_remapped_rows_uncorrectable",
        rollup="max",
    ),
    _M(
        "gpu",
        "row_remap_pending",
        "",
        "1 while a row remap waits for a GPU reset "
        "(remapped_rows.pending; DCGM_FI_DEV_ROW_REMAP_PENDING)",
        "gauge",
        "stallscope_gpu_row_remap_pending",
        rollup="max",
    ),
    _M(
        "gpu",
        "row_remap_failed",
        "",
        "1 once a row remap failed (remapped_rows.failure; DCGM_FI_DEV_ROW_REMAP_FAILURE)",
        "gauge",
        "stallscope_gpu_row_remap_failure",
        rollup="max",
    ),
    _M(
        "gpu",
        "retired_pages",
        "",
        "pages retired for ECC errors, before Ampere "
        "(retired_pages.sbe + .dbe; DCGM_FI_DEV_RETIRED_SBE + _DBE)",
        "gauge",
        "stallscope_gpu_retired_pages",
        rollup="max",
    ),
    _M(
        "gpu",
        "retired_pages_pending",
        "",
        "1 while a page retirement waits for a reset "
        "(retired_pages.pending; DCGM_FI_DEV_RETIRED_PENDING)",
        "gauge",
        "stallscope_gpu_retired_pages_pending",
        rollup="max",
    ),
    _M(
        "gpu",
        "xid_count",
        "",
        "XID errors since the source opened, application XIDs left out "
        "(exported per code as gpu.xid_errors_total)",
        "gauge",
        rollup="max",
    ),
    _M(
        "gpu",
        "xid_last",
        "",
        "the last XID code, 0 for none (DCGM_FI_DEV_XID_ERRORS)",
        "gauge",
        "stallscope_gpu_xid_last_code",
        rollup="max",
    ),
    _M(
        "gpu",
        "health_problem",
        "",
        "1 when the GPU needs a person: an XID, a pending or failed "
        "row remap, a pending page retirement, or uncorrected ECC errors, remapped rows or "
        "retired pages that grew during the run",
        "gauge",
        "stallscope_gpu_health_problem",
        rollup="max",
    ),
    # --- host: /proc, psutil ---------------------------------------------------------------------
    _M(
        "host",
        "cpu_pct",
        "%",
        "all-CPU busy time (top %Cpu us+sy+ni+irq+si+st)",
        "gauge",
        "stallscope_host_cpu_busy_ratio",
        0.01,
    ),
    _M(
        "host",
        "iowait_pct",
        "%",
        "CPU time idle with I/O outstanding (top wa)",
        "gauge",
        "stallscope_host_cpu_iowait_ratio",
        0.01,
    ),
    _M(
        "host",
        "cpu_max_core_pct",
        "%",
        "busiest single core (htop per-core bars)",
        "gauge",
        "stallscope_host_cpu_max_core_busy_ratio",
        0.01,
    ),
    _M(
        "host",
        "cpu_core_pct",
        "%",
        "busy time of one core; entity cpuN (mpstat -P ALL)",
        "gauge",
        "stallscope_host_cpu_core_busy_ratio",
        0.01,
        label="cpu",
    ),
    _M("host", "load1", "", "1-minute load average (uptime)", "gauge", "stallscope_host_load1"),
    _M(
        "host",
        "mem_used_mib",
        "MiB",
        "memory in use, excluding cache (free -m used)",
        "gauge",
        "stallscope_host_memory_used_bytes",
        1048576.0,
    ),
    _M(
        "host",
        "mem_total_mib",
        "MiB",
        "memory total (free -m total)",
        "gauge",
        "stallscope_host_memory_total_bytes",
        1048576.0,
    ),
    _M(
        "host",
        "mem_available_mib",
        "MiB",
        "memory available (free -m available)",
        "gauge",
        "stallscope_host_memory_available_bytes",
        1048576.0,
    ),
    _M(
        "host",
        "page_cache_mib",
        "MiB",
        "page cache (free -m buff/cache)",
        "gauge",
        "stallscope_host_page_cache_bytes",
        1048576.0,
    ),
    _M(
        "host",
        "swap_used_mib",
        "MiB",
        "swap in use (free -m swap used)",
        "gauge",
        "stallscope_host_swap_used_bytes",
        1048576.0,
    ),
    _M(
        "host",
        "swap_in_kb_s",
        "kB/s",
        "swapped in per second (vmstat si)",
        "rate",
        "stallscope_host_swap_in_bytes_per_second",
        1024.0,
    ),
    _M(
        "host",
        "swap_out_kb_s",
        "kB/s",
        "swapped out per second (vmstat so)",
        "rate",
        "stallscope_host_swap_out_bytes_per_second",
        1024.0,
    ),
    _M(
        "host",
        "shm_used_mib",
        "MiB",
        "/dev/shm used (df /dev/shm)",
        "gauge",
        "stallscope_host_shm_used_bytes",
        1048576.0,
    ),
    _M(
        "host",
        "shm_used_pct",
        "%",
        "/dev/shm used, share of its size (df /dev/shm Use%)",
        "gauge",
        "stallscope_host_shm_used_ratio",
        0.01,
        derived=True,
    ),
    _M(
        "host",
        "shm_total_mib",
        "MiB",
        "/dev/shm size (df /dev/shm)",
        "gauge",
        "stallscope_host_shm_total_bytes",
        1048576.0,
    ),
    _M(
        "host",
        "psi_io_some_pct",
        "%",
        "share of time some task stalled on I/O (/proc/pressure/io some avg10)",
        "gauge",
        "stallscope_host_psi_io_some_ratio",
        0.01,
    ),
    _M(
        "host",
        "psi_io_full_pct",
        "%",
        "share of time all tasks stalled on I/O (/proc/pressure/io full avg10)",
        "gauge",
        "stallscope_host_psi_io_full_ratio",
        0.01,
    ),
    _M(
        "host",
        "psi_cpu_some_pct",
        "%",
        "share of time some task waited for a CPU (/proc/pressure/cpu some avg10)",
        "gauge",
        "stallscope_host_psi_cpu_some_ratio",
        0.01,
    ),
    _M(
        "host",
        "psi_mem_some_pct",
        "%",
        "share of time some task stalled on memory (/proc/pressure/memory some avg10)",
        "gauge",
        "stallscope_host_psi_memory_some_ratio",
        0.01,
    ),
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
    # --- probe: the trainer's steps, per rank (entity rank<N>), last 30 s (sources/steps.py), ---
    # for the alert engine of a run; not exported (the agent exports stallscope_train_* counters)
    _M(
        "probe",
        "wait_pct",
        "%",
        "share of step wall time the rank waited for data over the last "
        "30 s, sum(wait_s) / sum(wait_s + host_s) of the probe's steps",
        "gauge",
        "",
        0.01,
        label="rank",
    ),
    _M(
        "probe",
        "step_ms",
        "ms",
        "median step time of the rank over the last 30 s (probe wait_s + host_s)",
        "gauge",
        "",
        1e-3,
        label="rank",
    ),
    _M(
        "probe",
        "rank_slowdown",
        "",
        "the rank's median step time over the other ranks' median "
        "(last 30 s; 1 = as fast as the others)",
        "gauge",
        "",
        label="rank",
    ),
    _M(
        "probe",
        "peers_wait_pct",
        "%",
        "how much more of their step the other ranks spent in "
        "collectives than this rank over the last interval (the largest share among the others "
        "minus its own; DDP with communication timed)",
        "gauge",
        "",
        0.01,
        label="rank",
    ),
    _M(
        "probe",
        "waited_for",
        "",
        "1 while the other ranks wait for this rank in the "
        "all-reduce (a change in its peers' wait, or a gap of 15 points held; "
        "sources/straggler.py), else 0",
        "gauge",
        "",
        label="rank",
    ),
    # --- stacks: where the training thread's time went, from sampled stacks (per process; ---
    # sources/stacks/; docs/diagnosis.md): shares of the last 10 s of sampled training time;
    # for a run's alerts and `top`, and the agent's /metrics (agent/trainstacks.py)
    *(
        _M(
            "stacks",
            f"{phase}_pct",
            "%",
            f"share of the training thread's time {what}, from its sampled stacks",
            "gauge",
            f"stallscope_stacks_{phase}_ratio",
            0.01,
        )
        for phase, what in (
            ("data", "waiting for or loading data"),
            ("h2d", "copying to the device"),
            ("compute", "computing (forward, backward, optimizer)"),
            ("gpu_wait", "waiting for the GPU (synchronize, .item())"),
            ("comm", "in collective communication"),
            ("ckpt", "in checkpoint I/O"),
            ("graph", "inside a compiled TensorFlow function"),
            ("other", "elsewhere"),
        )
    ),
    _M(
        "stacks",
        "sampled_s",
        "s",
        "seconds of training time the samples of the interval stand "
        "for (start-up left out; the last 10 s)",
        "gauge",
        "stallscope_stacks_sampled_seconds",
    ),
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
    # --- raw cumulative counters (Source.counters(), not in payloads; see the module doc) ------
    _M(
        "gpu",
        "xid_errors_total",
        "",
        "XID critical errors per code since the agent started, "
        "application XIDs (13, 31, 43, 45, 68, 109) left out (nvmlEventSetWait; "
        "DCGM_FI_DEV_XID_ERRORS)",
        "counter",
        "stallscope_gpu_xid_errors_total",
        label="gpu_xid",
    ),
    _M(
        "gpu",
        "energy_joules_total",
        "J",
        "energy used since the driver loaded "
        "(nvmlDeviceGetTotalEnergyConsumption / 1000; DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION)",
        "counter",
        "stallscope_gpu_energy_joules_total",
    ),
    _M(
        "gpu",
        "pcie_replays_total",
        "",
        "PCIe replays since the driver loaded "
        "(nvmlDeviceGetPcieReplayCounter; DCGM_FI_DEV_PCIE_REPLAY_COUNTER)",
        "counter",
        "stallscope_gpu_pcie_replays_total",
    ),
    _M(
        "disk",
        "reads_completed_total",
        "",
        "reads completed (/proc/diskstats field 4; node_disk_reads_completed_total)",
        "counter",
        "stallscope_disk_reads_completed_total",
        label="device",
    ),
    _M(
        "disk",
        "reads_merged_total",
        "",
        "reads merged (/proc/diskstats field 5; node_disk_reads_merged_total)",
        "counter",
        "stallscope_disk_reads_merged_total",
        label="device",
    ),
    _M(
        "disk",
        "read_bytes_total",
        "B",
        "bytes read, sectors x 512 (/proc/diskstats field 6; node_disk_read_bytes_total)",
        "counter",
        "stallscope_disk_read_bytes_total",
        label="device",
    ),
    _M(
        "disk",
        "read_time_seconds_total",
        "s",
        "time spent on reads (/proc/diskstats field 7, ms; node_disk_read_time_seconds_total)",
        "counter",
        "stallscope_disk_read_time_seconds_total",
        label="device",
    ),
    _M(
        "disk",
        "writes_completed_total",
        "",
        "writes completed (/proc/diskstats field 8; node_disk_writes_completed_total)",
        "counter",
        "stallscope_disk_writes_completed_total",
        label="device",
    ),
    _M(
        "disk",
        "writes_merged_total",
        "",
        "writes merged (/proc/diskstats field 9; node_disk_writes_merged_total)",
        "counter",
        "stallscope_disk_writes_merged_total",
        label="device",
    ),
    _M(
        "disk",
        "written_bytes_total",
        "B",
        "bytes written, sectors x 512 (/proc/diskstats field 10; node_disk_written_bytes_total)",
        "counter",
        "stallscope_disk_written_bytes_total",
        label="device",
    ),
    _M(
        "disk",
        "write_time_seconds_total",
        "s",
        "time spent on writes (/proc/diskstats field 11, ms; node_disk_write_time_seconds_total)",
        "counter",
        "stallscope_disk_write_time_seconds_total",
        label="device",
    ),
    _M(
        "disk",
        "io_time_seconds_total",
        "s",
        "time with I/O in flight (/proc/diskstats field 13, ms; node_disk_io_time_seconds_total)",
        "counter",
        "stallscope_disk_io_time_seconds_total",
        label="device",
    ),
    _M(
        "disk",
        "io_time_weighted_seconds_total",
        "s",
        "weighted time doing I/O (/proc/diskstats "
        "field 14, ms; node_disk_io_time_weighted_seconds_total)",
        "counter",
        "stallscope_disk_io_time_weighted_seconds_total",
        label="device",
    ),
    _M(
        "host",
        "cpu_seconds_total",
        "s",
        "CPU time per mode (entity), all CPUs summed "
        "(/proc/stat cpu line / SC_CLK_TCK; node_cpu_seconds_total)",
        "counter",
        "stallscope_host_cpu_seconds_total",
        label="mode",
    ),
    _M(
        "host",
        "swap_in_bytes_total",
        "B",
        "swapped in, pages x page size (/proc/vmstat pswpin; node_vmstat_pswpin)",
        "counter",
        "stallscope_host_swap_in_bytes_total",
    ),
    _M(
        "host",
        "swap_out_bytes_total",
        "B",
        "swapped out, pages x page size (/proc/vmstat pswpout; node_vmstat_pswpout)",
        "counter",
        "stallscope_host_swap_out_bytes_total",
    ),
    _M(
        "host",
        "psi_io_some_seconds_total",
        "s",
        "time some task stalled on I/O "
        "(/proc/pressure/io some total=, µs; node_pressure_io_waiting_seconds_total)",
        "counter",
        "stallscope_host_psi_io_some_seconds_total",
    ),
    _M(
        "host",
        "psi_io_full_seconds_total",
        "s",
        "time all tasks stalled on I/O "
        "(/proc/pressure/io full total=, µs; node_pressure_io_stalled_seconds_total)",
        "counter",
        "stallscope_host_psi_io_full_seconds_total",
    ),
    _M(
        "host",
        "psi_cpu_some_seconds_total",
        "s",
        "time some task waited for a CPU "
        "(/proc/pressure/cpu some total=, µs; node_pressure_cpu_waiting_seconds_total)",
        "counter",
        "stallscope_host_psi_cpu_some_seconds_total",
    ),
    _M(
        "host",
        "psi_cpu_full_seconds_total",
        "s",
        "time all tasks waited for a CPU (/proc/pressure/cpu full total=, µs, kernel 5.13+)",
        "counter",
        "stallscope_host_psi_cpu_full_seconds_total",
    ),
    _M(
        "host",
        "psi_mem_some_seconds_total",
        "s",
        "time some task stalled on memory "
        "(/proc/pressure/memory some total=, µs; node_pressure_memory_waiting_seconds_total)",
        "counter",
        "stallscope_host_psi_memory_some_seconds_total",
    ),
    _M(
        "host",
        "psi_mem_full_seconds_total",
        "s",
        "time all tasks stalled on memory "
        "(/proc/pressure/memory full total=, µs; node_pressure_memory_stalled_seconds_total)",
        "counter",
        "stallscope_host_psi_memory_full_seconds_total",
    ),
    _M(
        "procs",
        "cpu_seconds_total",
        "s",
        "CPU time of one process, utime+stime "
        "(/proc/PID/stat fields 14+15 / SC_CLK_TCK; process_cpu_seconds_total)",
        "counter",
        "stallscope_proc_cpu_seconds_total",
        label="pid",
    ),
    _M(
        "procs",
        "read_bytes_total",
        "B",
        "bytes read from storage (/proc/PID/io read_bytes; iotop, pidstat -d)",
        "counter",
        "stallscope_proc_read_bytes_total",
        label="pid",
    ),
    _M(
        "procs",
        "write_bytes_total",
        "B",
        "bytes written to storage (/proc/PID/io write_bytes; pidstat -d)",
        "counter",
        "stallscope_proc_write_bytes_total",
        label="pid",
    ),
    _M(
        "procs",
        "rchar_bytes_total",
        "B",
        "bytes read incl. page cache (/proc/PID/io rchar)",
        "counter",
        "stallscope_proc_rchar_bytes_total",
        label="pid",
    ),
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

_BY_NAME = {m.name: m for m in METRICS}


def lookup(name: str) -> Metric | None:
    """The metric called ``<source>.<key>``, or None."""
    return _BY_NAME.get(name)


def by_source(source: str, *, counters: bool = False) -> tuple[Metric, ...]:
    """The metrics of one source's payload (gauges and rates), in declaration order; with
    ``counters``, its raw counters too (those come from ``Source.counters()``, not the
    payload, so callers that walk payload keys must not see them by default)."""
    return tuple(m for m in METRICS if m.source == source and (counters or m.kind != "counter"))
