"""``[[alerts]]`` in the agent's config file: the node agent runs the alert engine too. A real
agent process with a rule that fires at once posts to a real local webhook and records the
alert in its run store; a bad rule is one line per problem, exit 2, before anything starts."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from test_agent import get, run_cli, start_agent, stop_agent

from stallscope.agent.config import ConfigError, load_config
from stallscope.store import RunStore


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_a: Any) -> None:
        return


def test_config_alerts_are_parsed_over_the_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        'interval_s = 1\nsmart = ["/dev/sda"]\n\n[[alerts]]\nname = "gpu_hot"\n'
        'metric = "gpu.temp_c"\nabove = 83\n\n[[alerts]]\nname = "host_swapping"\n'
        "enabled = false\n"
    )
    c = load_config(cfg)
    rules = {r.name: r for r in c.rules().rules}
    assert rules["gpu_hot"].above == 83 and "host_swapping" not in rules
    assert "smart_failing" in rules and c.smart == ["sda"]


def test_bad_alerts_in_config_are_one_line_each(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        '[[alerts]]\nname = "x"\nmetric = "nope"\nabove = 1\n'
        'actions = [{email = "a@b"}, {shell = "rm -rf /"}]\n'
    )
    with pytest.raises(ConfigError):
        load_config(cfg)
    r = run_cli("agent", "--config", str(cfg), "--store", str(tmp_path / "s"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert all(x.startswith(f"stallscope: config {cfg}: alerts[") for x in lines), lines
    assert any("metric: 'nope' is not a metric" in x for x in lines)
    assert any("unknown action 'shell'" in x for x in lines)
    assert not (tmp_path / "s").exists()


def test_agent_runs_config_alerts_and_notifies(tmp_path: Path) -> None:
    _Hook.received = []
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[[alerts]]\nname = "mem_used"\nmetric = "host.mem_used_mib"\nabove = 0\n'
        f'actions = [{{webhook = "{url}"}}]\n'
    )
    agent = start_agent(tmp_path, "--config", str(cfg))
    try:
        deadline = time.monotonic() + 20
        while not _Hook.received and time.monotonic() < deadline:
            time.sleep(0.2)
        health = json.loads(get(agent.url + "/api/v1/health")[2])
    finally:
        stop_agent(agent)
        hook.shutdown()
        hook.server_close()
    assert agent.proc.returncode == 0
    [msg] = _Hook.received
    assert msg["alert"] == "mem_used" and msg["state"] == "firing" and msg["value"] > 0
    assert msg["run"].startswith(str(agent.store))
    assert {"alert": "mem_used", "entity": ""} in health["alerts_firing"]
    [run_dir] = [p for p in agent.store.iterdir() if p.is_dir()]
    st = RunStore(run_dir / "run.db", readonly=True)
    kinds = [e["kind"] for e in st.events() if e["source"] == "alerts"]
    st.close()
    assert "alert_firing" in kinds and "alert_action" in kinds
