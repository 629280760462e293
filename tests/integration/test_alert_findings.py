"""`finding` rules: an alert on a diagnosis kind (`finding = "input_bound.prep"`), fed by the
run's diagnosis so far (live) or the whole run's (replay), on a real run of the demo trainer
(a prep-bound DataLoader) under `stallscope run`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, env_without_stallscope, stallscope_argv

from stallscope.alerts import actions as actions_mod
from stallscope.alerts import parse_rules
from stallscope.alerts.actions import AlertSink
from stallscope.collect import Sample

pytest.importorskip("torch")

RULES = """
[[alerts]]
name = "input_starved"
finding = "input_bound.prep"
severity = "critical"
"""


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    r = subprocess.run(
        [
            *stallscope_argv("run", "--quiet", "--interval", "1", "--out", str(out), "--"),
            sys.executable,
            str(ROOT / "examples" / "train_cpu.py"),
            "--max-seconds",
            "14",
            "--files",
            "600",
            "--model",
            "tiny",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env_without_stallscope(),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    [run_dir] = list(out.iterdir())
    return run_dir


def test_check_accepts_finding_rules_and_names_bad_ones(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(RULES)
    r = subprocess.run(
        stallscope_argv("alerts", "check", str(good)), capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert "the diagnosis so far finds input_bound.prep (confidence > 0" in r.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[alerts]]\nname = "x"\nfinding = "input_bound.slow"\n'
        '[[alerts]]\nname = "y"\nfinding = "host_swap"\nmetric = "gpu.temp_c"\n'
        "above = 1\n"
    )
    r = subprocess.run(
        stallscope_argv("alerts", "check", str(bad)), capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 1  # `alerts check`: 1 when the file has problems
    assert "alerts[0] (x).finding: 'input_bound.slow' is not a finding kind" in r.stderr
    assert "alerts[1] (y): give one of 'metric' or 'finding', not both" in r.stderr


@pytest.mark.slow
def test_a_finding_rule_fires_from_the_diagnosis_so_far(
    demo_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actions_mod, "FINDINGS_EVERY_S", 0.0)
    sink = AlertSink(
        parse_rules(
            {"alerts": [{"name": "input_starved", "finding": "input_bound.prep"}]}, defaults=False
        ),
        host="h",
    )
    sink.attach_run(demo_run)
    deadline = time.monotonic() + 30
    t = time.time()
    while not sink.transitions and time.monotonic() < deadline:
        sink.write(Sample(t))
        t += 1
        time.sleep(0.1)
    sink.close()
    [fired] = sink.transitions
    assert fired.rule.name == "input_starved" and fired.state == "firing"
    assert 0.5 <= fired.value <= 1.0  # the finding's confidence
    lines = (demo_run / "alerts.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["alert"] == "input_starved"


def test_replay_evaluates_finding_rules_on_the_whole_run(demo_run: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    r = subprocess.run(
        stallscope_argv("alerts", "replay", str(rules), str(demo_run), "--json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    [row] = doc["transitions"]
    assert row["alert"] == "input_starved" and row["state"] == "firing"
    assert doc["firing_at_end"] == ["input_starved"]
