"""How many Prometheus series one node's agent exports, and what a scrape of them costs.

    .venv/bin/python benchmarks/bench_series.py [--gpus 8] [--ranks 8] [--workers 8]

Builds the node the fleet issue names: ``--gpus`` GPUs (replayed from a real H100 capture,
tests/fixtures/README-nvml.md), one training of ``--ranks`` ranks each with ``--workers``
DataLoader workers (real processes: a launcher, its ranks, their workers, all sleeping), and a
run of that training followed through the run index, as the agent follows them; plus this
machine's real disks and host. Then it exports what ``stallscope agent`` exports and prints the
series per family group (GPU, process, steps, disk, host, the agent's own), the exposition's
size, and the time of one scrape (``generate_latest``), against the same node with no
training (the baseline in the same run), with every worker its own series and with each rank's
workers summed into one (the agent's ``worker_series = "rank"``).

The budget (docs/agent.md "Cardinality"): series grow with processes (14 families per process),
GPUs (39 per GPU) and ranks (6 step families per rank); at most 1,500 for 8 GPUs and 8 ranks x 8
workers, 700 with the workers summed per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

H100 = (
    HERE / "tests" / "fixtures" / "nvml-replay-h100-80gb-hbm3-load-from-nvidia-smi-590.48.01.json"
)

#: a launcher that starts RANKS ranks, each starting WORKERS workers; all sleep
TREE = """
import os, sys, time
ranks, workers = int(sys.argv[1]), int(sys.argv[2])
for r in range(ranks):
    if os.fork() == 0:
        os.environ["RANK"] = str(r)
        for w in range(workers):
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
        time.sleep(600)
        os._exit(0)
print("up", flush=True)
time.sleep(600)
"""


def group(name: str) -> str:
    for prefix in (
        "stallscope_gpu_",
        "stallscope_proc_",
        "stallscope_train_",
        "stallscope_disk_",
        "stallscope_host_",
        "stallscope_stacks_",
    ):
        if name.startswith(prefix):
            return prefix.removeprefix("stallscope_").rstrip("_")
    return "agent"


def measure(
    gpus: int, ranks: int, workers: int, tmp: Path, worker_series: str = "process"
) -> dict[str, object]:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stallscope.agent.exporter import PrometheusSink
    from stallscope.agent.steps import StepFollower
    from stallscope.agent.trainprocs import TrainerProcs
    from stallscope.collect import Collector
    from stallscope.sources import open_sources
    from stallscope.sources.gpu import GpuSource
    from stallscope.store import RunStore, StepRow, base_meta, new_run_dir, write_meta
    from stallscope.store.index import record_run
    from stallscope.testing.nvml_replay import NvmlReplay

    os.environ["STALLSCOPE_STATE_DIR"] = str(tmp / "state")
    tree = None
    if ranks:
        tree = subprocess.Popen(
            [sys.executable, "-c", TREE, str(ranks), str(workers)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert tree.stdout is not None and tree.stdout.readline().strip() == "up"
        time.sleep(0.5)
        run = new_run_dir(tmp / "runs", "train")
        write_meta(
            run,
            base_meta(
                ["torchrun", "train.py"], start=time.time() - 5, interval_s=1.0, pid=tree.pid
            ),
        )
        store = RunStore(run / "run.db")
        store.add_steps(
            [
                StepRow(r, s, time.time(), 0.01, 0.05, samples=32)
                for r in range(ranks)
                for s in range(10)
            ]
        )
        # each rank's probe says which process it is (the launcher's children, in order)
        for r, pid in enumerate(sorted(_children(tree.pid))):
            store.set_probe(r, pid, {}, 0, 0)
        store.close()
        record_run(run)
    gpu = GpuSource(backend=NvmlReplay.load(*[H100] * gpus)) if gpus else None
    sources, unavailable = open_sources(("disk", "host"))
    if gpu is not None:
        gpu.open()
        sources.append(gpu)
    follower = StepFollower(rescan_s=0)
    procs = TrainerProcs(follower, worker_series=worker_series)
    procs.open()
    sources.append(procs)
    sink = PrometheusSink(
        ["gpu", "disk", "host", "procs"], unavailable, steps=follower, hostname="gpu-node-1"
    )
    c = Collector(sources, [sink], interval=1.0)
    c.sample_once()
    time.sleep(1.0)
    c.sample_once()
    text = generate_latest(sink.registry)
    t0 = time.perf_counter()
    n = 50
    for _ in range(n):
        generate_latest(sink.registry)
    scrape_ms = (time.perf_counter() - t0) / n * 1000
    c.stop(final_sample=False)
    follower.close()
    if tree is not None:
        for child in _descendants(tree.pid):
            _kill(child)
        tree.kill()
        tree.wait()
    per_group: Counter[str] = Counter()
    total = 0
    for fam in text_string_to_metric_families(text.decode()):
        k = len(fam.samples)
        per_group[group(fam.name)] += k
        total += k
    return {
        "series": total,
        "groups": dict(sorted(per_group.items())),
        "bytes": len(text),
        "scrape_ms": round(scrape_ms, 2),
        "processes": 1 + ranks * (1 + workers) if ranks else 0,
    }


def _children(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children()]


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except OSError:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        base = measure(args.gpus, 0, 0, Path(d) / "base")
        node = measure(args.gpus, args.ranks, args.workers, Path(d) / "node")
        agg = measure(args.gpus, args.ranks, args.workers, Path(d) / "agg", "rank")
    if args.json:
        print(json.dumps({"baseline": base, "training": node, "workers_per_rank": agg}, indent=2))
        return 0
    print(
        f"node: {args.gpus} GPUs; training: {args.ranks} ranks x {args.workers} workers "
        f"({node['processes']} processes)"
    )
    cols = (base, node, agg)
    print(f"{'':22} {'no training':>12} {'training':>12} {'workers/rank':>13}")
    groups: set[str] = set()
    for c in cols:
        groups |= set(c["groups"])  # type: ignore[arg-type]
    for g in sorted(groups):
        print(f"  {g:20}" + "".join(f" {c['groups'].get(g, 0):>12}" for c in cols))  # type: ignore[attr-defined]
    for key, title in (
        ("series", "series"),
        ("bytes", "exposition bytes"),
        ("scrape_ms", "scrape (ms)"),
    ):
        print(f"  {title:20}" + "".join(f" {c[key]:>12}" for c in cols))
    print(
        f"ratio training/no training: series {node['series'] / base['series']:.2f}, "  # type: ignore[operator]
        f"scrape {node['scrape_ms'] / base['scrape_ms']:.2f}; "  # type: ignore[operator]
        f"workers summed per rank: series {agg['series'] / base['series']:.2f}, "  # type: ignore[operator]
        f"scrape {agg['scrape_ms'] / base['scrape_ms']:.2f}"
    )  # type: ignore[operator]
    return 0


if __name__ == "__main__":
    sys.exit(main())
