"""How the facts of a run are computed (:func:`build`), once, from what it recorded.

Pure functions over :class:`~stallscope.analysis.rundata.RunData`. The figures are gathered in
a private draft, one flat name each, then frozen into :class:`~stallscope.analysis.facts.Facts`
by domain. Every value here can appear in a finding's evidence, so names carry units.
"""

from __future__ import annotations

import types
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any

from stallscope.analysis.facts import DOMAINS, Facts, thawed
from stallscope.analysis.facts.common import _cores, _r, alive_together, mean, median, p95
from stallscope.analysis.facts.machine import (
    LIMIT_REACHED,
    _disk_signals,
    _gpu_signals,
    _niced_others_cpu,
    _others_cpu,
    _proc_signals,
    _process_rows,
    limited,
    others_taking_cores,
    spare_cores,
)
from stallscope.analysis.facts.steps import (
    COMM_GAP,
    COMM_GAP_STARVED,
    COMM_HEAVY,
    RUNQ_BUSY_PCT,
    _probe_signals,
    _stack_signals,
    starved,
)
from stallscope.analysis.stacks import ProcPhases, trainer_phases
from stallscope.analysis.threads import thread_facts
from stallscope.analysis.throughput import throughput
from stallscope.analysis.window import TrainingWindow, clip, exit_stacks, trainer_gpus
from stallscope.loadermodel import BUSY_SPARE, OTHERS_BUSY_CORES

if TYPE_CHECKING:
    from stallscope.analysis.rundata import RunData

# the thresholds and helpers the rules read from here, whichever part of the facts holds them
__all__ = [
    "BUSY_SPARE",
    "COMM_GAP",
    "COMM_GAP_STARVED",
    "COMM_HEAVY",
    "LIMIT_REACHED",
    "NO_TRAINING_SAMPLES",
    "OTHERS_BUSY_CORES",
    "RUNQ_BUSY_PCT",
    "alive_together",
    "build",
    "exit_status",
    "limited",
    "mean",
    "median",
    "others_taking_cores",
    "p95",
    "run_duration",
    "spare_cores",
    "starved",
    "trainer_gpus",
]


class _Draft(types.SimpleNamespace):
    """The facts while they are computed: flat, mutable, private (frozen by :func:`build`).
    Its names and defaults are the facts' own (:data:`~stallscope.analysis.facts.WHERE`): one
    declaration, in :mod:`stallscope.analysis.facts`; mappings and lists start as plain,
    mutable ones."""

    def __init__(self) -> None:
        super().__init__()
        for _dom, cls in DOMAINS:
            for f in fields(cls):
                v = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[operator]
                setattr(self, f.name, thawed(v))


def build(data: RunData) -> Facts:
    """The facts of ``data`` (:func:`stallscope.analysis.facts.compute_facts`)."""
    return Facts.of(vars(_draft(data)))


def _draft(data: RunData) -> _Draft:
    sig = _Draft()
    meta = data.meta
    cost = data.get("collector.cpu_s")
    sig.samples = len(cost.v) if cost else 0
    dur = run_duration(meta, data.span[1] if data.span else None)
    if dur is not None:
        sig.duration_s = dur
    elif cost and cost.ts:
        sig.duration_s = round(cost.ts[-1] - cost.ts[0], 1)
    _exit_facts(sig, meta)
    sig.physical_cores = _cores(meta.get("physical_cores"))
    sig.logical_cores = _cores(meta.get("logical_cores"))

    _probe_signals(sig, data)
    # one definition of the throughput for every surface (analysis/throughput.py)
    sig.samples_per_s, sig.throughput_source = throughput(data)
    procs = trainer_phases(data.stacks, data.roles())
    win = data.window()
    _window_signals(sig, data, win, procs)
    full, data = data, clip(data, win)  # every figure below is the training's, not the process's
    # probe > sampled stacks > system metrics for the stall; the stacks' phases are evidence
    # either way (where the training thread was: host-bound or GPU-bound)
    _stack_signals(sig, data, procs, stall=sig.stall_source is None)
    thread_facts(sig, data.stacks, procs)  # a thread loader's threads
    _gpu_signals(sig, data, full)
    _proc_signals(sig, data)
    sig.processes = _process_rows(data, full)
    _disk_signals(sig, data)

    host = {
        k: data.get(f"host.{k}")
        for k in (
            "cpu_pct",
            "cpu_nice_pct",
            "cpu_max_core_pct",
            "iowait_pct",
            "psi_io_some_pct",
            "mem_available_mib",
        )
    }
    sig.host_cpu_median_pct = _r(median(host["cpu_pct"].v)) if host["cpu_pct"] else None
    sig.host_max_core_median_pct = (
        _r(median(host["cpu_max_core_pct"].v)) if host["cpu_max_core_pct"] else None
    )
    sig.others_cpu_cores = _others_cpu(data, host["cpu_pct"], sig.logical_cores)
    sig.niced_others_cpu_cores = _niced_others_cpu(data, host["cpu_nice_pct"], sig.logical_cores)
    sig.iowait_median_pct = _r(median(host["iowait_pct"].v)) if host["iowait_pct"] else None
    sig.psi_io_median_pct = (
        _r(median(host["psi_io_some_pct"].v)) if host["psi_io_some_pct"] else None
    )
    sig.mem_available_min_mib = (
        _r(min(host["mem_available_mib"].v))
        if host["mem_available_mib"] and host["mem_available_mib"].v
        else None
    )
    _trained_facts(sig, data, full)
    if sig.stall_fraction is None and sig.gpu_idle_share is not None:
        sig.stall_fraction = sig.gpu_idle_share
        sig.stall_source = "gpu_idle"
    if sig.stall_fraction is None and sig.main_thread_busy_share is not None and sig.workers:
        # no probe, no GPU: the trainer's main thread is the consumer; while it does not run it
        # waits (for the next batch, above all). With num_workers=0 it loads the data itself,
        # so its busy share says nothing about waiting: no estimate then.
        sig.stall_fraction = round(max(0.0, 1.0 - sig.main_thread_busy_share), 3)
        sig.stall_source = "main_thread"
    return sig


#: signals a user sends to stop a training (Ctrl-C, `kill`, a scheduler's cancel)
_STOPS = frozenset({"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"})


def run_duration(meta: dict[str, Any], last_sample: float | None) -> float | None:
    """Seconds the run lasted (to the ms): start to end once finished, start to now while it
    runs, start to its last sample once interrupted (a killed monitor never wrote an end).
    ``show``, ``runs``, the report and the facts all read it here."""
    import time

    from stallscope.store.rundir import run_state

    start = meta.get("start")
    if not isinstance(start, (int, float)) or isinstance(start, bool):
        return None
    state = run_state(meta)
    end = (
        meta.get("end")
        if state == "finished"
        else time.time()
        if state == "running"
        else last_sample
    )
    if not isinstance(end, (int, float)) or isinstance(end, bool):
        return None
    return round(max(0.0, float(end) - float(start)), 3)


def exit_status(meta: dict[str, Any]) -> tuple[int | None, str | None, bool]:
    """(exit code, the signal that ended or stopped it, interrupted) from meta.json: the exit as
    a shell reports it (a child killed by signal N is 128 + N: ``run`` returns that, meta.json
    keeps what ``wait`` said, -N). A run stopped by the user (a stop signal it died of, or one
    ``run`` forwarded to it) is interrupted: its exit is not a finding. ``runs`` and the facts
    both read it here."""
    import signal as _signal

    code = meta.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool):
        return None, None, False
    name = None
    if code < 0 or code > 128:
        n = -code if code < 0 else code - 128
        try:
            name = _signal.Signals(n).name
        except ValueError:
            name = f"signal {n}" if code < 0 else None
        code = 128 + n
    forwarded = [s for s in meta.get("signals_forwarded") or [] if isinstance(s, str)]
    name = name or (forwarded[0] if forwarded else None)
    return code, name, bool(name in _STOPS or any(f in _STOPS for f in forwarded))


def _exit_facts(sig: _Draft, meta: dict[str, Any]) -> None:
    sig.exit_code, sig.exit_signal, sig.interrupted = exit_status(meta)


#: stack samples that, holding no training frame, show a process that did not train
NO_TRAINING_SAMPLES = 20


def _trained_facts(sig: _Draft, data: RunData, full: RunData) -> None:
    """Whether the run trained, the trainer's last uncaught exception, and whether its main
    process is Python (see :class:`~stallscope.analysis.facts.RunFacts`)."""
    from stallscope.sources.stacks.phases import TRAINING

    if full.errors:
        last = full.errors[-1]
        sig.error = last["error"]
        start = full.meta.get("start")
        if isinstance(start, (int, float)):
            sig.error_at_s = round(max(0.0, last["ts"] - start), 1)
    frames = sum(v for k, v in sig.phase_shares.items() if k in TRAINING)
    if sig.steps or frames >= 0.05 or sig.window_source in ("probe", "stacks", "workers", "gpu"):
        sig.trained = True
    elif sig.stack_samples >= NO_TRAINING_SAMPLES or not full.series:
        sig.trained = False
    mains = [
        e
        for e in full.entities
        if e.get("source") == "procs" and full.roles().get(str(e.get("entity"))) == "main"
    ]
    if mains:
        sig.main_python = any(
            "python" in str((e.get("attrs") or {}).get(k, "")).lower()
            for e in mains
            for k in ("name", "cmdline")
        )


def _window_signals(
    sig: _Draft, data: RunData, win: TrainingWindow, procs: list[ProcPhases]
) -> None:
    sig.window_source = win.source
    if win.source == "run":
        return
    sig.window_s = round(win.seconds, 1)
    sig.startup_s = win.startup_s
    sig.exit_s = win.exit_s
    if sig.exit_s:
        sig.exit_stacks = exit_stacks(data.stacks, {p.pid for p in procs}, win.end)
