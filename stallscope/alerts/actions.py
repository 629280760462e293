"""Delivering alerts: webhook, command, email and the run's own events, off the collector's
thread.

Every delivery is time-limited and never blocks sampling: the :class:`AlertSink` puts
notifications on a bounded queue that one background thread works through. A webhook is
retried with back-off (3 tries); a command runs from its argv list, never through a shell, with
the alert in ``STALLSCOPE_ALERT_*`` environment variables, and its output goes to the run's
events. Each action runs with the privileges of the process that runs stallscope, no more.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import smtplib
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallscope.alerts.engine import AlertEngine, Transition
from stallscope.alerts.rulefile import FINDING_PREFIX, Action, RulesFile, Smtp, finding_metric
from stallscope.collect.sinks import Sink
from stallscope.metrics import Point
from stallscope.store import alertlog

if TYPE_CHECKING:
    from stallscope.collect.collector import Sample

__all__ = ["AlertSink", "alert_body", "deliver"]

Say = Callable[[float, str, str, str], None]

WEBHOOK_TIMEOUT_S = 5.0
#: after the run (or the agent) stops, notifications still pending get this long, whole; what
#: is left then is dropped and said so, and a command still running is killed
CLOSE_GRACE_S = 5.0
#: seconds between two diagnoses of the run for `finding` rules
FINDINGS_EVERY_S = 30.0
WEBHOOK_TRIES = 3
COMMAND_TIMEOUT_S = 30.0
QUEUE_SIZE = 256


def alert_body(t: Transition, *, host: str, run: str) -> dict[str, Any]:
    """What a webhook receives (JSON) and an email says: no links, only facts."""
    return {
        "alert": t.rule.name,
        "state": t.state,
        "severity": t.rule.severity,
        "metric": t.rule.metric,
        "entity": t.entity,
        "value": t.value,
        "threshold": t.rule.threshold,
        "rule": t.rule.describe(),
        "host": host,
        "run": run,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t.ts)),
        "ts": t.ts,
        "summary": t.summary(),
    }


#: the command actions running now (each in its own process group), killed at close
_RUNNING: set[subprocess.Popen[str]] = set()
_RUNNING_LOCK = threading.Lock()


def _webhook(url: str, body: dict[str, Any], stop: threading.Event | None = None) -> str:
    data = json.dumps(body).encode()
    last = ""
    for attempt in range(WEBHOOK_TRIES):
        if stop is not None and stop.is_set():
            break
        req = urllib.request.Request(
            url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "stallscope-alerts"},
        )
        try:
            with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT_S) as resp:
                return f"webhook {url}: HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
            if exc.code < 500:
                break  # the receiver refused it: retrying will not help
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        if stop is not None:
            if stop.wait(0.5 * 2**attempt):
                break  # closing: no more retries
        else:
            time.sleep(0.5 * 2**attempt)
    raise OSError(f"webhook {url} failed after retries: {last}")


def _command(argv: tuple[str, ...], body: dict[str, Any]) -> str:
    env = dict(os.environ)
    for k, v in body.items():
        env[f"STALLSCOPE_ALERT_{k.upper()}"] = str(v)
    try:
        # its own process group: at close, it and whatever it started are killed together
        proc = subprocess.Popen(
            list(argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise OSError(f"command {argv[0]}: {exc.strerror or exc}") from exc
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        proc.communicate()
        raise OSError(f"command {argv[0]} timed out after {COMMAND_TIMEOUT_S:g} s") from exc
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    if proc.returncode < 0 and -proc.returncode == signal.SIGKILL:
        raise OSError(f"command {argv[0]} was killed: the run ended while it ran")
    out = (stdout + stderr).strip().replace("\n", " | ")[:500]
    msg = f"command {argv[0]} exited {proc.returncode}" + (f": {out}" if out else "")
    if proc.returncode != 0:
        raise OSError(msg)
    return msg


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass  # gone already


def kill_running_commands() -> int:
    """Kill every command action still running (and what it started); how many."""
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for proc in procs:
        _kill_group(proc)
    return len(procs)


def _email(to: str, body: dict[str, Any], smtp: Smtp) -> str:
    msg = EmailMessage()
    msg["Subject"] = f"[stallscope] {body['severity']}: {body['summary']}"[:200]
    msg["From"] = smtp.sender
    msg["To"] = to
    msg.set_content("\n".join(f"{k}: {v}" for k, v in body.items()))
    with smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout_s) as s:
        if smtp.starttls:
            s.starttls()
        if smtp.user:
            s.login(smtp.user, os.environ.get(smtp.password_env or "", ""))
        s.send_message(msg)
    return f"email to {to} via {smtp.host}:{smtp.port}"


def deliver(
    action: Action, body: dict[str, Any], smtp: Smtp | None, stop: threading.Event | None = None
) -> str:
    """Run one action; returns what happened, raises OSError/smtplib errors when it failed.
    ``stop``: set when the run ends (a webhook then retries no more)."""
    if action.kind == "webhook":
        return _webhook(str(action.target), body, stop)
    if action.kind == "command":
        return _command(tuple(action.target), body)
    if action.kind == "email":
        if smtp is None:
            raise OSError("email action without an [smtp] table")
        return _email(str(action.target), body, smtp)
    return "logged"  # log; probe actions travel through the run directory (publish)


class AlertSink(Sink):
    """Evaluates the rules on every sample; records each transition as a run event and hands
    the notifications to a background thread that runs their actions."""

    name = "alerts"

    def __init__(self, rules: RulesFile, *, run: str = "", host: str | None = None) -> None:
        self.rules = rules
        self.engine = AlertEngine(rules.rules)
        self.run = run
        self.host = host or socket.gethostname()
        #: the run directory whose alerts file the probe reads (training-side callbacks)
        self.publish: Path | None = None
        self.transitions: list[Transition] = []
        self.delivered: list[str] = []
        self.dropped = 0
        self._say: Say | None = None
        self._queue: queue.Queue[Transition | None] = queue.Queue(QUEUE_SIZE)
        self._stop = threading.Event()  #: set at close: what is still pending is dropped
        self._worker = threading.Thread(target=self._work, name="stallscope-alerts", daemon=True)
        self._worker.start()
        # `finding` rules: the run's diagnosis so far, recomputed every FINDINGS_EVERY_S off
        # the collector's thread; each rule reads its kind's confidence (0 while absent)
        self._kinds = sorted(
            {
                r.metric[len(FINDING_PREFIX) :]
                for r in rules.rules
                if r.metric.startswith(FINDING_PREFIX)
            }
        )
        self.findings_dir: Path | None = None
        self._findings: dict[str, float] | None = None  # None: no diagnosis yet
        self._next_diagnosis = 0.0
        self._diagnosing = threading.Lock()

    def bind(self, say: Say) -> None:
        self._say = say

    def _tell(self, ts: float, kind: str, message: str) -> None:
        if self._say is not None:
            self._say(ts, "alerts", kind, message)

    def attach_run(self, run_dir: Path) -> None:
        """Name the run in notifications and publish transitions into its directory, where the
        trainer's probe finds them (``stallscope.on_alert``)."""
        self.run = str(run_dir)
        self.publish = Path(run_dir)
        self.findings_dir = Path(run_dir)

    def _findings_due(self) -> None:
        if self.findings_dir is None or time.monotonic() < self._next_diagnosis:
            return
        if not self._diagnosing.acquire(blocking=False):
            return
        self._next_diagnosis = time.monotonic() + FINDINGS_EVERY_S
        threading.Thread(
            target=self._diagnose, name="stallscope-alert-findings", daemon=True
        ).start()

    def _diagnose(self) -> None:
        try:
            from stallscope.analysis.diagnose import diagnose_run

            assert self.findings_dir is not None
            doc = diagnose_run(self.findings_dir)
            found: dict[str, float] = {}
            for f in doc.get("findings", []):
                kind, conf = f.get("kind"), f.get("confidence")
                if isinstance(kind, str) and isinstance(conf, (int, float)):
                    found[kind] = max(found.get(kind, 0.0), float(conf))
            self._findings = found
        except Exception as exc:  # a run too young or unreadable: try again next time
            self._tell(time.time(), "note", f"finding rules: diagnosis failed ({exc})")
        finally:
            self._diagnosing.release()

    def _publish(self, t: Transition) -> None:
        if self.publish is None:
            return
        body = alert_body(t, host=self.host, run=self.run)
        body["notify"] = t.notify
        body["probe"] = [str(a.target) for a in t.rule.actions if a.kind == "probe"]
        try:
            alertlog.append(self.publish, body)  # one write of one line: never half a line
        except OSError as exc:
            self._tell(
                t.ts, "alert_action_error", f"{t.rule.name}: cannot publish to the trainer: {exc}"
            )

    def write(self, sample: Sample) -> None:
        points: list[Point] | Any = sample.points
        if self._kinds:
            self._findings_due()
            found = self._findings
            if found is not None:
                points = [
                    *points,
                    *(Point(finding_metric(k), "", found.get(k, 0.0)) for k in self._kinds),
                ]
        for t in self.engine.evaluate(sample.ts, points):
            self.transitions.append(t)
            self._publish(t)
            clock = time.strftime("%H:%M:%S", time.localtime(t.ts))
            self._tell(
                t.ts,
                f"alert_{t.state}",
                f"{clock} {t.summary()}" + ("" if t.notify else " (not notified: within cooldown)"),
            )
            if t.notify and any(a.kind not in ("log", "probe") for a in t.rule.actions):
                try:
                    self._queue.put_nowait(t)
                except queue.Full:
                    self.dropped += 1
                    self._tell(
                        t.ts,
                        "alert_dropped",
                        f"alert queue full: {self.dropped} notifications dropped",
                    )

    def _work(self) -> None:
        while True:
            t = self._queue.get()
            if t is None or self._stop.is_set():
                return
            body = alert_body(t, host=self.host, run=self.run)
            for action in t.rule.actions:
                if action.kind in ("log", "probe") or self._stop.is_set():
                    continue
                try:
                    done = deliver(action, body, self.rules.smtp, self._stop)
                    self.delivered.append(done)
                    self._tell(time.time(), "alert_action", f"{t.rule.name}: {done}")
                except (OSError, smtplib.SMTPException, ValueError) as exc:
                    self._tell(
                        time.time(),
                        "alert_action_error",
                        f"{t.rule.name}: {action.kind} failed: {exc}",
                    )

    def close(self, timeout_s: float = CLOSE_GRACE_S) -> None:
        """Deliver what is queued within ``timeout_s`` in all, then stop: notifications still
        pending are dropped (one event says how many), a command action still running is
        killed with its process group, and a webhook retries no more. The run's exit (and
        the trainer's exit code) never waits longer than that."""
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        self._worker.join(timeout=max(0.0, deadline - time.monotonic()))
        if not self._worker.is_alive():
            return
        self._stop.set()
        pending = self._queue.qsize()
        killed = kill_running_commands()
        self._tell(
            time.time(),
            "alert_action_error",
            f"the run ended with {pending} notification(s) still pending after "
            f"{timeout_s:g} s: dropped"
            + (f"; {killed} command action(s) killed" if killed else ""),
        )
        self._worker.join(timeout=1.0)
