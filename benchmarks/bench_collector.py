"""CPU cost of the whole collector per sample: sources, sinks and the run store together.

    .venv/bin/python benchmarks/bench_collector.py [--rounds 300] [--against DIR]

One sample = disk + host + procs over a 9-process tree (a parent with 8 children, like a
trainer with 8 DataLoader workers), turned into points and written to a real ``run.db`` in a
temporary directory, exactly what ``stallscope run`` does every interval (``sample_once``).

``--against DIR`` measures another checkout of stallscope (for instance the last release, made
with ``git worktree add /tmp/base <commit>``) in the same run, alternating the two so that the
machine's load affects both alike, and prints the ratio. Each measurement runs in its own
process with ``PYTHONPATH`` pointing at its checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent

TREE = textwrap.dedent("""
    import os, sys, time
    for _ in range(8):
        if os.fork() == 0:
            time.sleep(600); os._exit(0)
    print("ready", flush=True)
    time.sleep(600)
""")


def _collector(tmp: Path, root_pid: int) -> Any:
    """A collector over disk+host+procs writing into a fresh run store, through whichever
    collector API this checkout has."""
    from stallscope.sources import open_sources

    sources, _ = open_sources(("disk", "host"))
    procs, _ = open_sources(("procs",), root_pid=root_pid)
    try:  # the sink-based collector (this checkout)
        from stallscope.collect import Collector, StoreSink
        from stallscope.store import RunStore

        store = RunStore(tmp / "run.db")
        return Collector(sources + procs, sinks=[StoreSink(store)], interval=3600)
    except ImportError:  # an older checkout: Collector(store, sources)
        from stallscope.collector import Collector as OldCollector  # type: ignore[no-redef]

        from stallscope.store import RunStore

        store = RunStore(tmp / "run.db")
        return OldCollector(store, sources + procs, interval=3600)


def worker(rounds: int) -> dict[str, float]:
    # its own session, so the whole tree (the 8 forked children too) is killed at the end, and
    # no inherited stderr keeps the parent's pipe open
    tree = subprocess.Popen(
        [sys.executable, "-c", TREE],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert tree.stdout is not None
        tree.stdout.readline()
        with tempfile.TemporaryDirectory() as d:
            col = _collector(Path(d), tree.pid)
            col.sample_once()  # prime counters
            col.sample_once()
            per = []
            for _ in range(rounds):
                c0 = time.thread_time()
                col.sample_once()
                per.append(time.thread_time() - c0)
            return {"median_s": statistics.median(per), "p90_s": sorted(per)[int(0.9 * len(per))]}
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()


def _measure(checkout: Path, rounds: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", "--rounds", str(rounds)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=checkout,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="alternating measurements per checkout")
    ap.add_argument("--against", metavar="DIR", help="another stallscope checkout to compare")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.rounds)))
        return 0
    checkouts = [("this checkout", HERE)]
    if args.against:
        other = Path(args.against).resolve()
        if not (other / "stallscope" / "__init__.py").exists():
            print(f"bench_collector: {other} is not a stallscope checkout", file=sys.stderr)
            return 2
        checkouts.append((f"against {other}", other))
    results: dict[str, list[float]] = {name: [] for name, _ in checkouts}
    for _ in range(args.repeat):
        for name, path in checkouts:
            results[name].append(_measure(path, args.rounds)["median_s"])
    print(f"{'collector sample (disk+host+9 procs -> run.db)':50s} {'CPU per sample':>15s}")
    meds = {name: statistics.median(v) for name, v in results.items()}
    for name, v in meds.items():
        runs = ", ".join(f"{x * 1e6:.0f}" for x in results[name])
        print(f"{name:50s} {v * 1e6:12.0f} µs   (runs: {runs} µs)")
    if args.against:
        ratio = meds["this checkout"] / meds[checkouts[1][0]]
        print(f"ratio this / against: {ratio:.3f} (target ≤ 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
