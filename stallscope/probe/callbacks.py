"""Training-side alert actions: ``stallscope.on_alert("gpu_hot", fn)``.

The alert engine runs in the collector: in ``stallscope run``'s own process, or in a background
thread of the trainer when the probe runs standalone. Either way it appends every alert that
fires or clears to ``<run dir>/alerts.jsonl`` (:mod:`stallscope.store.alertlog`, one JSON object
a line, appended with one ``write``). The probe's writer thread (never the training thread) looks
at that file's size once per flush interval (1 s), and only while a callback is registered; new
lines go on a queue (:class:`AlertQueue`). Between two steps the training thread checks that
queue (one truth test per step) and runs the callbacks there, on the training thread, so a
callback may save a checkpoint, change the batch size or sleep until the GPU cooled down.

Nothing is read from the run, and nothing reaches the trainer, unless a callback is registered.
A callback runs for an alert of its name, or for an alert whose rule has a ``{probe = "name"}``
action of its name; only notified transitions run it (the cooldown holds, like every action).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "Alert",
    "AlertInbox",
    "AlertQueue",
    "firing",
    "on_alert",
    "registered",
    "remove_alert_callbacks",
    "run_callbacks",
]


class Alert(NamedTuple):
    """An alert as a training-side callback receives it."""

    name: str  #: the rule's name ("gpu_hot")
    state: str  #: "firing" or "cleared"
    entity: str  #: what it is about ("gpu0", "nvme0n1", "" for the host)
    value: float  #: the value that made it fire or clear
    threshold: float
    severity: str
    summary: str  #: one line with the numbers and the rule
    ts: float  #: Unix time of the transition (collector's clock)
    probe: tuple[str, ...]  #: names of the rule's ``{probe = ...}`` actions
    notify: bool  #: False inside the cooldown (callbacks do not run then)


Callback = Callable[[Alert], object]

_lock = threading.Lock()
#: name -> [(fn, also on clearing)]
_callbacks: dict[str, list[tuple[Callback, bool]]] = {}
#: (name, entity) -> the alert firing now, as the probe last read
_firing: dict[tuple[str, str], Alert] = {}


def on_alert(name: str, fn: Callback, *, cleared: bool = False) -> None:
    """Run ``fn(alert)`` on the training thread, between two steps, when the alert ``name``
    fires (and clears too, with ``cleared=True``). ``name`` is a rule's name or the name of a
    ``{probe = "name"}`` action. The probe polls for alerts only once a callback is registered.
    An exception raised by ``fn`` propagates into the training loop: it is your code."""
    if not isinstance(name, str) or not name:
        raise TypeError("on_alert: name must be a non-empty string (a rule or probe action name)")
    if not callable(fn):
        raise TypeError("on_alert: fn must be callable, taking one Alert")
    with _lock:
        _callbacks.setdefault(name, []).append((fn, cleared))


def remove_alert_callbacks() -> None:
    """Forget every callback (tests, notebooks)."""
    with _lock:
        _callbacks.clear()
        _firing.clear()


def registered() -> bool:
    """Whether any callback is registered (the probe polls only then)."""
    return bool(_callbacks)


def firing() -> list[Alert]:
    """Alerts firing now, as the probe last read them (a callback that pauses training until
    the GPU cooled down waits for its alert to leave this list)."""
    with _lock:
        return list(_firing.values())


def _alert(d: dict[str, Any]) -> Alert | None:
    """An alerts file's record as callbacks receive it; None when it is not a transition."""
    try:
        probe = d.get("probe") or []
        return Alert(
            str(d["alert"]),
            str(d["state"]),
            str(d.get("entity") or ""),
            float(d["value"]),
            float(d["threshold"]),
            str(d.get("severity", "")),
            str(d.get("summary", "")),
            float(d["ts"]),
            tuple(str(p) for p in probe),
            bool(d.get("notify", True)),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class AlertInbox:
    """Reads the alerts the engine appended since the last look (writer thread only)."""

    def __init__(self) -> None:
        # imported here: the store package opens SQLite, which importing the probe must not
        from stallscope.store.alertlog import AlertTail

        self._tail = AlertTail()
        self._first = True

    def poll(self, run_dir: Path | None) -> list[Alert]:
        """New alerts in ``run_dir``'s alerts file, oldest first. The first look skips what
        already cleared: a callback registered late hears only of alerts firing now."""
        if run_dir is None:
            return []
        recs, restarted = self._tail.read(run_dir)
        if restarted:
            self._first = True
        if recs is None:
            return []
        got = [a for a in map(_alert, recs) if a is not None]
        with _lock:
            for a in got:
                key = (a.name, a.entity)
                if a.state == "firing":
                    _firing[key] = a
                else:
                    _firing.pop(key, None)
            if self._first:
                self._first = False
                got = [a for a in _firing.values()]
        return got


class AlertQueue:
    """The alerts due to run callbacks, from a recorder's writer thread to its training
    thread. The writer fills ``due`` (:meth:`poll`); the training thread tests it once per step
    and empties it between steps (:meth:`run`)."""

    __slots__ = ("due", "inbox")

    def __init__(self) -> None:
        self.due: deque[Alert] = deque()
        self.inbox: AlertInbox | None = None  #: made on the first look with a callback

    def poll(self, run_dir: Path | None, say: Callable[[str, str], None]) -> None:
        """Writer thread: queue the alerts the engine published since the last look. Reads
        nothing unless a callback is registered; a read error is said (``say``) and skipped."""
        if not registered():
            return
        if self.inbox is None:
            self.inbox = AlertInbox()
        try:
            got = self.inbox.poll(run_dir)
        except OSError as exc:
            say("alerts", f"cannot read alerts from {run_dir}: {exc}")
            return
        self.due.extend(got)

    def run(self) -> int:
        """Training thread: run the callbacks of the alerts queued so far; returns how many
        ran."""
        due = self.due
        return run_callbacks([due.popleft() for _ in range(len(due))])


def run_callbacks(alerts: list[Alert]) -> int:
    """Run the callbacks ``alerts`` call for, in order (training thread); returns how many."""
    n = 0
    for a in alerts:
        if not a.notify:
            continue
        with _lock:
            todo = [
                (fn, clr)
                for key in (a.name, *a.probe)
                if key in _callbacks
                for fn, clr in _callbacks[key]
            ]
        for fn, clr in todo:
            if a.state == "firing" or clr:
                fn(a)
                n += 1
    return n
