"""Rules about the GPU: compute-bound (healthy), host-bound, throttling, XIDs and row remaps,
memory growth, a degraded PCIe link, and a GPU held while idle.
"""

from __future__ import annotations

from stallscope.analysis.diagnose.model import Finding, Fix, Kind, RunData, Severity
from stallscope.analysis.diagnose.rules.common import STALL_WARN
from stallscope.analysis.diagnose.rules.scores import fetch_prep_scores
from stallscope.analysis.diagnose.rules.threads import gil
from stallscope.analysis.diagnose.tfdata import (
    is_tf,
    tf_compute_fix,
)
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import (
    trainer_gpus,
)
from stallscope.sources.owner import OWNER_KEYS, describe
from stallscope.stats import fit_line

#: NVML clocks-event reasons that mean the GPU was slowed by heat or a hardware power event.
#: sw_power_cap (0x4) is left out: a datacenter GPU at full load sits at its power cap by
#: design, and gpu_idle / application-clock reasons are choices, not trouble.
_THROTTLE_BITS = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


#: a CPU trainer process at this share of a core or more computes (no probe, no GPU)
TRAINER_BUSY_PCT = 80.0
#: with no measured data wait (no probe, no sampled stacks) the GPU must be busier to be called
#: the bottleneck than with one (:data:`GPU_BUSY_PCT`): utilization alone cannot rule out a
#: short wait for data per step
GPU_BUSY_UNMEASURED_PCT = 80.0


#: gpu_throttled: thermal or hardware clock-event reasons in this share of samples, or a
#: temperature from HOT_C (°C)
THROTTLED_SHARE = 0.2
HOT_C = 85.0
#: gpu_health: the health flag's value that means a problem (0 or 1)
HEALTH_FLAG = 0.5
#: gpu_memory_growth: samples after the warm-up, fit (r²), growth in MiB and share of the card
GROWTH_MIN_SAMPLES = 10
GROWTH_R2 = 0.8
GROWTH_MIB = 512.0
GROWTH_SHARE = 0.02
#: pcie_degraded: the share of loaded samples below the maximum, and what loaded means (%)
PCIE_DEGRADED_SHARE = 0.5
PCIE_LOADED_PCT = 30.0


def rule_compute_bound(data: RunData, fx: Facts) -> list[Finding]:
    """compute_bound: data wait < 15% of step time (probe) and, when there is a GPU, it is busy
    ≥ 70% of the time. Without a GPU the CPU trainer itself is the compute."""
    if fx.steps.stall_source is None and fx.gpu.gpus == 0:
        return _cpu_trainer_computes(fx)
    if fx.steps.stall_source == "main_thread" and fx.steps.stall_fraction is not None:
        return _main_thread_computes(fx)
    if fx.steps.stall_source not in ("probe", "stacks") or fx.steps.stall_fraction is None:
        return _gpu_busy_unmeasured(fx)
    if fx.steps.stall_fraction >= STALL_WARN:
        return []
    if fx.loader.loader_threads and gil(fx, fx.steps.stall_fraction) is not None:
        return []  # loader threads hold the GIL the step needs: input_bound.gil, not healthy
    if fx.gpu.gpu_util_median_pct is not None and fx.gpu.gpu_util_median_pct < GPU_BUSY_PCT:
        return []  # the GPU idles without waiting for data: rule_host_bound
    if (
        fx.gpu.gpu_util_median_pct is None
        and fx.gpu.gpu_busy_share is not None
        and fx.gpu.gpu_busy_share < GPU_BUSY_PCT / 100
    ):
        return []
    gpu = (
        f", GPU busy {fx.gpu.gpu_util_median_pct:.0f}%"
        if fx.gpu.gpu_util_median_pct is not None
        else f", GPU busy {fx.gpu.gpu_busy_share:.0%} between the steps' CUDA events"
        if fx.gpu.gpu_busy_share is not None
        else ""
    )
    if fx.gpu.gpu_warmup_s:
        gpu += f" once warm (its first {fx.gpu.gpu_warmup_s:.0f} s of training were warm-up)"
    fixes = [
        tf_compute_fix()
        if is_tf(fx)
        else _gpu_compute_fixes()[0]
        if fx.gpu.gpus
        else Fix(
            "nothing to fix in the input pipeline; to go faster, make the model step "
            "cheaper (mixed precision, larger batch, torch.compile)",
            "the step is compute time, not waiting",
        )
    ]
    stacks = fx.steps.stall_source == "stacks"
    how = (
        " (sampled stacks of the training thread, no code in the trainer)"
        if stacks
        else f" (per-step probe, added by {fx.loader.config['added_by']}: no code in the trainer)"
        if fx.loader.config.get("added_by")
        else ""
    )
    return [
        Finding(
            kind=Kind.COMPUTE_BOUND,
            severity="info",
            confidence=0.8 if stacks else 0.85,
            summary=f"Compute-bound (healthy): the trainer waited for data only "
            f"{fx.steps.stall_fraction:.0%} of the time{gpu}{how}.",
            evidence=fx.evidence(
                "stall_fraction",
                "stall_source",
                "phase_shares",
                "stack_samples",
                "wait_ms_median",
                "step_ms_median",
                "gpu_util_median_pct",
                "gpu_warmup_s",
                "gpu_busy_share",
                "worker_cpu_pct",
                "samples_per_s",
            ),
            fixes=fixes,
            est_speedup=1.0,
            rule=f"{'sampled ' if stacks else ''}data wait "
            f"{fx.steps.stall_fraction:.0%} < {STALL_WARN:.0%}",
        )
    ]


def _cpu_trainer_computes(fx: Facts) -> list[Finding]:
    """compute_bound for CPU training without the probe: the trainer process itself is the
    compute."""
    if fx.procs.tf_trainer:  # tf.data prepares on the trainer's own threads: see rule_tf_blind
        return []
    if not fx.loader.workers:  # loading shares the trainer's threads: rule_loading_in_trainer
        return []
    # CPU training without the probe: the trainer process itself is the compute
    fs, _, ps, _ = fetch_prep_scores(fx)
    if (fx.procs.main_cpu_pct or 0) >= TRAINER_BUSY_PCT and max(fs, ps) < 2:
        return [
            Finding(
                kind=Kind.COMPUTE_BOUND,
                severity="info",
                confidence=0.5,
                summary=f"Likely compute-bound: the trainer process computes at "
                f"{fx.procs.main_cpu_pct:.0f}% CPU while its workers and the disk show "
                "no saturation.",
                evidence=fx.evidence(
                    "main_cpu_pct", "worker_cpu_pct", "worker_d_share", "disk_util_median_pct"
                ),
                fixes=[
                    Fix(
                        "wrap the loader with stallscope.watch(loader) to confirm",
                        "without the probe or a GPU the data wait is not measured",
                    )
                ],
                rule="trainer ≥ 80% CPU, no fetch/prep signal (no probe, no GPU)",
            )
        ]
    return []


def _main_thread_computes(fx: Facts) -> list[Finding]:
    """compute_bound estimated from the main thread's idle share (no probe, no GPU)."""
    if fx.steps.stall_fraction is None or fx.steps.stall_fraction >= STALL_WARN:
        return []
    busy = fx.procs.main_thread_busy_share or 0.0
    return [
        Finding(
            kind=Kind.COMPUTE_BOUND,
            severity="info",
            confidence=0.7,
            summary=f"Compute-bound (healthy): the trainer's main thread ran {busy:.0%} of "
            f"the time, so it waited for data about {fx.steps.stall_fraction:.0%} "
            "(an estimate: no probe, no GPU).",
            evidence=fx.evidence(
                "stall_fraction",
                "stall_source",
                "main_thread_busy_share",
                "main_cpu_pct",
                "worker_cpu_pct",
                "workers",
            ),
            fixes=[
                Fix(
                    "nothing to fix in the input pipeline; to go faster, make the "
                    "model step cheaper (a larger batch, torch.compile, more "
                    "torch threads)",
                    "the trainer computes; it rarely waits",
                ),
                Fix(
                    "wrap the loader with stallscope.watch(loader) to measure it",
                    "the probe times each step's data wait instead of estimating it",
                ),
            ],
            rule=f"estimated data wait {fx.steps.stall_fraction:.0%} < "
            f"{STALL_WARN:.0%} (main thread idle share, no probe, no GPU)",
        )
    ]


def _gpu_busy_unmeasured(fx: Facts) -> list[Finding]:
    """compute_bound with no measured data wait (no probe, no sampled stacks): the GPU busy
    ≥ GPU_BUSY_UNMEASURED_PCT."""
    if (
        fx.gpu.gpu_util_median_pct is not None
        and fx.gpu.gpu_util_median_pct >= GPU_BUSY_UNMEASURED_PCT
    ):
        return [
            Finding(
                kind=Kind.COMPUTE_BOUND,
                severity="info",
                confidence=0.6,
                summary=f"The GPU is busy (median {fx.gpu.gpu_util_median_pct:.0f}% "
                "utilization): compute is the bottleneck, which is healthy.",
                evidence=fx.evidence("gpu_util_median_pct"),
                fixes=[
                    Fix(
                        "wrap the loader with stallscope.watch(loader)",
                        "confirms with per-step data wait",
                    )
                ],
                est_speedup=1.0,
                rule=f"GPU util ≥ {GPU_BUSY_UNMEASURED_PCT:.0f}% (no probe)",
            )
        ]
    return []


#: NVML utilization (%, the window's steady state) from which a GPU counts as busy: at or
#: above it a run that does not wait for data is compute-bound, below it host-bound
GPU_BUSY_PCT = 70.0


#: the training thread's share in forward/backward/optimizer code (sampled stacks) from which
#: it counts as busy issuing work, and the share waiting for the GPU under which it does not
#: wait for it
HOST_BUSY_SHARE = 0.5


HOST_GPU_WAIT_SHARE = 0.2


def _gpu_compute_fixes() -> list[Fix]:
    return [
        Fix(
            "make the GPU's work cheaper: bf16 autocast (torch.autocast('cuda', "
            "dtype=torch.bfloat16)), channels_last for convolutions, torch.compile(model), "
            "a larger batch if memory allows",
            "the GPU is busy: it is the bottleneck, and the input keeps up",
        )
    ]


def rule_host_bound(data: RunData, fx: Facts) -> list[Finding]:
    """host_bound: a GPU training that does not wait for data (< 15%) nor for copies (< 15%),
    whose GPU is busy < 70% of the window's steady state (NVML), while its training thread is
    in forward/backward/optimizer code ≥ 50% of the time and waits for the GPU < 20% (sampled
    stacks; without them the probe's data wait alone says the gap is the host's step code):
    the GPU waits for the CPU to issue its work (Python overhead, many small kernels)."""
    if not fx.gpu.gpus or fx.gpu.gpu_util_median_pct is None or fx.steps.stall_fraction is None:
        return []
    if fx.steps.stall_source not in ("probe", "stacks") or fx.steps.stall_fraction >= STALL_WARN:
        return []
    if (fx.steps.h2d_share or 0.0) >= STALL_WARN or fx.gpu.gpu_util_median_pct >= GPU_BUSY_PCT:
        return []
    util = fx.gpu.gpu_util_median_pct
    shares = fx.steps.phase_shares
    if shares:
        busy = shares.get("compute", 0.0)
        waits = shares.get("gpu_wait", 0.0)
        if busy < HOST_BUSY_SHARE or waits >= HOST_GPU_WAIT_SHARE:
            return []
        where = (
            f"its training thread was in forward/backward/optimizer code {busy:.0%} of "
            f"the time and waited for the GPU only {waits:.0%} (sampled stacks)"
        )
        confidence = 0.8
        rule = (
            f"GPU util {util:.0f}% < {GPU_BUSY_PCT:.0f}%, data wait "
            f"{fx.steps.stall_fraction:.0%} < {STALL_WARN:.0%}, thread in compute {busy:.0%} ≥ "
            f"{HOST_BUSY_SHARE:.0%}, waiting for the GPU {waits:.0%} < "
            f"{HOST_GPU_WAIT_SHARE:.0%}"
        )
    else:
        where = (
            f"the trainer waited for data only {fx.steps.stall_fraction:.0%} of its steps "
            "(per-step probe), so the rest of each step is its own host code"
        )
        confidence = 0.6
        rule = (
            f"GPU util {util:.0f}% < {GPU_BUSY_PCT:.0f}%, data wait "
            f"{fx.steps.stall_fraction:.0%} < {STALL_WARN:.0%} (no stacks)"
        )
    est = round(min(5.0, GPU_BUSY_PCT / max(util, 14.0)), 2)
    fixes = _host_bound_fixes(util)
    ev = fx.evidence(
        "gpu_util_median_pct",
        "gpu_warmup_s",
        "gpu_busy_share",
        "stall_fraction",
        "stall_source",
        "phase_shares",
        "stack_samples",
        "step_ms_median",
        "main_cpu_pct",
        "window_s",
    )
    sev: Severity = "warning"
    return [
        Finding(
            kind=Kind.HOST_BOUND,
            severity=sev,
            confidence=confidence,
            summary=f"Host-bound: the GPU was busy only {util:.0f}% of the training (NVML, "
            f"steady state) while {where}: the GPU waits for the CPU to issue its "
            "work (Python overhead, kernels too short to hide their launch).",
            evidence=ev,
            fixes=fixes,
            est_speedup=est,
            rule=rule,
        )
    ]


def _host_bound_fixes(util: float) -> list[Fix]:
    """What makes the CPU issue the GPU's work faster (util: the GPU's busy %)."""
    return [
        Fix(
            'capture the step in CUDA graphs: torch.compile(model, mode="reduce-overhead")',
            "one launch replays the step's kernels: the CPU's per-kernel cost goes away",
        ),
        Fix(
            "a larger batch (same steps, more work per launch)",
            f"the GPU is busy {util:.0f}%: each kernel is too short to hide its launch",
        ),
        Fix(
            "fused optimizers: torch.optim.AdamW(..., fused=True) (or foreach=True)",
            "one kernel per parameter group instead of several per parameter",
        ),
        Fix(
            "fewer host syncs per step: log loss.item() every N steps, not every step",
            "each .item() waits for the GPU to drain, then the CPU starts issuing again",
        ),
    ]


def rule_gpu_throttled(data: RunData, fx: Facts) -> list[Finding]:
    """gpu_throttled: thermal/power clock-event reasons active in ≥ 20% of the samples, or the
    GPU at ≥ 85 °C (the usual alert threshold for sustained heat)."""
    out = []
    mine = trainer_gpus(data)
    for s in data.all("gpu.throttle_mask"):
        if s.entity not in mine:
            continue
        masks = [int(v) for v in s.v]
        if not masks:
            continue
        bad = [m for m in masks if any(m & b for b in _THROTTLE_BITS)]
        temp = data.get("gpu.temp_c", s.entity)
        tmax = max(temp.v) if temp and temp.v else None
        share = len(bad) / len(masks)
        if share < THROTTLED_SHARE and (tmax is None or tmax < HOT_C):
            continue
        reasons = sorted({n for m in bad for b, n in _THROTTLE_BITS.items() if m & b})
        mem = data.get("gpu.mem_temp_c", s.entity)
        ev = {
            "gpu": s.entity,
            "throttled_share": round(share, 3),
            "reasons": reasons,
            "temp_max_c": tmax,
            # HBM heats apart from the core: a hot memory throttles a GPU with a cool core
            "mem_temp_max_c": max(mem.v) if mem is not None and mem.v else None,
        }
        fixes = []
        if any("thermal" in r for r in reasons) or (tmax or 0) >= HOT_C:
            fixes.append(
                Fix(
                    "check cooling: fans, airflow, inlet temperature, dust",
                    f"thermal slowdown; max temperature {tmax} °C",
                )
            )
        if any("power" in r for r in reasons):
            fixes.append(
                Fix(
                    "check the power limit (nvidia-smi -q -d POWER) and PSU/cabling",
                    "clocks capped by the power limit",
                )
            )
        out.append(
            Finding(
                kind=Kind.GPU_THROTTLED,
                severity="warning",
                confidence=0.9,
                summary=f"{s.entity} was throttled ({', '.join(reasons) or 'temperature'}) "
                f"in {share:.0%} of samples.",
                evidence=ev,
                fixes=fixes,
                est_speedup=round(1 + 0.2 * share, 2),
                rule="thermal/power throttle reasons in ≥ 20% of samples or ≥ 85 °C",
            )
        )
    return out


def rule_gpu_health(data: RunData, fx: Facts) -> list[Finding]:
    """gpu_health: a GPU needs a person. An XID error during the run (the codes the NVIDIA
    device plugin treats as application errors left out), a row remap pending a reset or
    failed, or a page retirement pending. Any GPU of the machine, whether the trainer's or not:
    the next job lands on it."""
    from stallscope.sources.gpu import XID_MEANINGS

    out = []
    mine = trainer_gpus(data)

    def peak(name: str, entity: str) -> float:
        s = data.get(name, entity)
        return max(s.v) if s is not None and s.v else 0.0

    for s in data.all("gpu.health_problem"):
        if not s.v or max(s.v) < HEALTH_FLAG:
            continue
        gpu = s.entity
        xids = int(peak("gpu.xid_count", gpu))
        last = data.get("gpu.xid_last", gpu)
        code = next((int(v) for v in reversed(last.v) if v), 0) if last is not None else 0
        pending, failed = peak("gpu.row_remap_pending", gpu), peak("gpu.row_remap_failed", gpu)
        pages = peak("gpu.retired_pages_pending", gpu)
        what, fixes = [], []
        if xids:
            meaning, todo = XID_MEANINGS.get(
                code, ("an XID NVIDIA's catalog lists", "drain the node if it repeats")
            )
            what.append(f"{xids} XID error{'s' if xids > 1 else ''} (last: XID {code}, {meaning})")
            fixes.append(Fix(f"{todo[0].upper()}{todo[1:]}", f"XID {code} on {gpu}: {meaning}"))
        if failed:
            what.append("a row remap failed")
            fixes.append(
                Fix(
                    f"replace the GPU behind {gpu}",
                    "a row remap failed (remapped_rows.failure): its memory can no "
                    "longer hide bad rows",
                )
            )
        if pending:
            what.append("a row remap waits for a reset")
            fixes.append(
                Fix(
                    f"reset the GPU when its jobs end (nvidia-smi -r -i "
                    f"{gpu.removeprefix('gpu')}), or reboot the node",
                    "the remap takes effect at the next reset (remapped_rows.pending)",
                )
            )
        if pages:
            what.append("a page retirement waits for a reset")
            fixes.append(
                Fix(
                    "reset the GPU or reboot the node when its jobs end",
                    "pages are retired at the next reset (retired_pages.pending)",
                )
            )
        ev = {
            "gpu": gpu,
            "trainer_gpu": gpu in mine,
            "xid_count": xids,
            "xid_last": code,
            "row_remap_pending": int(pending),
            "row_remap_failed": int(failed),
            "retired_pages_pending": int(pages),
        }
        out.append(
            Finding(
                kind=Kind.GPU_HEALTH,
                severity="critical",
                confidence=0.95,
                summary=f"{gpu} needs attention: {'; '.join(what) or 'a health flag'}.",
                evidence=ev,
                fixes=fixes,
                est_speedup=1.0,
                rule="an XID (not an application's), a pending or failed row remap, or a "
                "pending page retirement",
            )
        )
    return out


def rule_gpu_memory_growth(data: RunData, fx: Facts) -> list[Finding]:
    """gpu_memory_growth: after the first quarter of the run (warm-up), GPU memory rises
    steadily (linear fit r² ≥ 0.8) by ≥ 512 MiB and ≥ 2% of the card over ≥ 10 samples: a leak
    (tensors kept across steps)."""
    out = []
    mine = trainer_gpus(data)
    for full in data.all("gpu.mem_used_mib"):
        # the first quarter of the run is warm-up (weights, CUDA context, allocator pools):
        # memory rising there is loading, not leaking
        skip = len(full.v) // 4
        ts, vs = full.ts[skip:], full.v[skip:]
        if full.entity not in mine or len(vs) < GROWTH_MIN_SAMPLES:
            continue
        s = full
        line = fit_line(zip(ts, vs))
        slope, r2 = line.slope, line.r2
        grew = vs[-1] - vs[0]
        total = data.get("gpu.mem_total_mib", s.entity)
        cap = total.v[-1] if total and total.v else None
        if slope <= 0 or r2 < GROWTH_R2 or grew < GROWTH_MIB or (cap and grew < GROWTH_SHARE * cap):
            continue
        ev = {
            "gpu": s.entity,
            "growth_mib": round(grew),
            "rate_mib_per_min": round(slope * 60, 1),
            "r2": round(r2, 3),
        }
        if cap:
            ev["minutes_to_full"] = round((cap - vs[-1]) / slope / 60, 1)
        out.append(
            Finding(
                kind=Kind.GPU_MEMORY_GROWTH,
                severity="warning",
                confidence=min(0.95, r2),
                summary=f"{s.entity} memory grows steadily ({slope * 60:.0f} MiB/min, "
                f"+{grew:.0f} MiB): likely a leak.",
                evidence=ev,
                fixes=[
                    Fix(
                        "look for tensors kept across steps (loss accumulated without "
                        ".item()/.detach(), lists of outputs, caches)",
                        "memory rises linearly while the workload is steady",
                    )
                ],
                est_speedup=1.0,
                rule="linear growth r² ≥ 0.8, ≥ 512 MiB and ≥ 2% of the card",
            )
        )
    return out


def rule_pcie_degraded(data: RunData, fx: Facts) -> list[Finding]:
    """pcie_degraded: under load (util ≥ 30%) the link runs below its max generation or width
    in ≥ 50% of samples. (Idle GPUs drop to a low generation to save power: not a finding.)"""
    out = []
    mine = trainer_gpus(data)
    for s in data.all("gpu.util_pct"):
        if s.entity not in mine:
            continue
        got = {
            k: data.get(f"gpu.{k}", s.entity)
            for k in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")
        }
        g = {k: v for k, v in got.items() if v is not None and v.v}
        if len(g) < len(got):
            continue
        idx = {t: i for i, t in enumerate(s.ts)}
        loaded = degraded = 0
        worst: tuple[float, float] = (99.0, 99.0)
        for series_t, gen, gmax, wid, wmax in zip(
            g["pcie_gen"].ts,
            g["pcie_gen"].v,
            g["pcie_gen_max"].v,
            g["pcie_width"].v,
            g["pcie_width_max"].v,
        ):
            i = idx.get(series_t)
            if i is None or s.v[i] < PCIE_LOADED_PCT:
                continue
            loaded += 1
            if gen < gmax or wid < wmax:
                degraded += 1
                worst = min(worst, (gen, wid))
        if loaded and degraded / loaded >= PCIE_DEGRADED_SHARE:
            gmax = g["pcie_gen_max"].v[-1]
            wmax = g["pcie_width_max"].v[-1]
            out.append(
                Finding(
                    kind=Kind.PCIE_DEGRADED,
                    severity="warning",
                    confidence=0.8,
                    summary=f"{s.entity} PCIe link at Gen{worst[0]:.0f} x{worst[1]:.0f} under load "
                    f"(max Gen{gmax:.0f} x{wmax:.0f}).",
                    evidence={
                        "gpu": s.entity,
                        "gen": worst[0],
                        "gen_max": gmax,
                        "width": worst[1],
                        "width_max": wmax,
                        "degraded_share": round(degraded / loaded, 3),
                    },
                    fixes=[
                        Fix(
                            "reseat the card / check the slot and riser; check BIOS PCIe settings",
                            "a degraded link cuts host-to-device bandwidth",
                        )
                    ],
                    est_speedup=1.0,
                    rule="link below max gen/width in ≥ 50% of loaded samples",
                )
            )
    return out


#: how long a GPU must sit idle while held before it is called held-idle, and what "held" is
HELD_IDLE_S = 600.0


HELD_MIB = 256.0


IDLE_PCT = 1.0


def rule_gpu_held_idle(data: RunData, fx: Facts) -> list[Finding]:
    """gpu_held_idle: a GPU at ≤ 1% utilization for the last ≥ 10 minutes of the run while
    processes hold ≥ 256 MiB of its memory: allocated to a job that does not use it (a hung
    or finished job that keeps its context, a notebook left open). Under MIG NVML gives no
    utilization: no series, no verdict (never read as idle)."""
    out = []
    for s in data.all("gpu.util_pct"):
        if not s.ts:
            continue
        end = s.ts[-1]
        since = end
        for t, v in zip(reversed(s.ts), reversed(s.v)):
            if v > IDLE_PCT:
                break
            since = t
        idle_s = end - since
        if idle_s < HELD_IDLE_S:
            continue
        holders = []
        for ps in data.all("gpu.proc_mem_mib"):
            if not ps.entity.startswith(f"{s.entity}:"):
                continue
            held = [v for t, v in zip(ps.ts, ps.v) if t >= since]
            if held and min(held) >= HELD_MIB:
                pid = ps.entity.split(":", 1)[1]
                attrs = data.entity_attrs("gpu", ps.entity)
                holders.append(
                    {
                        "pid": int(pid) if pid.isdigit() else pid,
                        "mem_mib": round(held[-1]),
                        **{k: attrs[k] for k in OWNER_KEYS if attrs.get(k)},
                    }
                )
        if not holders:
            continue
        who = ", ".join(describe(h) or f"pid {h['pid']}" for h in holders[:3])
        ev = {
            "gpu": s.entity,
            "idle_s": round(idle_s),
            "util_max_pct": max(v for t, v in zip(s.ts, s.v) if t >= since),
            "holders": holders,
        }
        out.append(
            Finding(
                kind=Kind.GPU_HELD_IDLE,
                severity="warning",
                confidence=0.9,
                summary=f"{s.entity} did no work for the last {idle_s / 60:.0f} min while {who} "
                f"held {sum(h['mem_mib'] for h in holders):.0f} MiB of its memory: allocated, "
                "unused.",
                evidence=ev,
                fixes=[
                    Fix(
                        "end or release the job holding it (or lower its GPU request)",
                        "a held GPU cannot be scheduled to another job",
                    ),
                    Fix(
                        "if it should be training: look for a hang (stallscope top --pid PID, "
                        "py-spy dump --pid PID)",
                        "no kernel ran on it for minutes",
                    ),
                ],
                est_speedup=1.0,
                rule=f"GPU utilization ≤ {IDLE_PCT:g}% for ≥ {HELD_IDLE_S / 60:.0f} "
                "min while "
                f"processes hold ≥ {HELD_MIB:.0f} MiB",
            )
        )
    return out
