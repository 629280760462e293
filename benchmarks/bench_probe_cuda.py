"""What the probe costs a step, its device (CUDA-event) timing included, per step length
(issue 37's goal: under 1% of the step at any step length).

    .venv/bin/python benchmarks/bench_probe_cuda.py          # CPU fakes, about a minute
    .venv/bin/python benchmarks/bench_probe_cuda.py --cuda   # real CUDA events (needs a GPU)
    .venv/bin/python benchmarks/bench_probe_cuda.py --method wall   # whole loops, by the clock
    .venv/bin/python benchmarks/bench_probe_cuda.py --only pairs --steps-us 50   # one arm

Two methods. ``cost`` (the default) measures what the probe itself takes, in one process: the
step's body spends no time but moves a virtual clock on by the step length (the watched loop
reads its clock through it, so it records, sums, samples and times the device exactly as for
real steps that long), so a pass takes only the loop's own time. That clock is a Python call,
dearer than ``time.perf_counter``: a counting pass gives each arm's clock reads per step, and
their surplus (measured in the same process) is taken off. Each arm's pass includes the
writer's flush of what it recorded (the writer shares the trainer's interpreter lock: counted as
if all of it came out of the trainer). Arms alternate, ``--reps`` passes each, medians. A
per-step cost of a fraction of a microsecond cannot be resolved by timing whole 50-us steps on a
shared VM (its passes swing by several percent), this can.

``wall`` is the older whole-loop A/B:
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
import math
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
dev_mod = importlib.import_module("stallscope.probe.device")  # Pairs reads timing_every here
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
        rec = Probe(rank=0, run_dir=run_dir, capacity=1 << 21, events=events, register_atexit=False)
    elif arm == "nodev":  # no device timer (a Probe would find torch's CUDA and time it)
        rec = Recorder(rank=0, run_dir=run_dir, capacity=1 << 21, register_atexit=False)
    if arm == "every":
        dev_mod.timing_every = lambda _s: 1
    n = max(20, int(seconds / step_s))
    items = list(range(n))
    warm = items[: max(20, n // 10)]

    def loop(xs: list[int]) -> Callable[[], Iterator[int]]:
        return (lambda: iter(xs)) if rec is None else (lambda: iter(Watched(xs, rec)))

    one_arm(loop(warm), step_s)
    if rec is not None:
        rec.flush()
    per_step = one_arm(loop(items), step_s)
    if rec is not None:
        rec.close()
    return per_step


class VirtualClock:
    """``time`` for the watched loop under the cost method: the real clock plus the length of
    the steps taken so far, which the step body adds instead of spending it."""

    def __init__(self) -> None:
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset


class CountingClock(VirtualClock):
    """A :class:`VirtualClock` that counts its reads (for the correction, never timed)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def perf_counter(self) -> float:
        self.reads += 1
        return time.perf_counter() + self.offset


def clock_surplus() -> float:
    """Seconds a :class:`VirtualClock` read costs beyond a ``time.perf_counter()`` call."""
    clock, real, n = VirtualClock(), time.perf_counter, 200_000
    virt, plain = [], []
    for _ in range(7):
        t0 = real()
        for _ in range(n):
            clock.perf_counter()
        t1 = real()
        for _ in range(n):
            real()
        virt.append(t1 - t0)
        plain.append(real() - t1)
    return max(0.0, (statistics.median(virt) - statistics.median(plain)) / n)


def cost_passes(step_s: float, reps: int, cuda: bool) -> dict[str, float]:
    """Per arm, the median real seconds per step of a pass (flush included); see the module
    docstring."""
    import gc

    clock = VirtualClock()
    real_time = watch_mod.time
    watch_mod.time = clock  # the watched loop's clock (only its own module's name)
    events: Callable[[], Any] = SpinEvent
    if cuda:
        import torch

        torch.zeros(1, device="cuda")
        events = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    tmp = tempfile.mkdtemp(prefix="stallscope-bench-")
    recs: dict[str, Recorder] = {}
    for arm in ARMS[1:]:
        run_dir = new_run_dir(tmp, arm)
        RunStore(run_dir / "run.db").close()
        recs[arm] = (
            Recorder(
                rank=0,
                run_dir=run_dir,
                capacity=1 << 22,
                flush_interval=3600,
                register_atexit=False,
            )
            if arm == "nodev"
            else Probe(
                rank=0,
                run_dir=run_dir,
                capacity=1 << 22,
                flush_interval=3600,
                events=events,
                register_atexit=False,
            )
        )
    n = max(20000, int(5.0 / step_s))
    items = range(n)
    perf = time.perf_counter
    every = dev_mod.timing_every
    out: dict[str, list[float]] = {k: [] for k in ARMS}
    reads: dict[str, float] = {"bare": 0.0}
    try:
        for r in range(reps + 2):  # a warm-up round, unmeasured; the last one counts reads
            counting = r == reps + 1
            for arm in ARMS if r % 2 else ARMS[::-1]:
                dev_mod.timing_every = (lambda _s: 1) if arm == "every" else every
                if counting and arm != "bare":
                    clock = watch_mod.time = CountingClock()
                gc.collect()
                t0 = perf()
                if arm == "bare":
                    for _ in items:
                        clock.offset += step_s
                else:
                    rec = recs[arm]
                    for _ in Watched(items, rec):
                        clock.offset += step_s
                    rec.flush()
                if counting and isinstance(clock, CountingClock):
                    reads[arm] = clock.reads / n
                elif r:
                    out[arm].append((perf() - t0) / n)
    finally:
        watch_mod.time = real_time
        dev_mod.timing_every = every
        for rec in recs.values():
            rec.close()
    surplus = clock_surplus()
    return {k: statistics.median(v) - reads[k] * surplus for k, v in out.items()}


def _check(args: argparse.Namespace) -> tuple[list[float], str | None]:
    """(the step lengths in microseconds, None), or ([], why the arguments are wrong in one
    line): every number finite and in range (``nan``, ``inf``, ``0`` ran into a division or a
    loop that never ends)."""
    if not 1 <= args.reps <= 1000:
        return [], f"--reps must be from 1 to 1000, got {args.reps}"
    if not (math.isfinite(args.seconds) and 0 < args.seconds <= 3600):
        return [], f"--seconds must be above 0 and at most 3600, got {args.seconds:g}"
    try:
        lengths = [float(x) for x in args.steps_us.split(",")]
    except ValueError:
        return [], (
            f"--steps-us {args.steps_us[:100]!r}: give step lengths in microseconds, e.g. 50,3300"
        )
    if not all(math.isfinite(x) and 0 < x <= 1e6 for x in lengths):
        return [], (
            f"--steps-us {args.steps_us[:100]!r}: every step length must be above 0 "
            "and at most 1000000 microseconds"
        )
    return lengths, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--steps-us",
        default="50,100,300,1000,3300",
        help="step lengths to try, in microseconds (comma-separated)",
    )
    ap.add_argument(
        "--method",
        choices=("cost", "wall"),
        default="cost",
        help="the probe's own time on a virtual clock (default), or whole loops "
        "by the wall clock, each arm in a process of its own",
    )
    ap.add_argument("--reps", type=int, default=5, help="rounds per step length")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one arm's pass")
    ap.add_argument("--cuda", action="store_true", help="real torch.cuda events (needs a GPU)")
    ap.add_argument(
        "--only",
        choices=ARMS,
        help="run this arm alone in this process and print its time per step "
        "(what each round runs; also to profile an arm under py-spy)",
    )
    args = ap.parse_args()
    lengths, problem = _check(args)
    if problem:  # one line, exit 2, as the CLI does; --only (what each round runs) too
        sys.stderr.write(f"bench_probe_cuda.py: error: {problem}\n")
        return 2
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            sys.stderr.write("bench_probe_cuda.py: error: --cuda: no CUDA device here\n")
            return 2
        kind = f"real CUDA events on {torch.cuda.get_device_name(0)}"
    else:
        kind = f"fake events, record() = {EVENT_RECORD_S * 1e6:.0f} us"
    if args.only:
        per = one_process(args.only, lengths[0] / 1e6, args.seconds, args.cuda)
        print(f"{args.only}: {per * 1e6:.3f} us per step")
        return 0
    if args.method == "cost":
        return cost_main(lengths, args.reps, args.cuda, kind)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load avg "
        f"{os.getloadavg()[0]:.1f}; {kind}; {args.reps} rounds x 4 arms of "
        f"{args.seconds:.2f} s per step length, each arm in a process of its own"
    )
    print(
        f"{'step':>8} {'bare':>9} {'no dev':>9} {'pairs':>9} {'every':>9} {'1 pair in':>9} "
        f"{'probe':>7} {'dev now':>8} {'dev before':>10}"
    )
    worst = 0.0
    for us in lengths:
        res: dict[str, list[float]] = {k: [] for k in ARMS}
        for r in range(args.reps):
            order = ARMS[r % 4 :] + ARMS[: r % 4]
            for arm in order:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--only",
                        arm,
                        "--steps-us",
                        f"{us:g}",
                        "--seconds",
                        str(args.seconds),
                        *(["--cuda"] if args.cuda else []),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=True,
                ).stdout
                res[arm].append(float(out.rsplit(":", 1)[1].split()[0]) / 1e6)
        med = {k: statistics.median(v) for k, v in res.items()}
        probe = (med["nodev"] - med["bare"]) / med["bare"] * 100
        now = (med["pairs"] - med["nodev"]) / med["bare"] * 100
        before = (med["every"] - med["nodev"]) / med["bare"] * 100
        worst = max(worst, probe + now)
        print(
            f"{us:>6.0f}us {med['bare'] * 1e6:>7.1f}us {med['nodev'] * 1e6:>7.1f}us "
            f"{med['pairs'] * 1e6:>7.1f}us {med['every'] * 1e6:>7.1f}us "
            f"{timing_every(us / 1e6):>9d} {probe:>6.2f}% {now:>7.2f}% {before:>9.2f}%",
            flush=True,
        )
    verdict = "OK" if worst < 1.0 else "OVER"
    print(
        f"the probe's worst cost, device timing included: {worst:.2f}% of a step "
        f"(goal < 1%) -> {verdict}"
    )
    return 0


def cost_main(lengths: list[float], reps: int, cuda: bool, kind: str) -> int:
    """The cost method's table (see the module docstring)."""
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load avg "
        f"{os.getloadavg()[0]:.1f}; {kind}; method cost: the probe's own time per step on "
        f"a virtual clock, {reps} passes per arm, the writer's flush included"
    )
    print(
        f"{'step':>8} {'no dev':>9} {'pairs':>9} {'every':>9} {'1 pair in':>9} {'probe':>7} "
        f"{'dev now':>8} {'total':>7} {'dev before':>10}"
    )
    worst = 0.0
    for us in lengths:
        med = cost_passes(us / 1e6, reps, cuda)
        cost = {k: med[k] - med["bare"] for k in ARMS[1:]}  # seconds a step the probe takes
        step_s = us / 1e6
        probe = cost["nodev"] / step_s * 100
        now = (cost["pairs"] - cost["nodev"]) / step_s * 100
        before = (cost["every"] - cost["nodev"]) / step_s * 100
        worst = max(worst, probe + now)
        print(
            f"{us:>6.0f}us {cost['nodev'] * 1e9:>6.0f} ns {cost['pairs'] * 1e9:>6.0f} ns "
            f"{cost['every'] * 1e9:>6.0f} ns {timing_every(step_s):>9d} {probe:>6.2f}% "
            f"{now:>7.2f}% {probe + now:>6.2f}% {before:>9.2f}%",
            flush=True,
        )
    verdict = "OK" if worst < 1.0 else "OVER"
    print(
        f"the probe's worst cost, device timing included: {worst:.2f}% of a step "
        f"(goal < 1%) -> {verdict}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
