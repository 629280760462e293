"""What the probe costs a step, its device (CUDA-event) timing included, per step length
(issue 37's goal: under 1% of the step at any step length).

    .venv/bin/python benchmarks/bench_probe_cuda.py          # CPU fakes, a few minutes
    .venv/bin/python benchmarks/bench_probe_cuda.py --cuda   # real CUDA events (needs a GPU)
    .venv/bin/python benchmarks/bench_probe_cuda.py --only pairs --steps-us 50   # one arm

Each step is a busy-wait of the given length on the training thread (a stand-in for the host
side of a step). Four arms: the bare loop; ``watch()`` without device timing (a plain
``Recorder``); ``watch()`` timing the device as it does now (pairs of steps, one pair in
``timing_every(step)``: stallscope/probe/device.py); and ``watch()`` timing every step, as it
did before. Each arm runs in a process of its own (after a warm-up pass that starts the
probe's writer), ``--reps`` rounds, order rotating: two probes in one process, as this ran
first, disturb each other (on the H200 the interleaved pairs arm read 4.2 us a step over the
no-device arm; alone, 0.7 us). Without ``--cuda`` the events are fakes whose ``record()`` spins
for ``EVENT_RECORD_S`` (7 us, torch.cuda.Event.record() on the H200). Printed per step length:
each arm's median time per step, the probe's own cost and the device timing's, as shares of
the bare step, against the 1% goal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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
ARMS = ("bare", "nodev", "pairs", "every")


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


def one_process(arm: str, step_s: float, seconds: float, cuda: bool) -> float:
    """Seconds per step of ``arm`` in this process, after a warm-up pass (the probe's writer
    has started and flushed once)."""
    events: Callable[[], Any]
    if cuda:
        import torch

        torch.zeros(1, device="cuda")  # the trainer initializes CUDA; the probe never does
        events = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    else:
        events = SpinEvent
    tmp = tempfile.mkdtemp(prefix="stallscope-bench-")
    run_dir = new_run_dir(tmp, "bench")
    RunStore(run_dir / "run.db").close()
    rec: Recorder | None = None
    if arm in ("pairs", "every"):
        rec = Probe(rank=0, run_dir=run_dir, capacity=1 << 21, events=events,
                    register_atexit=False)
    elif arm == "nodev":  # no device timer (a Probe would find torch's CUDA and time it)
        rec = Recorder(rank=0, run_dir=run_dir, capacity=1 << 21, register_atexit=False)
    if arm == "every":
        watch_mod.timing_every = lambda _s: 1
    n = max(20, int(seconds / step_s))
    items = list(range(n))
    warm = items[:max(20, n // 10)]

    def loop(xs: list[int]) -> Callable[[], Iterator[int]]:
        return (lambda: iter(xs)) if rec is None else (lambda: iter(Watched(xs, rec)))

    one_arm(loop(warm), step_s)
    if rec is not None:
        rec.flush()
    per_step = one_arm(loop(items), step_s)
    if rec is not None:
        rec.close()
    return per_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps-us", default="50,100,300,1000,3300",
                    help="step lengths to try, in microseconds (comma-separated)")
    ap.add_argument("--reps", type=int, default=5, help="rounds per step length")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one arm's pass")
    ap.add_argument("--cuda", action="store_true", help="real torch.cuda events (needs a GPU)")
    ap.add_argument("--only", choices=ARMS,
                    help="run this arm alone in this process and print its time per step "
                         "(what each round runs; also to profile an arm under py-spy)")
    args = ap.parse_args()
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            print("--cuda: no CUDA device here")
            return 2
        kind = f"real CUDA events on {torch.cuda.get_device_name(0)}"
    else:
        kind = f"fake events, record() = {EVENT_RECORD_S * 1e6:.0f} us"
    if args.only:
        step_s = float(args.steps_us.split(",")[0]) / 1e6
        per = one_process(args.only, step_s, args.seconds, args.cuda)
        print(f"{args.only}: {per * 1e6:.3f} us per step")
        return 0
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load avg "
          f"{os.getloadavg()[0]:.1f}; {kind}; {args.reps} rounds x 4 arms of "
          f"{args.seconds:.2f} s per step length, each arm in a process of its own")
    print(f"{'step':>8} {'bare':>9} {'no dev':>9} {'pairs':>9} {'every':>9} {'1 pair in':>9} "
          f"{'probe':>7} {'dev now':>8} {'dev before':>10}")
    worst = 0.0
    for us in (float(x) for x in args.steps_us.split(",")):
        res: dict[str, list[float]] = {k: [] for k in ARMS}
        for r in range(args.reps):
            order = ARMS[r % 4:] + ARMS[:r % 4]
            for arm in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--only", arm, "--steps-us", f"{us:g}",
                     "--seconds", str(args.seconds), *(["--cuda"] if args.cuda else [])],
                    capture_output=True, text=True, timeout=600, check=True).stdout
                res[arm].append(float(out.rsplit(":", 1)[1].split()[0]) / 1e6)
        med = {k: statistics.median(v) for k, v in res.items()}
        probe = (med["nodev"] - med["bare"]) / med["bare"] * 100
        now = (med["pairs"] - med["nodev"]) / med["bare"] * 100
        before = (med["every"] - med["nodev"]) / med["bare"] * 100
        worst = max(worst, probe + now)
        print(f"{us:>6.0f}us {med['bare'] * 1e6:>7.1f}us {med['nodev'] * 1e6:>7.1f}us "
              f"{med['pairs'] * 1e6:>7.1f}us {med['every'] * 1e6:>7.1f}us "
              f"{timing_every(us / 1e6):>9d} {probe:>6.2f}% {now:>7.2f}% {before:>9.2f}%",
              flush=True)
    verdict = "OK" if worst < 1.0 else "OVER"
    print(f"the probe's worst cost, device timing included: {worst:.2f}% of a step "
          f"(goal < 1%) -> {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
