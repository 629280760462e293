"""What one more sample costs ``stallscope run``, measured from outside, beside node_exporter.

    .venv/bin/python benchmarks/bench_run_cost.py [--seconds 30] [--pairs 3]

Issue 53's goal (0.2x before it, issue 38's): the whole ``stallscope run`` process's CPU per
extra sample at most 0.1x of one ``prometheus-node-exporter`` scrape of the same host, measured in
the same run, and the run's own "monitoring cost" line within 20% of it.

* The trainer is a stand-in: a 9-process tree (a parent with 8 sleeping children, like a
  trainer with 8 DataLoader workers) that lives ``--seconds``; ``--trainer-threads N`` gives
  the parent N sleeping threads (a PyTorch trainer's pools: its threads' states are read).
* Each pair runs ``stallscope run --no-stacks --quiet`` over it twice, at ``--interval 0.25`` and
  at ``--interval 60``. Between 5 s after the start and 3 s before the end it reads the run
  process's own CPU (each of its threads' ``schedstat``, to the nanosecond; none of its children).
  The extra CPU per extra sample is the difference of the two CPU rates over the difference of
  the sample rates (4/s against 1/60 s): start-up, exit and whatever does not grow with samples
  cancel out.
* node_exporter (Debian ``prometheus-node-exporter``) is measured the same way between the
  pairs: scraped every ``--interval`` of the fast run (0.25 s) for ``--ne-seconds``, then left
  idle as long; its CPU per scrape is the difference of the two CPU rates over the scrape rate.
  Both monitors then work with caches as cold as a sample 0.25 s after the last one finds
  them. Scraped back to back instead (bursts, as benchmarks/bench_agent.py does, caches warm)
  a scrape costs less: that figure is printed beside it (on 2026-11-29: 9.3-9.8 ms in bursts,
  11.3-13.3 ms paced), and the ratio against it too.
* The run's own line: the mean of ``collector.cpu_s`` in the fast run's ``run.db``, what the
  end-of-run "monitoring cost: ... ms CPU per sample" line prints (``stallscope show``): the
  collector thread's CPU per sample, its wake-up and loop included. Printed beside the
  outside figure with their ratio, per pair and for the medians. ``--no-stacks``: with stack
  sampling the in-process sampler runs in the trainer, not in this process, and is measured
  apart (benchmarks/bench_stacks.py); the stacks source that reads its records is a source
  like the others, inside the line.

Prints one line per pair (with the 1-minute load average at its end: on shared cores the
figures move with it) and the medians, with the ratios against the goals.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_agent import cpu_s, get, measure, stop, wait_up  # noqa: E402

TREE = (
    "import os, sys, time\n"
    "kids = []\n"
    "for _ in range(8):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        time.sleep(float(sys.argv[1]) + 1)\n"
    "        os._exit(0)\n"
    "    kids.append(pid)\n"
    "import threading\n"
    "for _ in range(int(sys.argv[2])):\n"
    "    threading.Thread(target=time.sleep, args=(float(sys.argv[1]),), daemon=True).start()\n"
    "time.sleep(float(sys.argv[1]))\n"
    "for k in kids: os.kill(k, 9)\n"
)
FAST, SLOW = 0.25, 60.0
GOAL = 0.1  #: at most this share of one node_exporter scrape per sample (issue 53)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def threads_cpu_s(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` now, to the nanosecond (each thread's
    ``/proc/PID/task/TID/schedstat``). ``/proc/PID/stat`` counts clock ticks: over a 22-s
    window a tick was 0.11 ms of the per-sample figure, the three pairs of a run read 1.71
    ms each. The run process's threads live as long as it (the collector's, the alerts'
    worker); one that ended inside the window would be missed."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def one_run(
    interval: float, seconds: float, out: Path, threads: int = 0
) -> tuple[float, float | None]:
    """(CPU seconds per second of the run process in its steady part, its own per-sample
    cost line in seconds, or None)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stallscope",
            "run",
            "--no-stacks",
            "--quiet",
            "--interval",
            str(interval),
            "--out",
            str(out),
            "--",
            sys.executable,
            "-c",
            TREE,
            str(seconds),
            str(threads),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    time.sleep(5.0)
    t0, c0 = time.perf_counter(), threads_cpu_s(proc.pid)
    time.sleep(max(1.0, seconds - 8.0))
    rate = (threads_cpu_s(proc.pid) - c0) / (time.perf_counter() - t0)
    proc.wait(timeout=seconds + 120)
    own = None
    dbs = sorted(out.glob("*/run.db"))
    if dbs:
        from stallscope.store import RunStore

        st = RunStore(dbs[-1], readonly=True)  # samples and, from an older store, points
        try:
            vals = [v for s in st.read("collector.cpu_s") for v in s.v]
        finally:
            st.close()
        own = statistics.fmean(vals) if vals else None
    return rate, own


def paced(pid: int, url: str, every: float, seconds: float) -> float:
    """node_exporter's CPU seconds per scrape, scraped every ``every`` seconds for ``seconds``
    (caches as cold as between two of our samples), its idle rate over as long taken out."""
    get(url)
    t0, c0 = time.perf_counter(), cpu_s(pid)
    n = 0
    due = t0
    while time.perf_counter() - t0 < seconds:
        get(url)
        n += 1
        due += every
        time.sleep(max(0.0, due - time.perf_counter()))
    busy = (cpu_s(pid) - c0) / (time.perf_counter() - t0)
    t1, c1 = time.perf_counter(), cpu_s(pid)
    time.sleep(seconds)
    idle = (cpu_s(pid) - c1) / (time.perf_counter() - t1)
    return max(0.0, busy - idle) * every


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="each run's length")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--scrapes", type=int, default=100, help="node_exporter scrapes per burst")
    ap.add_argument(
        "--ne-seconds",
        type=float,
        default=20.0,
        help="seconds of node_exporter scraped at the fast interval, then as long idle",
    )
    ap.add_argument(
        "--trainer-threads",
        type=int,
        default=0,
        help="threads in the stand-in trainer besides its main one (a PyTorch "
        "trainer has its intra-op pool, pin-memory and loader threads: 20-40)",
    )
    args = ap.parse_args()
    exporter_bin = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    exporter = None
    per_sample: list[float] = []
    own_line: list[float] = []
    scrape: list[float] = []  #: node_exporter paced, as our samples
    burst: list[float] = []  #: node_exporter scraped back to back
    try:
        if exporter_bin:
            port = free_port()
            exporter = subprocess.Popen(
                [exporter_bin, f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            url = f"http://127.0.0.1:{port}/metrics"
            wait_up(url, exporter, b"node_cpu_seconds_total")
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.pairs):
                order = (FAST, SLOW) if i % 2 == 0 else (SLOW, FAST)
                rates: dict[float, float] = {}
                pair_own: float | None = None
                for interval in order:
                    rate, own = one_run(
                        interval, args.seconds, Path(tmp) / f"{i}-{interval}", args.trainer_threads
                    )
                    rates[interval] = rate
                    if interval == FAST and own is not None:
                        own_line.append(own)
                        pair_own = own
                extra = (rates[FAST] - rates[SLOW]) / (1 / FAST - 1 / SLOW)
                per_sample.append(extra)
                line = f"pair {i + 1}: {extra * 1e3:.2f} ms CPU per extra sample"
                if pair_own is not None:
                    line += f" (its own line {pair_own * 1e3:.2f} ms, x{pair_own / extra:.2f})"
                if exporter is not None:
                    m = measure(exporter.pid, url, args.scrapes)
                    burst.append(m["cpu_per_scrape_ms"] / 1e3)
                    scrape.append(paced(exporter.pid, url, FAST, args.ne_seconds))
                    line += (
                        f"; node_exporter {scrape[-1] * 1e3:.2f} ms per scrape every {FAST} s"
                        f" ({burst[-1] * 1e3:.2f} in a burst)"
                    )
                line += f"; load average {os.getloadavg()[0]:.2f}"  # the cores are shared
                print(line, flush=True)
    finally:
        if exporter is not None:
            stop(exporter)
    ms = statistics.median(per_sample) * 1e3
    print(
        f"stallscope run (--no-stacks, a 9-process tree, {args.trainer_threads} threads "
        f"beside the trainer's main one): {ms:.2f} ms CPU per extra sample (median of "
        f"{len(per_sample)} pairs)"
    )
    if own_line:
        own = statistics.median(own_line) * 1e3
        print(
            f"its own 'monitoring cost' line: {own:.2f} ms per sample (median of "
            f"{len(own_line)} fast runs); own / outside: x{own / ms:.2f} "
            f"({own / ms - 1:+.0%}; goal within 20%)"
        )
    if scrape:
        ne = statistics.median(scrape) * 1e3
        nb = statistics.median(burst) * 1e3
        print(
            f"node_exporter: {ne:.2f} ms CPU per scrape every {FAST} s; ratio x{ms / ne:.2f} "
            f"(goal <= {GOAL}); scraped in bursts {nb:.2f} ms, ratio x{ms / nb:.2f}"
        )
    else:
        print(
            "prometheus-node-exporter is not installed: no ratio (apt-get install "
            "prometheus-node-exporter)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
