"""How steady is this machine's CPU speed? A benchmark's ratios mean nothing finer than that.

    .venv/bin/python benchmarks/cpu_speed.py [--seconds 10]

One process pinned to each usable core runs the same pure-Python loop in 0.5-s slices, all at
once, and counts iterations per second of its own CPU time (``thread_time``). CPU accounting
cannot see a virtual CPU slowed by its host: the process is on the CPU the whole time, it only
gets less done. On this project's 2-core VM (2026-11-27), one unpinned loop read 797-1,435 per
slice within 15 s; pinned, one core moved from 877 to 1,397 while the other held near 1,300,
and this script's spread per core ranged 4-53% over a dozen looks: two trials of the same
configuration, seconds apart, can then differ by more than the effects a tuner weighs.

``bench_tune.py`` prints this before and after its runs, so a reader sees how noisy the
machine was while it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

#: the child: pin to one core, wait for the common start, count loop iterations per CPU-second
_CHILD = r"""
import json, os, sys, time
cpu, start, seconds, slice_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), \
    float(sys.argv[4])
os.sched_setaffinity(0, {cpu})
while time.time() < start:
    time.sleep(0.001)
end, rates = start + seconds, []
while time.time() < end:
    a, c, n = time.perf_counter(), time.thread_time(), 0
    while time.perf_counter() - a < slice_s:
        for _ in range(10000):
            n += 1
    used = time.thread_time() - c
    if used > 0:
        rates.append(n / used / 1e4)
print(json.dumps(rates))
"""


@dataclass(frozen=True)
class CoreSpeed:
    cpu: int
    rates: list[float]  #: loop iterations per CPU-second, ×10⁴, one per slice

    @property
    def spread(self) -> float:
        """(max − min) / median of the slices: 0 on a steady core."""
        if not self.rates:
            return 0.0
        med = statistics.median(self.rates)
        return (max(self.rates) - min(self.rates)) / med if med > 0 else 0.0


def measure(seconds: float = 10.0, slice_s: float = 0.5) -> list[CoreSpeed]:
    """Every usable core at once for ``seconds`` (the machine is busy meanwhile)."""
    cores = sorted(os.sched_getaffinity(0))
    start = time.time() + 0.5  # every child pinned and waiting before the first slice
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(c), repr(start), repr(seconds), repr(slice_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in cores
    ]
    out = []
    for c, p in zip(cores, procs, strict=True):
        stdout, err = p.communicate(timeout=seconds + 30)
        if p.returncode != 0:
            raise RuntimeError(
                f"the speed probe on cpu {c} exited {p.returncode}: {_last_line(err)}"
            )
        out.append(CoreSpeed(c, [float(x) for x in json.loads(stdout)]))
    return out


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no message"


def line(seconds: float = 6.0) -> str:
    """``summary`` of a measurement, or one line saying why there is none (a benchmark goes on
    without it)."""
    try:
        return summary(measure(seconds))
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return f"CPU speed: not measured ({exc})"


def summary(speeds: list[CoreSpeed]) -> str:
    """One line: each core's slices min–median–max and their spread."""
    parts = [
        f"cpu{s.cpu} {min(s.rates):,.0f}–{statistics.median(s.rates):,.0f}–"
        f"{max(s.rates):,.0f} (spread {s.spread:.0%})"
        for s in speeds
        if s.rates
    ]
    return "CPU speed (a fixed loop, min–median–max per 0.5-s slice): " + "; ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="how long (default 10)")
    args = ap.parse_args()
    if not (0 < args.seconds < 3600):
        print("--seconds takes a number of seconds above 0 and under 3600", file=sys.stderr)
        return 2
    out = line(args.seconds)
    print(out)
    return 1 if out.startswith("CPU speed: not measured") else 0


if __name__ == "__main__":
    raise SystemExit(main())
