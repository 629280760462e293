"""Alerts: rules files, the engine (pending time, hysteresis, cooldown), replay over a stored
run, and delivery to a real local HTTP server, a real SMTP server (aiosmtpd) and a real command;
`stallscope run --alerts` end to end."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import stallscope_argv

from stallscope.alerts import AlertEngine, Rule, load_rules, parse_rules
from stallscope.alerts.actions import AlertSink, alert_body, deliver
from stallscope.alerts.rulefile import Action, Smtp
from stallscope.collect import Sample
from stallscope.errors import UsageError
from stallscope.metrics import Point
from stallscope.store import RunStore, write_meta

T0 = 1_763_712_000.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- rules files ---------------------------------------------------------------------------------
def test_check_names_every_problem_by_key(tmp_path: Path) -> None:
    f = tmp_path / "rules.toml"
    f.write_text("""
[[alerts]]
name = "hot"
metric = "gpu.temprature_c"
above = 85
clear_below = 90
for_s = -1
severty = "critical"
actions = [{webhook = "ftp://x"}, {command = "rm -rf /"}, {pager = "x"}]

[[alerts]]
metric = "gpu.temp_c"
above = 1
below = 2
""")
    r = subprocess.run(
        stallscope_argv("alerts", "check", str(f)), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert all(line.startswith("stallscope: ") for line in lines)
    text = r.stderr
    for key in (
        "'severty'",
        ".metric: 'gpu.temprature_c'",
        ".clear_below",
        ".for_s",
        "actions[0].webhook",
        "actions[1].command",
        "unknown action 'pager'",
        "alerts[1].name",
        "exactly one of 'above' or 'below'",
    ):
        assert key in text, key
    assert "Traceback" not in text
    assert len(lines) == 9


def test_check_accepts_a_good_file_and_lists_defaults(tmp_path: Path) -> None:
    f = tmp_path / "rules.toml"
    f.write_text(
        '[[alerts]]\nname = "gpu_hot"\nmetric = "gpu.temp_c"\nabove = 80\n'
        'for_s = 10\nclear_below = 75\n\n[[alerts]]\nname = "host_swapping"\n'
        "enabled = false\n"
    )
    r = subprocess.run(
        stallscope_argv("alerts", "check", str(f)), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "gpu_hot: gpu.temp_c > 80 for 10 s" in r.stdout  # the file replaces the default
    assert "host_swapping" not in r.stdout  # turned off
    assert "shm_nearly_full" in r.stdout  # other defaults stay on


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("not toml [", "not valid TOML"),
        ("[[alerts]]\nname='x'\nfinding='input_bound.fetched'\n", "is not a finding kind"),
        (
            "[[alerts]]\nname='x'\nmetric='gpu.temp_c'\nabove=1\nactions=[{email='a@b'}]\n",
            "needs an [smtp] table",
        ),
        ("[smtp]\nport='25'\n", "smtp.port"),
        # a command no one can run is found when the file is checked, not when the alert fires
        (
            "[[alerts]]\nname='x'\nmetric='gpu.temp_c'\nabove=1\n"
            "actions=[{command=['no-such-program-stallscope']}]\n",
            "is not a program this user",
        ),
        (
            "[[alerts]]\nname='x'\nmetric='gpu.temp_c'\nabove=1\n"
            "actions=[{command=['/dev/null']}]\n",
            "is not a program this user",
        ),
    ],
)
def test_bad_files_give_clear_lines(tmp_path: Path, text: str, fragment: str) -> None:
    f = tmp_path / "r.toml"
    f.write_text(text)
    with pytest.raises(UsageError, match=fragment.replace("[", r"\[")):
        load_rules(f)


# --- the engine ----------------------------------------------------------------------------------
def _run(
    engine: AlertEngine, values: list[float], dt: float = 1.0, metric: str = "gpu.temp_c"
) -> list[Any]:
    out = []
    for i, v in enumerate(values):
        out += engine.evaluate(T0 + i * dt, [Point(metric, "gpu0", v)])
    return out


def test_pending_time_and_hysteresis() -> None:
    rule = Rule("gpu_hot", "gpu.temp_c", above=85, for_s=30, clear_below=80)
    ts = _run(AlertEngine([rule]), [70] * 5 + [90] * 40 + [83] * 10 + [79] * 3)
    assert [(t.state, t.ts - T0) for t in ts] == [("firing", 35.0), ("cleared", 55.0)]
    assert all(t.notify for t in ts)
    # a spike shorter than for_s never fires
    assert _run(AlertEngine([rule]), [90] * 20 + [70] * 5 + [90] * 20) == []


def test_a_storm_around_the_threshold_notifies_at_most_twice() -> None:
    """1,000 samples alternating around the threshold, without hysteresis or pending time."""
    rule = Rule("hot", "gpu.temp_c", above=85, cooldown_s=600)
    ts = _run(AlertEngine([rule]), [86.0, 84.0] * 500)
    assert len(ts) == 1000  # every transition is recorded...
    assert sum(t.notify for t in ts) == 2  # ...one firing and its clearing are sent
    assert [t.state for t in ts if t.notify] == ["firing", "cleared"]


def test_confirm_needs_consecutive_evaluations() -> None:
    rule = Rule("hot", "gpu.temp_c", above=85, confirm=3)
    ts = _run(AlertEngine([rule]), [90, 90, 70, 90, 90, 90])
    assert [(t.state, t.ts - T0) for t in ts] == [("firing", 5.0)]


def test_entity_filter_and_below() -> None:
    rule = Rule("slow_clock", "gpu.sm_clock_mhz", below=1000, entity="gpu1")
    e = AlertEngine([rule])
    assert e.evaluate(T0, [Point("gpu.sm_clock_mhz", "gpu0", 500)]) == []
    [t] = e.evaluate(T0, [Point("gpu.sm_clock_mhz", "gpu1", 500)])
    assert t.entity == "gpu1" and t.state == "firing"


# --- delivery to real peers ----------------------------------------------------------------------
class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", 0))
        self.received.append(json.loads(self.rfile.read(n)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_a: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    handler = type("Hook", (_Hook,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()


def _transition() -> Any:
    rule = Rule("gpu_hot", "gpu.temp_c", above=85, severity="critical")
    [t] = AlertEngine([rule]).evaluate(T0, [Point("gpu.temp_c", "gpu0", 91.0)])
    return t


def test_webhook_posts_the_alert_as_json(webhook: tuple[str, list[dict[str, Any]]]) -> None:
    url, received = webhook
    body = alert_body(_transition(), host="node7", run="runs/r1")
    assert deliver(Action("webhook", url), body, None).endswith("HTTP 204")
    [got] = received
    assert got["alert"] == "gpu_hot" and got["state"] == "firing" and got["value"] == 91.0
    assert got["threshold"] == 85 and got["host"] == "node7" and got["entity"] == "gpu0"
    assert "http" not in got["summary"]  # link-free


def test_webhook_to_nothing_fails_in_bounded_time() -> None:
    url = f"http://127.0.0.1:{_free_port()}/hook"  # nobody listens
    with pytest.raises(OSError, match="failed after retries"):
        deliver(Action("webhook", url), alert_body(_transition(), host="h", run=""), None)


def test_email_reaches_a_real_smtp_server() -> None:
    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Message

    got: list[Any] = []

    class Keep(Message):
        def handle_message(self, message: Any) -> None:
            got.append(message)

    port = _free_port()  # aiosmtpd cannot bind port 0
    ctl = Controller(Keep(), hostname="127.0.0.1", port=port)
    ctl.start()
    try:
        smtp = Smtp(host="127.0.0.1", port=port, sender="stallscope@test")
        done = deliver(
            Action("email", "ops@example.org"),
            alert_body(_transition(), host="node7", run="r"),
            smtp,
        )
    finally:
        ctl.stop()
    assert "ops@example.org" in done
    [msg] = got
    assert msg["To"] == "ops@example.org" and "gpu_hot" in msg["Subject"]
    assert "value: 91.0" in msg.get_payload()


def test_command_gets_the_alert_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    argv = [
        sys.executable,
        "-c",
        "import os,sys; open(sys.argv[1],'w').write("
        "os.environ['STALLSCOPE_ALERT_ALERT'] + ' ' + os.environ['STALLSCOPE_ALERT_VALUE'])",
        str(out),
    ]
    done = deliver(
        Action("command", tuple(argv)), alert_body(_transition(), host="h", run=""), None
    )
    assert "exited 0" in done
    assert out.read_text() == "gpu_hot 91.0"
    with pytest.raises(OSError, match="exited 3"):
        deliver(
            Action("command", (sys.executable, "-c", "raise SystemExit(3)")),
            alert_body(_transition(), host="h", run=""),
            None,
        )


def test_sink_records_and_delivers_off_the_collector_thread(
    webhook: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = webhook
    doc = {
        "alerts": [
            {
                "name": "mem",
                "metric": "host.mem_used_mib",
                "above": 100,
                "actions": [{"webhook": url}],
            }
        ]
    }
    sink = AlertSink(parse_rules(doc, defaults=False), run="r1", host="h")
    said: list[tuple[str, str]] = []
    sink.bind(lambda ts, src, kind, msg: said.append((kind, msg)))
    for i, v in enumerate([50.0, 150.0, 160.0, 20.0]):
        sink.write(Sample(T0 + i, points=[Point("host.mem_used_mib", "", v)]))
    sink.close()
    assert [r["state"] for r in received] == ["firing", "cleared"]
    kinds = [k for k, _ in said]
    assert kinds.count("alert_firing") == 1 and kinds.count("alert_cleared") == 1
    assert kinds.count("alert_action") == 2


# --- replay and run ------------------------------------------------------------------------------
def test_replay_shows_what_would_have_fired_over_a_stored_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    st = RunStore(run / "run.db")
    temps = [70.0] * 10 + [90.0] * 60 + [75.0] * 10
    for i, v in enumerate(temps):
        st.add_points(T0 + i, [Point("gpu.temp_c", "gpu0", v), Point("collector.cpu_s", "", 0.001)])
    st.close()
    write_meta(run, {"command": ["train"], "start": T0, "end": T0 + 80, "exit_code": 0})
    r = subprocess.run(
        stallscope_argv("alerts", "replay", "-", str(run), "--json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(t["alert"], t["state"], t["t_s"]) for t in doc["transitions"]] == [
        ("gpu_hot", "firing", 40.0),
        ("gpu_hot", "cleared", 70.0),
    ]
    text = subprocess.run(
        stallscope_argv("alerts", "replay", "-", str(run)),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "+    40.0 s  firing   gpu_hot on gpu0 firing: gpu.temp_c = 90" in text


def test_run_with_alerts_fires_a_webhook(
    tmp_path: Path, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = webhook
    rules = tmp_path / "rules.toml"
    rules.write_text(
        f'[[alerts]]\nname = "mem_used"\nmetric = "host.mem_used_mib"\nabove = 0\n'
        f'actions = [{{webhook = "{url}"}}]\n'
    )
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--interval",
            "0.2",
            "--alerts",
            str(rules),
            "--out",
            str(tmp_path / "runs"),
            "--quiet",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(1.2)",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert [x["alert"] for x in received] == ["mem_used"]
    assert received[0]["run"].endswith(tuple(p.name for p in (tmp_path / "runs").iterdir()))
    [run_dir] = list((tmp_path / "runs").iterdir())
    st = RunStore(run_dir / "run.db", readonly=True)
    kinds = [e["kind"] for e in st.events() if e["source"] == "alerts"]
    st.close()
    assert "alert_firing" in kinds and "alert_action" in kinds


def test_run_with_a_bad_rules_file_starts_nothing(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[alerts]]\nname = "x"\nmetric = "nope"\nabove = 1\n')
    marker = tmp_path / "ran"
    r = subprocess.run(
        stallscope_argv("run", "--alerts", str(rules), "--", "touch", str(marker)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode != 0 and "metric: 'nope'" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()


def _short_run_with(
    rules: Path, tmp_path: Path, exit_code: int
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`stallscope run --alerts rules` of a 1.5 s trainer exiting with ``exit_code``; and how
    long `run` took."""
    t0 = time.monotonic()
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--interval",
            "0.2",
            "--alerts",
            str(rules),
            "--out",
            str(tmp_path / "runs"),
            "--quiet",
            "--",
            sys.executable,
            "-c",
            f"import time, sys; time.sleep(1.5); sys.exit({exit_code})",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return r, time.monotonic() - t0


@pytest.mark.slow
def test_a_hanging_command_action_dies_with_the_run(tmp_path: Path) -> None:
    """A command action that never ends (it starts a child of its own, too): `run` returns
    within the grace after a short trainer, with the trainer's exit code, and neither the
    command nor its child outlives it."""
    import psutil

    marker = tmp_path / "hang.pid"
    hang = tmp_path / "hang.sh"
    hang.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {marker}\nsleep 300\n")
    hang.chmod(0o755)
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[alerts]]\nname = "mem_used"\nmetric = "host.mem_used_mib"\nabove = 0\n'
        f'actions = [{{command = ["{hang}"]}}]\n'
    )
    r, took = _short_run_with(rules, tmp_path, exit_code=7)
    assert r.returncode == 7, r.stderr
    assert took < 15, took
    deadline = time.monotonic() + 5
    child = int(marker.read_text()) if marker.exists() else None
    while time.monotonic() < deadline:
        alive = [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(hang) in " ".join(p.info["cmdline"] or [])
        ]
        if not alive and (child is None or not psutil.pid_exists(child)):
            break
        time.sleep(0.2)
    assert not alive, alive
    assert (
        child is None
        or not psutil.pid_exists(child)
        or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    )


@pytest.mark.slow
def test_unanswered_webhooks_do_not_hold_the_run(tmp_path: Path) -> None:
    """200 firing rules whose webhooks go to a server that accepts and never answers: the run
    ends within the grace after its trainer (it waited on every retry before), exit code
    passed through, and the dropped notifications are said in the run."""
    import socket as so

    silent = so.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1024)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
    rules = tmp_path / "rules.toml"
    rules.write_text(
        "".join(
            f'[[alerts]]\nname = "r{i}"\nmetric = "host.mem_used_mib"\nabove = 0\n'
            f'actions = [{{webhook = "{url}"}}]\n'
            for i in range(200)
        )
    )
    try:
        r, took = _short_run_with(rules, tmp_path, exit_code=3)
    finally:
        silent.close()
    assert r.returncode == 3, r.stderr
    assert took < 15, took
    [run_dir] = list((tmp_path / "runs").iterdir())
    st = RunStore(run_dir / "run.db", readonly=True)
    msgs = [e["message"] for e in st.events() if e["kind"] == "alert_action_error"]
    st.close()
    assert any("still pending" in m and "dropped" in m for m in msgs), msgs[-3:]


def test_a_misspelt_metric_gets_the_closest_names_and_the_vocabulary_is_listed(
    tmp_path: Path,
) -> None:
    """Issue 40: a misspelt metric had no "did you mean", and no command listed the names."""
    f = tmp_path / "rules.toml"
    f.write_text(
        '[[alerts]]\nname = "hot"\nmetric = "gpu.temp"\nabove = 80\n'
        '[[alerts]]\nname = "slow"\nmetric = "disk.util_pct"\nabove = 90\n'
        'also = [{metric = "disk.r_awit_ms", above = 50}]\n'
        '[[alerts]]\nname = "odd"\nmetric = "zzz.qqq"\nabove = 1\n'
    )
    r = subprocess.run(
        stallscope_argv("alerts", "check", str(f)), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1
    assert "'gpu.temp' is not a metric of the vocabulary (did you mean gpu.temp_c?)" in r.stderr
    assert (
        "'disk.r_awit_ms' is not a metric of the vocabulary (did you mean disk.r_await_ms"
        in r.stderr
    )
    assert (
        "'zzz.qqq' is not a metric of the vocabulary (`stallscope alerts metrics` lists" in r.stderr
    )
    listing = subprocess.run(
        stallscope_argv("alerts", "metrics"), capture_output=True, text=True, timeout=60
    )
    assert listing.returncode == 0
    names = {
        line.split()[0]
        for line in listing.stdout.splitlines()
        if line[:1].isalpha() and "." in line.split()[0]
    }
    from stallscope.metrics import METRICS

    assert names == {f"{m.source}.{m.key}" for m in METRICS if m.kind != "counter"}
    assert "finding kinds" in listing.stdout and "gpu_health" in listing.stdout
    gpu = subprocess.run(
        stallscope_argv("alerts", "metrics", "--source", "gpu"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert all(line.startswith("gpu.") for line in gpu.stdout.splitlines())
    bad = subprocess.run(
        stallscope_argv("alerts", "metrics", "--source", "gpus"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no such source" in bad.stderr


def test_show_and_the_end_of_run_summary_list_the_alerts_that_fired(tmp_path: Path) -> None:
    """docs/alerts.md says every alert shows in `show`; text `show` and the summary at the end
    of `run` listed none (issue 40)."""
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[alerts]]\nname = "always"\nmetric = "host.mem_total_mib"\nabove = 0\nseverity = "info"\n'
    )
    out = tmp_path / "runs"
    r = subprocess.run(
        [
            *stallscope_argv("run", "--interval", "0.5", "--alerts", str(rules), "--out", str(out)),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(2.5)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-1500:]
    end = " ".join(r.stderr.split())
    assert "alerts: fired:" in end and "always" in end, end[-1500:]
    [run_dir] = list(out.iterdir())
    show = subprocess.run(
        stallscope_argv("show", str(run_dir)),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert show.returncode == 0
    lines = show.stdout.splitlines()
    i = lines.index("  alerts:")
    assert lines[i + 1].startswith("    fired: ") and "always" in lines[i + 1], lines[i : i + 3]
