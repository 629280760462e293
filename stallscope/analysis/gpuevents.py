"""A run's GPU health events, each with its time and the step it happened in, and which GPU
each rank trained on.

The gpu source tells the run each XID (``gpu_xid``) and each change of a GPU's health it reads
(``gpu_health``: new remapped rows, new uncorrected ECC errors or retired pages, a row remap
pending or failed, a PCIe link trained below its maximum; :func:`~stallscope.sources.gpu.health.
health_changes`); the collector stores them in ``run.db``'s events table with the time it took
them (within one sample of the event). The step is not stored: it is read here from the
probe's steps of the rank that trained on that GPU, so a run copied elsewhere gives the same
answer. ``show``, the report's timeline, ``diagnose --json`` (the ``gpu_slowdown`` finding's
evidence) read :func:`health_events`.
"""

from __future__ import annotations

import bisect
import re
from typing import Any

from stallscope.analysis.rundata import RunData

__all__ = ["HEALTH_KINDS", "clock", "event_line", "health_events", "rank_gpus", "step_at"]

#: the event kinds the gpu source tells about a GPU's health
HEALTH_KINDS = ("gpu_xid", "gpu_health", "gpu_lost")
_GPU = re.compile(r"^GPU (\d+)\b")
_XID = re.compile(r"\bXID (\d+)\b")


def rank_gpus(data: RunData) -> dict[int, tuple[str, bool]]:
    """rank -> (the GPU it trained on, whether that is known rather than guessed). Known: the
    rank's process (the probe's pid) held memory on that GPU (``gpu.proc_mem_mib`` of
    ``gpuN:PID``). Guessed: one GPU did the work, or as many GPUs as ranks, in order (local
    rank N on GPU N, as torchrun places them)."""
    from stallscope.analysis.window import trainer_gpus

    ranks = sorted(
        {s.rank for s in data.steps}
        | {int(p["rank"]) for p in data.probes if isinstance(p.get("rank"), int)}
    )
    holders: dict[str, str] = {}
    for (name, ent), s in data.series.items():
        if name == "gpu.proc_mem_mib" and ":" in ent and s.v and max(s.v) > 0:
            gpu, pid = ent.split(":", 1)
            holders.setdefault(pid, gpu)
    out: dict[int, tuple[str, bool]] = {}
    for p in data.probes:
        held = holders.get(str(p.get("pid")))
        if held is not None and isinstance(p.get("rank"), int):
            out[int(p["rank"])] = (held, True)
    used = sorted(trainer_gpus(data), key=_natural)
    rest = [r for r in ranks if r not in out]
    if rest and len(used) == 1:
        out.update({r: (used[0], False) for r in rest})
    elif rest and len(used) == len(ranks):
        out.update({r: (used[ranks.index(r)], False) for r in rest})
    return out


def _natural(s: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


def step_at(data: RunData, ts: float, rank: int | None = None) -> dict[str, Any] | None:
    """The step of ``rank`` (default: the lowest rank with steps) running at ``ts``:
    ``{"rank", "step", "epoch"}``; None before its first step began or after its last ended.
    A row of several short steps (``n`` > 1) is split evenly over its time."""
    ranks = sorted({s.rank for s in data.steps})
    if not ranks:
        return None
    r = rank if rank in ranks else ranks[0]
    rows = [s for s in data.steps if s.rank == r]
    ends = [s.ts + s.host_s for s in rows]
    i = bisect.bisect_left(ends, ts)
    if i >= len(rows):
        return None
    row = rows[i]
    start = row.ts - row.wait_s
    if i == 0 and ts < start:
        return None
    step = row.step
    if row.n > 1:  # the row's last step is `step`: which of its n steps held ts
        span = max(ends[i] - start, 1e-9)
        step = row.step - row.n + 1 + min(row.n - 1, int((ts - start) / span * row.n))
    return {"rank": r, "step": step, "epoch": row.epoch}


def health_events(data: RunData) -> list[dict[str, Any]]:
    """The run's GPU health events, by time: ``ts``, ``at_s`` (seconds into the run), ``gpu``
    (``gpu3``, None when the message names none), ``kind``, ``xid`` (for an XID), ``message``
    and ``step`` (:func:`step_at` on the rank that trained on that GPU; None outside the
    steps or without the probe)."""
    by_gpu = {gpu: r for r, (gpu, _known) in sorted(rank_gpus(data).items(), reverse=True)}
    out = []
    t0 = data.t0
    for ev in data.events:
        kind, ts = ev.get("kind"), ev.get("ts")
        if kind not in HEALTH_KINDS or not isinstance(ts, (int, float)):
            continue
        msg = str(ev.get("message", ""))
        m = _GPU.match(msg)
        gpu = f"gpu{m.group(1)}" if m else None
        x = _XID.search(msg) if kind == "gpu_xid" else None
        out.append(
            {
                "ts": float(ts),
                "at_s": round(float(ts) - t0, 1),
                "gpu": gpu,
                "kind": kind,
                "xid": int(x.group(1)) if x else None,
                "message": msg,
                "step": step_at(data, float(ts), by_gpu.get(gpu) if gpu else None),
            }
        )
    return sorted(out, key=lambda e: e["ts"])


def clock(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss`` of a time offset (the report's axis reads the same)."""
    s = round(seconds)
    h, rem = divmod(abs(s), 3600)
    m, sec = divmod(rem, 60)
    sign = "-" if s < 0 else ""
    return f"{sign}{h}:{m:02d}:{sec:02d}" if h else f"{sign}{m}:{sec:02d}"


def event_line(ev: dict[str, Any]) -> str:
    """``0:42 into the run, rank 0's step 153: GPU 0: XID 79: ...``: one event in words."""
    st = ev.get("step")
    where = f", rank {st['rank']}'s step {st['step']}" if st else ""
    return f"{clock(float(ev['at_s']))} into the run{where}: {ev['message']}"
