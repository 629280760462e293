"""Cluster mode: the shipped Prometheus alerting rules (deploy/prometheus/stallscope-alerts.yml)
pass ``promtool check rules`` and their unit tests, and loaded into a real Prometheus with a
real Alertmanager, scraping a real ``stallscope agent`` (GPU readings replayed) whose GPU crosses
85 °C, they reach a local webhook: firing, then resolved once it cools down. Everything binds
127.0.0.1."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import FIXTURES, ROOT, stallscope_argv, terminate, tool_missing
from test_agent import free_port, get

RULES = ROOT / "deploy" / "prometheus" / "stallscope-alerts.yml"
RECORDING = ROOT / "deploy" / "prometheus" / "stallscope-recording.yml"
H100_LOAD = FIXTURES / "nvml-replay-h100-80gb-hbm3-load-from-nvidia-smi-590.48.01.json"
WAIT_S = 45.0


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        tool_missing(f"{name} (Debian package {package})")
        raise AssertionError("unreachable")
    return path


@pytest.mark.prometheus
def test_rules_file_passes_promtool() -> None:
    promtool = _tool("promtool", "prometheus")
    r = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stdout + r.stderr
    alerts = RULES.read_text().count("- alert: ")
    assert alerts == 15, alerts  # every shipped alert (gpu_health the 15th), found by promtool
    records = RULES.read_text().count("- record: ")
    assert records == 7, records  # the straggler alert's two detectors and their baselines
    assert f"SUCCESS: {alerts + records} rules found" in r.stdout
    r = subprocess.run(
        [promtool, "check", "config", str(ROOT / "deploy" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and f"SUCCESS: {alerts + records} rules found" in r.stdout, (
        r.stdout + r.stderr
    )


@pytest.mark.prometheus
def test_rules_fire_and_clear_in_promtool_unit_tests() -> None:
    """tests/promtool/stallscope-alerts.test.yml: constructed series; each alert fires and
    clears at the times the stallscope default would, hysteresis and the disk rule's pair
    included, the training alerts over the agent's stallscope_train_* counters."""
    promtool = _tool("promtool", "prometheus")
    r = subprocess.run(
        [promtool, "test", "rules", "stallscope-alerts.test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT / "tests" / "promtool",
    )
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_rules_mirror_the_shipped_defaults() -> None:
    from stallscope.alerts import DEFAULT_RULES

    text = RULES.read_text()
    mirrored = set(re.findall(r"stallscope_rule: (\w+)", text))
    assert {r.name for r in DEFAULT_RULES} <= mirrored
    # the thresholds are the defaults', in base units
    assert "stallscope_gpu_temperature_celsius > 85" in text
    assert "stallscope_disk_read_await_seconds > 0.05" in text
    assert "rank:stallscope_train_data_wait:ratio_rate1m > 0.3" in text
    # the training alerts read the recording rules shipped beside them
    recorded = set(re.findall(r"record: (\S+)", RECORDING.read_text()))
    assert {
        "rank:stallscope_train_data_wait:ratio_rate1m",
        "rank:stallscope_train_step_seconds:mean_rate1m",
    } <= recorded


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_a: Any) -> None:
        return


@pytest.fixture
def webhook() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    _Hook.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Hook)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield int(server.server_address[1]), _Hook.received
    finally:
        server.shutdown()
        server.server_close()


def _stop(p: subprocess.Popen[bytes] | None) -> None:
    if p is not None:
        terminate(p)


def _wait(what: str, cond: Any, procs: list[subprocess.Popen[bytes]]) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                err = p.stderr.read().decode() if p.stderr else ""
                pytest.fail(
                    f"{p.args[0]} exited {p.returncode} while waiting for {what}: {err[-1500:]}"
                )
        got = cond()
        if got:
            return got
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    import urllib.parse

    try:
        status, _h, body = get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    except OSError:
        return []
    return list(json.loads(body)["data"]["result"]) if status == 200 else []


def _alerts(received: list[dict[str, Any]], status: str) -> list[dict[str, Any]]:
    return [
        a
        for msg in list(received)
        for a in msg.get("alerts", [])
        if a.get("status") == status and a["labels"].get("alertname") == "StallscopeGpuHot"
    ]


@pytest.mark.prometheus
@pytest.mark.alertmanager
@pytest.mark.prometheus
@pytest.mark.alertmanager
def test_prometheus_and_alertmanager_notify_a_webhook(
    tmp_path: Path, webhook: tuple[int, list[dict[str, Any]]]
) -> None:
    prometheus = _tool("prometheus", "prometheus")
    alertmanager = _tool("prometheus-alertmanager", "prometheus-alertmanager")
    hook_port, received = webhook
    agent_port, prom_port, am_port = free_port(), free_port(), free_port()
    hot = tmp_path / "hot"
    # the shipped alerting rules, with every `for:` shortened so the test takes seconds
    rules = tmp_path / "stallscope-alerts.yml"
    rules.write_text(re.sub(r"(\n\s+for:) \S+", r"\1 1s", RULES.read_text()))
    (tmp_path / "alertmanager.yml").write_text(
        "route:\n  receiver: hook\n  group_by: [alertname, instance, gpu]\n"
        "  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n"
        "receivers:\n  - name: hook\n    webhook_configs:\n"
        f"      - url: http://127.0.0.1:{hook_port}/alerts\n        send_resolved: true\n"
    )
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: [{rules.name}]\n"
        "alerting:\n  alertmanagers:\n"
        f"    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n"
        "scrape_configs:\n  - job_name: stallscope\n    scrape_interval: 1s\n"
        "    scrape_timeout: 1s\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{agent_port}']\n"
    )
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "tests" / "replay_agent.py"),
                    str(H100_LOAD),
                    str(hot),
                    "agent",
                    "--listen",
                    f"127.0.0.1:{agent_port}",
                    "--interval",
                    "0.5",
                    "--store",
                    str(tmp_path / "store"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=tmp_path,
                env=env,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    alertmanager,
                    f"--config.file={tmp_path / 'alertmanager.yml'}",
                    f"--storage.path={tmp_path / 'am'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=tmp_path,
                env=env,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=tmp_path,
                env=env,
            )
        )
        base = f"http://127.0.0.1:{prom_port}"
        # the GPU reads its recorded 59 °C: scraped, and nothing fires
        temp = _wait(
            "the agent's GPU temperature in Prometheus",
            lambda: _query(base, "stallscope_gpu_temperature_celsius"),
            procs,
        )
        assert float(temp[0]["value"][1]) == 59.0
        assert not _query(base, 'ALERTS{alertname="StallscopeGpuHot"}')
        hot.touch()  # now 95 °C
        [fired] = _wait(
            "the firing notification at the webhook", lambda: _alerts(received, "firing"), procs
        )
        assert fired["labels"]["severity"] == "critical" and fired["labels"]["gpu"] == "0"
        assert fired["labels"]["stallscope_rule"] == "gpu_hot"
        assert fired["annotations"]["summary"].startswith("GPU 0 on 127.0.0.1:")
        assert "95 °C" in fired["annotations"]["summary"]
        hot.unlink()  # back to 59 °C, below the 80 °C clear level
        [resolved] = _wait(
            "the resolved notification at the webhook", lambda: _alerts(received, "resolved"), procs
        )
        assert resolved["labels"]["gpu"] == "0"
    finally:
        for p in reversed(procs):
            _stop(p)


def test_every_alert_has_a_description_a_runbook_and_a_long_enough_for() -> None:
    """node-mixin grade: summary, templated description, runbook_url into an anchor that exists
    in docs/alerts.md, `for:` at least two of deploy/prometheus.yml's scrape intervals."""
    import yaml

    doc = yaml.safe_load(RULES.read_text())
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    interval = _seconds(scrape["global"]["scrape_interval"])
    alerts_md = (ROOT / "docs" / "alerts.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", alerts_md, re.M)
    }
    rules = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert len(rules) >= 12
    for r in rules:
        a = r["annotations"]
        assert a["summary"] and "{{" in a["description"], r["alert"]
        assert a["runbook_url"] == f"docs/alerts.md#{r['alert'].lower()}", r["alert"]
        assert r["alert"].lower() in anchors, f"docs/alerts.md has no section {r['alert']}"
        if "rank:stallscope_train_comm_wait_gap:cusum" in r["expr"]:
            continue  # no `for:`: the CUSUM needs two evaluations at least (below)
        assert _seconds(r.get("for", "0s")) >= 2 * interval, (r["alert"], r.get("for"))
    # the straggler alert reads a CUSUM that no single evaluation can take to its threshold
    # (recorded in the alert's own group, ahead of it: each evaluation's alert reads that
    # evaluation's CUSUM)
    [group] = [g for g in doc["groups"] if g["name"] == "stallscope-stragglers"]
    names = [r.get("record") or r.get("alert") for r in group["rules"]]
    assert names == [
        "rank:stallscope_train_comm_wait:ratio_rate15s",
        "rank:stallscope_train_comm_wait_gap:ratio_rate15s",
        "rank:stallscope_train_comm_wait_gap:cusum",
        "rank:stallscope_train_comm_wait_gap:ratio_rate1m",
        "rank:stallscope_train_comm_wait_gap:cusum_rate1m",
        "StallscopeRankWaitedFor",
    ], names
    [cusum] = [
        r for r in group["rules"] if r.get("record") == "rank:stallscope_train_comm_wait_gap:cusum"
    ]
    step = float(re.findall(r"clamp_max\([\s\S]*?,\s*(0\.\d+)\)", cusum["expr"])[0])
    cap = float(re.search(r"0, (0\.\d+)\)\s*$", cusum["expr"]).group(1))
    [alert] = [r for r in rules if r["alert"] == "StallscopeRankWaitedFor"]
    threshold = float(re.search(r"cusum >= (0\.\d+)", alert["expr"]).group(1))
    assert step < threshold <= 2 * step < cap + step, (step, threshold, cap)
    # each rank's baseline, the 30-minute median, is recorded once a minute in a group of its
    # own (at 5 s it was most of the straggler group's time), and the CUSUM reads it
    [base] = [g for g in doc["groups"] if g["name"] == "stallscope-straggler-baselines"]
    assert base["interval"] == "1m" and [r["record"] for r in base["rules"]] == [
        "rank:stallscope_train_comm_wait_gap:median30m",
        "rank:stallscope_train_comm_wait_gap:median30m_rate1m",
    ], base
    assert "[30m]" in base["rules"][0]["expr"] and "[30m]" not in cusum["expr"]
    assert "rank:stallscope_train_comm_wait_gap:median30m" in cusum["expr"]
    # hysteresis: once firing it holds while the CUSUM is above a lower level
    clear = float(re.search(r"cusum > (0\.\d+)", alert["expr"]).group(1))
    assert 0 < clear < threshold, (clear, threshold)
    # the slower detector for small slowdowns: the gap of the 1-minute shares that the
    # recording rules record, its own baseline (median30m_rate1m) and CUSUM, with the same
    # shape: no single evaluation reaches its threshold, and it clears below a lower level
    [slow] = [
        r
        for r in group["rules"]
        if r.get("record") == "rank:stallscope_train_comm_wait_gap:cusum_rate1m"
    ]
    assert "rank:stallscope_train_comm_wait_gap:median30m_rate1m" in slow["expr"]
    assert "[30m]" in base["rules"][1]["expr"] and "ratio_rate1m[30m]" in base["rules"][1]["expr"]
    s_step = float(re.findall(r"clamp_max\([\s\S]*?,\s*(0\.\d+)\)", slow["expr"])[0])
    s_cap = float(re.search(r"0, (0\.\d+)\)\s*$", slow["expr"]).group(1))
    s_threshold = float(re.search(r"cusum_rate1m >= (0\.\d+)", alert["expr"]).group(1))
    s_clear = float(re.search(r"cusum_rate1m > (0\.\d+)", alert["expr"]).group(1))
    assert s_step < s_threshold <= 2 * s_step < s_cap + s_step, (s_step, s_threshold, s_cap)
    assert 0 < s_clear < s_threshold, (s_clear, s_threshold)
    recording = yaml.safe_load(
        (ROOT / "deploy" / "prometheus" / "stallscope-recording.yml").read_text()
    )
    assert "rank:stallscope_train_comm_wait:ratio_rate1m" in {
        r.get("record") for g in recording["groups"] for r in g["rules"]
    }


def _seconds(d: str) -> float:
    total, units = 0.0, {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    for n, u in re.findall(r"(\d+)(ms|s|m|h|d)", d):
        total += int(n) * units[u]
    return total


@pytest.mark.prometheus
def test_the_shipped_rules_are_the_rendering_with_the_defaults(tmp_path: Path) -> None:
    """deploy/prometheus/stallscope-alerts.yml is `stallscope alerts prometheus` as is; with a
    selector every raw stallscope series and `up` carry it, the recorded ones do not, and the
    result still passes promtool."""
    r = subprocess.run(
        stallscope_argv("alerts", "prometheus"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert r.stdout == RULES.read_text()
    sel = 'job="gpu-nodes", cluster=~"a|b"'
    r = subprocess.run(
        stallscope_argv(
            "alerts",
            "prometheus",
            "--selector",
            sel,
            "--runbook-url",
            "https://wiki.example/alerts.md",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    import yaml

    rules = [rule for g in yaml.safe_load(r.stdout)["groups"] for rule in g["rules"]]
    for rule in rules:
        for name in re.findall(r"(?<![\w:])stallscope_[a-z0-9_]+(?![\w:])", rule["expr"]):
            assert f"{name}{{{sel}}}" in rule["expr"], rule["expr"]
        if "alert" in rule:
            assert rule["annotations"]["runbook_url"] == (
                f"https://wiki.example/alerts.md#{rule['alert'].lower()}"
            ), rule
    exprs = "\n".join(rule["expr"] for rule in rules)
    assert (
        f"up{{{sel}}} == 0" in exprs and "rank:stallscope_train_data_wait:ratio_rate1m >" in exprs
    )
    out = tmp_path / "rules.yml"
    out.write_text(r.stdout)
    promtool = shutil.which("promtool")
    if promtool is None:
        tool_missing("promtool (Debian package prometheus)")
    c = subprocess.run(
        [promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60
    )
    assert c.returncode == 0, c.stdout + c.stderr
    bad = subprocess.run(
        stallscope_argv("alerts", "prometheus", "--selector", "job=gpu"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
