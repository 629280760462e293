"""What the probe's device (CUDA-event) timing costs a step, per step length (issue 37 goal: the
probe costs < 1% of the step at any step length).

    .venv/bin/python benchmarks/bench_probe_cuda.py          # CPU fakes, ~1 min
    .venv/bin/python benchmarks/bench_probe_cuda.py --cuda   # real CUDA events (needs a GPU)

Each step is a busy-wait of the given length on the training thread (a stand-in for the host
side of a step; the events' cost is what is measured). Four arms, interleaved in each of
``--reps`` rounds, order rotating: the bare loop; ``watch()`` without device timing; ``watch()``
timing the device as it does now (pairs of steps, one pair in ``timing_every(step)``:
stallscope/probe/device.py); and ``watch()`` timing every step, as it did before (on an H200 that
took a 50.5-us launch-bound step to 97.7 us, +93%). Without ``--cuda`` the events are fakes
whose ``record()`` spins for ``EVENT_RECORD_S`` (7 us, torch.cuda.Event.record() on the H200:
tests/fixtures/gpu-h200/nvml-and-cuda-event-costs.txt). Printed per step length: each arm's
median time per step, and the device timing's cost as a share of the bare step (the ratio of
medians in the same run), against the 1% goal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import importlib

from stallscope.probe import Probe, Recorder, Watched
from stallscope.probe.device import EVENT_RECORD_S, timing_every
from stallscope.store import RunStore, new_run_dir

watch_mod = importlib.import_module("stallscope.probe.watch")  # the package exports watch()


class SpinEvent:
    """A fake CUDA event: ``record()`` costs what the H200's did; it completes at once."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        end = time.perf_counter() + EVENT_RECORD_S
        while time.perf_counter() < end:
            pass
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Any) -> float:
        return (end_event.t - self.t) * 1e3


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def one_arm(loop: Callable[[], Iterator[int]], step_s: float) -> float:
    """Seconds per step of one pass over ``loop``."""
    t0 = time.perf_counter()
    n = 0
    for _ in loop():
        spin(step_s)
        n += 1
    return (time.perf_counter() - t0) / max(1, n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps-us", default="50,100,300,1000,3300",
                    help="step lengths to try, in microseconds (comma-separated)")
    ap.add_argument("--reps", type=int, default=15, help="A/B rounds per step length")
    ap.add_argument("--seconds", type=float, default=0.25, help="length of one arm's pass")
    ap.add_argument("--cuda", action="store_true", help="real torch.cuda events (needs a GPU)")
    ap.add_argument("--only", choices=("bare", "nodev", "pairs", "every"),
                    help="run this arm alone for --seconds at the first --steps-us (to profile "
                         "it, e.g. under py-spy record)")
    args = ap.parse_args()

    events: Callable[[], Any]
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            print("--cuda: no CUDA device here")
            return 2
        torch.zeros(1, device="cuda")  # the trainer initializes CUDA; the probe never does
        events = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        kind = f"real CUDA events on {torch.cuda.get_device_name(0)}"
    else:
        events = SpinEvent
        kind = f"fake events, record() = {EVENT_RECORD_S * 1e6:.0f} us"
    tmp = tempfile.mkdtemp(prefix="stallscope-bench-")
    run_dir = new_run_dir(tmp, "bench")
    RunStore(run_dir / "run.db").close()
    timed = Probe(rank=0, run_dir=run_dir, capacity=1 << 20, events=events,
                  register_atexit=False)
    # no device timer at all (a Probe would find torch's CUDA and time the device itself)
    plain = Recorder(rank=1, run_dir=run_dir, capacity=1 << 20, register_atexit=False)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load avg "
          f"{os.getloadavg()[0]:.1f}; {kind}; {args.reps} rounds x 4 arms of "
          f"{args.seconds:.2f} s per step length")
    print(f"{'step':>8} {'bare':>9} {'no dev':>9} {'pairs':>9} {'every':>9} {'1 pair in':>9} "
          f"{'cost now':>9} {'cost before':>11}")
    worst = 0.0
    now_every = watch_mod.timing_every
    if args.only:
        step_s = float(args.steps_us.split(",")[0]) / 1e6
        n = max(20, int(args.seconds / step_s))
        items = list(range(n))
        loop = {"bare": lambda: iter(items), "nodev": lambda: iter(Watched(items, plain)),
                "pairs": lambda: iter(Watched(items, timed)),
                "every": lambda: iter(Watched(items, timed))}[args.only]
        if args.only == "every":
            watch_mod.timing_every = lambda _s: 1
        print(f"{args.only}: {one_arm(loop, step_s) * 1e6:.2f} us per step over {n} steps")
        timed.close()
        plain.close()
        return 0
    for us in (float(x) for x in args.steps_us.split(",")):
        step_s = us / 1e6
        n = max(20, int(args.seconds / step_s))
        items = list(range(n))
        arms: dict[str, Callable[[], Iterator[int]]] = {
            "bare": lambda items=items: iter(items),
            "nodev": lambda items=items: iter(Watched(items, plain)),
            "pairs": lambda items=items: iter(Watched(items, timed)),
            "every": lambda items=items: iter(Watched(items, timed)),
        }
        res: dict[str, list[float]] = {k: [] for k in arms}
        names = list(arms)
        for r in range(args.reps + 1):
            order = names[r % 4:] + names[:r % 4]
            for name in order:
                watch_mod.timing_every = (lambda _s: 1) if name == "every" else now_every
                t = one_arm(arms[name], step_s)
                if r:  # the first round warms up
                    res[name].append(t)
            timed.flush()
            plain.flush()
        watch_mod.timing_every = now_every
        med = {k: statistics.median(v) for k, v in res.items()}
        now = (med["pairs"] - med["nodev"]) / med["bare"] * 100
        before = (med["every"] - med["nodev"]) / med["bare"] * 100
        worst = max(worst, now)
        print(f"{us:>6.0f}us {med['bare'] * 1e6:>7.1f}us {med['nodev'] * 1e6:>7.1f}us "
              f"{med['pairs'] * 1e6:>7.1f}us {med['every'] * 1e6:>7.1f}us "
              f"{timing_every(step_s):>9d} {now:>8.2f}% {before:>10.2f}%")
    timed.close()
    plain.close()
    verdict = "OK" if worst < 1.0 else "OVER"
    print(f"device timing's worst cost now {worst:.2f}% of a step (goal < 1%) -> {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
