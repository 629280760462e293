"""CPU cost of one full host sample vs the classic tools, measured in the same run.

    .venv/bin/python benchmarks/bench_sample.py [--rounds 300]

A full host sample = disk (/proc/diskstats -> iostat -x fields for every device) + host (CPU,
memory, swap, shm, PSI) + procs over a 9-process trainer tree (a parent with 8 children, like a
trainer with 8 DataLoader workers). Baselines: spawning `iostat -x -d 1 1` once (its own CPU
plus the fork/exec in the parent), and `psutil.disk_io_counters(perdisk=True)`.
Target (issue 2): a full host sample costs at most a third of one iostat spawn.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from stallscope.sources.disk import DiskSource
from stallscope.sources.host import HostSource
from stallscope.sources.procs import ProcsSource

TREE = textwrap.dedent("""
    import os, sys, time
    for _ in range(8):
        if os.fork() == 0:
            time.sleep(600); os._exit(0)
    print("ready", flush=True)
    time.sleep(600)
""")


def cpu_now() -> float:
    """CPU seconds of this process and its reaped children."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def measure(fn: Callable[[], object], rounds: int) -> float:
    """Median CPU seconds per call over batches of 10 calls (rusage has 1-4 ms granularity
    per read on some kernels, so time batches and divide)."""
    per: list[float] = []
    batch = 10
    for _ in range(max(rounds // batch, 3)):
        c0 = cpu_now()
        for _ in range(batch):
            fn()
        per.append((cpu_now() - c0) / batch)
    return statistics.median(per)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    iostat = shutil.which("iostat")
    tree = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert tree.stdout is not None
        tree.stdout.readline()
        disk, host, procs = DiskSource(), HostSource(), ProcsSource(tree.pid)
        for s in (disk, host, procs):
            s.open()
        t = [time.time()]

        def full_sample() -> None:
            t[0] += 1.0
            disk.sample(t[0])
            host.sample(t[0])
            out = procs.sample(t[0])
            assert out is not None and len(out) == 9, out

        full_sample()
        # thread_time per sample, the figure the collector records about itself
        tt = []
        for _ in range(args.rounds):
            c0 = time.thread_time()
            full_sample()
            tt.append(time.thread_time() - c0)
        sample_thread = statistics.median(tt)
        sample_cpu = measure(full_sample, args.rounds)
        psutil_cpu = measure(lambda: psutil.disk_io_counters(perdisk=True), args.rounds)
        rows = [
            ("full host sample (disk+host+9 procs), thread_time", sample_thread),
            ("full host sample (disk+host+9 procs), rusage", sample_cpu),
            ("psutil.disk_io_counters(perdisk=True)", psutil_cpu),
        ]
        spawn_cpu = None
        if iostat:
            argv = [iostat, "-x", "-d", "1", "1"]
            spawn_cpu = measure(
                lambda: subprocess.run(argv, stdout=subprocess.DEVNULL, check=True),
                max(args.rounds // 3, 30),
            )
            rows.append(("spawn `iostat -x -d 1 1` (child + parent CPU)", spawn_cpu))
    finally:
        tree.kill()
        tree.wait()
    print(f"{'what':58s} {'CPU per call':>14s} {'vs iostat':>10s}")
    for name, v in rows:
        ratio = f"{v / spawn_cpu:.2f}x" if spawn_cpu else "-"
        print(f"{name:58s} {v * 1e6:11.0f} µs {ratio:>10s}")
    if spawn_cpu is None:
        print("iostat not installed: no baseline (apt-get install sysstat)")
        return 1
    ok = sample_cpu <= spawn_cpu / 3
    print(
        f"target: full sample ≤ 1/3 of an iostat spawn -> "
        f"{sample_cpu / spawn_cpu:.2f} ({'OK' if ok else 'MISSED'}) on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
