"""The node agent's cost next to prometheus-node-exporter's, on the same host, in the same run.

    .venv/bin/python benchmarks/bench_agent.py [--scrapes 200] [--hour-samples 3600]

Starts a real ``stallscope agent`` (sampling every second) and a real
``prometheus-node-exporter`` (Debian package), each on a loopback port, and measures:

* **CPU per scrape**: each process's CPU time (``/proc/PID/stat`` utime + stime) over
  ``--scrapes`` back-to-back ``GET /metrics``, minus what it used over the same wall time
  without scrapes (the agent samples in the background; node_exporter does nothing then);
* **CPU at 1 Hz sampling**: the agent's CPU share of one core while idle (no scrapes);
* **RSS** of both after the scrapes;
* **RSS after an hour of samples**: a separate process runs the agent's collector with its two
  sinks (Prometheus exposition and the bounded run store) over ``--hour-samples`` real samples
  taken back to back, scraping the exposition every 15 samples, and reports its RSS after the
  first 60 samples and at the end (flat = no growth per sample or per scrape).

Prints one table and the ratios agent / node_exporter. The goal: per-scrape CPU and RSS no
higher than node_exporter's, while covering GPUs, training steps and a local store as well.
Without node_exporter installed it says so and prints the agent's figures alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

HOUR = textwrap.dedent("""
    import json, sys, tempfile, time
    from pathlib import Path
    from prometheus_client import generate_latest
    from stallscope.agent.exporter import PrometheusSink
    from stallscope.agent.steps import StepFollower
    from stallscope.collect import Collector
    from stallscope.collect.sinks import StoreSink
    from stallscope.sources import SOURCE_NAMES, open_sources
    from stallscope.store import RunStore

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE

    PAGE = __import__("os").sysconf("SC_PAGE_SIZE")
    n = int(sys.argv[1])
    tmp = Path(tempfile.mkdtemp())
    sources, unavailable = open_sources(SOURCE_NAMES)
    prom = PrometheusSink(SOURCE_NAMES, unavailable, steps=StepFollower())
    store = RunStore(tmp / "run.db")
    # a simulated clock one second per sample: the store's downsampling sees an hour go by
    t = [time.time()]
    c = Collector(sources, [prom, StoreSink(store, keep_full_s=600)], interval=1.0,
                  unavailable=unavailable, clock=lambda: t[0])
    first = None
    for i in range(n):
        t[0] += 1.0
        c.sample_once()
        if i % 15 == 0:
            generate_latest(prom.registry)
        if i == 59:
            first = rss()
    out = {"rss_60": first, "rss_end": rss(), "samples": n,
           "db_bytes": (tmp / "run.db").stat().st_size}
    c.stop(final_sample=False)
    print(json.dumps(out))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return bytes(r.read())


def wait_up(url: str, proc: subprocess.Popen[bytes], needle: bytes) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args[0]} exited {proc.returncode}")
        try:
            if needle in get(url):
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"{url} never answered")


def measure(pid: int, url: str, scrapes: int) -> dict[str, float]:
    """CPU per scrape (scrape burst minus the idle rate over the same time), idle CPU share."""
    get(url)  # warm
    t0, c0 = time.perf_counter(), cpu_s(pid)
    size = 0
    for _ in range(scrapes):
        size = len(get(url))
    burst_s, burst_cpu = time.perf_counter() - t0, cpu_s(pid) - c0
    idle_wall = max(burst_s, 5.0)
    c1 = cpu_s(pid)
    time.sleep(idle_wall)
    idle_rate = (cpu_s(pid) - c1) / idle_wall
    per = max(0.0, burst_cpu - idle_rate * burst_s) / scrapes
    return {
        "cpu_per_scrape_ms": per * 1000,
        "idle_cpu_share": idle_rate,
        "rss_mib": rss_bytes(pid) / 1048576,
        "exposition_kib": size / 1024,
        "scrape_wall_ms": burst_s / scrapes * 1000,
    }


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--hour-samples", type=int, default=3600)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(HERE))
    with tempfile.TemporaryDirectory() as tmp:
        env["STALLSCOPE_STATE_DIR"] = tmp
        port = free_port()
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stallscope",
                "agent",
                "--listen",
                f"127.0.0.1:{port}",
                "--interval",
                "1",
                "--store",
                f"{tmp}/store",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        exporter_bin = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
        exporter = None
        rows: dict[str, dict[str, float]] = {}
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            wait_up(url, agent, b"stallscope_host_cpu_busy_ratio ")
            time.sleep(3)  # past start-up
            if exporter_bin:
                nport = free_port()
                exporter = subprocess.Popen(
                    [exporter_bin, f"--web.listen-address=127.0.0.1:{nport}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                nurl = f"http://127.0.0.1:{nport}/metrics"
                wait_up(nurl, exporter, b"node_cpu_seconds_total")
            # alternate the two, twice, so the machine's load affects both alike
            for _round in range(2):
                for name, pid, u in (
                    ("stallscope agent", agent.pid, url),
                    *((("node_exporter", exporter.pid, nurl),) if exporter else ()),
                ):
                    m = measure(pid, u, args.scrapes // 2)
                    prev = rows.get(name)
                    rows[name] = (
                        m
                        if prev is None
                        else {k: (prev[k] + v) / 2 if k != "rss_mib" else v for k, v in m.items()}
                    )
        finally:
            stop(agent)
            if exporter is not None:
                stop(exporter)
        hour = subprocess.run(
            [sys.executable, "-c", HOUR, str(args.hour_samples)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
    print(
        f"{'':18} {'CPU/scrape':>11} {'scrape wall':>12} {'exposition':>11} "
        f"{'idle CPU':>9} {'RSS':>9}"
    )
    for name, m in rows.items():
        print(
            f"{name:18} {m['cpu_per_scrape_ms']:9.2f}ms {m['scrape_wall_ms']:10.2f}ms "
            f"{m['exposition_kib']:8.1f}KiB {m['idle_cpu_share'] * 100:8.2f}% "
            f"{m['rss_mib']:6.1f}MiB"
        )
    if "node_exporter" in rows:
        a, n = rows["stallscope agent"], rows["node_exporter"]
        ratio_cpu = a["cpu_per_scrape_ms"] / max(n["cpu_per_scrape_ms"], 1e-9)
        print(
            f"ratio agent/node_exporter: CPU per scrape x{ratio_cpu:.2f}, "
            f"RSS x{a['rss_mib'] / n['rss_mib']:.2f}"
        )
    else:
        print(
            "prometheus-node-exporter is not installed (Debian package "
            "prometheus-node-exporter): no baseline in this run"
        )
    if hour.returncode == 0:
        h = json.loads(hour.stdout)
        print(
            f"collector + sinks over {h['samples']} samples (1 s apart, simulated): RSS "
            f"{h['rss_60'] / 1048576:.1f} MiB after 60, {h['rss_end'] / 1048576:.1f} MiB at "
            f"the end (x{h['rss_end'] / h['rss_60']:.2f}); run.db {h['db_bytes'] / 1048576:.1f}"
            " MiB"
        )
    else:
        print(f"hour of samples failed: {hour.stderr.strip()[-500:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
