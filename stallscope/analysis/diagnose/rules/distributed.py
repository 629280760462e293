"""Rules about distributed training: a straggler rank, ranks waiting for peers, collectives
that bound the step, and jitter between ranks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from stallscope.analysis.diagnose.model import Finding, Fix, Kind, RunData
from stallscope.analysis.diagnose.rules.common import STALL_CRIT, STALL_WARN
from stallscope.analysis.diagnose.rules.fetch import _fetch_fixes
from stallscope.analysis.diagnose.rules.host import _busy_host
from stallscope.analysis.diagnose.rules.input import _loader_fixes
from stallscope.analysis.diagnose.rules.prep import _prep_estimate, _prep_fixes
from stallscope.analysis.diagnose.rules.scores import fetch_prep_scores
from stallscope.analysis.diagnose.rules.slowdown import (
    CLOCK_DROP_MIN,
    REASON_SHARE,
    own_gpu_cause,
)
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import (
    COMM_GAP,
    COMM_GAP_STARVED,
    COMM_HEAVY,
    median,
    starved,
)
from stallscope.loadermodel import stall_cap
from stallscope.stats import weighted_median


def rule_straggler(data: RunData, fx: Facts) -> list[Finding]:
    """straggler_rank: with ≥ 2 ranks, one rank waits for data ≥ 15% of its steps and ≥ 15
    points more than the least-waiting rank (under DDP the all-reduce evens out step times, so
    where each rank spends its step tells, not how long it is); or, where steps are not tied
    together, one rank's median step takes ≥ 1.2× the median rank's."""
    detail = {d["rank"]: d for d in fx.comm.ranks_detail}
    if fx.comm.focus_rank is not None and fx.comm.focus_rank in detail:
        return _input_straggler(data, fx, detail[fx.comm.focus_rank])
    if fx.comm.comm_straggler is not None and fx.comm.comm_straggler in detail:
        return _comm_straggler(data, fx, detail[fx.comm.comm_straggler])
    per: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for s in data.steps:  # a row of n short steps counts n times, with its mean step
        per[s.rank].append((s.step_s, s.n))
    if len(per) < 2:
        return []
    med = {r: weighted_median(v) for r, v in per.items()}
    typical = median(list(med.values())) or 0.0
    slow = max(med, key=lambda r: med[r])
    if typical <= 0 or med[slow] < 1.2 * typical:
        return []
    wshare = (detail.get(slow) or {}).get("stall_fraction") or 0.0
    return [
        Finding(
            kind=Kind.STRAGGLER_RANK,
            severity="warning",
            confidence=0.8,
            summary=f"Rank {slow} is a straggler: its median step takes "
            f"{med[slow] * 1000:.0f} ms vs {typical * 1000:.0f} ms typical; the others "
            "wait for it at every all-reduce.",
            evidence={
                "rank": slow,
                "step_ms_median": round(med[slow] * 1000, 1),
                "typical_step_ms": round(typical * 1000, 1),
                "data_wait_share": round(wshare, 3),
                "ranks": fx.comm.ranks_detail,
            },
            fixes=[
                Fix(
                    f"look at rank {slow}'s node: its data wait share is {wshare:.0%}"
                    + (
                        " (input-bound there)"
                        if wshare >= STALL_WARN
                        else " (slow compute: check that GPU's clocks/throttling)"
                    ),
                    "all ranks go at the pace of the slowest",
                )
            ],
            est_speedup=round(med[slow] / typical, 2),
            rule="slowest rank ≥ 1.2× the median rank",
        )
    ]


def _input_straggler(data: RunData, fx: Facts, r: Mapping[str, Any]) -> list[Finding]:
    """straggler_rank from data wait: rank r waits for data far more than the least-waiting rank."""
    host = _host_of(data, r["rank"])
    others = [d for d in fx.comm.ranks_detail if d["rank"] != fx.comm.focus_rank]
    best = min(others, key=lambda d: d["stall_fraction"] or 0.0)
    where = f"rank {r['rank']} (host {host}" + (f", pid {r['pid']})" if "pid" in r else ")")
    wcpu = (
        f"; its {r['workers']} DataLoader worker(s) at {r['worker_cpu_pct']:.0f}% CPU"
        if r.get("worker_cpu_pct") is not None and r.get("workers")
        else ""
    )
    fs, _, ps, _ = fetch_prep_scores(fx)
    fixes = (_fetch_fixes(data, fx) if fs > ps else _prep_fixes(fx)) + _loader_fixes(fx)
    fixes = [Fix(f"on rank {r['rank']}: {f.action}", f.why) for f in fixes]
    fixes.append(
        Fix(
            f"compare rank {r['rank']}'s data with the others' (shard size, storage, transform)",
            "the ranks run the same code; the slow one differs in what it reads or where",
        )
    )
    ev = {
        "rank": r["rank"],
        "host": host,
        "cause": "input",
        "ranks": fx.comm.ranks_detail,
        "stall_fraction": r["stall_fraction"],
        "data_wait_share": r["stall_fraction"],
        "best_rank": best["rank"],
        "best_stall_fraction": best["stall_fraction"],
    }
    return [
        Finding(
            kind=Kind.STRAGGLER_RANK,
            severity="critical" if r["stall_fraction"] >= STALL_CRIT else "warning",
            confidence=0.85,
            summary=f"Rank {r['rank']} holds the job back: it waited for data "
            f"{r['stall_fraction']:.0%} of its steps while rank {best['rank']} "
            f"waited {best['stall_fraction']:.0%}{wcpu}. The all-reduce makes every "
            f"rank wait for {where}.",
            evidence=ev,
            fixes=fixes,
            est_speedup=_prep_estimate(fx) if ps >= fs else stall_cap(r["stall_fraction"]),
            rule=f"rank data wait {r['stall_fraction']:.0%} ≥ 15% and ≥ 15 points above "
            f"rank {best['rank']}'s {best['stall_fraction']:.0%}",
        )
    ]


def _host_of(data: RunData, rank: int) -> str:
    """Where ``rank`` ran: its node in a job read across nodes (``diagnose --prometheus``),
    else the run's host."""
    hosts = data.meta.get("rank_hosts")
    if isinstance(hosts, dict) and hosts.get(str(rank)):
        return str(hosts[str(rank)])
    return data.meta.get("host") or "this host"


def _peers_wait(fx: Facts, slow: int) -> tuple[list[Mapping[str, Any]], float]:
    """The other ranks with their communication share, and the least of those shares."""
    peers = [
        d for d in fx.comm.ranks_detail if d["rank"] != slow and d.get("comm_share") is not None
    ]
    return peers, min((d["comm_share"] for d in peers), default=0.0)


def _comm_straggler(data: RunData, fx: Facts, r: Mapping[str, Any]) -> list[Finding]:
    """straggler_rank from communication time: the peers wait in collectives for rank ``r``,
    whose own data wait is not the cause (that is the input branch above). Its cause: short
    of CPU (its process waits for a core), else its own compute is slower than the peers'."""
    host = _host_of(data, r["rank"])
    peers, peer_comm = _peers_wait(fx, r["rank"])
    gap = peer_comm - (r.get("comm_share") or 0.0)
    peer_compute = median(
        [d["compute_ms_median"] for d in peers if d.get("compute_ms_median") is not None]
    )
    mine = r.get("compute_ms_median")
    runq = r.get("runq_wait_pct")
    peer_runq = (
        median([d["runq_wait_pct"] for d in peers if d.get("runq_wait_pct") is not None]) or 0.0
    )
    names = ", ".join(str(d["rank"]) for d in peers)
    wait_words, their = (
        (f"rank {names} waits", "its") if len(peers) == 1 else (f"ranks {names} wait", "their")
    )
    cause, why, fixes = _straggler_cause(r, peers, host, runq, peer_runq, mine, peer_compute)
    gpu = None if cause == "cpu" else own_gpu_cause(data, r["rank"], [d["rank"] for d in peers])
    if gpu is not None:  # its compute is slower because its GPU runs slower
        cause, why = "gpu", f"{why}; {gpu['words']}"
        fixes = [*gpu["fixes"], *fixes]
    on = f" (on {host})" if data.meta.get("rank_hosts") else ""
    ev = {
        "rank": r["rank"],
        "host": host,
        "cause": cause,
        "ranks": fx.comm.ranks_detail,
        "comm_share": r.get("comm_share"),
        "peers_comm_share": round(peer_comm, 3),
        "compute_ms_median": mine,
        "peers_compute_ms_median": peer_compute,
        "runq_wait_pct": runq,
        "peers_runq_wait_pct": peer_runq,
        "data_wait_share": r.get("stall_fraction"),
        "gpu": None if gpu is None else {k: v for k, v in gpu.items() if k != "fixes"},
    }
    return [
        Finding(
            kind=Kind.STRAGGLER_RANK,
            severity="critical" if gap >= STALL_CRIT else "warning",
            confidence=0.85,
            summary=f"Rank {r['rank']}{on} holds the job back: {wait_words} for it in the "
            f"all-reduce {peer_comm:.0%} of {their} step time, while it waits "
            f"{r.get('comm_share') or 0.0:.0%}; {why}.",
            evidence=ev,
            fixes=fixes,
            est_speedup=stall_cap(gap),
            rule=f"peers' communication wait {peer_comm:.0%} ≥ "
            f"{(COMM_GAP if gap >= COMM_GAP else COMM_GAP_STARVED):.0%} above rank "
            f"{r['rank']}'s {r.get('comm_share') or 0.0:.0%} (collectives timed, "
            f"{'probe' if mine is not None else 'sampled stacks'}); "
            + (
                "run-queue wait ≥ 20% and ≥ 20 points above the others'"
                if cause == "cpu"
                else "its data wait is not the cause"
            )
            + (
                f"; its GPU's SM clock ≥ {CLOCK_DROP_MIN:.0%} under the others' with a "
                f"clock-event reason ≥ {REASON_SHARE:.0%} of the time, or a health event"
                if cause == "gpu"
                else ""
            ),
        )
    ]


def _straggler_cause(
    r: Mapping[str, Any],
    peers: list[Mapping[str, Any]],
    host: str,
    runq: Any,
    peer_runq: float,
    mine: Any,
    peer_compute: float | None,
) -> tuple[str, str, list[Fix]]:
    """Why rank r is slow, its cause's name, and the fixes: short of CPU (its process waits
    for a core), else its own compute is slower than the peers'."""
    if starved(r, peers):
        cause = "cpu"
        why = (
            f"its process waited for a CPU {runq:.0f}% of the time (run-queue wait; the "
            f"others {peer_runq:.0f}%): a busy host or a CPU quota (cgroup cpu.max / "
            "cpu.cfs_quota_us) slows it"
        )
        fixes = [
            Fix(
                f"on rank {r['rank']}'s host {host}: give the trainer its cores back (look "
                "for other processes, a CPU quota on its container or cgroup, or too many "
                "DataLoader workers for the cores)",
                f"its trainer waited for a CPU {runq:.0f}% of the time; the others did not",
            )
        ]
    else:
        cause = "compute"
        peer_share = median(
            [d["compute_share"] for d in peers if d.get("compute_share") is not None]
        )
        if mine is not None and peer_compute:
            slower = (
                f"{mine:.0f} ms of compute per step against {peer_compute:.0f} ms on the others"
            )
        elif r.get("compute_share") is not None and peer_share is not None:
            slower = (
                f"it computes {r['compute_share']:.0%} of its time against "
                f"{peer_share:.0%} on the others (sampled stacks)"
            )
        else:
            slower = "more compute per step"
        why = f"its own step is slower: {slower}"
        fixes = [
            Fix(
                f"compare rank {r['rank']}'s work with the others': a larger shard or "
                "batch, longer sequences, a different model branch, or a slower or "
                "throttled device (its GPU's clocks and throttle reasons)",
                "the ranks run the same code; the slow one does more or runs slower",
            )
        ]
    return cause, why, fixes


def rule_waiting_for_peers(data: RunData, fx: Facts) -> list[Finding]:
    """waiting_for_peers: the ranks a straggler holds back, with the share of their step spent
    in collectives waiting (their GPUs idle in the all-reduce, their step looks like compute)."""
    slow = fx.comm.focus_rank if fx.comm.focus_rank is not None else fx.comm.comm_straggler
    if slow is None:
        return []
    peers, _least = _peers_wait(fx, slow)
    waiting = [d for d in peers if d["comm_share"] >= COMM_GAP]
    if not waiting:
        return []
    names = ", ".join(str(d["rank"]) for d in waiting)
    shares = ", ".join(f"rank {d['rank']} {d['comm_share']:.0%}" for d in waiting)
    who, their = (
        (f"Rank {names} waits", "its") if len(waiting) == 1 else (f"Ranks {names} wait", "their")
    )
    return [
        Finding(
            kind=Kind.WAITING_FOR_PEERS,
            severity="info",
            confidence=0.85,
            summary=f"{who} for rank {slow} in the all-reduce ({shares} of {their} step "
            f"time): {their} devices sit idle there, so {their} step looks like "
            f"compute. It goes away with rank {slow}'s own cause.",
            evidence={
                "rank": slow,
                "waiting_ranks": [d["rank"] for d in waiting],
                "comm_share": {str(d["rank"]): d["comm_share"] for d in waiting},
            },
            fixes=[
                Fix(
                    f"fix rank {slow} (the straggler finding); nothing to change on "
                    f"rank{'s' if len(waiting) > 1 else ''} {names}",
                    f"{their} wait is rank {slow}'s slowness, passed on by the collective",
                )
            ],
            est_speedup=1.0,
            rule=f"communication wait ≥ {COMM_GAP:.0%} of the step while "
            f"rank {slow} is the straggler",
        )
    ]


def rule_communication_bound(data: RunData, fx: Facts) -> list[Finding]:
    """communication_bound: every rank spends ≥ 30% of its step in collectives and none waits
    for another (no straggler): the network or the topology is the limit."""
    ranks = fx.comm.ranks_detail
    if len(ranks) < 2 or fx.comm.focus_rank is not None or fx.comm.comm_straggler is not None:
        return []
    shares = [d.get("comm_share") for d in ranks]
    if any(x is None for x in shares):
        return []
    least = min(x for x in shares if x is not None)
    if least < COMM_HEAVY or _busy_host(fx) is not None:
        return []  # ranks that wait for a CPU wait for one another: see rule_cpu_contention
    transfer = fx.comm.comm_transfer_share
    if transfer is not None and transfer < least / 2:
        return [_rank_jitter(fx, least, transfer)]
    if transfer is not None:
        told = ""
    elif "prometheus" in data.meta:
        told = (
            " (from Prometheus' totals the transfer itself and the wait for each step's "
            "slowest rank cannot be told apart: stallscope diagnose on a run folder of "
            "the job, with its per-step records, splits them)"
        )
    else:
        told = (
            " (sampled stacks give shares, not each step's times, so the transfer itself "
            "and the wait for each step's slowest rank cannot be told apart: the probe, "
            "`stallscope.watch(loader)` in each rank, splits them)"
        )
    return [
        Finding(
            kind=Kind.COMMUNICATION_BOUND,
            severity="critical" if least >= STALL_CRIT else "warning",
            confidence=0.8,
            summary=f"Communication-bound: every rank spends at least {least:.0%} of its step in "
            "collectives (the gradient all-reduce), and no rank is waited for: the "
            f"network or the topology is the limit{told}.",
            evidence={
                "comm_share": {str(d["rank"]): d["comm_share"] for d in ranks},
                "transfer_share": transfer,
                "ranks": ranks,
            },
            fixes=[
                Fix(
                    "all-reduce less often: a larger batch per rank, or gradient "
                    "accumulation with model.no_sync() for all but the last micro-batch",
                    "the collective's cost is per step, not per sample",
                ),
                Fix(
                    "send less: a compression hook (model.register_comm_hook(None, "
                    "fp16_compress_hook)) or larger buckets (bucket_cap_mb)",
                    "fewer bytes, fewer round trips",
                ),
                Fix(
                    "check the interconnect: NCCL_DEBUG=INFO for the transport chosen, "
                    "`nvidia-smi topo -m` for the GPUs' links",
                    "a fallback to sockets or PCIe across sockets multiplies the cost",
                ),
            ],
            est_speedup=stall_cap(least),
            rule=f"every rank's communication wait ≥ {COMM_HEAVY:.0%} of its step, no straggler",
        )
    ]


def _rank_jitter(fx: Facts, least: float, transfer: float) -> Finding:
    """rank_jitter: every rank waits heavily in collectives, but the transfer is a small part
    of it: each step waits for that step's slowest rank, a different one each time."""
    jitter = least - transfer
    return Finding(
        kind=Kind.RANK_JITTER,
        severity="critical" if jitter >= STALL_CRIT else "warning",
        confidence=0.8,
        summary=f"The ranks wait for each other, not for the network: every rank spends at least "
        f"{least:.0%} of its step in collectives, but the all-reduce itself takes "
        f"{transfer:.0%} (the least wait in each step). The rest is each step waiting for "
        "that step's slowest rank, a different one each time: the ranks' step times vary "
        "from step to step.",
        evidence={
            "comm_share": {str(d["rank"]): d["comm_share"] for d in fx.comm.ranks_detail},
            "transfer_share": transfer,
            "jitter_share": round(jitter, 3),
            "ranks": fx.comm.ranks_detail,
        },
        fixes=[
            Fix(
                "make every rank's step as even as possible: enough DataLoader workers and "
                "prefetch_factor that no batch arrives late, no other work on the trainers' "
                "cores "
                "(one CPU thread per rank: torch.set_num_threads), batches of even size "
                "(bucket sequences by length)",
                "a step lasts as long as its slowest rank's; spikes on any rank cost every rank",
            ),
            Fix(
                "look at one rank's steps over time (stallscope report RUN): spikes at a "
                "period point to garbage collection (gc.freeze() after setup) or logging",
                "periodic spikes have one cause; random ones come from contention",
            ),
        ],
        est_speedup=stall_cap(jitter),
        rule=f"every rank's communication wait ≥ {COMM_HEAVY:.0%}, the transfer (least wait per "
        "step) under half of it (per-step records)",
    )
