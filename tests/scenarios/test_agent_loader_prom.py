"""Slow samples holding up the batches, seen through a real agent and a real Prometheus: a real
process tree (a trainer and two DataLoader-like workers that time their batches with the real
writer of :mod:`stallscope.sources.stacks.fetches`, 2% of them 40× slower), step rows with
bursty data waits written by the probe's store, the agent exporting its histograms, Prometheus
scraping it, and ``diagnose --prometheus`` naming ``input_bound.head_of_line`` with the
workers' own cost figures, as the run's files give them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_agent import start_agent, stop_agent
from test_agent_deploy import (
    diagnose_over_prometheus,
    start_prometheus,
    stop_prometheus,
    wait_for,
)
from test_agent_steps import make_run

from stallscope.loadermodel import OTHERS_BUSY_CORES
from stallscope.sources.stacks import fetches
from stallscope.store import RunStore, StepRow
from stallscope.store.index import record_run

#: a trainer that forks two workers; each times 300 batches (2% of them 40x slower) with the
#: real recorder over the steps' 14 s, mostly asleep (a worker waiting for its turn to hand a
#: batch over), then idles
_TREE = r"""
import os, random, sys, time
from stallscope.loadermodel import OTHERS_BUSY_CORES
from stallscope.sources.stacks import fetches
stop = sys.argv[1]
for w in range(2):
    if os.fork() == 0:
        r = random.Random(w)
        rec = fetches.RECORDER
        for i in range(300):
            cost = 0.05 * (40 if r.random() < 0.02 else 1) * r.uniform(0.9, 1.1)
            t = time.process_time()
            while time.process_time() - t < 0.002:  # a little CPU for each batch
                pass
            rec.add(cost)
            if i % 50 == 49:
                rec.flush()
            time.sleep(0.04)  # 300 batches over the ~14 s of steps
        rec.flush()
        while not os.path.exists(stop):
            time.sleep(0.1)
        os._exit(0)
while not os.path.exists(stop):
    time.sleep(0.1)
"""


def _steps(store: RunStore, first: int, n: int) -> None:
    """``n`` steps of 50 ms compute: one in ten waits 0.4 s for its batch, the rest none."""
    now = time.time()
    rows = [
        StepRow(0, first + i, now, 0.4 if (first + i) % 10 == 0 else 0.0, 0.05) for i in range(n)
    ]
    store.add_steps(rows)


@pytest.mark.slow
@pytest.mark.prometheus
# alone: beside the parallel pass's other tests (three at a time on two cores) they kept
# 1.84-1.86 cores busy in both fresh-clone CI runs, and the rule rightly promised nothing
@pytest.mark.exclusive
def test_head_of_line_from_the_agent_s_series(tmp_path: Path) -> None:
    agent = start_agent(tmp_path / "node", interval="0.5")
    prom = None
    stop = tmp_path / "stop"
    run = make_run(tmp_path / "runs", pid=os.getpid())  # the tree's pid once it runs
    tree = subprocess.Popen(
        [sys.executable, "-c", _TREE, str(stop)],
        env=dict(os.environ, PYTHONPATH=str(ROOT), STALLSCOPE_RUN_DIR=str(run)),
        start_new_session=True,
    )
    try:
        meta = json.loads((run / "meta.json").read_text())
        meta["pid"] = tree.pid
        (run / "meta.json").write_text(json.dumps(meta))
        store = RunStore(run / "run.db")
        store.set_probe(0, tree.pid, {}, 0, 0)
        record_run(run)
        prom = start_prometheus(tmp_path, [f"127.0.0.1:{agent.port}"], None)
        wait_for(prom, {"up": "stallscope_host_cpu_busy_ratio"}, 30, [agent.proc])
        step = 0
        deadline = time.monotonic() + 16
        while time.monotonic() < deadline:  # 20 steps a second, as the probe writes them
            _steps(store, step, 5)
            step += 5
            time.sleep(0.25)
        store.close()
        wait_for(
            prom,
            {
                "costs": 'stallscope_loader_batch_seconds_count{role="main"} >= 600',
                "waits": 'stallscope_train_step_data_wait_seconds_count{rank="0"} > 0',
                "workers": 'stallscope_proc_cpu_ratio{role="worker"}',
            },
            20,
            [agent.proc],
        )
        time.sleep(2)  # the last steps scraped
        doc = diagnose_over_prometheus(prom, agent.port)
        sig = doc["signals"]
        # the workers' own timing, as the run's files give it
        local = fetches.cost_summary(fetches.read_histograms(run).values())
        assert local is not None and local["batches"] == 600
        assert sig["batches_timed"] == 600, sig
        assert sig["batch_cost_p50_ms"] == local["p50_ms"], sig
        assert sig["batch_cost_p99_ms"] == local["p99_ms"], sig
        assert sig["batch_cost_tail_share"] == local["tail_share"], sig
        # the waits in bursts: a tenth of the steps hold all of it
        assert sig["wait_top_share"] >= 0.9, sig
        busy = sig.get("others_cpu_cores") or 0.0
        if busy >= OTHERS_BUSY_CORES:
            # the rule rightly promises nothing with no core to spare (as a run's own
            # diagnosis does: tests/scenarios/test_scenarios_headofline.py)
            pytest.skip(f"the facts came back; other processes kept {busy} cores busy")
        kinds = [f["kind"] for f in doc["findings"]]
        seen = {k: sig.get(k) for k in ("worker_cpu_pct", "others_cpu_cores", "logical_cores")}
        assert "input_bound.head_of_line" in kinds, (seen, doc["findings"])
    finally:
        stop.touch()
        try:
            tree.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(tree.pid, signal.SIGKILL)
            tree.wait()
        if prom is not None:
            stop_prometheus(prom)
        stop_agent(agent)
    err = agent.proc.stderr.read() if agent.proc.stderr else ""
    assert "Traceback" not in err, err[-2000:]
