"""Training-side alert actions: ``stallscope.on_alert(name, fn)``. The alert engine publishes
transitions into the run directory, the probe's writer thread picks them up, and the callback
runs on the training thread between steps; end to end under ``stallscope run --alerts``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import env_without_stallscope, stallscope_argv

import stallscope
from stallscope.alerts import parse_rules
from stallscope.alerts.actions import AlertSink
from stallscope.collect import Sample
from stallscope.metrics import Point
from stallscope.probe import callbacks
from stallscope.probe.callbacks import Alert, AlertInbox, run_callbacks
from stallscope.probe.recorder import Recorder, reset
from stallscope.store import RunStore, alertlog
from stallscope.store.alertlog import ALERTS_FILE, AlertTail

T0 = 1_763_712_000.0


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k in ("STALLSCOPE_RUN_DIR", "STALLSCOPE_OUT", "STALLSCOPE_ALERTS", "RANK"):
        monkeypatch.delenv(k, raising=False)
    callbacks.remove_alert_callbacks()
    yield
    reset()
    callbacks.remove_alert_callbacks()


def _sink(tmp_path: Path, doc: dict[str, object]) -> AlertSink:
    sink = AlertSink(parse_rules(doc, defaults=False), host="h")
    sink.attach_run(tmp_path)
    return sink


HOT = {
    "alerts": [
        {
            "name": "gpu_hot",
            "metric": "gpu.temp_c",
            "above": 85,
            "clear_below": 80,
            "cooldown_s": 0,
            "actions": [{"probe": "cool_down"}],
        }
    ]
}


def _temps(sink: AlertSink, temps: list[float], t0: float = T0) -> None:
    for i, v in enumerate(temps):
        sink.write(Sample(t0 + i, points=[Point("gpu.temp_c", "gpu0", v)]))


def test_the_sink_publishes_transitions_for_the_probe(tmp_path: Path) -> None:
    sink = _sink(tmp_path, HOT)
    _temps(sink, [70, 90, 91, 75])
    sink.close()
    lines = [json.loads(x) for x in (tmp_path / ALERTS_FILE).read_text().splitlines()]
    assert [(d["alert"], d["state"], d["value"], d["probe"]) for d in lines] == [
        ("gpu_hot", "firing", 90, ["cool_down"]),
        ("gpu_hot", "cleared", 75, ["cool_down"]),
    ]
    assert lines[0]["threshold"] == 85 and lines[0]["notify"] is True
    assert lines[0]["summary"].startswith("gpu_hot on gpu0 firing: gpu.temp_c = 90 (")


def test_the_inbox_reads_whole_lines_and_skips_what_cleared_before(tmp_path: Path) -> None:
    sink = _sink(tmp_path, HOT)
    _temps(sink, [90, 70, 90])  # fired, cleared, fired again: only the last one is current
    inbox = AlertInbox()
    got = inbox.poll(tmp_path)
    assert [(a.name, a.state, a.value) for a in got] == [("gpu_hot", "firing", 90.0)]
    assert [a.name for a in stallscope.alerts_firing()] == ["gpu_hot"]
    with open(tmp_path / ALERTS_FILE, "ab") as f:
        f.write(b'{"alert": "gpu_hot", "state": "cle')  # the engine is writing this line
    assert inbox.poll(tmp_path) == []
    with open(tmp_path / ALERTS_FILE, "ab") as f:
        f.write(b'ared", "entity": "gpu0", "value": 70, "threshold": 85, "ts": 1.0}\n')
    [a] = inbox.poll(tmp_path)
    assert (a.state, a.value, a.entity) == ("cleared", 70.0, "gpu0")
    assert callbacks.firing() == []


def test_the_alerts_file_is_read_by_whole_lines_and_again_when_replaced(tmp_path: Path) -> None:
    tail = AlertTail()
    assert tail.read(tmp_path) == (None, False)  # nothing fired yet: no file
    alertlog.append(tmp_path, {"alert": "a", "n": 1})
    alertlog.append(tmp_path, {"alert": "b", "n": 2})
    with open(tmp_path / ALERTS_FILE, "ab") as f:
        f.write(b'[1, 2]\nnot json\n{"alert": "c"')  # not objects, and a line being written
    assert tail.read(tmp_path) == ([{"alert": "a", "n": 1}, {"alert": "b", "n": 2}], False)
    assert tail.read(tmp_path) == (None, False)
    (tmp_path / ALERTS_FILE).write_bytes(alertlog.alert_line({"alert": "d"}))  # replaced
    assert tail.read(tmp_path) == ([{"alert": "d"}], True)
    assert tail.offset == (tmp_path / ALERTS_FILE).stat().st_size


def test_callbacks_run_by_rule_or_probe_name_and_respect_the_cooldown() -> None:
    seen: list[tuple[str, str]] = []
    stallscope.on_alert("gpu_hot", lambda a: seen.append(("by-name", a.state)))
    stallscope.on_alert("cool_down", lambda a: seen.append(("by-probe", a.state)), cleared=True)

    def alert(state: str, notify: bool = True) -> Alert:
        return Alert(
            "gpu_hot", state, "gpu0", 90.0, 85.0, "critical", "s", T0, ("cool_down",), notify
        )

    run_callbacks([alert("firing"), alert("cleared"), alert("firing", notify=False)])
    assert seen == [("by-name", "firing"), ("by-probe", "firing"), ("by-probe", "cleared")]
    with pytest.raises(TypeError):
        stallscope.on_alert("", print)


def test_nothing_is_read_unless_a_callback_is_registered(tmp_path: Path) -> None:
    sink = _sink(tmp_path, HOT)
    _temps(sink, [90])
    rec = Recorder(run_dir=tmp_path, register_atexit=False)
    rec.poll_alerts()
    assert rec.alerts.inbox is None and not rec.alerts.due
    rec.close()


def test_a_callback_runs_on_the_stepping_thread_between_steps(tmp_path: Path) -> None:
    RunStore(tmp_path / "run.db").close()
    rec = Recorder(run_dir=tmp_path, register_atexit=False, flush_interval=0.05)
    ran: list[tuple[str, int, int]] = []
    stallscope.on_alert(
        "cool_down", lambda a: ran.append((a.name, threading.get_ident(), rec.state.step))
    )
    sink = _sink(tmp_path, HOT)
    with rec.begin_step():
        pass
    _temps(sink, [95])
    deadline = time.monotonic() + 5
    while not rec.alerts.due and time.monotonic() < deadline:  # the writer polls every 0.05 s
        time.sleep(0.01)
    assert ran == []  # queued: nothing runs outside a step boundary
    with rec.begin_step():
        time.sleep(0.01)
    assert ran == [("gpu_hot", threading.get_ident(), 1)]
    rec.close()


TRAINER = """
import json, sys, threading, time
import stallscope

seen = []
def save(alert):
    seen.append({"name": alert.name, "state": alert.state, "value": alert.value,
                 "main_thread": threading.current_thread() is threading.main_thread(),
                 "summary": alert.summary})
stallscope.on_alert("save_checkpoint", save)
steps = 0
for x in stallscope.watch(range(100000)):
    time.sleep(0.01)
    steps += 1
    if seen or steps > 1500:
        break
json.dump({"seen": seen, "steps": steps}, open(sys.argv[1], "w"))
sys.exit(3)
"""


def _run_with_a_probe_alert(
    tmp_path: Path, trainer: str, *, timeout: float
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`stallscope run --alerts` of ``trainer`` (a script taking the path it reports to) with a
    rule that fires at once and asks the probe for ``save_checkpoint``."""
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[alerts]]\nname = "mem_used"\nmetric = "host.mem_used_mib"\nabove = 0\n'
        'actions = [{probe = "save_checkpoint"}]\n'
    )
    script = tmp_path / "train.py"
    script.write_text(trainer)
    out = tmp_path / "seen.json"
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
            str(script),
            str(out),
        ),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env=env_without_stallscope(),
    )
    return r, out


def test_run_with_alerts_reaches_the_trainer(tmp_path: Path) -> None:
    """A real `stallscope run --alerts`: the rule fires in the monitor process, the callback runs
    on the trainer's main thread, and the trainer's exit code passes through."""
    r, out = _run_with_a_probe_alert(tmp_path, TRAINER, timeout=120)
    assert r.returncode == 3, r.stderr
    doc = json.loads(out.read_text())
    assert doc["steps"] < 1500, "the callback never ran"
    [seen] = doc["seen"]
    assert seen["name"] == "mem_used" and seen["state"] == "firing" and seen["main_thread"]
    assert seen["value"] > 0 and "host.mem_used_mib > 0" in seen["summary"]


KERAS_TRAINER = """
import json, sys, threading
import numpy as np
import tensorflow as tf
import keras
import stallscope
from stallscope.integrations.keras import StallscopeCallback

seen = []
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
model.compile(optimizer="sgd", loss="mse")
def save(alert):
    seen.append({"name": alert.name, "state": alert.state,
                 "main_thread": threading.current_thread() is threading.main_thread()})
    model.stop_training = True
stallscope.on_alert("save_checkpoint", save)
data = tf.data.Dataset.from_tensor_slices((np.zeros((64, 8), "float32"),
                                           np.zeros((64, 4), "float32"))).batch(4)
h = model.fit(data, epochs=2000, verbose=0, callbacks=[StallscopeCallback()])
json.dump({"seen": seen, "epochs": len(h.history["loss"])}, open(sys.argv[1], "w"))
sys.exit(3)
"""


@pytest.mark.tensorflow
def test_run_with_alerts_reaches_a_keras_fit(tmp_path: Path) -> None:
    """The same under model.fit with the Keras callback: the alert callback runs on the
    training thread between two train-function calls, and can stop the training."""
    pytest.importorskip("tensorflow")
    r, out = _run_with_a_probe_alert(tmp_path, KERAS_TRAINER, timeout=180)
    assert r.returncode == 3, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["epochs"] < 2000, "the callback never ran"
    [seen] = doc["seen"]
    assert seen["name"] == "mem_used" and seen["state"] == "firing" and seen["main_thread"]
