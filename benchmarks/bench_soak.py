"""The node agent under a long soak: scraped 10 times a second for an hour, RSS and CPU recorded.

    .venv/bin/python benchmarks/bench_soak.py [--minutes 60] [--rate 10] [--out FILE]

Starts a real ``stallscope agent`` (sampling every second, its store in a temp folder) and
scrapes its ``/metrics`` ``--rate`` times a second for ``--minutes``. Every minute it records
the agent's RSS (``/proc/PID/statm``), its CPU seconds over that minute (``/proc/PID/stat``),
the scrapes done and the exposition's size, and prints one line; at the end a table, RSS first
minute vs last (the ratio), a least-squares slope of RSS per hour over the minutes after the
first five (start-up allocations settle there), and CPU per scrape. It passes when RSS is flat:
the slope under 1 MiB per hour and the last minute within 5% of minute 5. ``--out`` writes the
per-minute records as JSON lines; ``--malloc-arena-max N`` starts the agent with
``MALLOC_ARENA_MAX=N`` (glibc's malloc arenas; run it beside one without, to compare). The
agent gets a state folder of its own, so it follows no training started elsewhere on the machine
meanwhile (``--follow-trainings``: the user's, as a deployed agent would).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 1048576


def slope_per_hour(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var * 60


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=10.0, help="scrapes per second")
    ap.add_argument("--out", type=Path, help="per-minute records as JSON lines")
    ap.add_argument(
        "--follow-trainings",
        action="store_true",
        help="use the user's state folder: the agent follows the trainings started "
        "on this machine meanwhile (by default it has a state folder of its own)",
    )
    ap.add_argument(
        "--malloc-arena-max",
        type=int,
        metavar="N",
        help="start the agent with MALLOC_ARENA_MAX=N (glibc's malloc arenas)",
    )
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = dict(os.environ)
    if args.malloc_arena_max is not None:
        env["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.follow_trainings:
            # a state folder of its own: the agent follows no training started elsewhere on the
            # machine (a test suite's, another benchmark's), whose runs it would hold while
            # they last: what is measured is sampling and scraping alone
            env["STALLSCOPE_STATE_DIR"] = f"{tmp}/state"
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
            cwd=HERE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(url, timeout=2).read()
                    break
                except OSError:
                    if agent.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(
                            f"agent did not start: {agent.stderr.read()!r}"
                            if agent.stderr
                            else "agent did not start"
                        ) from None
                    time.sleep(0.2)
            records: list[dict[str, float]] = []
            period = 1.0 / args.rate
            start = time.monotonic()
            minute_end = start + 60
            cpu0, scrapes, size, errors = cpu_s(agent.pid), 0, 0, 0
            print(
                f"{'min':>4} {'RSS MiB':>8} {'CPU s':>7} {'scrapes':>8} {'ms CPU/scrape':>14}",
                flush=True,
            )
            nxt = start
            while time.monotonic() - start < args.minutes * 60:
                try:
                    size = len(urllib.request.urlopen(url, timeout=5).read())
                    scrapes += 1
                except OSError:
                    errors += 1
                nxt += period
                time.sleep(max(0.0, nxt - time.monotonic()))
                if time.monotonic() >= minute_end:
                    cpu1 = cpu_s(agent.pid)
                    rec = {
                        "minute": len(records) + 1,
                        "rss_mib": round(rss_mib(agent.pid), 2),
                        "cpu_s": round(cpu1 - cpu0, 3),
                        "scrapes": scrapes,
                        "bytes": size,
                        "errors": errors,
                    }
                    records.append(rec)
                    per = rec["cpu_s"] / scrapes * 1000 if scrapes else float("nan")
                    print(
                        f"{rec['minute']:>4} {rec['rss_mib']:>8.2f} {rec['cpu_s']:>7.2f} "
                        f"{scrapes:>8} {per:>14.2f}",
                        flush=True,
                    )
                    if args.out is not None:
                        with args.out.open("a") as f:
                            f.write(json.dumps(rec) + "\n")
                    cpu0, scrapes, errors = cpu1, 0, 0
                    minute_end += 60
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
    if not records:
        print("ran under a minute: nothing recorded")
        return 1
    settled = [r for r in records if r["minute"] >= 5] or records
    slope = slope_per_hour([r["minute"] for r in settled], [r["rss_mib"] for r in settled])
    first, last = settled[0]["rss_mib"], records[-1]["rss_mib"]
    total_scrapes = sum(r["scrapes"] for r in records)
    cpu_per = sum(r["cpu_s"] for r in records) / total_scrapes * 1000 if total_scrapes else 0
    flat = abs(slope) < 1.0 and abs(last / first - 1) <= 0.05
    print(
        f"{len(records)} min, {total_scrapes} scrapes ({total_scrapes / len(records) / 60:.1f}"
        f"/s), {sum(r['errors'] for r in records)} failed; RSS minute {settled[0]['minute']} "
        f"{first:.2f} MiB, last {last:.2f} MiB (x{last / first:.3f}); slope "
        f"{slope:+.2f} MiB/h; CPU {cpu_per:.2f} ms per scrape (sampling included): "
        f"{'flat' if flat else 'NOT flat'}"
    )
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
