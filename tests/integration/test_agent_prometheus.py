"""A real Prometheus server scrapes two real agents on loopback: both targets up, and a query
over the agents' series returns one series per agent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import terminate, tool_missing
from test_agent import RunningAgent, free_port, start_agent, stop_agent

pytestmark = pytest.mark.prometheus

WAIT_S = 40.0


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def test_prometheus_scrapes_two_agents(tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        tool_missing("prometheus (Debian package prometheus)")
        return
    agents: list[RunningAgent] = []
    server: subprocess.Popen[bytes] | None = None
    try:
        agents = [start_agent(tmp_path / f"a{i}") for i in range(2)]
        port = free_port()
        targets = [f"127.0.0.1:{a.port}" for a in agents]
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: stallscope\n    scrape_interval: 1s\n"
            "    scrape_timeout: 1s\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        server = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=dict(os.environ, HOME=str(tmp_path)),
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WAIT_S
        up: list[dict[str, Any]] = []
        busy: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            if server.poll() is not None:
                err = server.stderr.read().decode() if server.stderr else ""
                pytest.fail(f"prometheus exited {server.returncode}: {err[-2000:]}")
            try:
                up = query(base, 'up{job="stallscope"} == 1')
                busy = query(base, "stallscope_host_cpu_busy_ratio")
            except OSError:
                up, busy = [], []
            if len(up) == 2 and len(busy) == 2:
                break
            time.sleep(0.5)
        assert {r["metric"]["instance"] for r in up} == set(targets), up
        assert {r["metric"]["instance"] for r in busy} == set(targets), busy
        assert all(0.0 <= float(r["value"][1]) <= 1.0 for r in busy)
        # counters arrive as counters: rate() over them works in Prometheus
        cpu = query(base, 'stallscope_host_cpu_seconds_total{mode="idle"}')
        assert len(cpu) == 2
        # Prometheus asked for OpenMetrics, gzipped, and parsed it with its own strict parser
        for a in agents:
            with urllib.request.urlopen(a.url + "/api/v1/health", timeout=5) as r:
                scrapes = json.loads(r.read())["scrapes"]
            assert scrapes.get("openmetrics,gzip", 0) >= 1, scrapes
    finally:
        if server is not None:
            terminate(server, 15)
        for a in agents:
            stop_agent(a)
    for a in agents:
        assert a.proc.returncode == 0
