"""Run-store size for a long run: synthetic samples and probe steps through the real RunStore,
the collector's choice of stored metrics and its downsampling path.

    # 24 h at the default intervals (1 s for 2 min, then 5 s), 8 GPUs, 4 disks, a 9-process
    # tree, the probe at 100 steps/s (goal: 50 MB):
    .venv/bin/python benchmarks/bench_store_size.py
    .venv/bin/python benchmarks/bench_store_size.py --hours 2  # quicker
    # the older figure: 1 s throughout, 16 processes, no probe, every metric random
    .venv/bin/python benchmarks/bench_store_size.py --interval 1 --procs 16 --steps-per-s 0 \
        --all-random --budget-mb 100

Prints the database size, what each table takes (SQLite's dbstat), and the write's CPU per
collector sample and per 1,000 probe steps (``time.process_time`` around the store's calls).

Values: what a node keeps constant (a GPU's memory total, power limit, maximum clock and PCIe
link, error counters at zero; the host's memory total) is constant here; every other value
moves with random noise (``--all-random``: every value random, the worst case for the store).
Steps: 10-ms steps with the probe's default grouping (:data:`~stallscope.probe.buffer.GROUP_S`,
16 ms: two steps a row) and device timing (a timed pair every
:func:`~stallscope.probe.device.timing_every` steps, each of them a row of its own with its GPU
times), written as the probe's writer thread writes them (plain rows as one block, timed rows
as values) once per collector interval.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stallscope.collect.session import DEFAULT_INTERVAL_S, DEFAULT_WARMUP
from stallscope.collect.sinks import _stored
from stallscope.metrics import by_source
from stallscope.probe.buffer import GROUP_S
from stallscope.probe.device import timing_every
from stallscope.store import Point, RunStore
from stallscope.store.buckets import unpack
from stallscope.store.db import StepTuple, StepValues
from stallscope.store.samples import unpack as unpack_sample

#: metrics a node keeps constant over a run (by key)
CONSTANT = {
    "mem_total_mib": 143771.0,
    "power_limit_w": 700.0,
    "sm_clock_max_mhz": 1980.0,
    "pcie_gen_max": 5.0,
    "pcie_width_max": 16.0,
    "pcie_gen": 5.0,
    "pcie_width": 16.0,
    "ecc_errors": 0.0,
    "throttle_mask": 0.0,
    "throttle_serious": 0.0,
    "remapped_rows_correctable": 0.0,
    "remapped_rows_uncorrectable": 0.0,
    "row_remap_pending": 0.0,
    "row_remap_failed": 0.0,
    "retired_pages": 0.0,
    "retired_pages_pending": 0.0,
    "xid_last": 0.0,
    "health_problem": 0.0,
    "shm_total_mib": 65536.0,
    "processes": 1.0,
    "tf_threads": 0.0,
}


def _value(key: str, all_random: bool, base: float) -> float:
    if not all_random and key in CONSTANT:
        return CONSTANT[key]
    return base + random.random()


def sample_points(
    t: float, gpus: int, disks: int, procs: int, cores: int, all_random: bool
) -> list[Point]:
    pts: list[Point] = []
    for g in range(gpus):
        for m in by_source("gpu"):
            if m.key.startswith("mig_"):
                continue  # a GPU not split by MIG has none
            base = 50 + 40 * math.sin(t / 300 + g)
            pts.append(Point(m.name, f"gpu{g}", _value(m.key, all_random, base)))
    for d in range(disks):
        for m in by_source("disk"):
            pts.append(Point(m.name, f"nvme{d}n1", random.random() * 100))
    for m in by_source("host"):
        if m.key != "cpu_core_pct":
            pts.append(Point(m.name, "", _value(m.key, all_random, 0.0) * 100))
    for c in range(cores):
        pts.append(Point("host.cpu_core_pct", f"cpu{c}", random.random() * 100))
    for p in range(procs):
        for m in by_source("procs"):
            pts.append(Point(m.name, str(1000 + p), _value(m.key, all_random, 0.0) * 100))
    pts.append(Point("collector.cpu_s", "", 0.0004 + random.random() * 1e-4))
    pts.append(Point("collector.wall_s", "", 0.0006 + random.random() * 1e-4))
    if all_random:
        return pts
    return [p for p in pts if _stored(p.name)]  # what StoreSink keeps: no counters


class Steps:
    """The probe's rows for 10-ms steps (``1 / steps_per_s``), made one interval at a time."""

    def __init__(self, t0: float, steps_per_s: float) -> None:
        self.step_s = 1.0 / steps_per_s
        self.group = max(1, math.ceil(GROUP_S / self.step_s - 1e-9))
        self.every = timing_every(self.step_s)  # a timed pair of steps once per this many
        self.perf = 1000.0  # the probe's clock (perf_counter)
        self.wall0 = t0 - self.perf
        self.step = -1

    def _one(self) -> tuple[float, float, float, float]:
        """(batch handed over, data wait, host time, copy) of the next step; advances."""
        wait = random.lognormvariate(math.log(0.0005), 0.5)
        host = random.gauss(self.step_s - 0.0006, self.step_s * 0.03)
        got = self.perf + wait
        self.perf = got + host + random.random() * 2e-6
        self.step += 1
        return got, wait, host, 0.0002 + random.random() * 5e-5

    def until(self, t: float) -> tuple[list[StepTuple], list[StepValues]]:
        """The rows of the steps ending before wall time ``t``: plain (a block) and timed."""
        plain: list[StepTuple] = []
        timed: list[StepValues] = []
        while self.wall0 + self.perf < t:
            if (self.step + 1) % self.every < 2:  # a timed step: a row of its own
                got, wait, host, h2d = self._one()
                busy = random.gauss(self.step_s * 0.85, self.step_s * 0.02)
                idle = random.random() * 0.001
                epoch = self.step // 20000
                timed.append(
                    (
                        0,
                        self.step,
                        self.wall0 + got,
                        wait,
                        host,
                        h2d,
                        busy,
                        idle,
                        64,
                        epoch,
                        None,
                        1,
                    )
                )
                continue
            got, wait, host, h2d = self._one()
            first_got, waits, hosts, h2ds, n = got - wait, wait, host, h2d, 1
            while n < self.group and (self.step + 1) % self.every >= 2:
                _g, wait, host, h2d = self._one()
                waits, hosts, h2ds, n = waits + wait, hosts + host, h2ds + h2d, n + 1
            epoch = self.step // 20000
            rec = (self.step, first_got + waits, waits, hosts, 64 * n, epoch, h2ds, None, n)
            plain.append(rec)
        return plain, timed


def table_sizes(path: Path) -> dict[str, int]:
    """Bytes per table with its indexes (SQLite's dbstat; {} where it is not compiled in)."""
    try:
        with sqlite3.connect(path) as db:
            rows = db.execute(
                "SELECT coalesce(tbl_name, name), SUM(pgsize) FROM dbstat "
                "LEFT JOIN sqlite_master USING(name) GROUP BY 1 ORDER BY 2 DESC"
            ).fetchall()
    except sqlite3.Error:
        return {}
    return {str(n): int(b) for n, b in rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument(
        "--interval", type=float, default=None, help="seconds (default: stallscope run's)"
    )
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--disks", type=int, default=4)
    ap.add_argument("--procs", type=int, default=9)
    ap.add_argument("--cores", type=int, default=16)
    ap.add_argument("--steps-per-s", type=float, default=100.0)
    ap.add_argument("--all-random", action="store_true")
    ap.add_argument("--keep-full", type=float, default=3600.0)
    ap.add_argument("--budget-mb", type=float, default=50.0)
    args = ap.parse_args()

    random.seed(0)
    end = args.hours * 3600
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.db"
        st = RunStore(path)
        t0 = 1.7e9
        steps = Steps(t0, args.steps_per_s) if args.steps_per_s > 0 else None
        start = time.perf_counter()
        cpu_points = cpu_steps = cpu_pack = 0.0
        samples = step_rows = 0
        elapsed, next_report = 0.0, 3600.0
        per_sample = 0
        while elapsed < end:
            t = t0 + elapsed + random.random() * 0.01  # time.time() when sampled
            pts = sample_points(t, args.gpus, args.disks, args.procs, args.cores, args.all_random)
            c = time.process_time()
            per_sample = st.add_points(t, pts)
            samples += 1
            if samples % 60 == 0:  # what the collector does every 60 samples
                st.downsample(t - args.keep_full, 60.0)
                if steps is not None:
                    c1 = time.process_time()
                    st.pack_steps(t)
                    cpu_pack += time.process_time() - c1
                    c += time.process_time() - c1
            cpu_points += time.process_time() - c
            if steps is not None:
                plain, timed = steps.until(t)
                c = time.process_time()
                if plain:
                    st.add_step_block(0, steps.wall0, plain)
                if timed:
                    st.add_step_values(timed)
                cpu_steps += time.process_time() - c
                step_rows += len(plain) + len(timed)
            if args.interval is not None:
                elapsed += args.interval
            else:
                warm_iv, warm_s = DEFAULT_WARMUP
                elapsed += warm_iv if elapsed < warm_s else DEFAULT_INTERVAL_S
            if elapsed >= next_report:
                next_report += 3600.0
                print(
                    f"  {elapsed / 3600:.0f} h, {time.perf_counter() - start:.0f} s, "
                    f"{os.path.getsize(path) / 1e6:.1f} MB",
                    file=sys.stderr,
                    flush=True,
                )
        st.checkpoint()
        (free,) = st.db.execute("PRAGMA freelist_count").fetchone()
        free *= st.db.execute("PRAGMA page_size").fetchone()[0]
        full = st.db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
        for (d,) in st.db.execute("SELECT data FROM samples"):
            got = unpack_sample(d)
            full += len(got[1]) if got is not None else 0
        rolled = st.db.execute("SELECT COUNT(*) FROM rollup").fetchone()[0]
        packed = sum(len(unpack(d)) for (d,) in st.db.execute("SELECT data FROM rollup_packs"))
        st.close()
        size = os.path.getsize(path)
        wal = Path(str(path) + "-wal")
        size += wal.stat().st_size if wal.exists() else 0
        tables = table_sizes(path)
    mb = size / 1e6
    iv = f"{args.interval:g} s" if args.interval is not None else "the default intervals"
    print(
        f"run: {args.hours:g} h at {iv}, {args.gpus} GPUs, {args.disks} disks, "
        f"{args.procs} procs, {args.cores} cores = {per_sample} points/sample; "
        f"probe {args.steps_per_s:g} steps/s"
        + (f" ({step_rows:,} step rows)" if steps is not None else "")
    )
    print(f"written in {time.perf_counter() - start:.0f} s")
    print(
        f"store size: {mb:.1f} MB ({full:,} full-resolution points, {rolled + packed:,} 1-minute "
        f"buckets, {packed:,} of them packed)"
    )
    print(
        "by table: "
        + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in tables.items())
        + f"; free pages {free / 1e6:.1f} MB"
    )
    print(
        f"write CPU: {cpu_points / samples * 1e3:.3f} ms per sample ({samples:,} samples, "
        "downsampling included)"
        + (
            f"; the probe's writer {cpu_steps / max(1, steps.step + 1) * 1e6:.2f} us per step "
            f"({cpu_steps / max(1, step_rows) * 1e6:.2f} us per row), packing "
            f"{cpu_pack / max(1, step_rows) * 1e6:.2f} us per row "
            f"({cpu_pack / samples * 1e3:.3f} ms per sample)"
            if steps is not None
            else ""
        )
    )
    print(
        f"budget {args.budget_mb:g} MB: {mb / args.budget_mb:.2f} of budget "
        f"({'OK' if mb <= args.budget_mb else 'OVER'})"
    )
    return 0 if mb <= args.budget_mb else 1


if __name__ == "__main__":
    sys.exit(main())
