"""Run-store size for a long run: synthetic samples through the real RunStore and collector
downsampling path.

    # 24 h at 1 Hz, 8 GPUs, 4 disks, 16 procs:
    .venv/bin/python benchmarks/bench_store_size.py
    .venv/bin/python benchmarks/bench_store_size.py --hours 2  # quicker

Prints the database size, the points stored at full resolution and rolled up, and the ratio to the
100 MB budget. The baseline in the same run is the size the same samples would take without
downsampling (extrapolated from the bytes per full-resolution point measured here).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stallscope.metrics import by_source
from stallscope.store import Point, RunStore


def sample_points(t: float, gpus: int, disks: int, procs: int, cores: int) -> list[Point]:
    pts: list[Point] = []
    for g in range(gpus):
        for m in by_source("gpu"):
            pts.append(Point(m.name, f"gpu{g}", 50 + 40 * math.sin(t / 300 + g) + random.random()))
    for d in range(disks):
        for m in by_source("disk"):
            pts.append(Point(m.name, f"nvme{d}n1", random.random() * 100))
    for m in by_source("host"):
        if m.key != "cpu_core_pct":
            pts.append(Point(m.name, "", random.random() * 100))
    for c in range(cores):
        pts.append(Point("host.cpu_core_pct", f"cpu{c}", random.random() * 100))
    for p in range(procs):
        for m in by_source("procs"):
            pts.append(Point(m.name, str(1000 + p), random.random() * 100))
    pts.append(Point("collector.cpu_s", "", 0.0004))
    pts.append(Point("collector.wall_s", "", 0.0006))
    return pts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--disks", type=int, default=4)
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--cores", type=int, default=16)
    ap.add_argument("--keep-full", type=float, default=3600.0)
    ap.add_argument("--budget-mb", type=float, default=100.0)
    args = ap.parse_args()

    random.seed(0)
    n = int(args.hours * 3600 / args.interval)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.db"
        st = RunStore(path)
        t0 = 1.7e9
        start = time.perf_counter()
        per_sample = 0
        window = int(args.keep_full / args.interval)
        bytes_per_point = 0.0
        for i in range(n):
            t = t0 + i * args.interval
            pts = sample_points(t, args.gpus, args.disks, args.procs, args.cores)
            per_sample = st.add_points(t, pts)
            if i + 1 == min(window, n):  # before any folding: the cost of full resolution
                st.checkpoint()
                bytes_per_point = os.path.getsize(path) / ((i + 1) * per_sample)
            if (i + 1) % 60 == 0:  # what the collector does every 60 samples
                st.downsample(t - args.keep_full, 60.0)
            if (i + 1) % 3600 == 0:
                el = time.perf_counter() - start
                print(
                    f"  {i + 1}/{n} samples, {el:.0f} s, {os.path.getsize(path) / 1e6:.1f} MB",
                    file=sys.stderr,
                    flush=True,
                )
        st.checkpoint()
        full = st.db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
        rolled = st.db.execute("SELECT COUNT(*) FROM rollup").fetchone()[0]
        st.close()
        size = os.path.getsize(path)
        wal = Path(str(path) + "-wal")
        size += wal.stat().st_size if wal.exists() else 0
    hours_full = min(args.hours, args.keep_full / 3600)
    undownsampled = bytes_per_point * per_sample * n
    mb = size / 1e6
    print(
        f"run: {args.hours:g} h at {args.interval:g} s, {args.gpus} GPUs, {args.disks} disks, "
        f"{args.procs} procs, {args.cores} cores = {per_sample} points/sample"
    )
    print(f"written in {time.perf_counter() - start:.0f} s")
    print(
        f"store size: {mb:.1f} MB ({full:,} full-resolution points for the last "
        f"{hours_full:g} h, {rolled:,} 1-minute rollups)"
    )
    print(
        f"without downsampling (estimated): {undownsampled / 1e6:.0f} MB "
        f"-> downsampling ratio {undownsampled / max(size, 1):.1f}x"
    )
    print(
        f"budget {args.budget_mb:g} MB: {mb / args.budget_mb:.2f} of budget "
        f"({'OK' if mb <= args.budget_mb else 'OVER'})"
    )
    return 0 if mb <= args.budget_mb else 1


if __name__ == "__main__":
    sys.exit(main())
