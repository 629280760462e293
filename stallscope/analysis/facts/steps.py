"""The training's steps as facts: the probe's records (the stall, step and wait medians, epoch
starts, per-rank pictures and who the ranks wait for), else the training thread's sampled stacks.
Part of :func:`~stallscope.analysis.facts.build.build`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stallscope.analysis.facts.common import (
    _WAIT,
    _cores,
    _procs,
    _r,
    _step_wall,
    alive_together,
    mean,
    median,
    rank_pids,
    step_median,
    tree_of,
)
from stallscope.analysis.stacks import ProcPhases
from stallscope.store import StepRow

if TYPE_CHECKING:
    from stallscope.analysis.facts.build import _Draft
    from stallscope.analysis.rundata import RunData

__all__ = ["COMM_GAP", "COMM_GAP_STARVED", "COMM_HEAVY", "RUNQ_BUSY_PCT", "starved"]


#: a rank whose peers spend ≥ this share of their step more in collectives than it does is the
#: one they wait for (docs/diagnosis.md "Communication wait")
COMM_GAP = 0.15
#: every rank in collectives ≥ this share of its step, none waiting for another: the network
#: or the topology is the limit
COMM_HEAVY = 0.30
#: a rank's process waiting for a CPU this share of the time, and this many points more than
#: the others', is short of CPU (a busy host or a CPU quota), not slow by its own work
RUNQ_BUSY_PCT = 20.0
#: ... and such a rank is the one its peers wait for from this gap on: time it spends frozen
#: (throttled, or runnable with no core) inside a collective counts as its own collective wait,
#: so the gap shrinks (measured: 0.11 on a 0.3-core quota with a CPU hog on the host)
COMM_GAP_STARVED = 0.05


def _probe_signals(sig: _Draft, data: RunData) -> None:
    if data.probes:
        # the probe keeps the DataLoader's knobs under "loader", the machine's beside them
        raw = data.probes[0]["config"]
        loader = raw.get("loader")
        cfg = {k: v for k, v in raw.items() if k != "loader"}
        if isinstance(loader, dict):
            cfg.update(loader)  # one flat table: each field once
        sig.config = cfg
        if _cores(cfg.get("physical_cores")):  # the probe's config is a file too: checked
            sig.physical_cores = _cores(cfg.get("physical_cores"))
    steps = data.steps
    if not steps:
        return
    sig.steps = sum(s.n for s in steps)
    sig.ranks = len({s.rank for s in steps})
    # the first step of the run includes worker start-up and is reported apart (epoch gaps)
    first: dict[int, int] = {}
    for s in steps:
        first[s.rank] = min(first.get(s.rank, s.step), s.step)
    body = [s for s in steps if s.step != first[s.rank]] or steps
    _rank_signals(sig, data, body)
    wait = sum(s.wait_s for s in body)
    wall = sum(s.wait_s + s.host_s for s in body)
    if sig.focus_rank is not None:  # the rank that holds the job back speaks for it
        body = [s for s in body if s.rank == sig.focus_rank]
        wait = sum(s.wait_s for s in body)
        wall = sum(s.wait_s + s.host_s for s in body)
    # the headline share counts every step, as the trainer's own timer does (the first step
    # holds the workers' start and the GPU's warm-up: a real part of the wait)
    every = [s for s in steps if sig.focus_rank is None or s.rank == sig.focus_rank]
    all_wall = sum(s.wait_s + s.host_s for s in every)
    if wall > 0 and all_wall > 0:
        sig.stall_fraction = round(sum(s.wait_s for s in every) / all_wall, 3)
        sig.steady_stall_fraction = round(wait / wall, 3)
        sig.stall_source = "probe"
    if sig.focus_rank is not None:
        cfgs = [p["config"] for p in data.probes if p.get("rank") == sig.focus_rank]
        focus_cfg: Any = cfgs[0] if cfgs else None
        if isinstance(focus_cfg, dict):
            loader = focus_cfg.get("loader")
            sig.config = {k: v for k, v in focus_cfg.items() if k != "loader"}
            if isinstance(loader, dict):
                sig.config.update(loader)
    sig.wait_ms_median = _r(step_median(body, _WAIT))
    sig.step_ms_median = _r(step_median(body, _step_wall))
    sig.wait_top_share, sig.wait_ms_p99 = wait_spread(body)
    sig.step_timing_source = "probe"
    # over the steps whose copies were timed (the probe times short steps' device in pairs,
    # one in so many: probe/device.py)
    copied = [s for s in body if s.h2d_s is not None]
    copy_wall = sum(s.wait_s + s.host_s for s in copied)
    if copied and copy_wall > 0:
        sig.h2d_share = round(sum(s.h2d_s or 0.0 for s in copied) / copy_wall, 3)
    epochs: dict[int, list[StepRow]] = defaultdict(list)
    for s in steps:
        if s.epoch is not None:
            epochs[s.epoch].append(s)
    sig.epochs = len(epochs)
    # an epoch's first step is a row of its own (probe/watch.py)
    firsts = [w[0].wait_s for e, w in sorted(epochs.items()) if e >= 1 and w]
    if firsts:
        sig.epoch_start_wait_s = _r(median(firsts), 3)
        usual = (step_median([s for ws in epochs.values() for s in ws[1:]], _WAIT) or 0.0) / 1000
        extra = [max(0.0, f - usual) for f in firsts]
        sig.epoch_start_cost_s = _r(median(extra), 3)
        sig.epoch_start_total_s = _r(sum(extra), 2)


#: the longest-waiting share of the steps whose share of the data wait is
#: ``wait_top_share``; fewer steps than MIN_SPREAD_STEPS: the spread is not told
TOP_STEPS = 0.1
MIN_SPREAD_STEPS = 100


def wait_spread(rows: Sequence[StepRow]) -> tuple[float | None, float | None]:
    """(the share of the data wait in the longest-waiting :data:`TOP_STEPS` of the steps, the
    99th percentile of a step's wait in ms). A record of several short steps (probe/watch.py)
    stands for its steps at their mean wait: a burst inside one is spread over its steps, so
    the share is never overstated. None, None under :data:`MIN_SPREAD_STEPS` steps or no wait."""
    per = sorted(((s.wait_s / s.n, s.n) for s in rows if s.n >= 1), reverse=True)
    steps = sum(n for _w, n in per)
    total = sum(w * n for w, n in per)
    if steps < MIN_SPREAD_STEPS or total <= 0:
        return None, None
    top, p99 = TOP_STEPS * steps, 0.01 * steps
    got = acc = 0.0
    p99_ms: float | None = None
    for w, n in per:
        if p99_ms is None and got + n > p99:
            p99_ms = w * 1000
        take = min(float(n), top - got)
        if take <= 0:
            break
        acc += w * take
        got += take
    return round(acc / total, 3), _r(p99_ms)


def _stack_signals(sig: _Draft, data: RunData, procs: list[ProcPhases], stall: bool) -> None:
    """The stall from the sampled stacks of the training thread: its data share (waiting for
    the next batch, or loading it itself). With several ranks each gets its own picture, and
    the rank that waits most, by ≥ 15 points, speaks for the job (as with the probe).
    ``stall`` False (the probe measured it): only where the thread was, as evidence."""
    if not procs:
        return
    if not stall:
        focus_p = next((p for p in procs if p.rank == sig.focus_rank), procs[0])
        sig.phase_shares = focus_p.shares()
        sig.stack_sampler = focus_p.sampler or None
        sig.stack_samples = sum(p.samples for p in procs)
        return
    roles = data.roles()
    detail = []
    for p in procs:
        d: dict[str, Any] = {
            "rank": p.rank if p.rank is not None else 0,
            "pid": p.pid,
            "stall_fraction": round(p.share("data"), 3),
            "comm_share": round(p.share("comm"), 3),
            "compute_share": round(p.share("compute"), 3),
            "sampled_s": round(p.total_s, 1),
            "source": "stacks",
        }
        workers = {q for q in tree_of(data, str(p.pid)) if roles.get(q) == "worker"}
        d["workers"] = alive_together(_procs(data, "procs.cpu_pct", "worker", workers)) or len(
            workers
        )
        w = [v for s in _procs(data, "procs.cpu_pct", "worker", workers) for v in s.v]
        if w:
            d["worker_cpu_pct"] = _r(mean(w))
        runq_s = data.series.get(("procs.runq_wait_pct", str(p.pid)))
        if runq_s is not None and runq_s.v:
            d["runq_wait_pct"] = _r(mean(runq_s.v))
        detail.append(d)
    focus = procs[0]
    if max(p.share("graph") for p in procs) >= 0.5:
        # most of the time inside a compiled TensorFlow function, where the input pipeline
        # runs too: the stacks cannot split it (docs/diagnosis.md); system metrics decide
        sig.phase_shares = focus.shares()
        return
    if len(detail) >= 2:
        sig.ranks_detail = detail
        worst = max(detail, key=lambda d: d["stall_fraction"])
        best = min(detail, key=lambda d: d["stall_fraction"])
        if (
            worst["stall_fraction"] >= 0.15
            and worst["stall_fraction"] - best["stall_fraction"] >= 0.15
        ):
            sig.focus_rank = worst["rank"]
            focus = next(p for p in procs if p.pid == worst["pid"])
        if any(p.seconds.get("comm") for p in procs):  # DDP's wait timed (sources/comm.py)
            _comm_focus(sig, detail)
        sig.ranks = len(detail)
    sig.stall_fraction = round(focus.share("data"), 3)
    sig.stall_source = "stacks"
    _batch_timing(sig, focus)
    sig.phase_shares = focus.shares()
    sig.stack_sampler = focus.sampler or None
    sig.stack_samples = sum(p.samples for p in procs)
    if focus.seconds.get("h2d"):
        sig.h2d_share = round(focus.share("h2d"), 3)


def _batch_timing(sig: _Draft, p: ProcPhases) -> None:
    """No probe: the step timing of the batches the in-trainer sampler timed in trainer ``p``
    (:mod:`stallscope.sources.stacks.batches`; ≥ :data:`MIN_SPREAD_STEPS` of them): the
    median wait and step, the share of the wait in the longest-waiting :data:`TOP_STEPS` of
    them and the 99th percentile of one wait, each read off its bucket's middle (±10%)."""
    from stallscope.sources.stacks.fetches import cost_summary

    if sum(p.wait_b.values()) < MIN_SPREAD_STEPS:
        return
    waits, steps = cost_summary([p.wait_b], tail=TOP_STEPS), cost_summary([p.step_b])
    if waits is None or steps is None:
        return
    sig.wait_ms_median, sig.wait_ms_p99 = _r(waits["p50_ms"]), _r(waits["p99_ms"])
    sig.wait_top_share = waits["tail_share"]
    sig.step_ms_median = _r(steps["p50_ms"])
    sig.step_timing_source = "counted_batches"


def _rank_signals(sig: _Draft, data: RunData, body: list[StepRow]) -> None:
    """Per rank, where its steps go. Under DDP the all-reduce makes every rank's step as long as
    the slowest rank's, so step times look alike; the data-wait share tells which rank's input
    holds the job back. That rank becomes the focus: its figures are the run's (a job whose
    rank 1 waits 92% and rank 0 3% waits for data, not "47%")."""
    by_rank: dict[int, list[StepRow]] = defaultdict(list)
    for s in body:
        by_rank[s.rank].append(s)
    if len(by_rank) < 2:
        return
    pids = rank_pids(data)
    roles = data.roles()
    detail = []
    for rank, rows in sorted(by_rank.items()):
        wall = sum(s.wait_s + s.host_s for s in rows)
        d: dict[str, Any] = {
            "rank": rank,
            "steps": sum(s.n for s in rows),
            "stall_fraction": round(sum(s.wait_s for s in rows) / wall, 3) if wall else None,
            "wait_ms_median": _r(step_median(rows, _WAIT)),
            "step_ms_median": _r(step_median(rows, _step_wall)),
        }
        comm = [s.comm_s for s in rows if s.comm_s is not None]
        if comm and wall:
            d["comm_share"] = round(sum(comm) / wall, 3)
            d["compute_ms_median"] = _r(step_median(rows, lambda s: s.host_s - (s.comm_s or 0.0)))
        pid = pids.get(rank)
        if pid is not None:
            d["pid"] = int(pid)
            runq_s = data.series.get(("procs.runq_wait_pct", pid))
            runq = runq_s.v if runq_s is not None else []
            if runq:
                d["runq_wait_pct"] = _r(mean(runq))
            workers = {p for p in tree_of(data, pid) if roles.get(p) == "worker"}
            d["workers"] = alive_together(_procs(data, "procs.cpu_pct", "worker", workers)) or len(
                workers
            )
            w = [v for s in _procs(data, "procs.cpu_pct", "worker", workers) for v in s.v]
            if w:
                d["worker_cpu_pct"] = _r(mean(w))
        detail.append(d)
    sig.ranks_detail = detail
    if "prometheus" not in data.meta:  # per-step records, not totals spread over steps
        sig.comm_transfer_share = _transfer_share(by_rank)
    shares = [d for d in detail if d["stall_fraction"] is not None]
    if not shares:
        return
    worst = max(shares, key=lambda d: d["stall_fraction"])
    best = min(shares, key=lambda d: d["stall_fraction"])
    if worst["stall_fraction"] >= 0.15 and worst["stall_fraction"] - best["stall_fraction"] >= 0.15:
        sig.focus_rank = worst["rank"]
    _comm_focus(sig, detail)


def _transfer_share(by_rank: dict[int, list[StepRow]]) -> float | None:
    """Per step that every rank recorded with its communication time: the least of those
    times (the transfer: the step's slowest rank waits for nothing else), summed over the
    steps' wall time (the longest rank's). None under 10 such steps. Rows of several short
    steps are left out: ranks sum different steps together."""
    steps: dict[int, list[StepRow]] = defaultdict(list)
    for rows in by_rank.values():
        for s in rows:
            if s.comm_s is not None and s.n == 1:
                steps[s.step].append(s)
    full = [rows for rows in steps.values() if len(rows) == len(by_rank)]
    wall = sum(max(s.wait_s + s.host_s for s in rows) for rows in full)
    if len(full) < 10 or wall <= 0:
        return None
    return round(sum(min(s.comm_s or 0.0 for s in rows) for rows in full) / wall, 3)


def starved(rank: Mapping[str, Any], peers: Sequence[Mapping[str, Any]]) -> bool:
    """``rank``'s process waited for a CPU ≥ RUNQ_BUSY_PCT of the time and ≥ that many points
    more than its peers' median (a CPU quota on it, or a host busy around it)."""
    runq = rank.get("runq_wait_pct")
    theirs = (
        median([d["runq_wait_pct"] for d in peers if d.get("runq_wait_pct") is not None]) or 0.0
    )
    return runq is not None and runq >= RUNQ_BUSY_PCT and runq - theirs >= RUNQ_BUSY_PCT


def _comm_focus(sig: _Draft, detail: list[dict[str, Any]]) -> None:
    """The rank the others wait for in collectives: the least communication share, ≥ COMM_GAP
    below the most (every rank's share known); ≥ COMM_GAP_STARVED below when that rank is short
    of CPU (its frozen time inside collectives counts as its own wait there)."""
    timed = [d for d in detail if d.get("comm_share") is not None]
    if len(timed) < 2 or len(timed) != len(detail):
        return
    least = min(timed, key=lambda d: d["comm_share"])
    most = max(timed, key=lambda d: d["comm_share"])
    gap = most["comm_share"] - least["comm_share"]
    if gap >= COMM_GAP or (
        gap >= COMM_GAP_STARVED and starved(least, [d for d in timed if d is not least])
    ):
        sig.comm_straggler = least["rank"]
