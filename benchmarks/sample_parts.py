"""Where one sample of ``stallscope run --no-stacks`` spends its CPU, part by part.

    .venv/bin/python benchmarks/sample_parts.py [--samples 160] [--gap 0.25]

Builds the run's collector as ``stallscope run`` does (``Session`` with its sources, the run
store and the default alert rules) over a 9-process stand-in trainer (a parent with 8 sleeping
children), then takes ``--samples`` samples ``--gap`` seconds apart (0.25: the benchmark's fast
interval, caches as cold as there; 0: back to back, warm) and prints each part's thread CPU per
sample (each source's read, each sink's write, the store's ``add_points`` inside the store
sink) and its share of the whole sample, then the thread's user and system time. The figure
``benchmarks/bench_run_cost.py`` measures from outside is the whole; this says what it is made
of (issue 53).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TREE = (
    "import os, time\n"
    "for _ in range(8):\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(600); os._exit(0)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def timed(obj: Any, method: str, key: str, acc: dict[str, list[float]]) -> None:
    """Wrap ``obj.method`` so that each call's thread CPU is added to ``acc[key]``."""
    f: Callable[..., Any] = getattr(obj, method)

    def wrapper(*a: Any, **k: Any) -> Any:
        c = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            acc.setdefault(key, []).append(time.thread_time() - c)

    setattr(obj, method, wrapper)


def measure(samples: int, gap: float, root_pid: int) -> None:
    from stallscope.alerts.actions import AlertSink
    from stallscope.alerts.rulefile import parse_rules
    from stallscope.collect.session import Session

    acc: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        alerts = AlertSink(parse_rules({}, "defaults"))
        session = Session.create(d, "parts", ["parts"], interval=3600, sinks=[alerts])
        alerts.attach_run(session.run_dir)
        session.watch(root_pid)
        col = session.collector
        assert col is not None and col._thread is not None
        col.halt()  # its thread stops: the samples are taken here, at our pace
        for _ in range(20):
            col.sample_once()
        for src in col.sources:
            timed(src, "read", f"source {src.name}", acc)
        for sink in col.sinks:
            timed(sink, "write", f"sink {sink.name}", acc)
        timed(session.store, "add_points", "  of which RunStore.add_points", acc)
        timed(col, "sample_once", "whole sample", acc)
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        for _ in range(samples):
            col.sample_once()
            if gap:
                time.sleep(gap)
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        parts = {k: list(v) for k, v in acc.items()}  # not the final sample finish() takes
        session.finish(0)
    whole = statistics.mean(parts["whole sample"])
    for key, v in sorted(parts.items(), key=lambda kv: -sum(kv[1])):
        per = sum(v) / samples
        print(f"{key:32s} {per * 1e3:7.3f} ms per sample  ({per / whole:5.1%})")
    user = (r1.ru_utime - r0.ru_utime) / samples * 1e3
    system = (r1.ru_stime - r0.ru_stime) / samples * 1e3
    print(f"the thread: {user:.3f} ms user, {system:.3f} ms system per sample (sleeps included)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=160)
    ap.add_argument("--gap", type=float, default=0.25, help="seconds between samples (0: warm)")
    args = ap.parse_args()
    tree = subprocess.Popen(
        [sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert tree.stdout is not None
        tree.stdout.readline()
        print(f"load average {os.getloadavg()[0]:.2f}; {args.samples} samples {args.gap} s apart")
        measure(args.samples, args.gap, tree.pid)
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
