"""Diagnosis rules: pure functions from a run's signals and series to findings, split by what
they look at (:mod:`.input`, :mod:`.gpu`, :mod:`.host`, :mod:`.distributed`; what they share in
:mod:`.common`), and declared here, in the order they run: each with the kinds it may report,
the section of docs/diagnosis.md that explains it for users, and (read off the rule itself) the
thresholds it compares against.

Each rule documents its trigger in its docstring. The verdict comes from combinations of
signals, scored, never from one threshold: e.g. a throughput-capped cloud disk shows low %util
and low await while the trainer starves, so the workers' D state and their flat read rate count
as much as the device's %util.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.analysis.diagnose.model import Finding, Kind, RunData
from stallscope.analysis.diagnose.rules.common import Rule
from stallscope.analysis.diagnose.rules.distributed import (
    rule_communication_bound,
    rule_straggler,
    rule_waiting_for_peers,
)
from stallscope.analysis.diagnose.rules.gpu import (
    rule_compute_bound,
    rule_gpu_health,
    rule_gpu_held_idle,
    rule_gpu_memory_growth,
    rule_gpu_throttled,
    rule_host_bound,
    rule_pcie_degraded,
)
from stallscope.analysis.diagnose.rules.headofline import rule_head_of_line
from stallscope.analysis.diagnose.rules.host import (
    rule_command_failed,
    rule_cpu_contention,
    rule_disk_health,
    rule_host_swap,
    rule_insufficient,
    rule_not_training,
    rule_shm_pressure,
    rule_slow_exit,
)
from stallscope.analysis.diagnose.rules.input import (
    rule_epoch_start,
    rule_h2d,
    rule_input_bound,
    rule_loading_in_trainer,
    rule_tf_blind,
)
from stallscope.analysis.diagnose.rules.slowdown import rule_gpu_slowdown
from stallscope.analysis.diagnose.rules.threads import rule_thread_loader
from stallscope.analysis.facts import Facts

__all__ = ["RULES", "RuleSpec", "run_rules"]


@dataclass(frozen=True)
class RuleSpec:
    """One rule, declared: the function, the kinds it may report (a finding of another kind is
    a bug, raised as one), and the section of docs/diagnosis.md that explains it."""

    check: Rule
    kinds: tuple[Kind, ...]
    docs: str  #: the heading in docs/diagnosis.md
    #: the facts it reads (:class:`~stallscope.analysis.facts.Facts`, by flat name), its
    #: helpers' included: declared, and held to the code by a test (rules/declared.py)
    reads: tuple[str, ...] = ()
    #: the run's series it reads itself, beside the facts (the GPU rules read theirs)
    series: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.check.__name__

    @property
    def thresholds(self) -> dict[str, float]:
        """The named numbers the rule compares against (UPPER_CASE module constants, and each
        field of a named set such as ``SCORES``), its helpers' included, read off the code so
        the list cannot drift from it (:func:`~.declared.thresholds_of`)."""
        from stallscope.analysis.diagnose.rules.declared import thresholds_of

        return thresholds_of(self.check)


_INPUT, _OTHER, _COMM = (
    "input_bound.fetch vs input_bound.prep",
    "Other kinds",
    "Communication wait",
)
_THREADS = "Thread loaders and the GIL"

RULES: tuple[RuleSpec, ...] = (
    RuleSpec(
        rule_command_failed,
        (Kind.COMMAND_FAILED,),
        _OTHER,
        reads=(
            "duration_s",
            "error",
            "error_at_s",
            "exit_code",
            "exit_signal",
            "interrupted",
            "trained",
        ),
    ),
    RuleSpec(
        rule_insufficient,
        (Kind.INSUFFICIENT_DATA,),
        _OTHER,
        reads=("duration_s", "samples", "steps"),
    ),
    RuleSpec(
        rule_not_training,
        (Kind.INSUFFICIENT_DATA,),
        _OTHER,
        reads=(
            "main_cpu_pct",
            "main_d_share",
            "main_python",
            "main_read_kb_s",
            "phase_shares",
            "samples",
            "stack_samples",
            "steps",
            "worker_cpu_pct",
            "worker_d_share",
            "worker_read_kb_s",
            "workers",
        ),
        series=("gpu.trainer_mem_mib", "gpu.util_pct"),
    ),
    RuleSpec(
        rule_input_bound,
        (Kind.INPUT_FETCH, Kind.INPUT_PREP, Kind.INPUT_WAIT),
        _INPUT,
        reads=(
            "batch_cost_hist",
            "batch_cost_p50_ms",
            "batch_cost_p99_ms",
            "batch_cost_tail_share",
            "batches_timed",
            "config",
            "device",
            "disk_r_await_median_ms",
            "disk_r_s_median",
            "disk_rareq_kb_median",
            "disk_rkb_s_cv",
            "disk_rkb_s_median",
            "disk_rkb_s_p95",
            "disk_util_median_pct",
            "epoch_start_cost_s",
            "epoch_start_total_s",
            "epoch_start_wait_s",
            "epochs",
            "focus_rank",
            "host_cpu_median_pct",
            "iowait_median_pct",
            "loader_threads",
            "logical_cores",
            "main_cpu_pct",
            "main_d_share",
            "main_read_kb_s",
            "main_runq_pct",
            "mem_available_min_mib",
            "niced_others_cpu_cores",
            "others_cpu_cores",
            "phase_shares",
            "physical_cores",
            "psi_io_median_pct",
            "read_limit_kb_s",
            "samples_per_s",
            "stack_sampler",
            "stack_samples",
            "stall_fraction",
            "stall_source",
            "step_ms_median",
            "step_timing_source",
            "tf_trainer",
            "thread_wait_share",
            "wait_ms_median",
            "wait_top_share",
            "worker_blkio_pct",
            "worker_cpu_pct",
            "worker_d_share",
            "worker_read_kb_s",
            "worker_runq_pct",
            "workers",
        ),
    ),
    RuleSpec(
        rule_thread_loader,
        (Kind.INPUT_FETCH, Kind.INPUT_PREP, Kind.INPUT_GIL),
        _THREADS,
        reads=(
            "host_cpu_median_pct",
            "loader_threads",
            "logical_cores",
            "main_cpu_pct",
            "niced_others_cpu_cores",
            "others_cpu_cores",
            "physical_cores",
            "stall_fraction",
            "stall_source",
            "thread_busy",
            "thread_cpu_cores",
            "thread_fetch_share",
            "thread_gil_wait_ms",
            "thread_prep_share",
            "thread_wait_share",
        ),
    ),
    RuleSpec(
        rule_head_of_line,
        (Kind.INPUT_HEAD_OF_LINE,),
        _INPUT,
        reads=(
            "batch_cost_hist",
            "batch_cost_p50_ms",
            "batch_cost_p99_ms",
            "batch_cost_tail_share",
            "batches_timed",
            "config",
            "device",
            "disk_r_await_median_ms",
            "disk_rkb_s_cv",
            "disk_rkb_s_median",
            "disk_rkb_s_p95",
            "disk_util_median_pct",
            "host_cpu_median_pct",
            "iowait_median_pct",
            "logical_cores",
            "main_cpu_pct",
            "main_d_share",
            "niced_others_cpu_cores",
            "others_cpu_cores",
            "physical_cores",
            "psi_io_median_pct",
            "read_limit_kb_s",
            "stall_fraction",
            "stall_source",
            "step_ms_median",
            "step_timing_source",
            "tf_trainer",
            "wait_ms_median",
            "wait_ms_p99",
            "wait_top_share",
            "worker_blkio_pct",
            "worker_cpu_pct",
            "worker_d_share",
            "worker_runq_pct",
            "workers",
        ),
    ),
    RuleSpec(
        rule_epoch_start,
        (Kind.INPUT_EPOCH_START,),
        _OTHER,
        reads=(
            "config",
            "epoch_start_cost_s",
            "epoch_start_total_s",
            "epoch_start_wait_s",
            "epochs",
            "wait_ms_median",
            "workers",
        ),
    ),
    RuleSpec(rule_h2d, (Kind.H2D_BOUND,), _OTHER, reads=("config", "h2d_share", "step_ms_median")),
    RuleSpec(
        rule_compute_bound,
        (Kind.COMPUTE_BOUND,),
        _OTHER,
        reads=(
            "config",
            "device",
            "disk_r_await_median_ms",
            "disk_rkb_s_cv",
            "disk_rkb_s_median",
            "disk_rkb_s_p95",
            "disk_util_median_pct",
            "gpu_busy_share",
            "gpu_util_median_pct",
            "gpu_warmup_s",
            "gpus",
            "host_cpu_median_pct",
            "iowait_median_pct",
            "loader_threads",
            "logical_cores",
            "main_cpu_pct",
            "main_d_share",
            "main_thread_busy_share",
            "niced_others_cpu_cores",
            "others_cpu_cores",
            "phase_shares",
            "physical_cores",
            "psi_io_median_pct",
            "read_limit_kb_s",
            "samples_per_s",
            "stack_samples",
            "stall_fraction",
            "stall_source",
            "step_ms_median",
            "tf_trainer",
            "thread_busy",
            "thread_cpu_cores",
            "thread_gil_wait_ms",
            "thread_prep_share",
            "wait_ms_median",
            "worker_blkio_pct",
            "worker_cpu_pct",
            "worker_d_share",
            "worker_runq_pct",
            "workers",
        ),
    ),
    RuleSpec(
        rule_host_bound,
        (Kind.HOST_BOUND,),
        _OTHER,
        reads=(
            "gpu_busy_share",
            "gpu_util_median_pct",
            "gpu_warmup_s",
            "gpus",
            "h2d_share",
            "main_cpu_pct",
            "phase_shares",
            "stack_samples",
            "stall_fraction",
            "stall_source",
            "step_ms_median",
            "window_s",
        ),
    ),
    RuleSpec(
        rule_slow_exit,
        (Kind.SLOW_EXIT,),
        _OTHER,
        reads=(
            "config",
            "exit_s",
            "exit_stacks",
            "interrupted",
            "startup_s",
            "window_s",
            "window_source",
            "workers",
        ),
    ),
    RuleSpec(
        rule_tf_blind,
        (Kind.DATA_WAIT_UNKNOWN,),
        _OTHER,
        reads=(
            "disk_util_median_pct",
            "gpus",
            "host_cpu_median_pct",
            "main_cpu_pct",
            "main_d_share",
            "stall_source",
            "tf_trainer",
        ),
    ),
    RuleSpec(
        rule_loading_in_trainer,
        (Kind.DATA_WAIT_UNKNOWN,),
        _OTHER,
        reads=(
            "disk_util_median_pct",
            "gpus",
            "host_cpu_median_pct",
            "main_cpu_pct",
            "main_d_share",
            "main_read_kb_s",
            "samples",
            "stall_source",
            "tf_trainer",
            "workers",
        ),
    ),
    RuleSpec(
        rule_gpu_throttled,
        (Kind.GPU_THROTTLED,),
        _OTHER,
        reads=(),
        series=(
            "gpu.mem_temp_c",
            "gpu.temp_c",
            "gpu.throttle_mask",
            "gpu.trainer_mem_mib",
            "gpu.util_pct",
        ),
    ),
    RuleSpec(
        rule_gpu_health,
        (Kind.GPU_HEALTH,),
        _OTHER,
        reads=(),
        series=("gpu.health_problem", "gpu.trainer_mem_mib", "gpu.util_pct", "gpu.xid_last"),
    ),
    RuleSpec(
        rule_gpu_memory_growth,
        (Kind.GPU_MEMORY_GROWTH,),
        _OTHER,
        reads=(),
        series=("gpu.mem_total_mib", "gpu.mem_used_mib", "gpu.trainer_mem_mib", "gpu.util_pct"),
    ),
    RuleSpec(
        rule_pcie_degraded,
        (Kind.PCIE_DEGRADED,),
        _OTHER,
        reads=(),
        series=("gpu.trainer_mem_mib", "gpu.util_pct"),
    ),
    RuleSpec(
        rule_host_swap,
        (Kind.HOST_SWAP,),
        _OTHER,
        reads=("mem_available_min_mib",),
        series=("host.swap_in_kb_s", "host.swap_out_kb_s"),
    ),
    RuleSpec(
        rule_shm_pressure,
        (Kind.SHM_PRESSURE,),
        _OTHER,
        reads=("config", "workers"),
        series=("host.shm_total_mib", "host.shm_used_mib"),
    ),
    RuleSpec(
        rule_straggler,
        (Kind.STRAGGLER_RANK,),
        _COMM,
        reads=(
            "comm_straggler",
            "config",
            "device",
            "disk_r_await_median_ms",
            "disk_r_s_median",
            "disk_rareq_kb_median",
            "disk_rkb_s_cv",
            "disk_rkb_s_median",
            "disk_rkb_s_p95",
            "disk_util_median_pct",
            "epoch_start_wait_s",
            "epochs",
            "focus_rank",
            "host_cpu_median_pct",
            "iowait_median_pct",
            "logical_cores",
            "main_cpu_pct",
            "main_d_share",
            "main_read_kb_s",
            "main_runq_pct",
            "mem_available_min_mib",
            "niced_others_cpu_cores",
            "others_cpu_cores",
            "physical_cores",
            "psi_io_median_pct",
            "ranks_detail",
            "read_limit_kb_s",
            "stall_fraction",
            "stall_source",
            "tf_trainer",
            "worker_blkio_pct",
            "worker_cpu_pct",
            "worker_d_share",
            "worker_read_kb_s",
            "worker_runq_pct",
            "workers",
        ),
        series=("gpu.sm_clock_mhz", "gpu.temp_c", "gpu.throttle_mask"),
    ),
    RuleSpec(
        rule_waiting_for_peers,
        (Kind.WAITING_FOR_PEERS,),
        _COMM,
        reads=("comm_straggler", "focus_rank", "ranks_detail"),
    ),
    RuleSpec(
        rule_communication_bound,
        (Kind.COMMUNICATION_BOUND, Kind.RANK_JITTER),
        _COMM,
        reads=(
            "comm_straggler",
            "comm_transfer_share",
            "focus_rank",
            "main_runq_pct",
            "niced_others_cpu_cores",
            "others_cpu_cores",
            "ranks_detail",
        ),
    ),
    RuleSpec(
        rule_cpu_contention,
        (Kind.CPU_CONTENTION,),
        _OTHER,
        reads=(
            "comm_straggler",
            "host_cpu_median_pct",
            "logical_cores",
            "main_runq_pct",
            "niced_others_cpu_cores",
            "others_cpu_cores",
            "ranks_detail",
        ),
    ),
    RuleSpec(rule_disk_health, (Kind.DISK_HEALTH,), _OTHER, reads=()),
    RuleSpec(
        rule_gpu_held_idle,
        (Kind.GPU_HELD_IDLE,),
        _OTHER,
        reads=(),
        series=("gpu.proc_mem_mib", "gpu.util_pct"),
    ),
    RuleSpec(
        rule_gpu_slowdown,
        (Kind.GPU_SLOWDOWN,),
        _OTHER,
        reads=(),
        series=("gpu.sm_clock_mhz", "gpu.util_pct"),
    ),
)

_SEV = {"critical": 0, "warning": 1, "info": 2}
#: kinds about the process around the training, listed after every finding about the training
#: itself (the verdict names what limited the training)
AFTER_TRAINING = frozenset({Kind.SLOW_EXIT, Kind.COMMAND_FAILED})
#: facts that need no time series: they stay when the run holds too little data for the rest
NO_SERIES = frozenset({Kind.DISK_HEALTH, Kind.GPU_HEALTH, Kind.SHM_PRESSURE, Kind.GPU_HELD_IDLE})


def run_rules(data: RunData, fx: Facts) -> list[Finding]:
    """Every rule's findings, most important first."""
    findings: list[Finding] = []
    for spec in RULES:
        found = spec.check(data, fx)
        for f in found:
            if f.kind not in spec.kinds:
                raise AssertionError(f"{spec.name} reported {f.kind}, which it does not declare")
        findings += found
    # what happened after the training (its exit) never outranks what limited the training
    findings.sort(
        key=lambda f: (f.kind in AFTER_TRAINING, _SEV[f.severity], -f.est_speedup, -f.confidence)
    )
    insufficient = [f for f in findings if f.too_little_data]
    failed = [f for f in insufficient if f.kind == Kind.COMMAND_FAILED]
    if failed:
        # a command that failed before it trained: that is what to say, not "run longer"
        insufficient = failed
    if insufficient:
        # too little data: that is the verdict; only facts that need no time series stay
        findings = insufficient + [f for f in findings if f.kind in NO_SERIES]
    return findings
