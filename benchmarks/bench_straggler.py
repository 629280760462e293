"""The online straggler detector (stallscope/sources/straggler.py) on simulated DDP ranks.

    .venv/bin/python benchmarks/bench_straggler.py [--seeds 20] [--ranks 4] [--noise 0.02]

Each seed simulates ``--ranks`` ranks whose communication share per one-second interval is
0.05 plus Gaussian noise (σ ``--noise``; the per-second shares of the 2-rank gloo runs in
tests/scenarios/test_ddp.py vary by about that much): a healthy hour (3,600 intervals), then a fresh
detector sees a minute of healthy intervals and a slowdown of one rank that makes its peers
wait ``gap`` more of their step (0.09 for a rank 10% slower, 0.045 for 5%, 0.45 for 50%).
Prints, per slowdown, the detection latency in intervals (median, p95, max) and how many were
missed within a minute, and the false alarms over the healthy hours (intervals flagged).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def shares(
    rng: random.Random, n: int, ranks: int, gap: float, noise: float, slow: int
) -> list[dict[int, float]]:
    out = []
    for _ in range(n):
        s = {r: max(0.0, 0.05 + rng.gauss(0, noise)) for r in range(ranks)}
        for r in range(ranks):
            if r != slow:
                s[r] += gap
        out.append(s)
    return out


def _q(xs: list[int], p: float) -> str:
    return str(xs[min(len(xs) - 1, int(p * len(xs)))]) if xs else "-"


def main() -> int:
    from stallscope.sources.straggler import StragglerWatch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--noise", type=float, default=0.02)
    args = ap.parse_args()
    false_alarms = 0
    for seed in range(args.seeds):
        rng = random.Random(seed)
        w = StragglerWatch()
        false_alarms += sum(
            1 for s in shares(rng, 3600, args.ranks, 0.0, args.noise, 0) if w.update(s)
        )
    print(f"{args.ranks} ranks, noise σ {args.noise}, {args.seeds} seeds")
    print(f"false alarms over {args.seeds} healthy hours: {false_alarms} flagged intervals")
    print(f"{'slower by':>10} {'peer wait':>10} {'median':>7} {'p95':>5} {'max':>5} {'missed':>7}")
    for pct, gap in ((5, 0.045), (10, 0.09), (20, 0.17), (50, 0.45)):
        lat: list[int] = []
        missed = 0
        for seed in range(args.seeds):
            rng = random.Random(1000 + seed)
            w = StragglerWatch()
            slow = rng.randrange(args.ranks)
            for s in shares(rng, 60, args.ranks, 0.0, args.noise, slow):
                w.update(s)
            for i, s in enumerate(shares(rng, 60, args.ranks, gap, args.noise, slow)):
                if slow in w.update(s):
                    lat.append(i + 1)
                    break
            else:
                missed += 1
        lat.sort()
        print(
            f"{pct:>9}% {gap:>10.3f} {_q(lat, 0.5):>7} {_q(lat, 0.95):>5} "
            f"{lat[-1] if lat else '-':>5} {missed:>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
