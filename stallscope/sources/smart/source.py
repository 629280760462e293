"""SMART health as metrics, for the alert engine and Prometheus: a slow source; and the check.

:func:`check_drives` is one check of some drives, the same for ``stallscope disk``,
``stallscope run --data`` (the dataset's drive) and this source: SMART read with smartctl
(:mod:`.runner`), growth judged against the SMART state file and the trend fitted through the
drive's past checks (:mod:`.history`).

``smartctl`` can take seconds (a drive waking up) and SMART counters change over hours, so the
source checks its drives on a background thread every :data:`SMART_EVERY_S` seconds and each
sample reports the latest check. Per drive (entity: the device name, ``sda``, ``nvme0n1``):

``smart.failing``
    1 while the drive's verdict is ``failing`` (docs/disk-health.md), else 0.
``smart.medium_growth``
    how much the medium-defect counters (reallocated, pending, offline-uncorrectable,
    reported-uncorrect, NVMe media errors, SAS grown defects) grew since the baseline check.
``smart.reallocated``, ``smart.pending``, ``smart.nvme_used_pct``, ``smart.nvme_spare_pct``
    the raw values, when the drive reports them (what a trend fit and Prometheus need).
``smart.days_left``
    days until the soonest value crosses its threshold at the current rate (a line fitted
    through the drive's past checks, :func:`~stallscope.sources.smart.history.forecast_drive`),
    when one heads there.

Drives whose SMART cannot be read (virtual disks, no permission) give no points; why is said
once as a run event. :func:`drive_points` is the pure part.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from stallscope.errors import SourceUnavailable, UsageError
from stallscope.metrics import Point
from stallscope.sources.base import Source
from stallscope.sources.blockdev import device_info
from stallscope.sources.smart.history import HealthState, default_state_path
from stallscope.sources.smart.parse import MEDIUM_FAIL_AT, DriveHealth
from stallscope.sources.smart.runner import read_smart, validate_device

__all__ = ["SAVE_EVERY_S", "SMART_EVERY_S", "SmartSource", "check_drives", "drive_points"]

#: seconds between two SMART checks of the watched drives
SMART_EVERY_S = 600.0

Check = Callable[[Sequence[str]], "tuple[list[DriveHealth], list[str]]"]


def check_drives(
    devices: Sequence[str],
    *,
    device_type: str | None = None,
    smartctl: Sequence[str] = ("smartctl",),
    use_state: bool = True,
    state_path: Path | None = None,
    save: bool = True,
) -> tuple[list[DriveHealth], list[str]]:
    """Read SMART for each device (partitions map to their disk), judge growth against the
    state file and record this check. Returns the drives and notes for the user.

    Used by ``stallscope disk`` and by ``stallscope run --data`` (the dataset's drive). With
    ``save=False`` growth is judged but this check is not recorded (the periodic checks of the
    ``smart`` source must not push a month of history out of the file)."""
    notes: list[str] = []
    state = None
    if use_state:
        state = HealthState.load(state_path or default_state_path())
        if state.note:
            notes.append(state.note)
    drives = []
    for name in devices:
        disk = name
        extra: list[str] = []
        try:
            info = device_info(name)
            disk = str(info.get("disk") or name)
            if info.get("virtual"):
                extra.append(
                    f"{disk} is a {info.get('kind')} device: virtual disks rarely "
                    "pass SMART through"
                )
        except UsageError as exc:
            extra.append(str(exc))
        drive = read_smart(validate_device(disk), device_type=device_type, smartctl=smartctl)
        if extra:
            drive = replace(drive, notes=(*drive.notes, *extra))
        if state is not None:
            drive = state.observe(drive, time.time())
        drives.append(drive)
    if save and state is not None and any(d.counters for d in drives):
        try:
            state.save()
        except OSError as exc:
            notes.append(
                f"could not save {state.path} ({exc.strerror}): growth will not be "
                "tracked; set STALLSCOPE_STATE_DIR to a writable directory"
            )
    return drives, notes


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
        "medium_growth": float(
            sum(g.end - g.start for k, g in drive.growth.items() if k in MEDIUM_FAIL_AT)
        ),
    }
    if "Reallocated_Sector_Ct" in c:
        out["reallocated"] = float(c["Reallocated_Sector_Ct"])
    if "Current_Pending_Sector" in c:
        out["pending"] = float(c["Current_Pending_Sector"])
    if isinstance(a.get("percentage_used"), int):
        out["nvme_used_pct"] = float(a["percentage_used"])
    if isinstance(a.get("available_spare"), int):
        out["nvme_spare_pct"] = float(a["available_spare"])
    if drive.forecast:  # soonest first (history.forecast_drive)
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
        save = time.monotonic() >= self._next_save
        if save:
            self._next_save = time.monotonic() + SAVE_EVERY_S
        return check_drives(devices, save=save)


class SmartSource(Source):
    """The latest SMART check of ``devices``, refreshed every ``every_s`` in the background."""

    name = "smart"

    def __init__(
        self, devices: Sequence[str], *, every_s: float = SMART_EVERY_S, check: Check | None = None
    ) -> None:
        self.devices = list(devices)
        self.every_s = every_s
        self._check = check or _DailySave()
        self._latest: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: set[str] = set()

    def open(self) -> None:
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
