"""How close does `stallscope tune` get to the best configuration, and how fast?

    .venv/bin/python benchmarks/bench_tune.py [--window 3] [--only cpu_heavy,small_files,mixed]

For each example dataset with a known bottleneck (examples/tune_datasets.py), with the example
training step as the consumer:

1. an exhaustive grid over the tuner's space (num_workers 0 … usable cores × prefetch_factor
   2, 4, 8 × persistent_workers False, True), each configuration measured for the same window;
2. the tuner, given the same window per trial (budget = 14 windows);
3. the tuner's pick and the grid's best re-measured alternately (3 rounds each), so that both
   figures come from the same minutes of the machine.

Prints, per dataset: pick ÷ grid best (goal ≥ 0.95), tuner wall time ÷ grid wall time (goal
≤ 0.15), and the pick's speed-up over num_workers=0 and over the configuration as given
(``examples/tune_datasets.py:loader`` gives num_workers=1 without persistent workers).
``small_files`` reads cold files from a device capped at 4 MB/s, ``mixed`` at 12 MB/s (cgroup
blkio throttle, root only; otherwise they read without a cap and say so). Timings move with
the machine's load: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
CONSTRAIN = ROOT / "examples" / "constrain.py"
#: read caps (bytes/s): small_files is storage-bound; mixed has a cap the CPU work nears
CAP_BPS = {"small_files": 4_000_000, "mixed": 12_000_000}
AS_GIVEN = {"num_workers": 1, "persistent_workers": False, "prefetch_factor": 2}


def one(name: str, window: float) -> dict[str, Any]:
    import tune_datasets  # type: ignore[import-not-found]

    from stallscope.tuner import tune
    from stallscope.tuner.measure import run_trial
    from stallscope.tuner.search import usable_cores
    from stallscope.tuner.target import target_of

    dataset = getattr(tune_datasets, name)()
    step = tune_datasets.step
    target = target_of(dataset)
    cores = usable_cores()

    def cfg(w: int, pf: int = 2, pers: bool = False) -> dict[str, Any]:
        return {"num_workers": w} if w == 0 else {"num_workers": w, "prefetch_factor": pf,
                                                    "persistent_workers": pers}

    def rate(config: dict[str, Any]) -> float:
        t = run_trial(target.make, config, window_s=window, step_fn=step)
        if t.status != "ok" or not t.samples_per_s:
            raise SystemExit(f"{name}: {config} failed: {t.reason}")
        return t.samples_per_s

    space = [cfg(0)] + [cfg(w, pf, pers) for w, pf, pers in
                        itertools.product(range(1, cores + 1), (2, 4, 8), (False, True))]
    t0 = time.monotonic()
    grid = [(c, rate(c)) for c in space]
    grid_s = time.monotonic() - t0
    grid_best = max(grid, key=lambda x: x[1])[0]

    t0 = time.monotonic()
    result = tune(dataset, step_fn=step, budget_s=14 * window)
    tune_s = time.monotonic() - t0
    pick = dict(result.best)

    rounds: dict[str, list[float]] = {"pick": [], "grid": [], "zero": [], "given": []}
    for _ in range(3):
        rounds["pick"].append(rate(pick))
        rounds["grid"].append(rate(grid_best))
        rounds["zero"].append(rate(cfg(0)))
        rounds["given"].append(rate(AS_GIVEN))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    return {"dataset": name, "cores": cores, "grid_trials": len(space),
            "tuner_trials": len(result.trials), "grid_s": round(grid_s, 1),
            "tune_s": round(tune_s, 1), "pick": pick, "grid_best": grid_best,
            "rates": {k: round(v, 1) for k, v in med.items()},
            "pick_vs_grid": round(med["pick"] / med["grid"], 3),
            "time_share": round(tune_s / grid_s, 3),
            "vs_zero": round(med["pick"] / med["zero"], 2),
            "vs_given": round(med["pick"] / med["given"], 2),
            "bound": result.bound, "stopped": result.stopped}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=float, default=3.0, help="seconds per trial (default 3)")
    ap.add_argument("--only", default="cpu_heavy,small_files,mixed")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.window)))
        return 0
    import tune_datasets

    rows = []
    for name in args.only.split(","):
        argv = [sys.executable, __file__, "--one", name, "--window", str(args.window)]
        capped = False
        group = f"stallscope-bench-tune-{os.getpid()}"
        if name in ("small_files", "mixed") and os.geteuid() == 0 and \
                Path("/sys/fs/cgroup/blkio").is_dir():
            data = tune_datasets.data_dir()
            bps = CAP_BPS[name]
            argv = [sys.executable, str(CONSTRAIN), "--read-bps", str(bps), "--data",
                    str(data), "--cgroup", group, "--", *argv]
            capped = True
        print(f"{name}: grid, tuner, then 3 alternating rounds …", file=sys.stderr, flush=True)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, check=False)
        finally:
            if capped:
                subprocess.run([sys.executable, str(CONSTRAIN), "--cleanup", group],
                               check=False, capture_output=True)
        if out.returncode != 0:
            print(f"{name}: failed: {out.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["reads_capped"] = CAP_BPS[name] if capped else 0
        rows.append(row)
    print(f"{'dataset':<12} {'pick/grid':>9} {'time':>6} {'×w=0':>6} {'×given':>7} "
          f"{'trials':>8}  pick → grid best")
    for r in rows:
        print(f"{r['dataset']:<12} {r['pick_vs_grid']:>9.3f} {r['time_share']:>6.2f} "
              f"{r['vs_zero']:>6.2f} {r['vs_given']:>7.2f} "
              f"{r['tuner_trials']:>3}/{r['grid_trials']:<4}  {r['pick']} → {r['grid_best']}")
        print(f"{'':<12} rates {r['rates']}; {r['tune_s']} s vs {r['grid_s']} s"
              + (f"; reads capped at {r['reads_capped'] / 1e6:g} MB/s"
                 if r["reads_capped"] else ""))
        print(f"{'':<12} bound: {r['bound']}")
    print("goals: pick/grid ≥ 0.95, time ≤ 0.15 of the grid's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
