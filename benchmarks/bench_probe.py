"""What the step probe costs the trainer (issue 3 goals: <= 2 us host time per step, <= 0.5 %
throughput loss on a CPU training loop with ~5 ms steps).

    .venv/bin/python benchmarks/bench_probe.py            # both parts, ~1 min
    .venv/bin/python benchmarks/bench_probe.py --standalone  # probe also samples the machine

Part 1, per-step overhead: a tight loop over a list, bare vs ``watch()``-ed, interleaved A/B over
many repetitions; overhead = (median watched - median bare) / steps. The buffer is flushed between
repetitions (outside the timed part), so this is the training thread's cost; the writer thread's
cost shows in part 2.

Part 2, throughput: a small CPU model trained with ~5 ms steps from a DataLoader, bare epochs and
watched epochs interleaved in one process (order alternating each round); loss = median over
rounds of (watched time / bare time) - 1. By default the probe reports into a run directory as
under ``stallscope run`` (the collector is then another process); ``--standalone`` also runs the
probe's own machine collector inside the trainer (interval ``--interval``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stallscope.probe import Probe, StepTimer, Watched
from stallscope.store import RunStore, new_run_dir


def per_step_overhead(
    p: Probe, items: list[object], reps: int
) -> tuple[float, float, float, float]:
    """(bare us/step, watched us/step, overhead us/step, writer us/step), medians over ``reps``.

    The writer's cost is the time ``flush()`` takes per step (convert + SQLite insert; steps
    shorter than the probe's GROUP_S come summed, several to a record); it runs on the probe's
    thread, counted here as if it all came out of the trainer."""
    n = len(items)
    bare: list[float] = []
    watched: list[float] = []
    writer: list[float] = []
    perf = time.perf_counter
    gc.disable()
    try:
        for r in range(reps):
            for arm in (0, 1) if r % 2 == 0 else (1, 0):
                if arm == 0:
                    t0 = perf()
                    for _x in items:
                        pass
                    bare.append(perf() - t0)
                else:
                    w = Watched(items, p)
                    t0 = perf()
                    for _x in w:
                        pass
                    watched.append(perf() - t0)
                    before = p.writer.sums[0]
                    t0 = perf()
                    p.flush()
                    steps = p.writer.sums[0] - before  # records may hold several steps
                    if steps:
                        writer.append((perf() - t0) / steps)
    finally:
        gc.enable()
    b, w_ = statistics.median(bare) / n * 1e6, statistics.median(watched) / n * 1e6
    return b, w_, w_ - b, statistics.median(writer) * 1e6 if writer else float("nan")


def step_ctx_overhead(p: Probe, n: int, reps: int) -> float:
    """us per ``with StepTimer(...)`` block over an empty one-op body, minus the bare loop."""
    perf = time.perf_counter
    bare: list[float] = []
    timed: list[float] = []
    for _ in range(reps):
        t0 = perf()
        for _i in range(n):
            pass
        bare.append(perf() - t0)
        t0 = perf()
        for _i in range(n):
            with StepTimer(p).start():
                pass
        timed.append(perf() - t0)
        p.flush()
    return (statistics.median(timed) - statistics.median(bare)) / n * 1e6


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def train_epoch(
    model: nn.Module, opt: torch.optim.Optimizer, batches: object
) -> tuple[float, int, float]:
    """(wall seconds, steps, CPU seconds of this thread + the probe's writer thread)"""
    c0 = _cpu()
    t0 = time.perf_counter()
    n = 0
    for x, y in batches:  # type: ignore[attr-defined]
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        n += 1
    return time.perf_counter() - t0, n, _cpu() - c0


_WRITER: list[int] = []


def _cpu() -> float:
    """CPU seconds of the training thread plus the probe's writer thread: what the probe can take
    from training, without the time other processes on a busy machine take from both arms."""
    t = time.thread_time()
    for ident in _WRITER:
        try:
            t += time.clock_gettime(time.pthread_getcpuclockid(ident))
        except OSError:
            _WRITER.remove(ident)
    return t


def throughput(p: Probe, rounds: int, steps: int, target_ms: float) -> dict[str, float]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    batch = 64
    ds = TensorDataset(torch.randn(steps * batch, 256), torch.randint(0, 10, (steps * batch,)))
    loader = DataLoader(ds, batch_size=batch, shuffle=False, num_workers=0)
    # calibrate the width so that a step takes ~target_ms here
    width = 256
    for _ in range(6):
        model = make_model(width)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        train_epoch(model, opt, loader)
        dt, n, _ = train_epoch(model, opt, loader)
        ms = dt / n * 1e3
        width = max(32, int(width * (target_ms / ms) ** 0.5))
        if abs(ms - target_ms) / target_ms < 0.15:
            break
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_epoch(model, opt, loader)  # warm up
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    times: dict[str, list[float]] = {"bare": [], "watched": []}
    tb = tw = cb = cw = 0.0
    for r in range(rounds):
        res = {}
        for arm in ("bare", "watched") if r % 2 == 0 else ("watched", "bare"):
            src = loader if arm == "bare" else Watched(loader, p)
            res[arm] = train_epoch(model, opt, src)
        times["bare"].append(res["bare"][0])
        times["watched"].append(res["watched"][0])
        ratios.append(res["watched"][0] / res["bare"][0])
        cpu_ratios.append(res["watched"][2] / res["bare"][2])
        tb += res["bare"][0]
        tw += res["watched"][0]
        cb += res["bare"][2]
        cw += res["watched"][2]
    q = statistics.quantiles(ratios, n=4)
    cq = statistics.quantiles(cpu_ratios, n=4)
    # interference from other processes only ever adds time: the fastest rounds of each arm are
    # the least disturbed estimate of its own cost
    k = max(1, rounds // 5)
    fast = {a: statistics.mean(sorted(v)[:k]) for a, v in times.items()}
    return {
        "step_ms": tb / (rounds * steps) * 1e3,
        "width": width,
        "fast_ratio": fast["watched"] / fast["bare"],
        "median_arm_ratio": statistics.median(times["watched"]) / statistics.median(times["bare"]),
        "median_ratio": statistics.median(ratios),
        "total_ratio": tw / tb,
        "p25": q[0],
        "p75": q[2],
        "cpu_median_ratio": statistics.median(cpu_ratios),
        "cpu_total_ratio": cw / cb,
        "cpu_p25": cq[0],
        "cpu_p75": cq[2],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=41, help="part 1 repetitions per arm")
    ap.add_argument(
        "--n",
        type=int,
        default=200000,
        help="part 1 steps per repetition (a pass of these empty steps must last well "
        "over the first record's 16 ms, timed in full before sampling starts)",
    )
    ap.add_argument("--rounds", type=int, default=30, help="part 2 A/B rounds")
    ap.add_argument("--steps", type=int, default=60, help="part 2 steps per epoch")
    ap.add_argument("--step-ms", type=float, default=5.0, help="part 2 target step time")
    ap.add_argument(
        "--standalone",
        action="store_true",
        help="also run the machine collector inside the trainer (standalone mode)",
    )
    ap.add_argument("--interval", type=float, default=5.0, help="standalone collector interval")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="stallscope-bench-")
    if args.standalone:
        os.environ.pop("STALLSCOPE_RUN_DIR", None)
        os.environ["STALLSCOPE_OUT"] = tmp
        p = Probe(rank=0, capacity=max(65536, args.n * 2), collect_interval=args.interval)
    else:
        run_dir = new_run_dir(tmp, "bench")
        RunStore(run_dir / "run.db").close()
        p = Probe(rank=0, run_dir=run_dir, capacity=max(65536, args.n * 2))
    if p.writer.thread.ident is not None:
        _WRITER.append(p.writer.thread.ident)
    print(
        f"python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f}, "
        f"mode {'standalone' if args.standalone else 'under stallscope run'}"
    )

    ints: list[object] = list(range(args.n))
    pairs: list[object] = [(torch.zeros(8, 4), torch.zeros(8)) for _ in range(args.n)]
    hot = wr = 0.0
    for name, items in (("ints", ints), ("(tensor, tensor) batches", pairs)):
        b, w, o, wr = per_step_overhead(p, items, args.reps)
        hot = max(hot, o)
        print(
            f"part 1, per-step overhead over {name}: bare {b:.3f} us, watched {w:.3f} us, "
            f"overhead {o:.2f} us/step (goal <= 2 us) -> {'OK' if o <= 2 else 'OVER'}; "
            f"writer thread {wr:.2f} us/step"
        )
    o = step_ctx_overhead(p, args.n, args.reps // 2 + 1)
    print(f"part 1, stallscope.step() block: overhead {o:.2f} us/step")

    t = throughput(p, args.rounds, args.steps, args.step_ms)
    bound = (hot + wr) / (t["step_ms"] * 1e3) * 100
    print(
        f"part 2, bound from part 1: (hot path {hot:.2f} + writer {wr:.2f}) us per "
        f"{t['step_ms']:.2f} ms step = {bound:.3f} % (goal <= 0.5 %)"
    )
    print(
        f"part 2, wall clock: fastest-{max(1, args.rounds // 5)}-rounds ratio "
        f"{t['fast_ratio']:.4f} -> loss {(t['fast_ratio'] - 1) * 100:+.2f} %; "
        f"ratio of per-arm medians {t['median_arm_ratio']:.4f}"
    )
    loss = (t["median_ratio"] - 1) * 100
    noisy = t["p75"] - t["p25"] > 0.01
    verdict = "OK" if loss <= 0.5 else "OVER"
    if noisy:
        verdict += (
            f" - but the rounds' spread (IQR {(t['p75'] - t['p25']) * 100:.1f} %) is wider "
            "than the goal: this machine is too busy to resolve 0.5 % by wall clock; "
            "trust the bound above"
        )
    print(
        f"part 2, CPU training loop ({t['step_ms']:.2f} ms/step, {args.rounds} A/B rounds x "
        f"{args.steps} steps): paired watched/bare time ratio median {t['median_ratio']:.4f} "
        f"(IQR {t['p25']:.4f}-{t['p75']:.4f}), total {t['total_ratio']:.4f} -> "
        f"throughput loss {loss:+.2f} % (goal <= 0.5 %) -> {verdict}"
    )
    closs = (t["cpu_median_ratio"] - 1) * 100
    print(
        f"part 2, same rounds in CPU time of the training + writer threads (robust to other "
        f"load on the machine): ratio median {t['cpu_median_ratio']:.4f} (IQR {t['cpu_p25']:.4f}-"
        f"{t['cpu_p75']:.4f}), total {t['cpu_total_ratio']:.4f} -> cost {closs:+.2f} %"
    )
    st = p.stats()
    p.close()
    print(
        f"probe: {st['steps']} steps, {st['written']} written, {st['dropped']} dropped, "
        f"{st['lost']} lost; run in {p.run_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
