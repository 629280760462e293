"""How close does `stallscope tune` get to the best configuration, and how fast?

    .venv/bin/python benchmarks/bench_tune.py [--window 3] [--only cpu_heavy,small_files,mixed]
                                              [--rounds 5] [--verify-window 6]

For each example dataset with a known bottleneck (examples/tune_datasets.py), with the example
training step as the consumer:

1. an exhaustive grid over the tuner's space (num_workers 0 … usable cores × prefetch_factor
   2, 4, 8 × persistent_workers False, True), each configuration measured for the same window;
2. the tuner, given the same window per trial (budget = 14 windows);
3. ``--rounds`` rounds of ``--verify-window`` seconds per configuration: the tuner's pick, the
   grid's three fastest, no workers and the configuration as given, back to back (each first
   in turn). The pick's figure is the median over rounds of its rate ÷ the grid's best in the
   same round, the best chosen from the *other* rounds (``benchmarks/paired.py``: the
   machine's drift cancels within a round, and on a machine whose configurations differ by
   less than one window's noise, a best chosen on the figures it is compared on is biased
   upwards). The naive figure is printed beside it.

Prints, per dataset: pick ÷ grid best (goal ≥ 0.95), tuner wall time ÷ grid wall time (goal
≤ 0.35 on this 2-core machine), and the pick's speed-up over num_workers=0 and over the
configuration as given (``examples/tune_datasets.py:loader`` gives num_workers=1 without
persistent workers), and the tuner's predicted speed-up for its pick against the one measured
over the rounds (the pick and no workers back to back in each) and the one its own trials
measured. Before and after, each core's speed on a fixed loop (``cpu_speed.py``): on a VM whose
cores slow and speed up by up to ~50% within seconds, no ratio here is finer than that.

``--simulate-cores 16,64`` runs the same search policy (``stallscope/tuner/search.py``) against
a model of a machine with that many cores instead, calibrated per dataset on this machine: the
step's time, one worker's rate and loading CPU per sample, and how much a second worker falls
short of the model here (``contention``: each worker beyond the first slows every worker's
loading by that share, which the tuner's model does not know). Every simulated trial draws ±3%
noise. The grid (every configuration of the same space) and the tuner see the same simulated
machine; their picks are compared by the machine's true rate, the time by trials × window
(goal: ≤ 0.15 of the grid's).
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from paired import paired_ratio  # noqa: E402

CONSTRAIN = ROOT / "examples" / "constrain.py"
#: read caps (bytes/s): small_files is storage-bound; mixed has a cap the CPU work nears
CAP_BPS = {"small_files": 4_000_000, "mixed": 12_000_000}
AS_GIVEN = {"num_workers": 1, "persistent_workers": False, "prefetch_factor": 2}


def one(name: str, window: float, rounds: int, verify_window: float) -> dict[str, Any]:
    import tune_datasets  # type: ignore[import-not-found]

    from stallscope.tuner import tune
    from stallscope.tuner.measure import run_trial
    from stallscope.tuner.search import _short, usable_cores
    from stallscope.tuner.target import target_of

    dataset = getattr(tune_datasets, name)()
    step = tune_datasets.step
    target = target_of(dataset)
    cores = usable_cores()

    def cfg(w: int, pf: int = 2, pers: bool = False) -> dict[str, Any]:
        return (
            {"num_workers": w}
            if w == 0
            else {"num_workers": w, "prefetch_factor": pf, "persistent_workers": pers}
        )

    def rate(config: dict[str, Any], window_s: float = window) -> float:
        t = run_trial(target.make, config, window_s=window_s, step_fn=step)
        if t.status != "ok" or not t.samples_per_s:
            raise SystemExit(f"{name}: {config} failed: {t.reason}")
        return t.samples_per_s

    space = [cfg(0)] + [
        cfg(w, pf, pers)
        for w, pf, pers in itertools.product(range(1, cores + 1), (2, 4, 8), (False, True))
    ]
    t0 = time.monotonic()
    grid = [(c, rate(c)) for c in space]
    grid_s = time.monotonic() - t0
    grid_best = max(grid, key=lambda x: x[1])[0]

    t0 = time.monotonic()
    result = tune(dataset, step_fn=step, budget_s=14 * window)
    tune_s = time.monotonic() - t0
    pick = dict(result.best)

    # the pick, the grid's three fastest, no workers and the configuration as given, back to
    # back in every round (each first in turn), with longer windows: the ratio to the grid's
    # best is taken within each round, the best chosen from the other rounds (paired.py)
    def key(c: dict[str, Any]) -> str:
        return json.dumps(c, sort_keys=True)

    top = [c for c, _ in sorted(grid, key=lambda x: x[1], reverse=True)[:3]]
    configs = {key(c): c for c in [pick, *top, cfg(0), AS_GIVEN]}
    measured: dict[str, list[float]] = {k: [] for k in configs}
    # the pick and no workers always back to back (their order alternating), the pair at a
    # rotating place among the others: the speed-up is their ratio, and this machine's speed
    # moves over seconds (3-s trials of one configuration read 228-307 samples/s in a row), so
    # a pair 20 s apart within a round measured the drift as much as the speed-up
    pair = list(dict.fromkeys([key(pick), key(cfg(0))]))
    rest = [k for k in configs if k not in pair]
    for i in range(rounds):
        rot = rest[i % len(rest) :] + rest[: i % len(rest)] if rest else []
        at = i % (len(rot) + 1)
        for k in rot[:at] + (pair if i % 2 == 0 else pair[::-1]) + rot[at:]:
            measured[k].append(rate(configs[k], verify_window))
    cmp = paired_ratio(measured[key(pick)], {key(c): measured[key(c)] for c in top})
    # the speed-up the model predicted for the pick (before a trial measured it) against the
    # one measured here: the pick over no workers, round by round
    ups = [p / z for p, z in zip(measured[key(pick)], measured[key(cfg(0))], strict=True)]
    speedup = statistics.median(ups)
    predicted = result.predicted_speedup
    base_rate = result.baseline.get("samples_per_s")
    # the speed-up the tuner itself measured: its pick's trials over its baseline's trial
    own = (
        (result.samples_per_s / base_rate)
        if result.samples_per_s and base_rate and not result.baseline["config"].get("num_workers")
        else None
    )
    med = {
        "pick": statistics.median(measured[key(pick)]),
        "grid": statistics.median(measured[cmp.best]),
        "zero": statistics.median(measured[key(cfg(0))]),
        "given": statistics.median(measured[key(AS_GIVEN)]),
    }
    return {
        "dataset": name,
        "cores": cores,
        "grid_trials": len(space),
        "tuner_trials": len(result.trials),
        "grid_s": round(grid_s, 1),
        "tune_s": round(tune_s, 1),
        "pick": pick,
        "grid_best": configs[cmp.best],
        "grid_first_pass_best": grid_best,
        "rates": {k: round(v, 1) for k, v in med.items()},
        "pick_vs_grid": round(cmp.ratio, 3),
        "pick_vs_grid_naive": round(cmp.in_sample, 3),
        "per_round": [round(r, 3) for r in cmp.per_round],
        "pick_is_top": key(pick) in {key(c) for c in top},
        "rounds": rounds,
        "verify_window_s": verify_window,
        "time_share": round(tune_s / grid_s, 3),
        "vs_zero": round(med["pick"] / med["zero"], 2),
        "vs_given": round(med["pick"] / med["given"], 2),
        "bound": result.bound,
        "stopped": result.stopped,
        "predictions": [n for n in result.notes if "predicted" in n],
        "predicted_speedup": round(predicted, 3) if predicted else None,
        "measured_speedup": round(speedup, 3),
        "speedup_error": round(predicted / speedup - 1.0, 3) if predicted else None,
        "speedup_per_round": [round(u, 3) for u in ups],
        "trials_speedup": round(own, 3) if own else None,
        "trials_speedup_error": round(predicted / own - 1.0, 3) if predicted and own else None,
        "trial_configs": [_short(t.config) for t in result.trials],
    }


def calibrate(name: str, window: float) -> dict[str, Any]:
    """This machine's figures for ``name``: the step per sample, one worker's load time and
    loading CPU per sample, and the second worker's shortfall against the model."""
    import tune_datasets  # type: ignore[import-not-found]

    from stallscope.tuner.measure import run_trial
    from stallscope.tuner.search import usable_cores
    from stallscope.tuner.target import target_of

    dataset = getattr(tune_datasets, name)()
    target = target_of(dataset)
    step = tune_datasets.step
    batch = next(iter(target.make(num_workers=0)))
    step(batch)
    t = time.perf_counter()
    for _ in range(20):
        step(batch)
    step_s = (time.perf_counter() - t) / 20
    per_batch = len(batch[1]) if isinstance(batch, (list, tuple)) else 32
    one = run_trial(
        target.make, {"num_workers": 1, "prefetch_factor": 2}, window_s=window, step_fn=step
    )
    two = run_trial(
        target.make, {"num_workers": 2, "prefetch_factor": 2}, window_s=window, step_fn=step
    )
    cores = usable_cores()
    load = 1.0 / (one.samples_per_s or 1.0)
    cpu = min((one.cpu_ms_per_sample or 0.0) / 1000.0 or load, load)
    c = step_s / per_batch
    model2 = min(2 / load, 1 / c, cores / (cpu + c))
    # two workers at (1 + δ) each: 2 / (load (1 + δ)) = measured, when loading is the limit
    contention = max(0.0, model2 / max(two.samples_per_s or model2, 1e-9) - 1.0)
    return {
        "dataset": name,
        "step_ms": round(step_s * 1000, 3),
        "batch": per_batch,
        "load_ms": round(load * 1000, 4),
        "cpu_ms": round(cpu * 1000, 4),
        "contention": round(contention, 3),
        "one_rate": round(one.samples_per_s or 0, 1),
        "two_rate": round(two.samples_per_s or 0, 1),
    }


def simulate(cal: dict[str, Any], cores: int, window: float, seed: int = 0) -> dict[str, Any]:
    """The search policy and the exhaustive grid against a ``cores``-core machine modelled on
    ``cal`` (see the module docstring)."""
    import random

    import tune_datasets  # type: ignore[import-not-found]

    from stallscope.tuner.measure import Trial
    from stallscope.tuner.search import Search
    from stallscope.tuner.target import target_of

    rng = random.Random(seed)
    load, cpu = cal["load_ms"] / 1000, cal["cpu_ms"] / 1000
    c, batch, delta = cal["step_ms"] / 1000 / cal["batch"], cal["batch"], cal["contention"]

    def truth(config: dict[str, Any]) -> float:
        k = int(config.get("num_workers", 0) or 0)
        if k == 0:
            return 1.0 / (load + c)
        slowed = load * (1.0 + delta * (k - 1))
        return min(k / slowed, 1.0 / c, cores / (cpu * (1.0 + delta * (k - 1)) + c))

    def measure(config: dict[str, Any], window_s: float, _best: float | None) -> Trial:
        rate = truth(config) * (1.0 + rng.uniform(-0.03, 0.03))
        k = int(config.get("num_workers", 0) or 0)
        wait = max(0.0, 1.0 - rate * c)
        return Trial(
            config=config,
            samples_per_s=rate,
            data_wait_share=wait,
            cpu_ms_per_sample=1000 * cpu * (1.0 + delta * max(0, k - 1)),
            step_ms=c * batch * 1000,
            samples=int(rate * window_s),
            batches=max(1, int(rate * window_s / batch)),
            seconds=window_s,
        )

    def cfg(w: int, pf: int = 2, pers: bool = False) -> dict[str, Any]:
        return (
            {"num_workers": w}
            if w == 0
            else {"num_workers": w, "prefetch_factor": pf, "persistent_workers": pers}
        )

    space = [cfg(0)] + [
        cfg(w, pf, pers)
        for w, pf, pers in itertools.product(range(1, cores + 1), (2, 4, 8), (False, True))
    ]
    grid = [(conf, measure(conf, window, None).samples_per_s or 0.0) for conf in space]
    grid_best = max(grid, key=lambda x: x[1])[0]
    target = target_of(getattr(tune_datasets, cal["dataset"])())
    search = Search(
        target,
        step_fn=tune_datasets.step,
        budget_s=14 * window * 4,
        max_workers=None,
        start_method=None,
        gpu=False,
        cores=cores,
        measure=measure,
        step_ms=c * batch * 1000,
        read_caps={},
    )
    search.window_s = window
    result = search.run()
    tuner_s = sum(t.seconds for t in result.trials) + min(2.0, window)
    pick = {k: v for k, v in result.best.items() if k in ("num_workers", "prefetch_factor")}
    best_truth = max(truth(conf) for conf in space)
    k = int(pick.get("num_workers", 0) or 0)
    return {
        "dataset": cal["dataset"],
        "cores": cores,
        "grid_trials": len(space),
        "tuner_trials": sum(t.repeats for t in result.trials),
        "grid_s": round(len(space) * window, 1),
        "tune_s": round(tuner_s, 1),
        "time_share": round(tuner_s / (len(space) * window), 3),
        "pick": pick,
        "grid_best": {k2: v for k2, v in grid_best.items() if k2 != "persistent_workers"},
        "pick_vs_grid": round(truth(pick) / truth(grid_best), 3),
        "pick_vs_best": round(truth(pick) / best_truth, 3),
        # the prediction made before the pick's trial (its last one may have been fitted
        # to that trial)
        "predicted": round(search.forecast.get(k, search.predicted.get(k, 0.0)), 1),
        "pick_truth": round(truth(pick), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=float, default=3.0, help="seconds per trial (default 3)")
    ap.add_argument("--only", default="cpu_heavy,small_files,mixed")
    ap.add_argument(
        "--simulate-cores",
        metavar="N,N",
        default="",
        help="run the search against a model of machines with these many cores "
        "(calibrated here) instead of the real grid",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds re-measuring the pick against the grid's three fastest (default 5)",
    )
    ap.add_argument(
        "--verify-window",
        type=float,
        default=6.0,
        help="seconds per configuration in those rounds (default 6)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 2 or args.verify_window <= 0:
        print(
            "--rounds takes 2 or more, --verify-window a positive number of seconds",
            file=sys.stderr,
        )
        return 2
    if args.one:
        print(json.dumps(one(args.one, args.window, args.rounds, args.verify_window)))
        return 0
    if args.simulate_cores:
        return simulate_main(args)
    import tune_datasets
    from cpu_speed import line as cpu_speed

    # how steady the cores were, before and after: no ratio below is finer than that
    before = cpu_speed(6.0)
    rows = []
    for name in args.only.split(","):
        argv = [
            sys.executable,
            __file__,
            "--one",
            name,
            "--window",
            str(args.window),
            "--rounds",
            str(args.rounds),
            "--verify-window",
            str(args.verify_window),
        ]
        capped = False
        group = f"stallscope-bench-tune-{os.getpid()}"
        if (
            name in ("small_files", "mixed")
            and os.geteuid() == 0
            and Path("/sys/fs/cgroup/blkio").is_dir()
        ):
            data = tune_datasets.data_dir()
            bps = CAP_BPS[name]
            argv = [
                sys.executable,
                str(CONSTRAIN),
                "--read-bps",
                str(bps),
                "--data",
                str(data),
                "--cgroup",
                group,
                "--",
                *argv,
            ]
            capped = True
        print(
            f"{name}: grid, tuner, then {args.rounds} rounds of {args.verify_window:g} s per "
            "configuration …",
            file=sys.stderr,
            flush=True,
        )
        try:
            out = subprocess.run(argv, capture_output=True, text=True, check=False)
        finally:
            if capped:
                subprocess.run(
                    [sys.executable, str(CONSTRAIN), "--cleanup", group],
                    check=False,
                    capture_output=True,
                )
        if out.returncode != 0:
            print(f"{name}: failed: {out.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["reads_capped"] = CAP_BPS[name] if capped else 0
        rows.append(row)
    print(
        f"{'dataset':<12} {'pick/grid':>9} {'time':>6} {'×w=0':>6} {'×given':>7} "
        f"{'trials':>8}  pick → grid best"
    )
    for r in rows:
        print(
            f"{r['dataset']:<12} {r['pick_vs_grid']:>9.3f} {r['time_share']:>6.2f} "
            f"{r['vs_zero']:>6.2f} {r['vs_given']:>7.2f} "
            f"{r['tuner_trials']:>3}/{r['grid_trials']:<4}  {r['pick']} → {r['grid_best']}"
        )
        print(
            f"{'':<12} per round {r['per_round']} (naive {r['pick_vs_grid_naive']:.3f}"
            + ("; the pick is one of the grid's three fastest" if r["pick_is_top"] else "")
            + ")"
        )
        print(
            f"{'':<12} rates {r['rates']}; {r['tune_s']} s vs {r['grid_s']} s"
            + (f"; reads capped at {r['reads_capped'] / 1e6:g} MB/s" if r["reads_capped"] else "")
        )
        print(f"{'':<12} bound: {r['bound']}")
        print(f"{'':<12} trials: {' | '.join(r.get('trial_configs', []))}")
        for n in r.get("predictions", []):
            print(f"{'':<12} {n}")
        if r.get("predicted_speedup"):
            print(
                f"{'':<12} speed-up over no workers: predicted ×{r['predicted_speedup']:.2f} "
                f"before its trial, measured ×{r['measured_speedup']:.2f} over the rounds "
                f"({r['speedup_error']:+.0%}; per round {r['speedup_per_round']})"
            )
            if r.get("trials_speedup"):
                print(
                    f"{'':<12} the tuner's own trials measured ×{r['trials_speedup']:.2f} "
                    f"(the prediction {r['trials_speedup_error']:+.0%})"
                )
        else:
            print(
                f"{'':<12} speed-up over no workers: measured ×{r['measured_speedup']:.2f}; "
                "the pick is a calibration trial's configuration (measured, not predicted)"
            )
    print(f"before: {before}\nafter:  {cpu_speed(6.0)}")
    print(
        "goals: pick/grid ≥ 0.95, time ≤ 0.35 of the grid's (this 2-core machine), the "
        "predicted speed-up within 10% of the measured one; the notes give each prediction "
        "against its trial's measurement"
    )
    return 0


def simulate_main(args: argparse.Namespace) -> int:
    try:
        counts = [int(x) for x in args.simulate_cores.split(",") if x.strip()]
    except ValueError:
        print(
            f"--simulate-cores takes numbers such as 16,64, got {args.simulate_cores!r}",
            file=sys.stderr,
        )
        return 2
    from stallscope.tuner.search import usable_cores

    rows = []
    for name in args.only.split(","):
        print(f"{name}: calibrating on this machine …", file=sys.stderr, flush=True)
        cal = calibrate(name, args.window)
        print(
            f"  step {cal['step_ms']} ms per batch of {cal['batch']}, one worker "
            f"{cal['one_rate']} samples/s (load {cal['load_ms']} ms, CPU {cal['cpu_ms']} ms "
            f"per sample), two {cal['two_rate']}: contention {cal['contention']:.1%} per "
            "extra worker",
            file=sys.stderr,
            flush=True,
        )
        for cores in [usable_cores(), *counts]:
            rows.append(simulate(cal, cores, args.window))
    print(
        f"{'dataset':<12} {'cores':>5} {'pick/grid':>9} {'pick/true best':>14} "
        f"{'trials':>8} {'time':>6}  pick (grid best)"
    )
    for r in rows:
        print(
            f"{r['dataset']:<12} {r['cores']:>5} {r['pick_vs_grid']:>9.3f} "
            f"{r['pick_vs_best']:>14.3f} {r['tuner_trials']:>3}/{r['grid_trials']:<4} "
            f"{r['time_share']:>6.3f}  {r['pick']} ({r['grid_best']}); predicted "
            f"{r['predicted']} vs {r['pick_truth']} samples/s"
        )
    print("goals: pick/grid ≥ 0.95, time ≤ 0.15 of the grid's at 16 and 64 cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
