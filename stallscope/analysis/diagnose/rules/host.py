"""Rules about the host around the training: the trainer's slow exit, swap, /dev/shm, CPU
contention, disk health, and trees that are not a training or too young to judge.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from stallscope.analysis.diagnose.model import Finding, Fix, Kind, RunData, Severity
from stallscope.analysis.diagnose.rules.common import STALL_CRIT
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import (
    NO_TRAINING_SAMPLES,
    OTHERS_BUSY_CORES,
    RUNQ_BUSY_PCT,
    others_taking_cores,
    trainer_gpus,
)
from stallscope.loadermodel import stall_cap
from stallscope.textsafe import plain

#: fewer samples than this and fewer steps than MIN_STEPS: too little data for a verdict
MIN_SAMPLES = 3
MIN_STEPS = 10
#: share of the sampled stacks in training phases from which a tree counts as training
TRAINING_FRAMES_SHARE = 0.05
#: swap in + out (KiB/s) that counts a sample as swapping, and the shares of such samples for
#: a warning and a critical host_swap
SWAP_KB_S = 1024.0
SWAP_SHARE = 0.1
SWAP_SHARE_CRIT = 0.3
#: /dev/shm: full from this share (warning; critical from the next), small under this (MiB)
SHM_FULL = 0.8
SHM_FULL_CRIT = 0.95
SHM_SMALL_MIB = 1024.0
#: cores of other processes cpu_contention says came and went unnamed, from this many
UNNAMED_CORES = 0.1


#: seconds after the last training step from which a trainer's exit is called slow
SLOW_EXIT_S = 5.0


def rule_slow_exit(data: RunData, fx: Facts) -> list[Finding]:
    """slow_exit: the trainer's process took ≥ 5 s to end after its last training step. When
    its stacks show a DataLoader joining its workers at exit (PyTorch joins each worker with a
    5-s timeout when ``pin_memory`` and ``persistent_workers`` are both on), it says so and
    names the fix; a team running many short jobs or sweeps pays this on every run."""
    exit_s = fx.run.exit_s
    if (
        exit_s is None
        or exit_s < SLOW_EXIT_S
        or not fx.run.window_source
        or fx.run.window_source == "run"
    ):
        return []
    if fx.run.interrupted:
        return []  # the user stopped it (Ctrl-C): an exit the user caused is not a finding
    stacks = fx.run.exit_stacks
    joins = sum(
        v
        for k, v in stacks
        if "dataloader.py" in k and ("join" in k or "_clean_up" in k or "_shutdown" in k)
    )
    total = fx.run.window_s or 0.0
    cfg = fx.loader.config
    workers = (
        cfg.get("num_workers") if isinstance(cfg.get("num_workers"), int) else fx.loader.workers
    )
    ev = _exit_evidence(fx, workers)
    pinned = (cfg.get("pin_memory") is True and cfg.get("persistent_workers") is True) or any(
        "_clean_up_worker " in k for k, _ in stacks
    )
    what = (
        f"its DataLoader joined its {workers} worker processes for {joins:.0f} s"
        if workers
        else f"its DataLoader joined its workers for {joins:.0f} s"
    )
    why, fixes = _exit_fixes(data, joins, exit_s, what, pinned, stacks)
    life = total + exit_s + (fx.run.startup_s or 0.0)
    share = exit_s / life if total else None
    more = f" ({share:.0%} of the process's life)" if share else ""
    return [
        Finding(
            kind=Kind.SLOW_EXIT,
            severity="warning",
            confidence=0.9 if joins >= 0.5 * exit_s else 0.7,
            summary=f"The trainer took {exit_s:.0f} s to exit after its last training step"
            f"{more}: {why}. A team running many short jobs or sweeps pays this on "
            "every run.",
            evidence=ev,
            fixes=fixes,
            est_speedup=1.0,
            rule=f"exit {exit_s:.1f} s ≥ {SLOW_EXIT_S:.0f} s after the last training step",
        )
    ]


def _exit_evidence(fx: Facts, workers: Any) -> dict[str, Any]:
    """slow_exit's evidence: the exit, its stacks, the workers and the loader's options."""
    cfg = fx.loader.config
    ev: dict[str, Any] = {
        "exit_s": fx.run.exit_s,
        "window_s": fx.run.window_s,
        "exit_stacks": [{"stack": k, "s": v} for k, v in fx.run.exit_stacks],
    }
    if workers:
        ev["workers"] = workers
    for k in ("pin_memory", "persistent_workers"):
        if k in cfg:
            ev[k] = cfg[k]
    return ev


def _exit_fixes(
    data: RunData,
    joins: float,
    exit_s: float,
    what: str,
    pinned: bool,
    stacks: Sequence[tuple[str, float]],
) -> tuple[str, list[Fix]]:
    """What slowed the exit, in words, and its fixes: workers finishing their batches, PyTorch
    joining pinned persistent workers, or whatever the stacks show."""
    if joins >= 0.5 * exit_s and not pinned:
        why = (
            f"{what} after the loop: a worker still working on a batch finishes it before it stops"
        )
        fixes = [
            Fix(
                "shut the loader down as soon as the last batch you need is taken "
                "(`del loader` and any iterator of it) and keep per-batch work short: "
                "each worker ends its current batch before it can stop",
                why,
            )
        ]
    elif joins >= 0.5 * exit_s:
        why = (
            f"{what}: with pin_memory and persistent_workers PyTorch's exit waits up to "
            "5 s for each worker before stopping it (PyTorch issue 81794)"
        )
        fixes = [
            Fix(
                "end the workers once training is done: drop every reference to the "
                "loader and its iterator (`del loader`) before the script ends, so "
                "PyTorch stops them at once rather than at interpreter exit",
                why,
            ),
            Fix(
                "persistent_workers=False when epochs are few (it keeps the workers "
                "between epochs, and makes exit join them one by one)",
                "the exit then takes about a second (measured on an H200, 2 workers: "
                "11.0 s with both options on, 1.0-1.7 s with either off)",
                change={"persistent_workers": False},
            ),
        ]
    else:
        # a sentence only from what was sampled: no stacks, no claim about them
        why = (
            f"the exit's heaviest stack ends in {stacks[0][0].rsplit(';', 1)[-1]}"
            if stacks
            else "no stack of the exit was sampled"
        )
        report = (
            f"`stallscope report {shlex.quote(str(data.run_dir))}` lists the exit's stacks"
            if stacks and str(data.run_dir) not in ("", ".")
            else "py-spy dump of the trainer's pid as it exits shows where"
        )
        fixes = [
            Fix(
                "look at what runs after the loop (saving, closing files, joining "
                f"threads or processes): {report}",
                why,
            )
        ]
    return why, fixes


def rule_host_swap(data: RunData, fx: Facts) -> list[Finding]:
    """host_swap: swapping ≥ 1 MB/s in ≥ 10% of samples (in or out)."""
    si, so = data.get("host.swap_in_kb_s"), data.get("host.swap_out_kb_s")
    if not si or not so or not si.v:
        return []
    rates = [a + b for a, b in zip(si.v, so.v)]
    active = [r for r in rates if r >= SWAP_KB_S]
    share = len(active) / len(rates)
    if share < SWAP_SHARE:
        return []
    sev: Severity = "critical" if share >= SWAP_SHARE_CRIT else "warning"
    return [
        Finding(
            kind=Kind.HOST_SWAP,
            severity=sev,
            confidence=0.9,
            summary=f"The host swapped in {share:.0%} of samples (peak {max(rates) / 1024:.0f} "
            "MB/s): memory is overcommitted.",
            evidence={
                "swap_share": round(share, 3),
                "swap_peak_kb_s": round(max(rates)),
                "mem_available_min_mib": fx.host.mem_available_min_mib,
            },
            fixes=[
                Fix(
                    "reduce memory: fewer num_workers or a smaller prefetch_factor (each "
                    "worker holds batches), smaller in-memory caches, or add RAM",
                    "every swapped page costs a disk read on the critical path",
                )
            ],
            est_speedup=1.0,
            rule="swap ≥ 1 MB/s in ≥ 10% of samples",
        )
    ]


def rule_shm_pressure(data: RunData, fx: Facts) -> list[Finding]:
    """shm_pressure: /dev/shm ≥ 80% full (critical ≥ 95%), or smaller than 1 GiB while
    DataLoader workers are in use (Docker's default is 64 MB): workers die with bus errors."""
    used, total = data.get("host.shm_used_mib"), data.get("host.shm_total_mib")
    if not used or not total or not used.v or not total.v:
        return []
    cap = total.v[-1]
    peak = max(used.v)
    frac = peak / cap if cap else 0.0
    small = cap < SHM_SMALL_MIB and (
        fx.loader.workers > 0 or (fx.loader.config.get("num_workers") or 0) > 0
    )
    if frac < SHM_FULL and not small:
        return []
    # a small /dev/shm that the run did not fill is worth knowing, not the verdict of the run
    sev: Severity = (
        "critical" if frac >= SHM_FULL_CRIT else "warning" if frac >= SHM_FULL else "info"
    )
    return [
        Finding(
            kind=Kind.SHM_PRESSURE,
            severity=sev,
            confidence=0.9,
            summary=f"/dev/shm peaked at {peak:.0f} of {cap:.0f} MiB ({frac:.0%}): DataLoader "
            "workers pass batches through it and fail with bus errors when it is full.",
            evidence={
                "shm_peak_mib": round(peak, 1),
                "shm_total_mib": round(cap, 1),
                "shm_peak_share": round(frac, 3),
            },
            fixes=[
                Fix(
                    "enlarge /dev/shm (docker run --shm-size=8g, or mount -o remount,"
                    "size=... /dev/shm)",
                    f"only {cap:.0f} MiB available",
                ),
                Fix(
                    "lower prefetch_factor or batch size; remove stale files in /dev/shm",
                    "each worker keeps prefetch_factor batches in shared memory",
                ),
            ],
            est_speedup=1.0,
            rule="/dev/shm ≥ 80% full, or < 1 GiB with workers",
        )
    ]


def _busy_host(fx: Facts) -> tuple[float, float] | None:
    """(least run-queue wait %, other processes' cores) when every trainer process waited for a
    CPU ≥ RUNQ_BUSY_PCT of the time while other processes kept ≥ OTHERS_BUSY_CORES busy. Those
    at a lower priority than the trainer do not count (:func:`others_taking_cores`): they yield
    their cores, so the trainer's wait is its own processes' (prep's shared cores)."""
    if len(fx.comm.ranks_detail) >= 2:
        waits = [d.get("runq_wait_pct") for d in fx.comm.ranks_detail]
    else:
        waits = [fx.procs.main_runq_pct]
    others = fx.host.others_cpu_cores
    if any(w is None for w in waits) or others is None:
        return None
    if others_taking_cores(fx) < OTHERS_BUSY_CORES:
        return None
    least = min(w for w in waits if w is not None)
    return (least, others) if least >= RUNQ_BUSY_PCT else None


def _other_text(b: dict[str, Any]) -> str:
    """ "pid 19288 (python, 0.2 cores)", "8 processes named python (pid 19288 the busiest, 1.6
    cores)", "pid 77 (bash, 1.1 cores with the short-lived processes it started)"."""
    name = plain(str(b.get("name", "?")), 40)
    kids = " with the short-lived processes they started" if b.get("children_cores") else ""
    if isinstance(b.get("processes"), int) and b["processes"] > 1:
        return (
            f"{b['processes']} processes named {name} (pid {b['pid']} the busiest, "
            f"{b['cores']:.1f} cores{kids})"
        )
    kids = kids.replace("they", "it")
    return f"pid {b['pid']} ({name}, {b['cores']:.1f} cores{kids})"


def rule_cpu_contention(data: RunData, fx: Facts) -> list[Finding]:
    """cpu_contention: every trainer process (each rank, or the one trainer) waited for a CPU
    ≥ 20% of the time while other processes kept ≥ 0.5 of the host's cores busy: a busy host,
    not the training's own work. A rank short of CPU alone is a straggler (``starved``)."""
    busy = _busy_host(fx)
    if busy is None:
        return []
    least, others = busy
    ranks = fx.comm.ranks_detail
    host = data.meta.get("host") or "this host"
    cores = f" of its {fx.host.logical_cores}" if fx.host.logical_cores else ""
    if len(ranks) >= 2:
        who = (
            "every rank waited for a CPU ("
            + ", ".join(f"rank {d['rank']} {d['runq_wait_pct']:.0f}%" for d in ranks)
            + " of the time"
        )
    else:
        who = f"the trainer waited for a CPU {least:.0f}% of the time ("
    summary = (
        f"The host is short of CPU for this training: {who}"
        f"{', ' if len(ranks) >= 2 else ''}run-queue wait) while other processes kept "
        f"{others:.1f}{cores} cores busy."
    )
    niced = fx.host.niced_others_cpu_cores
    comm = [d.get("comm_share") for d in ranks]
    if len(ranks) >= 2 and fx.comm.comm_straggler is None and all(c is not None for c in comm):
        shares = ", ".join(f"rank {d['rank']} {d['comm_share']:.0%}" for d in ranks)
        summary += (
            f" While the ranks share too few cores, their wait in the all-reduce "
            f"({shares} of the step) cannot show which rank the others wait for."
        )
    others_busy = _busy_others(data)
    # processes at a lower priority yield their cores: stopping them gives the trainer nothing
    taking = [b for b in others_busy if not (niced and (b.get("nice") or 0) > 0)]
    action = _contention_action(taking, others_taking_cores(fx), host)
    fixes = [
        Fix(
            action,
            f"its processes were ready to run but waited for a CPU {least:.0f}% of the "
            f"time while other processes used {others:.1f} cores",
        )
    ]
    ev: dict[str, Any] = {
        "runq_wait_pct": least,
        "others_cpu_cores": others,
        "host_cpu_median_pct": fx.host.host_cpu_median_pct,
        "logical_cores": fx.host.logical_cores,
    }
    if niced:
        ev["niced_others_cpu_cores"] = niced
    if others_busy:
        ev["busiest_others"] = others_busy
    if len(ranks) >= 2:
        ev["ranks"] = ranks
    return [
        Finding(
            kind=Kind.CPU_CONTENTION,
            severity="critical" if least >= STALL_CRIT * 100 else "warning",
            confidence=0.8,
            summary=summary,
            evidence=ev,
            fixes=fixes,
            est_speedup=stall_cap(least / 100),
            rule=f"every trainer process waited for a CPU ≥ {RUNQ_BUSY_PCT:.0f}% of the time "
            f"(least {least:.0f}%) and other processes kept ≥ {OTHERS_BUSY_CORES} "
            f"core busy ({others:.1f}"
            + (f", {niced:.1f} of them at a lower priority, not counted" if niced else "")
            + ")",
        )
    ]


def _contention_action(others_busy: list[dict[str, Any]], others: float, host: str) -> str:
    """What to do on the host: the named busy processes to stop or move, and the cores no one
    named."""
    # the run names who took the cores when they were still there at its end (a process
    # with the short-lived ones it started, one name's processes together); what they do not
    # explain of the figure above is said, so the named parts add up to it
    named = sum(float(b["cores"]) for b in others_busy)
    rest = others - named
    parts = [_other_text(b) for b in others_busy]
    if others_busy and rest >= UNNAMED_CORES:
        parts.append(
            f"and {rest:.1f} cores more by processes that came and went during the "
            "run (not there to be named at its end)"
        )
    action = (
        f"give the training its cores back on {host}: stop or move the other busy "
        "processes: " + ", ".join(parts) + ", or run on a less loaded node"
        if others_busy
        else f"give the training its cores back on {host}: stop or move the other busy "
        "processes, or run on a less loaded node; they are listed by "
        "`ps -eo pid,pcpu,comm --sort=-pcpu | head`"
    )
    return action


def _busy_others(data: RunData) -> list[dict[str, Any]]:
    """The other processes the run named as busy at its end (the four busiest)."""
    return [
        b
        for b in data.meta.get("busy_others") or []
        if isinstance(b, dict)
        and isinstance(b.get("pid"), int)
        and isinstance(b.get("cores"), (int, float))
    ][:4]


def rule_disk_health(data: RunData, fx: Facts) -> list[Finding]:
    """disk_health: the dataset's drive has a SMART verdict of ageing or failing."""
    out = []
    for drive in data.disk_health:
        verdict = drive.get("verdict")
        if verdict not in ("ageing", "failing"):
            continue
        dsev: Severity = "critical" if verdict == "failing" else "warning"
        out.append(
            Finding(
                kind=Kind.DISK_HEALTH,
                severity=dsev,
                confidence=0.9,
                summary=f"The dataset's drive {drive.get('device')} is {verdict}: "
                + "; ".join(drive.get("reasons", [])[:3]),
                evidence={
                    "device": drive.get("device"),
                    "model": drive.get("model"),
                    "verdict": verdict,
                    "reasons": drive.get("reasons", []),
                    "growth": drive.get("growth", {}),
                },
                fixes=[
                    Fix(
                        "back up the dataset and checkpoints now; plan to replace the drive",
                        "SMART counters that grow predict failure",
                    )
                ],
                est_speedup=1.0,
                rule="SMART verdict ageing/failing (see docs/disk-health.md)",
            )
        )
    return out


#: below this much CPU (100 = one core), the watched processes together do nothing a
#: training does
IDLE_TREE_CPU_PCT = 10.0


#: nor this much reading (kB/s, page cache included), nor this share of samples in D state
IDLE_TREE_READ_KB_S = 100.0


IDLE_TREE_D_SHARE = 0.1


def rule_not_training(data: RunData, fx: Facts) -> list[Finding]:
    """insufficient_data ("nothing looks like a training"): no probe steps, no training frames
    in the sampled stacks, no GPU held by the watched processes, and those processes together
    used under 10% of a core, read under 100 kB/s and were rarely in D state. Then no verdict
    is made: a sleeping script or ``--pid 1`` is not input-bound."""
    if fx.steps.steps or fx.run.samples < MIN_SAMPLES:
        return []
    from stallscope.sources.stacks.phases import TRAINING

    frames = sum(v for k, v in (fx.steps.phase_shares or {}).items() if k in TRAINING)
    if frames >= TRAINING_FRAMES_SHARE or trainer_gpus(data):
        return []
    tree = (fx.procs.main_cpu_pct or 0.0) + (fx.loader.worker_cpu_pct or 0.0) * fx.loader.workers
    read = (fx.procs.main_read_kb_s or 0.0) + (fx.loader.worker_read_kb_s or 0.0)
    blocked = max(fx.procs.main_d_share or 0.0, fx.loader.worker_d_share or 0.0)
    idle = not (
        tree >= IDLE_TREE_CPU_PCT or read >= IDLE_TREE_READ_KB_S or blocked >= IDLE_TREE_D_SHARE
    )
    # busy, but not a training: its stacks were sampled and hold no training frame, or it is
    # not Python at all (`run --pid` on `yes`, `dd`, a busy loop), and it has no DataLoader
    # workers. A busy Python process whose stacks were not sampled may be a training that
    # loads on its own threads: rule_loading_in_trainer speaks of that one.
    not_python = fx.procs.main_python is False
    busy_elsewhere = not fx.loader.workers and (
        fx.steps.stack_samples >= NO_TRAINING_SAMPLES or not_python
    )
    if not idle and not busy_elsewhere:
        return []
    procs = 1 + fx.loader.workers
    stacks = (
        f"no training frames in {fx.steps.stack_samples} sampled stacks"
        if fx.steps.stack_samples
        else "no stacks sampled"
    )
    what = _tree_work(procs, tree, read, idle, not_python)
    return [
        Finding(
            kind=Kind.INSUFFICIENT_DATA,
            severity="info",
            confidence=0.9,
            summary=f"Nothing here looks like a training: no steps, {stacks}, no GPU work, no "
            f"DataLoader workers; {what}. "
            + ("It sleeps. " if idle else "It is busy, but not with a training. ")
            + "No verdict.",
            evidence={
                "tree_cpu_pct": round(tree, 2),
                "processes": procs,
                "read_kb_s": round(read, 1),
                "d_share": round(blocked, 3),
                "stack_samples": fx.steps.stack_samples,
            },
            fixes=[
                Fix(
                    "watch the training itself: stallscope run -- followed by your training "
                    "command, or stallscope run --pid with the pid of the Python process that runs "
                    "the training loop",
                    "the watched processes did no work a training does",
                )
            ],
            est_speedup=1.0,
            rule="no steps, no training frames, no GPU, "
            + (
                "< 10% of a core, < 100 kB/s read, < 10% of samples in D state"
                if idle
                else "no DataLoader workers, and "
                + (
                    "not a Python process"
                    if not_python
                    else f"≥ {NO_TRAINING_SAMPLES} sampled stacks without a training frame"
                )
            ),
            too_little_data=True,
        )
    ]


def _tree_work(procs: int, tree: float, read: float, idle: bool, not_python: bool) -> str:
    """What the watched processes did, in words: slept, or kept cores busy (and read)."""
    return (
        f"{'it is not a Python process, ' if not_python else ''}"
        f"{'its' if procs == 1 else f'its {procs}'} process{'es' if procs > 1 else ''} "
        + (
            f"used {tree:.1f}% of one core and read {read:.0f} kB/s"
            if idle
            else f"kept {tree / 100:.1f} core(s) busy"
            + (f" and read {read:,.0f} kB/s" if read >= IDLE_TREE_READ_KB_S else "")
        )
    )


def rule_insufficient(data: RunData, fx: Facts) -> list[Finding]:
    """insufficient_data: fewer than 3 samples and fewer than 10 probe steps."""
    if fx.run.samples >= MIN_SAMPLES or fx.steps.steps >= MIN_STEPS:
        return []
    return [
        Finding(
            kind=Kind.INSUFFICIENT_DATA,
            severity="info",
            confidence=1.0,
            summary=f"Too little data to diagnose: {fx.run.samples} samples and "
            f"{fx.steps.steps} steps.",
            evidence={
                "samples": fx.run.samples,
                "steps": fx.steps.steps,
                "duration_s": fx.run.duration_s,
            },
            fixes=[
                Fix(
                    "run longer (≥ 30 s of training) or lower --interval",
                    "rules need several samples to tell a pattern from noise",
                )
            ],
            est_speedup=1.0,
            rule="< 3 samples and < 10 steps",
            too_little_data=True,
        )
    ]


def rule_command_failed(data: RunData, fx: Facts) -> list[Finding]:
    """command_failed: the trainer ended with a non-zero exit code that the user did not cause
    (no Ctrl-C, no SIGTERM forwarded). Said plainly, with the exit code, when, and the last
    uncaught exception of its Python processes (``<run>/errors.jsonl``). When the run never
    trained (no steps, no training frames, no workers, no GPU work) it is the verdict and no
    bottleneck is named from it; after some training it is listed after the training's own
    findings."""
    code = fx.run.exit_code
    if code is None or code == 0 or fx.run.interrupted:
        return []
    when = fx.run.error_at_s if fx.run.error_at_s is not None else fx.run.duration_s
    how = (
        f"killed by {fx.run.exit_signal} (exit code {code})"
        if fx.run.exit_signal
        else f"exit code {code}"
    )
    trained = fx.run.trained is True
    summary = (
        f"The training command failed: {how}, {when:.0f} s into the run"
        + ("" if trained else ", before any training step was seen")
        + "."
    )
    if fx.run.error:
        summary += f" Its last error: {plain(fx.run.error, 300).rstrip('.')}."
        why = "the trainer's own error, recorded when it was raised"
    else:
        why = (
            "the trainer's error output (above, in the terminal) says why; no Python "
            "exception was recorded"
        )
    if not trained:
        summary += " No bottleneck is named from a run that did not train."
    fixes = [
        Fix(
            "fix the error the trainer reported"
            + (f" ({plain(fx.run.error, 120)})" if fx.run.error else "")
            + ", then watch the training again",
            why,
        )
    ]
    ev: dict[str, Any] = {"exit_code": code, "trained": fx.run.trained, "failed_at_s": when}
    if fx.run.error:
        ev["error"] = fx.run.error
    if fx.run.exit_signal:
        ev["signal"] = fx.run.exit_signal
    return [
        Finding(
            kind=Kind.COMMAND_FAILED,
            severity="critical" if not trained else "warning",
            confidence=1.0,
            summary=summary,
            evidence=ev,
            fixes=fixes,
            est_speedup=1.0,
            rule=f"exit code {code} ≠ 0, not stopped by the user"
            + ("" if trained else "; no training seen: the verdict, no bottleneck named"),
            too_little_data=not trained,
        )
    ]
