"""The GPU slowed the training (``gpu_slowdown``): step time rose and stayed up at the moment
the GPU a rank trained on showed a cause of its own.

Training-side tools see "the job got slower"; fleet exporters see XIDs, ECC errors and clock
throttling with no step attached. This rule joins the two: a rise in step time found by the
run's change detection (:func:`stallscope.analysis.changes.detect_changes`, the detector
``diagnose``'s ``changes`` uses) is told as the GPU's doing only when, within
:data:`CAUSE_NEAR_S` of its start, that GPU's SM clock fell with a throttle reason active, an
XID came, remapped rows, retired pages or uncorrected ECC errors grew, its PCIe link trained
below its maximum under load, or its memory reached its temperature limit. A clock that drops
while step time holds (an idle phase, an evaluation) and a slower step with no GPU cause are
not this finding.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from stallscope.analysis.diagnose.model import Finding, Fix, Kind, RunData, Severity
from stallscope.analysis.facts import Facts
from stallscope.analysis.gpuevents import clock, health_events, rank_gpus

__all__ = ["own_gpu_cause", "rule_gpu_slowdown", "slowdown_causes"]

#: step time must rise by this share of its level before (and stay up) to count as slower
SLOWDOWN_MIN = 0.10
#: a GPU cause counts when it began within this many seconds of the slowdown's start (or
#: three sample intervals, whichever is longer): the change's start is dated to a sample or two
CAUSE_NEAR_S = 15.0
#: the GPU's level before a slowdown is read over this many seconds, and after it over as many
BASELINE_S = 60.0
#: the SM clock must fall by this share of its level before
CLOCK_DROP_MIN = 0.08
#: a throttle reason counts when it is active in this share of the samples after the drop
REASON_SHARE = 0.5
#: HBM's maximum operating temperature (H100/H200 HBM3/HBM3e; NVML does not report it), and how
#: near it counts as "at its limit"
MEM_TEMP_LIMIT_C = 95.0
MEM_TEMP_MARGIN_C = 5.0
#: NVML utilization from which a GPU counts as loaded (an idle link drops its PCIe generation),
#: and the share of loaded samples below the link's maximum that counts as trained down
PCIE_LOAD_PCT = 30.0
PCIE_LOW_SHARE = 0.5
#: a power limit lowered by this share of its level before is named beside the clock
POWER_LIMIT_DROP = 0.05

#: clock-event reasons that are a cause, as users read them (gpu_idle is no cause: an idle GPU
#: is slow because nothing runs, not the other way round)
REASON_WORDS = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal": "HW thermal slowdown",
    "sw_thermal": "SW thermal slowdown",
    "hw_power_brake": "HW power brake",
    "sw_power_cap": "power cap",
    "sync_boost": "sync boost",
    "applications_clocks": "clocks locked or set by an administrator",
}
#: health counters and flags read when a run holds no events (Prometheus), and their words
_GREW = (
    ("remapped_rows_uncorrectable", "rows remapped after uncorrectable ECC errors"),
    ("remapped_rows_correctable", "rows remapped after correctable ECC errors"),
    ("ecc_errors", "uncorrected ECC errors"),
    ("retired_pages", "pages retired"),
    ("row_remap_failed", "a row remap failed"),
    ("row_remap_pending", "a row remap waits for a reset"),
)


def _median(xs: list[float]) -> float | None:
    from stallscope.stats import median

    xs = [x for x in xs if math.isfinite(x)]
    return median(xs) if xs else None


def _between(data: RunData, name: str, gpu: str, a: float, b: float) -> list[float]:
    s = data.get(name, gpu)
    if s is None:
        return []
    return [v for t, v in zip(s.ts, s.v) if a <= t <= b]


def _interval(data: RunData) -> float:
    iv = data.meta.get("interval_s")
    return float(iv) if isinstance(iv, (int, float)) and iv > 0 else 1.0


def _slowdowns(data: RunData, rank: int) -> list[dict[str, Any]]:
    """Rises in ``rank``'s step time that lasted (the change detection ``diagnose`` runs, with
    this rule's smaller relative threshold): start, before and after (ms), when it ended."""
    from stallscope.analysis.changes import detect_changes
    from stallscope.analysis.diagnose import MIN_LASTING_S, NOISE_TIMES, _level_end, _noise

    rows = [s for s in data.steps if s.rank == rank]
    ts = [s.ts for s in rows]
    xs = [s.step_s * 1000 for s in rows]
    if len(xs) < 2:
        return []
    floor = max(NOISE_TIMES * _noise(xs), 1e-9)
    step = (ts[-1] - ts[0]) / max(1, len(ts) - 1)
    lasting = max(MIN_LASTING_S, 5 * step)
    out = []
    for c in detect_changes(ts, xs):
        if c.direction != "up" or c.after - c.before < max(SLOWDOWN_MIN * c.before, floor):
            continue
        ended = _level_end(ts, xs, c.detected_ts, c.before, c.after)
        if ended is not None and ended - c.start_ts < lasting:
            continue  # a blip
        out.append(
            {
                "rank": rank,
                "start": c.start_ts,
                "before_ms": c.before,
                "after_ms": c.after,
                "ended": ended,
            }
        )
    return out


def slowdown_causes(
    data: RunData, gpu: str, start: float, end: float, events: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """What ``gpu`` did that slows a training, beginning within :data:`CAUSE_NEAR_S` of
    ``start`` (its level after read up to ``end``): each cause with its numbers and its words."""
    near = max(CAUSE_NEAR_S, 3 * _interval(data))
    w = _Windows(start - near - BASELINE_S, start - near, start, min(end, start + BASELINE_S), near)
    told = [
        e
        for e in (events if events is not None else health_events(data))
        if e["gpu"] == gpu and abs(e["ts"] - start) <= near
    ]
    return [
        *_clock_cause(data, gpu, w),
        *_told_causes(gpu, told),
        *([] if told else _grown_causes(data, gpu, start, w)),
        *_pcie_cause(data, gpu, w),
        *_mem_temp_cause(data, gpu, w),
    ]


@dataclass(frozen=True)
class _Windows:
    """Where a GPU's level before a slowdown is read (b0..b1) and after it (a0..a1)."""

    b0: float
    b1: float
    a0: float
    a1: float
    near: float


def _clock_cause(data: RunData, gpu: str, w: _Windows) -> list[dict[str, Any]]:
    """The SM clock fell, with a throttle reason active after."""
    from stallscope.sources.gpu import THROTTLE_REASONS

    before = _median(_between(data, "gpu.sm_clock_mhz", gpu, w.b0, w.b1))
    after = _median(_between(data, "gpu.sm_clock_mhz", gpu, w.a0, w.a1))
    masks = [int(m) for m in _between(data, "gpu.throttle_mask", gpu, w.a0, w.a1)]
    if not before or after is None or after > before * (1 - CLOCK_DROP_MIN) or not masks:
        return []
    reasons = [
        name
        for bit, name in THROTTLE_REASONS
        if name in REASON_WORDS and sum(1 for m in masks if m & bit) >= REASON_SHARE * len(masks)
    ]
    if not reasons:
        return []
    temp = _median(_between(data, "gpu.temp_c", gpu, w.a0, w.a1))
    p_before = _median(_between(data, "gpu.power_limit_w", gpu, w.b0, w.b1))
    p_after = _median(_between(data, "gpu.power_limit_w", gpu, w.a0, w.a1))
    why = [REASON_WORDS[r] for r in reasons]
    if temp is not None:
        why.append(f"{temp:.0f} °C")
    lowered = (
        p_before is not None and p_after is not None and p_after < (1 - POWER_LIMIT_DROP) * p_before
    )
    if lowered:
        why.append(f"power limit lowered from {p_before:,.0f} to {p_after:,.0f} W")
    return [
        {
            "cause": "sm_clock",
            "gpu": gpu,
            "sm_clock_before_mhz": round(before),
            "sm_clock_after_mhz": round(after),
            "reasons": reasons,
            "temp_c": None if temp is None else round(temp, 1),
            "power_limit_before_w": p_before if lowered else None,
            "power_limit_after_w": p_after if lowered else None,
            "words": f"GPU {gpu.removeprefix('gpu')}'s SM clock fell from {before:,.0f} to "
            f"{after:,.0f} MHz ({', '.join(why)})",
        }
    ]


def _told_causes(gpu: str, told: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The XIDs and other health events the source told near the start."""
    from stallscope.sources.gpu import XID_MEANINGS

    out = []
    for e in told:
        st = e.get("step")
        at = f" at {clock(e['at_s'])}" + (f" (rank {st['rank']}'s step {st['step']})" if st else "")
        if e["kind"] == "gpu_xid" and e.get("xid") is not None:
            meaning = XID_MEANINGS.get(e["xid"], ("see NVIDIA's XID catalog",))[0]
            words = f"GPU {gpu.removeprefix('gpu')} raised XID {e['xid']}{at}: {meaning}"
        else:
            what = e["message"].split(": ", 1)[-1]
            words = f"GPU {gpu.removeprefix('gpu')} reported{at}: {what}"
        out.append(
            {
                "cause": "xid" if e["kind"] == "gpu_xid" else "health_event",
                "gpu": gpu,
                "xid": e.get("xid"),
                "at_s": e["at_s"],
                "step": st,
                "message": e["message"],
                "words": words,
            }
        )
    return out


def _grown_causes(data: RunData, gpu: str, start: float, w: _Windows) -> list[dict[str, Any]]:
    """Health counters that grew near the start, for a run read without its events (from
    Prometheus): remapped rows, ECC errors, retired pages, remap flags, XIDs."""
    idx = gpu.removeprefix("gpu")
    out = []
    for key, what in (*_GREW, ("xid_count", "XID errors")):
        prior = _between(data, f"gpu.{key}", gpu, -math.inf, start - w.near - 1e-9)
        around = _between(data, f"gpu.{key}", gpu, start - w.near, start + w.near)
        if not prior or not around or max(around) <= prior[-1]:
            continue
        n = max(around) - prior[-1]
        words = (
            f"on GPU {idx}, {what}"
            if key.startswith("row_remap_")
            else f"{n:.0f} more {what} on GPU {idx}"
        )
        out.append(
            {
                "cause": "xid" if key == "xid_count" else key,
                "gpu": gpu,
                "before": prior[-1],
                "after": max(around),
                "words": words,
            }
        )
    return out


def _loaded_low(data: RunData, gpu: str, a: float, b: float) -> float | None:
    """The share of the loaded samples in a..b whose PCIe link ran below its maximum."""
    util = data.get("gpu.util_pct", gpu)
    gen, gmax, wid, wmax = (
        data.get(f"gpu.{k}", gpu)
        for k in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")
    )
    if util is None or gen is None or gmax is None or wid is None or wmax is None:
        return None
    load = {t for t, v in zip(util.ts, util.v) if a <= t <= b and v >= PCIE_LOAD_PCT}
    mx = {t: (gm, wm) for t, gm, wm in zip(gmax.ts, gmax.v, wmax.v)}
    low = n = 0
    for t, gv, wv in zip(gen.ts, gen.v, wid.v):
        if t in load and t in mx:
            n += 1
            low += gv < mx[t][0] or wv < mx[t][1]
    return low / n if n else None


def _pcie_cause(data: RunData, gpu: str, w: _Windows) -> list[dict[str, Any]]:
    """The PCIe link trained below its maximum under load (at its maximum before)."""
    lo_before, lo_after = _loaded_low(data, gpu, w.b0, w.b1), _loaded_low(data, gpu, w.a0, w.a1)
    if lo_before is None or lo_after is None or not lo_before < PCIE_LOW_SHARE <= lo_after:
        return []
    gen, wid, gmax, wmax = (
        _median(_between(data, f"gpu.{k}", gpu, w.a0, w.a1)) or 0.0
        for k in ("pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max")
    )
    return [
        {
            "cause": "pcie",
            "gpu": gpu,
            "gen": gen,
            "width": wid,
            "gen_max": gmax,
            "width_max": wmax,
            "words": f"GPU {gpu.removeprefix('gpu')}'s PCIe link fell to Gen{gen:.0f} "
            f"x{wid:.0f} under load (its maximum Gen{gmax:.0f} x{wmax:.0f})",
        }
    ]


def _mem_temp_cause(data: RunData, gpu: str, w: _Windows) -> list[dict[str, Any]]:
    """The GPU's memory reached its temperature limit."""
    hot = MEM_TEMP_LIMIT_C - MEM_TEMP_MARGIN_C
    before = _median(_between(data, "gpu.mem_temp_c", gpu, w.b0, w.b1))
    after = _median(_between(data, "gpu.mem_temp_c", gpu, w.a0, w.a1))
    if before is None or after is None or not before < hot <= after:
        return []
    return [
        {
            "cause": "mem_temp",
            "gpu": gpu,
            "mem_temp_before_c": round(before, 1),
            "mem_temp_after_c": round(after, 1),
            "words": f"GPU {gpu.removeprefix('gpu')}'s memory reached {after:.0f} °C (from "
            f"{before:.0f} °C; HBM's limit is about {MEM_TEMP_LIMIT_C:.0f} °C)",
        }
    ]


def _fixes(causes: list[dict[str, Any]], gpu: str, when: str = "as the steps slowed") -> list[Fix]:
    kinds = {c["cause"] for c in causes}
    reasons = {r for c in causes for r in c.get("reasons") or ()}
    idx = gpu.removeprefix("gpu")
    fixes = []
    if kinds & {
        "xid",
        "health_event",
        "ecc_errors",
        "remapped_rows_uncorrectable",
        "remapped_rows_correctable",
        "retired_pages",
        "row_remap_pending",
        "row_remap_failed",
    }:
        fixes.append(
            Fix(
                f"drain the node and reset GPU {idx} (nvidia-smi -r -i {idx}) when its "
                "jobs end; replace it if the errors come back",
                f"the GPU reported errors {when}",
            )
        )
    if reasons & {"hw_thermal", "sw_thermal"} or "mem_temp" in kinds:
        fixes.append(
            Fix(
                "check the GPU's cooling: fans, airflow, inlet temperature, a blocked heatsink",
                f"the GPU slowed its clocks for heat {when}",
            )
        )
    if reasons & {"sw_power_cap", "hw_power_brake", "hw_slowdown"}:
        fixes.append(
            Fix(
                f"check GPU {idx}'s power limit and supply (nvidia-smi -q -d "
                "POWER,PERFORMANCE): a lowered limit, a PSU or cabling fault",
                f"the clocks fell under a power limit or brake {when}",
            )
        )
    if "applications_clocks" in reasons or "sync_boost" in reasons:
        fixes.append(
            Fix(
                f"reset GPU {idx}'s clocks (nvidia-smi -rgc -i {idx}; -rac for "
                "application clocks) or ask who locked them",
                "the clocks were set lower while the training ran",
            )
        )
    if "pcie" in kinds:
        fixes.append(
            Fix(
                "reseat the card or check its slot and riser; a reboot retrains the link",
                f"the link trained below its maximum {when}",
            )
        )
    return fixes


def _when(ts: float, t0: float) -> str:
    return f"{time.strftime('%H:%M', time.localtime(ts))}, {clock(ts - t0)} into the run"


def rule_gpu_slowdown(data: RunData, fx: Facts) -> list[Finding]:
    """gpu_slowdown: a rank's step time rose ≥ 10% and stayed up (change detection on the
    probe's steps, ≥ 3× the steps' own noise, lasting ≥ 10 s), and within 15 s of its start the
    GPU the rank trained on showed a cause: its SM clock fell ≥ 8% with a throttle reason
    (HW slowdown, thermal, power brake, power cap, sync boost, locked clocks) active in ≥ half
    the samples after, an XID or another health event (remapped rows, ECC errors, retired
    pages), its PCIe link trained below its maximum under load, or its memory reached
    ≥ 90 °C. Under DDP every rank slows with the slowest: the rank whose own GPU has the cause
    is named the straggler."""
    if not data.steps:
        return []
    gpus = rank_gpus(data)
    ranks = sorted({s.rank for s in data.steps})
    events = health_events(data)
    slow = [d for r in ranks for d in _slowdowns(data, r)]
    if not slow:
        return []
    near = max(CAUSE_NEAR_S, 3 * _interval(data))
    groups = _grouped(slow, near)
    candidates = sorted({g for g, _k in gpus.values()}) or sorted(
        {s.entity for s in data.all("gpu.sm_clock_mhz")}
    )
    t_end = data.t1
    out = []
    for group in groups:
        start = min(d["start"] for d in group)
        end = min((d["ended"] or t_end) for d in group)
        by_gpu = {g: c for g in candidates if (c := slowdown_causes(data, g, start, end, events))}
        if not by_gpu:
            continue  # slower steps with no GPU cause: another rule's business
        for gpu, causes in by_gpu.items():
            own = [r for r, (g, _k) in gpus.items() if g == gpu]
            known = all(gpus[r][1] for r in own)
            worst = max(group, key=lambda d: d["after_ms"] / max(d["before_ms"], 1e-9))
            lead = next((d for d in group if d["rank"] in own), worst)
            pct = lead["after_ms"] / max(lead["before_ms"], 1e-9) - 1
            ended = lead["ended"]
            text = _slowdown_text(data, group, lead, own, ranks, gpu, known, start, pct, causes)
            severity: Severity = (
                "critical"
                if any(c["cause"] in ("xid", "row_remap_failed") for c in causes)
                else "warning"
            )
            ev = {
                "gpu": gpu,
                "ranks": sorted({d["rank"] for d in group}),
                "straggler_rank": own[0] if len(ranks) > 1 and len(own) == 1 else None,
                "rank_gpu_known": known if own else None,
                "start_s": round(start - data.t0, 1),
                "start_ts": round(start, 3),
                "ended_s": None if ended is None else round(ended - data.t0, 1),
                "step_ms_before": round(lead["before_ms"], 2),
                "step_ms_after": round(lead["after_ms"], 2),
                "slower_share": round(pct, 3),
                "step_at_start": _step(data, start, own[0] if own else None),
                "causes": causes,
                "health_events": [
                    {k: e[k] for k in ("at_s", "gpu", "kind", "xid", "message", "step")}
                    for e in events
                    if e["gpu"] == gpu
                ],
            }
            out.append(
                Finding(
                    kind=Kind.GPU_SLOWDOWN,
                    severity=severity,
                    confidence=0.85 if known or not own else 0.7,
                    summary=text,
                    evidence=ev,
                    fixes=_fixes(causes, gpu),
                    est_speedup=round(max(1.0, 1 + pct), 2),
                    rule=f"step time ≥ {SLOWDOWN_MIN:.0%} slower and lasting, with a GPU cause "
                    f"within {near:.0f} s of its start (clock ≥ {CLOCK_DROP_MIN:.0%} down "
                    "with a throttle reason, an XID or health event, a PCIe link below its "
                    f"maximum, memory ≥ {MEM_TEMP_LIMIT_C - MEM_TEMP_MARGIN_C:.0f} °C)",
                )
            )
    return out


def _grouped(slow: list[dict[str, Any]], near: float) -> list[list[dict[str, Any]]]:
    """The slowdowns grouped by start: those starting within near seconds of a group's first
    are one slowdown seen on several ranks (they wait for each other)."""
    slow.sort(key=lambda d: d["start"])
    groups: list[list[dict[str, Any]]] = []
    for d in slow:
        if groups and d["start"] - groups[-1][0]["start"] <= near:
            groups[-1].append(d)
        else:
            groups.append([d])
    return groups


def _slowdown_text(
    data: RunData,
    group: list[dict[str, Any]],
    lead: dict[str, Any],
    own: list[int],
    ranks: list[int],
    gpu: str,
    known: bool,
    start: float,
    pct: float,
    causes: list[dict[str, Any]],
) -> str:
    """The finding's text: how much slower since when, the GPU's causes, and under DDP the
    straggler and the ranks that waited for it."""
    ended = lead["ended"]
    text = (
        f"Steps {pct:.0%} slower ({lead['before_ms']:,.0f} → "
        f"{lead['after_ms']:,.0f} ms a step) since {_when(start, data.t0)}"
        + (f", back {ended - start:.0f} s later" if ended else "")
        + f", when {'; '.join(c['words'] for c in causes)}."
    )
    if len(ranks) > 1 and own:
        others = sorted({d["rank"] for d in group} - set(own))
        who = ", ".join(str(r) for r in own)
        text += (
            f" Rank {who} is the straggler, slowed by its own GPU "
            f"(gpu{gpu.removeprefix('gpu')}"
            + ("" if known else ", by the order of the ranks")
            + ")"
        )
        text += (
            f"; rank{'s' if len(others) > 1 else ''} "
            f"{', '.join(str(r) for r in others)} slowed with it, waiting."
            if others
            else "."
        )
    return text


def _step(data: RunData, ts: float, rank: int | None) -> dict[str, Any] | None:
    from stallscope.analysis.gpuevents import step_at

    return step_at(data, ts, rank)


def own_gpu_cause(data: RunData, rank: int, peers: list[int]) -> dict[str, Any] | None:
    """Why a straggler rank's GPU, not its code, may be what holds it back over the whole run
    (no change point needed): its SM clock's median at least :data:`CLOCK_DROP_MIN` under the
    median of the peers' GPUs' medians, with a clock-event reason (:data:`REASON_WORDS`)
    active in :data:`REASON_SHARE` of its samples, or a health event (XID, ECC, remapped rows)
    of that GPU during the run. None when the ranks' GPUs are not known apart or nothing of
    the kind shows; else the cause with its numbers, its words and its fixes' input."""
    from stallscope.sources.gpu import THROTTLE_REASONS

    gpus = rank_gpus(data)
    if rank not in gpus:
        return None
    gpu, known = gpus[rank]
    others = sorted({gpus[p][0] for p in peers if p in gpus} - {gpu})
    sm = data.get("gpu.sm_clock_mhz", gpu)
    mine = _median(list(sm.v)) if sm else None
    theirs = _median(
        [m for g in others if (s := data.get("gpu.sm_clock_mhz", g)) and (m := _median(list(s.v)))]
    )
    if mine is None or not theirs or mine > theirs * (1 - CLOCK_DROP_MIN):
        return None
    mask = data.get("gpu.throttle_mask", gpu)
    masks = [int(m) for m in mask.v] if mask else []
    reasons = [
        name
        for bit, name in THROTTLE_REASONS
        if name in REASON_WORDS
        and masks
        and sum(1 for m in masks if m & bit) >= REASON_SHARE * len(masks)
    ]
    told = [e for e in health_events(data) if e["gpu"] == gpu]
    if not reasons and not told:
        return None
    temp = data.get("gpu.temp_c", gpu)
    temp_c = _median(list(temp.v)) if temp else None
    why = [REASON_WORDS[r] for r in reasons] + ([f"{temp_c:.0f} °C"] if temp_c is not None else [])
    events = _told_causes(gpu, told)
    words = (
        f"its GPU ({gpu}) ran at {mine:,.0f} MHz against {theirs:,.0f} MHz on the others' "
        f"GPUs"
        + (f" ({', '.join(why)})" if why else "")
        + "".join(f"; {e['words']}" for e in events[:2])
    )
    return {
        "cause": "gpu",
        "gpu": gpu,
        "rank_gpu_known": known,
        "sm_clock_mhz": round(mine),
        "peers_sm_clock_mhz": round(theirs),
        "reasons": reasons,
        "temp_c": None if temp_c is None else round(temp_c, 1),
        "events": len(told),
        "words": words,
        "fixes": _fixes(
            [{"cause": "sm_clock", "reasons": reasons}, *events], gpu, "while its rank lagged"
        ),
    }
