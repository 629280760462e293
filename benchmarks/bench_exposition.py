"""What the agent's ``/metrics`` costs an 8-GPU training node, per encoding (issue 38).

    .venv/bin/python benchmarks/bench_exposition.py [--gpus 8] [--scrapes 200]

Builds the agent's own exposition (``PrometheusSink`` behind a ``Collector``) over this host's
real host, disk and procs sources and ``--gpus`` GPUs replayed from the lent H200's direct
NVML recording in training (tests/fixtures/gpu-h200/session2/, one process per GPU), takes two
samples, then encodes it ``--scrapes`` times per way a scraper may ask: text 0.0.4 plain (what
the agent always sent before), text gzipped at levels 1, 6 and 9, OpenMetrics plain and
gzipped. Prints bytes per scrape and the agent's CPU per scrape (``time.process_time``; median
of 5 rounds), with each as a ratio of the plain text, measured in the same run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.exposition import choose_encoder  # noqa: E402

from stallscope.agent.exporter import PrometheusSink  # noqa: E402
from stallscope.collect.collector import Collector  # noqa: E402
from stallscope.sources.disk import DiskSource  # noqa: E402
from stallscope.sources.gpu import GpuSource  # noqa: E402
from stallscope.sources.host import HostSource  # noqa: E402
from stallscope.testing.nvml_replay import FORMAT, NvmlReplay  # noqa: E402

RECORDING = (
    ROOT / "tests" / "fixtures" / "gpu-h200" / "session2" / "nvml-h200-load-nvml-580.159.04.json"
)
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def node(gpus: int) -> dict:
    """The H200 recording as an ``gpus``-GPU machine (each GPU its own index, UUID, bus)."""
    doc = json.loads(RECORDING.read_text())
    devices = []
    for i in range(gpus):
        d = json.loads(json.dumps(doc["devices"][0]))
        d["nvmlDeviceGetUUID"] = f"GPU-b3f8fe2e-49ba-a0ff-65ef-62edd2b4a{i:03d}"
        d["nvmlDeviceGetPciInfo"] = {**d["nvmlDeviceGetPciInfo"], "busId": f"00000000:{i:02X}:00.0"}
        devices.append(d)
    return {
        "format": FORMAT,
        "provenance": doc["provenance"],
        "system": {**doc["system"], "nvmlDeviceGetCount": gpus},
        "devices": devices,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()
    sink = PrometheusSink(["gpu", "host", "disk"], hostname="node-1")
    gpu = GpuSource(NvmlReplay(node(args.gpus)), background=False)
    sources = [gpu, HostSource(), DiskSource()]
    for s in sources:
        s.open()
    col = Collector(sources, [sink], interval=1.0)
    col.sample_once()
    time.sleep(0.2)
    col.sample_once()
    reg = sink.registry
    text_enc, _ = choose_encoder("")
    om_enc, _ = choose_encoder(OPENMETRICS)
    ways: dict[str, Callable[[], bytes]] = {
        "text 0.0.4, plain (before)": lambda: text_enc(reg),
        "text, gzip level 1": lambda: gzip.compress(text_enc(reg), compresslevel=1),
        "text, gzip level 6": lambda: gzip.compress(text_enc(reg), compresslevel=6),
        "text, gzip level 9": lambda: gzip.compress(text_enc(reg), compresslevel=9),
        "OpenMetrics, plain": lambda: om_enc(reg),
        "OpenMetrics, gzip level 6": lambda: gzip.compress(om_enc(reg), compresslevel=6),
    }
    res: dict[str, tuple[int, float]] = {}
    for name, fn in ways.items():
        size = len(fn())
        rounds = []
        for _ in range(5):
            t = time.process_time()
            for _ in range(args.scrapes):
                fn()
            rounds.append((time.process_time() - t) / args.scrapes)
        res[name] = (size, statistics.median(rounds))
    for s in sources:
        s.close()
    base_b, base_t = res["text 0.0.4, plain (before)"]
    print(
        f"{args.gpus} replayed H200 GPUs + this host's host and disk sources; "
        f"{args.scrapes} encodings x 5 rounds each"
    )
    print(f"{'encoding':<28} {'bytes':>9} {'x plain':>8} {'CPU ms':>8} {'x plain':>8}")
    for name, (b, t) in res.items():
        print(f"{name:<28} {b:>9,} {b / base_b:>8.3f} {t * 1e3:>8.3f} {t / base_t:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
