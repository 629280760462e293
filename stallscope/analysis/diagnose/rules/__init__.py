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

import sys
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
from stallscope.analysis.facts import Facts

__all__ = ["RULES", "RuleSpec", "run_rules"]


@dataclass(frozen=True)
class RuleSpec:
    """One rule, declared: the function, the kinds it may report (a finding of another kind is
    a bug, raised as one), and the section of docs/diagnosis.md that explains it."""

    check: Rule
    kinds: tuple[Kind, ...]
    docs: str  #: the heading in docs/diagnosis.md

    @property
    def name(self) -> str:
        return self.check.__name__

    @property
    def thresholds(self) -> dict[str, float]:
        """The module constants the rule compares against (UPPER_CASE numbers it names), read
        off the rule itself so the list cannot drift from the code."""
        module = vars(sys.modules[self.check.__module__])
        return {n: float(module[n]) for n in self.check.__code__.co_names
                if n.isupper() and isinstance(module.get(n), (int, float))
                and not isinstance(module.get(n), bool)}


_INPUT, _OTHER, _COMM = ("input_bound.fetch vs input_bound.prep", "Other kinds",
                         "Communication wait")

RULES: tuple[RuleSpec, ...] = (
    RuleSpec(rule_command_failed, (Kind.COMMAND_FAILED,), _OTHER),
    RuleSpec(rule_insufficient, (Kind.INSUFFICIENT_DATA,), _OTHER),
    RuleSpec(rule_not_training, (Kind.INSUFFICIENT_DATA,), _OTHER),
    RuleSpec(rule_input_bound, (Kind.INPUT_FETCH, Kind.INPUT_PREP, Kind.INPUT_WAIT), _INPUT),
    RuleSpec(rule_epoch_start, (Kind.INPUT_EPOCH_START,), _OTHER),
    RuleSpec(rule_h2d, (Kind.H2D_BOUND,), _OTHER),
    RuleSpec(rule_compute_bound, (Kind.COMPUTE_BOUND,), _OTHER),
    RuleSpec(rule_host_bound, (Kind.HOST_BOUND,), _OTHER),
    RuleSpec(rule_slow_exit, (Kind.SLOW_EXIT,), _OTHER),
    RuleSpec(rule_tf_blind, (Kind.DATA_WAIT_UNKNOWN,), _OTHER),
    RuleSpec(rule_loading_in_trainer, (Kind.DATA_WAIT_UNKNOWN,), _OTHER),
    RuleSpec(rule_gpu_throttled, (Kind.GPU_THROTTLED,), _OTHER),
    RuleSpec(rule_gpu_health, (Kind.GPU_HEALTH,), _OTHER),
    RuleSpec(rule_gpu_memory_growth, (Kind.GPU_MEMORY_GROWTH,), _OTHER),
    RuleSpec(rule_pcie_degraded, (Kind.PCIE_DEGRADED,), _OTHER),
    RuleSpec(rule_host_swap, (Kind.HOST_SWAP,), _OTHER),
    RuleSpec(rule_shm_pressure, (Kind.SHM_PRESSURE,), _OTHER),
    RuleSpec(rule_straggler, (Kind.STRAGGLER_RANK,), _COMM),
    RuleSpec(rule_waiting_for_peers, (Kind.WAITING_FOR_PEERS,), _COMM),
    RuleSpec(rule_communication_bound, (Kind.COMMUNICATION_BOUND, Kind.RANK_JITTER), _COMM),
    RuleSpec(rule_cpu_contention, (Kind.CPU_CONTENTION,), _OTHER),
    RuleSpec(rule_disk_health, (Kind.DISK_HEALTH,), _OTHER),
    RuleSpec(rule_gpu_held_idle, (Kind.GPU_HELD_IDLE,), _OTHER),
    RuleSpec(rule_gpu_slowdown, (Kind.GPU_SLOWDOWN,), _OTHER),
)

_SEV = {"critical": 0, "warning": 1, "info": 2}
#: kinds about the process around the training, listed after every finding about the training
#: itself (the verdict names what limited the training)
AFTER_TRAINING = frozenset({Kind.SLOW_EXIT, Kind.COMMAND_FAILED})
#: facts that need no time series: they stay when the run holds too little data for the rest
NO_SERIES = frozenset({Kind.DISK_HEALTH, Kind.GPU_HEALTH, Kind.SHM_PRESSURE,
                       Kind.GPU_HELD_IDLE})


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
    findings.sort(key=lambda f: (f.kind in AFTER_TRAINING, _SEV[f.severity], -f.est_speedup,
                                 -f.confidence))
    insufficient = [f for f in findings if f.too_little_data]
    failed = [f for f in insufficient if f.kind == Kind.COMMAND_FAILED]
    if failed:
        # a command that failed before it trained: that is what to say, not "run longer"
        insufficient = failed
    if insufficient:
        # too little data: that is the verdict; only facts that need no time series stay
        findings = insufficient + [f for f in findings if f.kind in NO_SERIES]
    return findings

