"""An offline model of the straggler rules (`StallscopeRankWaitedFor` and the three series it
reads, deploy/prometheus/stallscope-alerts.yml), to weigh their parameters in seconds instead of
hours: fleetsim's DDP jobs run in virtual time, scraped every 5 s, and the rules are evaluated
every 5 s in one group as Prometheus does (a phase after each scrape: Prometheus fixes it per
group and target, so each faulty job draws its own).

    .venv/bin/python benchmarks/straggler_rule_model.py [--threshold 0.15] [--allowance 0.02]
        [--cap 0.075] [--window 15] [--eval 5] [--slow-window 60] [--slow-allowance 0.01]
        [--slow-threshold 0.08] [--healthy-hours 3] [--fault-jobs 8] [--seeds 4]

The defaults are the shipped rules: the 15-s CUSUM, and the slower one on 1-minute shares
(recorded every 15 s by the recording rules) for small slowdowns; ``--slow-window 0`` models
the first alone.

``--eval 1`` (or 2.5) models the group evaluated more often than the scrapes, each evaluation
adding its share of a scrape's rise: the CUSUM grows as fast per second, and a scrape's news is
read within a second instead of within 5 (what that is worth: docs/agent.md "A fleet").

It prints, for the parameters given, the false alarms and the highest CUSUM of a healthy rank
over ``--healthy-hours`` per seed on the raw recording (its seconds-long slow stretches are this
VM's real noise) and on the detrended one, and the detection latency of 10% and larger
slowdowns injected as bench_fleet.py injects them (detrended replay, 30 minutes per job).

A model, not the real thing: the rate over the window is the counters' increase between the
first and the last scrape inside it (Prometheus' extrapolation cancels in the ratio), the
baseline is the median gap of the 30 minutes before the last one (from 2 minutes of them;
the shipped rules record it once a minute, the model at every scrape),
there is no scrape jitter and no agent lag. `benchmarks/bench_fleet.py` measures the real
rules with a real Prometheus; this one only says which parameters are worth that run
(docs/agent.md "A fleet").
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleetsim import DETREND_STEPS, Fault, Job, load_recording, schedule

SCRAPE_S = 5.0
WARMUP_S = 240.0
TRAIL_S = 60.0  #: an activation this long after a fault's end still belongs to it


@dataclass(frozen=True)
class Params:
    threshold: float = 0.15
    allowance: float = 0.02
    cap: float = 0.075
    window_s: float = 15.0
    level: float = 0.15  #: the level clause: a gap this large held for a minute
    clear: float = 0.05  #: hysteresis: once firing, held while the CUSUM is above this
    #: the rule group's evaluation interval; each evaluation adds eval_s / SCRAPE_S of a
    #: scrape's rise (and of its cap), so the CUSUM grows per second as at 5 s
    eval_s: float = 5.0
    #: the second, slower CUSUM (small slowdowns): on the gap over a ``slow_window_s`` rate,
    #: over its own median baseline, less ``slow_allowance``; kept within [0, slow_ceiling];
    #: it fires at ``slow_threshold`` and holds while above ``slow_clear``. 0 = not modelled
    slow_window_s: float = 60.0
    slow_allowance: float = 0.01
    slow_threshold: float = 0.08
    slow_cap: float = 0.05
    slow_ceiling: float = 0.15
    slow_clear: float = 0.03
    #: how often the slow window's share is recomputed: it is read from the recording rules'
    #: group (rank:stallscope_train_comm_wait:ratio_rate1m, every 15 s in deploy/prometheus.yml)
    slow_every_s: float = 15.0


def scrapes(job: Job, horizon: float) -> list[tuple[float, list[tuple[float, float]]]]:
    """Per scrape: each rank's (communication seconds, step seconds) counters."""
    cum = [[0.0, 0.0] for _ in range(job.size)]
    out = []
    t = SCRAPE_S
    while t <= horizon:
        for rows in job.steps_until(t).values():
            for r, _k, _ts, wait, host, comm in rows:
                cum[r][0] += comm
                cum[r][1] += wait + host
        out.append((t, [(c, s) for c, s in cum]))
        t += SCRAPE_S
    return out


def activations(
    job: Job,
    horizon: float,
    p: Params,
    phase: float | None = None,
    spans: list[tuple[float, float, int]] | None = None,
) -> tuple[list[tuple[float, int]], float, float]:
    """(time, rank) of each activation of the alert, and the highest CUSUM of any rank (the
    main one, then the slow one's: 0 when not modelled).
    ``phase``: the group's first evaluation after each scrape, in seconds (under ``eval_s``;
    Prometheus fixes it per group and target); half an interval when not given. ``spans``,
    when given, gets each activation's (start, end, rank): end is ``horizon`` while it lasts."""
    phase = p.eval_s / 2 if phase is None else phase
    evals = max(1, round(SCRAPE_S / p.eval_s))
    scale = p.eval_s / SCRAPE_S
    sc = scrapes(job, horizon)
    # one detector per window: (window, allowance, cap, ceiling, threshold, clear)
    dets = [(p.window_s, p.allowance, p.cap, 0.3, p.threshold, p.clear)]
    if p.slow_window_s:
        dets.append(
            (
                p.slow_window_s,
                p.slow_allowance,
                p.slow_cap,
                p.slow_ceiling,
                p.slow_threshold,
                p.slow_clear,
            )
        )
    history = [[[] for _ in range(job.size)] for _ in dets]
    held: list[list[float | None] | None] = [None for _ in dets]
    cusum = [[0.0] * job.size for _ in dets]
    firing = [False] * job.size
    since = [0.0] * job.size
    acts: list[tuple[float, int]] = []
    tops = [0.0] * len(dets)
    for j in range(len(sc)):
        te = sc[j][0] + phase
        rises: list[list[float | None]] = []
        for d, (window, allowance, cap, _ceil, _thr, _clr) in enumerate(dets):
            per_window = int(window // SCRAPE_S) + 1
            every = 1 if d == 0 else max(1, round(p.slow_every_s / SCRAPE_S))
            if j % every:  # the slow share is still the one recorded at its group's last turn
                shares = held[d]
            else:
                inside = [k for k in range(max(0, j - per_window), j + 1) if sc[k][0] > te - window]
                shares = None
                if len(inside) >= 2:
                    a, b = sc[inside[0]][1], sc[inside[-1]][1]
                    shares = [
                        (b[r][0] - a[r][0]) / (b[r][1] - a[r][1]) if b[r][1] > a[r][1] else None
                        for r in range(job.size)
                    ]
                held[d] = shares
            if shares is None or any(x is None for x in shares):
                rises.append([None] * job.size)
                continue
            most = max(x for x in shares if x is not None)
            row: list[float | None] = []
            for r in range(job.size):
                gap = most - (shares[r] or 0.0)
                hist = history[d][r]
                base = [g for t, g in hist if te - 60 - 1800 < t <= te - 60]
                row.append(
                    min(gap - statistics.median(base) - allowance, cap) * scale
                    if len(base) >= 24
                    else None
                )
                hist.append((te, gap))
            rises.append(row)
        if all(x is None for row in rises for x in row) and not history[0][0]:
            continue
        for r in range(job.size):
            last = [g for t, g in history[0][r] if te - 60 < t <= te]
            level = len(last) >= 12 and sum(last) / len(last) >= p.level
            for m in range(evals):  # the evaluations until the next scrape see the same window
                on = level
                for d, (_w, _a, _c, ceiling, threshold, clear) in enumerate(dets):
                    rise = rises[d][r]
                    if rise is not None:
                        cusum[d][r] = min(max(cusum[d][r] + rise, 0.0), ceiling)
                        tops[d] = max(tops[d], cusum[d][r])
                    on = on or cusum[d][r] >= threshold or (firing[r] and cusum[d][r] > clear)
                if on and not firing[r]:
                    acts.append((te + m * p.eval_s, r))
                    since[r] = te + m * p.eval_s
                elif firing[r] and not on and spans is not None:
                    spans.append((since[r], te + m * p.eval_s, r))
                firing[r] = on
    if spans is not None:
        spans.extend((since[r], horizon, r) for r in range(job.size) if firing[r])
    return acts, tops[0], (tops[1] if len(tops) > 1 else 0.0)


def healthy(p: Params, hours: float, seeds: int, detrend: int) -> tuple[int, float, float]:
    rec = load_recording(detrend_steps=detrend)
    false, top, slow_top = 0, 0.0, 0.0
    for seed in range(seeds):
        job = Job(f"j{seed}", ["a", "b"], 8, rec, 0.0, seed=seed)
        acts, t, st = activations(job, WARMUP_S + hours * 3600, p)
        false += len(acts)
        top, slow_top = max(top, t), max(slow_top, st)
    return false, top, slow_top


def faults(p: Params, jobs: int) -> tuple[dict[float, list[float]], dict[float, int], int]:
    """Per slowdown size, the latencies and the faults missed; the false alarms."""
    rec = load_recording(detrend_steps=DETREND_STEPS)
    lat: dict[float, list[float]] = {}
    missed: dict[float, int] = {}
    false = 0
    for seed in range(jobs):
        job = Job(f"j{seed}", ["a", "b"], 8, rec, 0.0, seed=seed)
        horizon = WARMUP_S + 1800
        rng = random.Random(seed)
        fl: list[Fault] = schedule(job, rng, WARMUP_S, horizon)
        spans: list[tuple[float, float, int]] = []
        acts, _, _ = activations(job, horizon, p, phase=rng.uniform(0, p.eval_s), spans=spans)
        for f in fl:
            hit = [t for t, r in acts if r in f.ranks and f.start <= t <= f.end + TRAIL_S]
            if hit:
                lat.setdefault(f.x, []).append(min(hit) - f.start)
            elif any(r in f.ranks and a < f.start < b for a, b, r in spans):
                # still flagged from before: found at once, as bench_fleet counts it
                lat.setdefault(f.x, []).append(0.0)
            else:
                missed[f.x] = missed.get(f.x, 0) + 1
        false += sum(
            1
            for t, r in acts
            if not any(r in f.ranks and f.start <= t <= f.end + TRAIL_S for f in fl)
        )
    return lat, missed, false


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threshold", type=float, default=0.15)
    ap.add_argument("--allowance", type=float, default=0.02)
    ap.add_argument("--cap", type=float, default=0.075)
    ap.add_argument("--window", type=float, default=15.0, help="rate window, seconds")
    ap.add_argument(
        "--eval",
        type=float,
        default=5.0,
        choices=(1.0, 2.5, 5.0),
        help="the rule group's evaluation interval, seconds",
    )
    ap.add_argument(
        "--slow-window",
        type=float,
        default=60.0,
        help="the second, slower CUSUM's rate window, seconds (0: not modelled)",
    )
    ap.add_argument("--slow-allowance", type=float, default=0.01)
    ap.add_argument("--slow-threshold", type=float, default=0.08)
    ap.add_argument("--slow-cap", type=float, default=0.05)
    ap.add_argument("--slow-ceiling", type=float, default=0.15)
    ap.add_argument("--healthy-hours", type=float, default=3.0)
    ap.add_argument("--seeds", type=int, default=4, help="healthy jobs (16 ranks each)")
    ap.add_argument("--fault-jobs", type=int, default=8)
    a = ap.parse_args()
    if (
        a.window < 2 * SCRAPE_S
        or not 0 < a.threshold < 1
        or a.healthy_hours <= 0
        or a.seeds < 1
        or a.fault_jobs < 1
    ):
        print(
            "straggler_rule_model: --window must span two scrapes (>= 10), --threshold lie "
            "in (0, 1), and --healthy-hours, --seeds, --fault-jobs be positive",
            file=sys.stderr,
        )
        return 2
    if min(a.allowance, a.slow_allowance) < 0 or min(a.cap, a.slow_cap) <= 0:
        print(
            "straggler_rule_model: the allowances must be 0 or more and the caps above 0",
            file=sys.stderr,
        )
        return 2
    if a.slow_window and (
        a.slow_window < 2 * SCRAPE_S or not 0 < a.slow_threshold < a.slow_ceiling
    ):
        print(
            "straggler_rule_model: --slow-window must span two scrapes (>= 10), and "
            "--slow-threshold lie between 0 and --slow-ceiling",
            file=sys.stderr,
        )
        return 2
    p = Params(
        a.threshold,
        a.allowance,
        a.cap,
        a.window,
        eval_s=a.eval,
        slow_window_s=a.slow_window,
        slow_allowance=a.slow_allowance,
        slow_threshold=a.slow_threshold,
        slow_cap=a.slow_cap,
        slow_ceiling=a.slow_ceiling,
    )
    print(f"parameters: {p}")
    for name, detrend in (("raw recording", 0), ("detrended", DETREND_STEPS)):
        false, top, slow_top = healthy(p, a.healthy_hours, a.seeds, detrend)
        print(
            f"healthy, {name}: {false} false alarm(s) in {a.seeds} x {a.healthy_hours:g} h "
            f"of 16 ranks; highest CUSUM {top:.3f}"
            + (f", slow CUSUM {slow_top:.3f}" if p.slow_window_s else "")
        )
    lat, missed, false = faults(p, a.fault_jobs)
    big = sorted(x for k, v in lat.items() if k >= 0.1 for x in v)
    ten = sorted(lat.get(0.1, []))
    if big:
        p95 = big[min(len(big) - 1, int(0.95 * len(big)))]
        print(
            f"slowdowns >= 10%: {len(big)} found, latency median {statistics.median(big):.1f} "
            f"s, p95 {p95:.1f} s; 10% alone: "
            + (
                f"median {statistics.median(ten):.1f} s, max {max(ten):.1f} s ({len(ten)})"
                if ten
                else "none"
            )
        )
    lost = sum(v for k, v in missed.items() if k >= 0.1)
    five = sorted(lat.get(0.05, []))
    print(
        f"recall >= 10%: {len(big) / max(1, len(big) + lost):.3f} ({lost} missed); "
        f"5%: {len(five)} found"
        + (f" (median {statistics.median(five):.1f} s, max {max(five):.1f} s)" if five else "")
        + f", {missed.get(0.05, 0)} missed; "
        f"false alarms among the faults: {false}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
