"""Stragglers across a simulated fleet: real agents, a real Prometheus with the shipped rules,
DDP step records replayed from a real run, slowdowns injected at known times on known ranks.

    .venv/bin/python benchmarks/bench_fleet.py [--nodes 8,16,32,64] [--ranks-per-node 8]
        [--nodes-per-job 2] [--warmup 240] [--faults-for 360] [--healthy-for 0] [--seed 1]

For each N in ``--nodes``: N ``stallscope agent`` processes on loopback ports (each its own
state folder, so each follows only its own "node"), one ``prometheus`` scraping them every 5 s
with ``deploy/prometheus/*.yml`` as shipped, and this process writing the step records of N /
``--nodes-per-job`` DDP jobs into the nodes' run stores as the probe would (one run per node and
job, its probes naming the job: the agents export ``train_job``). The steps replay a real 2-rank
gloo run (``tests/fixtures/ddp-steps``, ``benchmarks/fleetsim.py``) in real time.

After ``--warmup`` healthy seconds, each job gets slowdowns one after another for
``--faults-for`` seconds: one rank or a whole node 5, 10, 20, 30 or 50% slower, by compute or
by data wait, for 60-90 s, 60-120 s apart. ``--healthy-for`` seconds with no fault come first
(a healthy stretch; 3600 for the healthy hour). The alert ``StallscopeRankWaitedFor`` is read
from Prometheus' ``/api/v1/alerts`` every second:

* a **detection** is an activation on a rank of a fault, between its start and 60 s after its
  end; its latency is the activation time (``activeAt``) minus the fault's start (0 when the
  rank is still flagged from an earlier slowdown as this one starts);
* any other activation is a **false alarm**; precision = detections' activations / all;
* **recall** = faults detected / faults, per size.

Then one more slowdown, 30%: by compute on one rank of the first job, by data wait on one rank
of the second; a minute later, ``stallscope diagnose --prometheus --since 60s --json``: its
time, and whether each job's finding names that node, rank and cause. Also Prometheus' head
series, its RSS and the straggler rule group's evaluation time, the agents' CPU and RSS.

Prints one table per N and a summary. ``--json FILE`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "benchmarks"))

from fleetsim import DETREND_STEPS, Fault, Job, load_recording, schedule  # noqa: E402

from stallscope.store import RunStore, StepRow  # noqa: E402
from stallscope.store.rundir import base_meta, new_run_dir, write_meta  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
ALERT = "StallscopeRankWaitedFor"
#: the straggler rules' rate window, read from the shipped rules (stallscope-alerts.yml)
RULES = HERE / "deploy" / "prometheus" / "stallscope-alerts.yml"
RULE_WINDOW_S = float(re.findall(r"ratio_rate(\d+)s", RULES.read_text())[0])
#: the rule groups' default interval, as deploy/prometheus.yml sets it (the straggler groups set
#: their own): the recording rules' 1-minute shares, which the slower detector reads, are
#: evaluated this often
EVAL_INTERVAL = re.search(
    r"^\s+evaluation_interval:\s*(\S+)", (HERE / "deploy" / "prometheus.yml").read_text(), re.M
).group(1)
#: an activation this long after a fault's end still belongs to it (the windows trail)
TRAIL_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def proc_rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def prom_metric(base: str, name: str) -> dict[str, float]:
    """A metric of Prometheus' own /metrics: labels text -> value."""
    out = {}
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name) and not line.startswith("#"):
                key, _, v = line.rpartition(" ")
                try:
                    out[key[len(name) :]] = float(v)
                except ValueError:
                    pass
    return out


def parse_ts(text: str) -> float:
    # Prometheus gives RFC 3339 with nanoseconds: 2026-11-25T20:49:59.123456789Z
    head, _, frac = text.rstrip("Z").partition(".")
    t = (
        datetime.strptime(head, "%Y-%m-%dT%H:%M:%S")
        .replace(tzinfo=__import__("datetime").timezone.utc)
        .timestamp()
    )
    return t + (float("0." + frac[:9]) if frac else 0.0)


class Writer(threading.Thread):
    """Writes each job's steps into its nodes' run stores as time goes by (every 0.5 s)."""

    def __init__(self, jobs: list[Job], stores: dict[tuple[str, str], RunStore]) -> None:
        super().__init__(daemon=True)
        self.jobs, self.stores = jobs, stores
        self.stop = threading.Event()
        self.rows = 0
        self.lag_s = 0.0

    def run(self) -> None:
        while not self.stop.wait(0.5):
            now = time.time()
            for job in self.jobs:
                for node, rows in job.steps_until(now).items():
                    if rows:
                        self.stores[(job.name, node)].add_steps(
                            StepRow(r, k, ts, w, h, samples=64, comm_s=c)
                            for r, k, ts, w, h, c in rows
                        )
                        self.rows += len(rows)
            self.lag_s = max(self.lag_s, time.time() - now)


def start_fleet(
    root: Path, n: int, rpn: int, npj: int, rec, seed: int, t0: float, trainer: int
) -> tuple[list[Job], dict[tuple[str, str], RunStore], list[str]]:
    """The nodes' runs: ``trainer`` is the pid their meta.json names (a process of its own,
    alive for the run, without children: not this one, whose children are the agents)."""
    nodes = [f"node-{i:02d}" for i in range(n)]
    jobs, stores = [], {}
    for j in range(n // npj):
        names = nodes[j * npj : (j + 1) * npj]
        job = Job(f"torchrun:job{j:02d}", names, rpn, rec, t0, seed=seed * 1000 + j)
        jobs.append(job)
        for ni, node in enumerate(names):
            state = root / node
            run = new_run_dir(root / "runs" / node, f"job{j:02d}")
            write_meta(
                run, base_meta(["python", "train.py"], start=t0, interval_s=1.0, pid=trainer)
            )
            store = RunStore(run / "run.db")
            for lr in range(rpn):
                store.set_probe(ni * rpn + lr, trainer, {"job": job.name}, 0, 0)
            stores[(job.name, node)] = store
            state.mkdir(parents=True, exist_ok=True)
            with open(state / "runs.txt", "a") as f:
                f.write(str(run.resolve()) + "\n")
    return jobs, stores, nodes


def run_one(args: argparse.Namespace, n: int, rec) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"bench-fleet-{n}-"))
    rng = random.Random(args.seed * 100 + n)
    # the "trainer" each run names: the agents follow its process tree (a lone sleep; were it
    # this process, every agent would sample every other agent as the training's processes)
    trainer = subprocess.Popen(["sleep", "infinity"])
    procs: list[subprocess.Popen] = [trainer]
    t0 = time.time()
    jobs, stores, nodes = start_fleet(
        root, n, args.ranks_per_node, args.nodes_per_job, rec, args.seed, t0, trainer.pid
    )
    try:
        ports = {}
        exe = [sys.executable, "-m", "stallscope"]
        for node in nodes:
            ports[node] = free_port()
            env = {**os.environ, "STALLSCOPE_STATE_DIR": str(root / node)}
            procs.append(
                subprocess.Popen(
                    [*exe, "agent", "--listen", f"127.0.0.1:{ports[node]}", "--hostname", node],
                    env=env,
                    stdout=open(root / f"{node}.log", "w"),
                    stderr=subprocess.STDOUT,
                )
            )
        agents = procs[1:]  # not the sleeping "trainer"
        rules = root / "rules"
        rules.mkdir()
        for f in (HERE / "deploy" / "prometheus").glob("*.yml"):
            shutil.copy(f, rules / f.name)
        targets = "\n".join(
            f'      - targets: ["127.0.0.1:{ports[node]}"]\n        labels: {{instance: {node}}}'
            for node in nodes
        )
        (root / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: 5s\n  evaluation_interval: {EVAL_INTERVAL}\n"
            "rule_files:\n  - rules/*.yml\nscrape_configs:\n  - job_name: stallscope\n"
            "    scrape_timeout: 4s\n    static_configs:\n" + targets + "\n"
        )
        pport = free_port()
        prom = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{pport}",
            ],
            stdout=open(root / "prometheus.log", "w"),
            stderr=subprocess.STDOUT,
        )
        procs.append(prom)
        base = f"http://127.0.0.1:{pport}"
        writer = Writer(jobs, stores)
        writer.start()
        # the faults: after the warm-up and the healthy stretch, per job, one after another
        f_start = t0 + args.warmup + args.healthy_for
        f_end = f_start + args.faults_for
        faults: list[Fault] = []
        for job in jobs:
            faults += schedule(job, rng, f_start, f_end)
        print(
            f"N={n}: {len(nodes)} agents, {len(jobs)} jobs of {args.nodes_per_job} nodes × "
            f"{args.ranks_per_node} ranks, {len(faults)} faults from "
            f"+{f_start - t0:.0f} s to +{f_end - t0:.0f} s; files in {root}",
            flush=True,
        )
        seen: dict[tuple[str, str, str, str], float] = {}  # activation -> activeAt
        cpu0 = {p.pid: proc_cpu_s(p.pid) for p in procs}
        me0 = time.process_time()
        end = f_end + TRAIL_S
        last_note = 0.0
        while time.time() < end:
            time.sleep(1.0)
            _poll_alerts(base, seen)
            if time.time() - last_note > 60:
                last_note = time.time()
                print(
                    f"  +{time.time() - t0:.0f} s: {len(seen)} activations, "
                    f"{writer.rows} step rows written",
                    flush=True,
                )
        wall = time.time() - t0
        cpu = {p.pid: proc_cpu_s(p.pid) - cpu0[p.pid] for p in procs}
        me = time.process_time() - me0
        res = score(faults, seen, t0 + args.warmup, f_start)
        res.update(
            n=n,
            ranks=n * args.ranks_per_node,
            jobs=len(jobs),
            wall_s=round(wall),
            writer_rows=writer.rows,
            writer_max_lag_s=round(writer.lag_s, 2),
        )
        # cost
        res["prom_head_series"] = int(
            sum(prom_metric(base, "prometheus_tsdb_head_series").values())
        )
        evals = prom_metric(base, "prometheus_rule_group_last_duration_seconds")
        res["straggler_rules_eval_ms"] = round(
            1000 * sum(v for k, v in evals.items() if "stallscope-stragglers" in k), 2
        )
        res["straggler_baselines_eval_ms"] = round(
            1000 * sum(v for k, v in evals.items() if "stallscope-straggler-baselines" in k), 2
        )
        res["all_rules_eval_ms"] = round(1000 * sum(evals.values()), 2)
        res["prom_rss_mib"] = round(proc_rss_mib(prom.pid), 1)
        res["prom_cpu_pct"] = round(100 * cpu[prom.pid] / (end - t0 - 0), 1)
        res["agents_cpu_pct"] = round(100 * sum(cpu[a.pid] for a in agents) / (end - t0), 1)
        res["agent_rss_mib_mean"] = round(statistics.mean(proc_rss_mib(a.pid) for a in agents), 1)
        res["writer_cpu_pct"] = round(100 * me / (end - t0), 1)
        # diagnose --prometheus over the fleet, during one more known slowdown
        res["diagnose"] = diagnose_check(args, base, jobs, rng)
        return res
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if "writer" in locals():
            writer.stop.set()
            writer.join(timeout=5)
        for s in stores.values():
            s.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


#: activation -> when it was last seen firing (a fault that starts while its rank is still
#: flagged from an earlier one is detected at once)
last_seen: dict[tuple[str, str, str, str], float] = {}


def _poll_alerts(base: str, seen: dict[tuple[str, str, str, str], float]) -> None:
    try:
        doc = get_json(f"{base}/api/v1/alerts")
    except (OSError, ValueError):
        return
    for a in doc.get("data", {}).get("alerts", []):
        lab = a.get("labels", {})
        if lab.get("alertname") != ALERT or a.get("state") != "firing":
            continue
        key = (
            lab.get("train_job", ""),
            lab.get("instance", ""),
            lab.get("rank", ""),
            a.get("activeAt", ""),
        )
        if key not in seen:
            seen[key] = parse_ts(a["activeAt"])
        last_seen[key] = time.time()


def score(
    faults: list[Fault],
    seen: dict[tuple[str, str, str, str], float],
    watch_from: float,
    faults_from: float,
) -> dict:
    """Match activations to faults (see the module docstring)."""
    first: dict[int, float] = {}
    matched, false = 0, []
    for (job, inst, rank, _), at in seen.items():
        hit = None
        for i, f in enumerate(faults):
            if f.job == job and int(rank) in f.ranks and f.start <= at <= f.end + TRAIL_S:
                hit = i
                break
        if hit is None:
            false.append(
                {
                    "job": job,
                    "instance": inst,
                    "rank": rank,
                    "at_s": round(at - watch_from, 1),
                    "healthy_stretch": at < faults_from,
                }
            )
        else:
            matched += 1
            first[hit] = min(first.get(hit, at), at)
    # a fault that starts while its rank is still flagged (an earlier slowdown's alert has not
    # cleared yet) is seen at once: latency 0
    for (job, _inst, rank, act), at in seen.items():
        until = last_seen.get((job, _inst, rank, act), at)
        for i, f in enumerate(faults):
            if i not in first and f.job == job and int(rank) in f.ranks and at < f.start <= until:
                first[i] = f.start
    by_size: dict[str, dict] = {}
    for x in sorted({f.x for f in faults}):
        fs = [i for i, f in enumerate(faults) if f.x == x]
        lat = sorted(first[i] - faults[i].start for i in fs if i in first)
        by_size[f"{x:.0%}"] = {
            "faults": len(fs),
            "detected": len(lat),
            "recall": round(len(lat) / len(fs), 3) if fs else None,
            "latency_median_s": round(statistics.median(lat), 1) if lat else None,
            "latency_p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 1)
            if lat
            else None,
            "within_30s": sum(1 for v in lat if v <= 30.0),
        }
    total = matched + len(false)
    big = [i for i, f in enumerate(faults) if f.x >= 0.1]
    big_lat = sorted(first[i] - faults[i].start for i in big if i in first)
    return {
        "faults": len(faults),
        "detected": len(first),
        "recall": round(len(first) / len(faults), 3) if faults else None,
        "recall_10pct_up": round(len(big_lat) / len(big), 3) if big else None,
        "latency_10pct_up_median_s": round(statistics.median(big_lat), 1) if big_lat else None,
        "latency_10pct_up_p95_s": round(big_lat[min(len(big_lat) - 1, int(0.95 * len(big_lat)))], 1)
        if big_lat
        else None,
        "activations": total,
        "precision": round(matched / total, 3) if total else None,
        "false_alarms": len(false),
        "false_alarms_healthy_stretch": sum(1 for f in false if f["healthy_stretch"]),
        "false_alarm_detail": false[:20],
        "by_size": by_size,
        "faults_detail": [
            dict(asdict(f), detected_after_s=round(first[i] - f.start, 1) if i in first else None)
            for i, f in enumerate(faults)
        ],
    }


def diagnose_check(
    args: argparse.Namespace, base: str, jobs: list[Job], rng: random.Random
) -> dict:
    """One more slowdown, 30%: by compute on a rank of the first job and, with two jobs or
    more, by data wait on a rank of the second; a minute later, diagnose --prometheus."""
    now = time.time()
    slowed = []
    for job, cause in zip(jobs, ("compute", "input")):
        rank = rng.randrange(job.size)
        job.faults.append(
            Fault(job.name, (rank,), (job.node_of(rank),), now, now + 3600, 0.3, cause, "rank")
        )
        slowed.append((job, rank, cause))
    time.sleep(70)
    t = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope",
            "diagnose",
            "--prometheus",
            base,
            "--since",
            "60s",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out: dict = {"seconds": round(time.perf_counter() - t, 2), "rc": r.returncode, "checks": []}
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        out["error"] = (r.stderr or r.stdout)[-400:]
        return out
    for job, rank, cause in slowed:
        found = None
        for j in doc.get("jobs", []):
            if j.get("train_job") == job.name:
                found = next(
                    (f for f in j.get("findings", []) if f.get("kind") == "straggler_rank"), None
                )
        ev = (found or {}).get("evidence", {})
        out["checks"].append(
            {
                "job": job.name,
                "slow_rank": rank,
                "slow_node": job.node_of(rank),
                "cause": cause,
                "named": (
                    ev.get("rank") == rank
                    and ev.get("host") == job.node_of(rank)
                    and ev.get("cause") == cause
                ),
                "found_rank": ev.get("rank"),
                "found_host": ev.get("host"),
                "found_cause": ev.get("cause"),
                "summary": (found or {}).get("summary", "")[:300],
            }
        )
    out["named"] = all(c["named"] for c in out["checks"])
    return out


def explain(path: Path, args: argparse.Namespace, rec) -> int:
    """For each false alarm of a saved run (``--json``), how much slower than its job's median
    rank the flagged rank really was in the 30 s before (the rules' 15 s windows): the replayed
    recording has stretches where one rank runs a few percent slower than the others, which
    recur each time a rank's replay loops (908 steps). The simulation is deterministic: the same
    seeds and schedule rebuild every step."""
    rows = json.loads(path.read_text())
    for res in rows:
        n = res["n"]
        rng = random.Random(args.seed * 100 + n)
        nodes = [f"node-{i:02d}" for i in range(n)]
        jobs = {}
        for j in range(n // args.nodes_per_job):
            names = nodes[j * args.nodes_per_job : (j + 1) * args.nodes_per_job]
            job = Job(
                f"torchrun:job{j:02d}",
                names,
                args.ranks_per_node,
                rec,
                0.0,
                seed=args.seed * 1000 + j,
            )
            f_start = args.warmup + args.healthy_for
            schedule(job, rng, f_start, f_start + args.faults_for)
            jobs[job.name] = job
        natural = []
        for fa in res["false_alarm_detail"]:
            job = jobs[fa["job"]]
            at = args.warmup + fa["at_s"]
            own: dict[int, list[tuple[float, float]]] = {}
            probe = Job(
                job.name,
                job.nodes,
                job.ranks_per_node,
                rec,
                0.0,
                seed=job.seed,
                faults=list(job.faults),
            )
            for rows_ in probe.steps_until(at + 1).values():
                for r, _k, ts, w, h, c in rows_:
                    if ts >= at - 60:
                        own.setdefault(r, []).append((ts, w + h - c))
            worst = 0.0
            for end in [at - 30 + 5 * i for i in range(7)]:
                means = {
                    r: statistics.mean([o for ts, o in v if end - RULE_WINDOW_S <= ts < end] or [0])
                    for r, v in own.items()
                }
                med = statistics.median(means.values())
                if med > 0:
                    worst = max(worst, means[int(fa["rank"])] / med - 1.0)
            natural.append(round(worst, 3))
            fa["rank_slower_than_median"] = round(worst, 3)
        slow = sum(1 for x in natural if x >= 0.04)
        print(
            f"N={n}: {len(natural)} false alarm(s); the flagged rank was ≥4% slower than its "
            f"job's median rank ({RULE_WINDOW_S:g} s windows, 30 s before) in {slow}: {natural}"
        )
    path.write_text(json.dumps(rows, indent=1))
    return 0


def print_table(res: dict) -> None:
    print(f"\nN = {res['n']} nodes, {res['ranks']} ranks in {res['jobs']} jobs, {res['wall_s']} s")
    print(
        f"{'slowdown':>9} {'faults':>7} {'found':>6} {'recall':>7} {'median s':>9} "
        f"{'p95 s':>6} {'≤30 s':>6}"
    )
    for size, row in res["by_size"].items():
        print(
            f"{size:>9} {row['faults']:>7} {row['detected']:>6} {row['recall']!s:>7} "
            f"{row['latency_median_s']!s:>9} {row['latency_p95_s']!s:>6} "
            f"{row['within_30s']:>6}"
        )
    print(
        f"  all: recall {res['recall']}, ≥10%: recall {res['recall_10pct_up']}, latency "
        f"median {res['latency_10pct_up_median_s']} s, p95 {res['latency_10pct_up_p95_s']} s"
    )
    print(
        f"  precision {res['precision']} ({res['activations']} activations, "
        f"{res['false_alarms']} false, {res['false_alarms_healthy_stretch']} in the healthy "
        "stretch)"
    )
    print(
        f"  Prometheus: {res['prom_head_series']} head series, RSS {res['prom_rss_mib']} MiB, "
        f"CPU {res['prom_cpu_pct']}%, straggler rules {res['straggler_rules_eval_ms']} ms "
        f"per 5-s evaluation, their baselines {res['straggler_baselines_eval_ms']} ms per 1-min "
        f"evaluation (all rules {res['all_rules_eval_ms']} ms)"
    )
    print(
        f"  agents: CPU {res['agents_cpu_pct']}% of a core together, RSS "
        f"{res['agent_rss_mib_mean']} MiB each; step writer CPU {res['writer_cpu_pct']}%, "
        f"{res['writer_rows']} rows, worst lag {res['writer_max_lag_s']} s"
    )
    d = res["diagnose"]
    print(
        f"  diagnose --prometheus: {d['seconds']} s, rc {d['rc']}"
        + (f"; {d['error']}" if d.get("error") else "")
    )
    for c in d.get("checks", []):
        print(
            f"    {c['job']}: rank {c['slow_rank']} on {c['slow_node']} slowed by "
            f"{c['cause']}: named {c['named']} (found rank {c['found_rank']} on "
            f"{c['found_host']}, cause {c['found_cause']})"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="8,16,32,64")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--nodes-per-job", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=240.0)
    ap.add_argument("--healthy-for", type=float, default=0.0)
    ap.add_argument("--faults-for", type=float, default=360.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    ap.add_argument(
        "--raw-recording",
        action="store_true",
        help="replay each rank as recorded, its seconds-long slow stretches kept "
        "(fleetsim.load_recording): alarms on them count as false",
    )
    ap.add_argument(
        "--explain",
        type=Path,
        metavar="JSON",
        help="no run: for each false alarm in a saved run (--json FILE, same "
        "options), how much slower than its peers that rank really was",
    )
    args = ap.parse_args()
    if args.explain is not None:
        return explain(
            args.explain,
            args,
            load_recording(detrend_steps=0 if args.raw_recording else DETREND_STEPS),
        )
    if shutil.which("prometheus") is None:
        print(
            "bench_fleet: needs prometheus on PATH (Debian: apt-get install prometheus)",
            file=sys.stderr,
        )
        return 2
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        print(
            f"bench_fleet: --nodes takes numbers such as 8,16, got {args.nodes!r}", file=sys.stderr
        )
        return 2
    if any(n < args.nodes_per_job or n % args.nodes_per_job for n in sizes):
        print(
            "bench_fleet: each --nodes value must be a multiple of --nodes-per-job", file=sys.stderr
        )
        return 2
    # a SIGTERM ends it like Ctrl-C: the agents and Prometheus it started are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rec = load_recording(detrend_steps=0 if args.raw_recording else DETREND_STEPS)
    results = []
    for n in sizes:
        res = run_one(args, n, rec)
        print_table(res)
        results.append(res)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
