"""SMART health as metrics, for the alert engine and Prometheus: a slow source.

``smartctl`` can take seconds (a drive waking up) and SMART counters change over hours, so the
drives are checked on a background thread every :data:`SMART_EVERY_S` seconds (the same check as
``stallscope disk``: :func:`~stallscope.tools.health_state.check_drives`, growth judged against
the SMART state file) and each sample reports the latest check. Per drive (entity: the device
name, ``sda``, ``nvme0n1``):

``smart.failing``
    1 while the drive's verdict is ``failing`` (docs/disk-health.md), else 0.
``smart.medium_growth``
    how much the medium-defect counters (reallocated, pending, offline-uncorrectable,
    reported-uncorrect, NVMe media errors, SAS grown defects) grew since the baseline check.
``smart.reallocated``, ``smart.pending``, ``smart.nvme_used_pct``, ``smart.nvme_spare_pct``
    the raw values, when the drive reports them (what a trend fit and Prometheus need).
``smart.days_left``
    days until the soonest value crosses its threshold at the current rate (a line fitted
    through the drive's past checks, :mod:`stallscope.sources.smart_trend`), when one heads
    there.

Drives whose SMART cannot be read (virtual disks, no permission) give no points; why is said
once as a run event. :func:`drive_points` is the pure part.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from stallscope.metrics import Point
from stallscope.sources.base import Source
from stallscope.sources.health import MEDIUM_FAIL_AT, DriveHealth

__all__ = ["SMART_EVERY_S", "SmartSource", "drive_points"]

#: seconds between two SMART checks of the watched drives
SMART_EVERY_S = 600.0

Check = Callable[[Sequence[str]], "tuple[list[DriveHealth], list[str]]"]


def _entity(drive: DriveHealth) -> str:
    dev = drive.device or ""
    return dev.rsplit("/", 1)[-1] if dev else ""


def drive_points(drive: DriveHealth) -> dict[str, float]:
    """The metrics of one drive's check (no entity), pure; {} when SMART could not be read."""
    if drive.verdict == "unknown" and not drive.counters:
        return {}
    c, a = drive.counters, drive.attributes
    out: dict[str, float] = {
        "failing": 1.0 if drive.verdict == "failing" else 0.0,
        "medium_growth": float(sum(g.end - g.start for k, g in drive.growth.items()
                                   if k in MEDIUM_FAIL_AT)),
    }
    if "Reallocated_Sector_Ct" in c:
        out["reallocated"] = float(c["Reallocated_Sector_Ct"])
    if "Current_Pending_Sector" in c:
        out["pending"] = float(c["Current_Pending_Sector"])
    if isinstance(a.get("percentage_used"), int):
        out["nvme_used_pct"] = float(a["percentage_used"])
    if isinstance(a.get("available_spare"), int):
        out["nvme_spare_pct"] = float(a["available_spare"])
    if drive.forecast:  # soonest first (sources/smart_trend.py)
        out["days_left"] = round(float(drive.forecast[0].days), 2)
    return out


#: seconds between two checks the source records in the SMART state file: the history that
#: growth and the trend fit (smart.days_left) need builds up at one point a day, without the
#: 10-minute checks pushing older history out of the file
SAVE_EVERY_S = 86400.0


class _DailySave:
    """The default check: ``check_drives``, recording a check in the state file on the first
    call and then once a day (a long-running agent builds its own history)."""

    def __init__(self) -> None:
        self._next_save = 0.0

    def __call__(self, devices: Sequence[str]) -> tuple[list[DriveHealth], list[str]]:
        import time

        from stallscope.tools.health_state import check_drives

        save = time.monotonic() >= self._next_save
        if save:
            self._next_save = time.monotonic() + SAVE_EVERY_S
        return check_drives(devices, save=save)


class SmartSource(Source):
    """The latest SMART check of ``devices``, refreshed every ``every_s`` in the background."""

    name = "smart"

    def __init__(self, devices: Sequence[str], *, every_s: float = SMART_EVERY_S,
                 check: Check | None = None) -> None:
        self.devices = list(devices)
        self.every_s = every_s
        self._check = check or _DailySave()
        self._latest: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: set[str] = set()

    def open(self) -> None:
        from stallscope.errors import SourceUnavailable

        if not self.devices:
            raise SourceUnavailable("no drive to watch")
        self._thread = threading.Thread(target=self._loop, name="stallscope-smart", daemon=True)
        self._thread.start()

    def check_now(self) -> None:
        """One check of every drive (the background thread's work; tests call it)."""
        drives, notes = self._check(self.devices)
        latest: dict[str, dict[str, float]] = {}
        for d in drives:
            pts = drive_points(d)
            if pts:
                latest[_entity(d)] = pts
            elif d.reasons and d.device not in self._said:
                self._said.add(d.device or "")
                self.emit("note", f"SMART of {d.device}: {d.reasons[0]}")
        for n in notes:
            if n not in self._said:
                self._said.add(n)
                self.emit("note", n)
        with self._lock:
            self._latest = latest

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check_now()
            except Exception as exc:  # a broken check must not end the thread: say it
                if "error" not in self._said:
                    self._said.add("error")
                    self.emit("error", f"SMART check failed: {exc!r}")
            self._stop.wait(self.every_s)

    def sample(self, now: float) -> Any:
        with self._lock:
            return {k: dict(v) for k, v in self._latest.items()}

    def points(self, payload: Any) -> list[Point]:
        return [Point(f"smart.{k}", ent, v) for ent, d in payload.items() for k, v in d.items()]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:  # a smartctl under way ends within its own time limit
            self._thread.join(timeout=5)
