"""The SMART counters of past checks, kept so that each check can report growth.

One small JSON file (default ``~/.local/state/stallscope/smart.json``; ``$STALLSCOPE_STATE_DIR``
or ``$XDG_STATE_HOME/stallscope`` move it) holds, per drive identity (serial, else model +
capacity), the last :data:`MAX_CHECKS` checks: their time and counters. Writes are atomic
(temporary file + rename). A damaged file is set aside as ``smart.json.bad`` and a fresh one
started, with a note saying so; it never stops a check.

Growth is measured against a *baseline* check (:func:`pick_baseline`): the oldest check within
the last :data:`WINDOW_S` (30 days), or, when there is none that recent, the latest check before
now. So "Reallocated_Sector_Ct 1 → 304 since 2026-11-20" keeps being reported for a month after
it happened, however often ``stallscope disk`` runs, instead of vanishing at the next check.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stallscope.errors import UsageError
from stallscope.sources.disk import device_info
from stallscope.sources.health import (
    DriveHealth,
    Growth,
    apply_growth,
    compute_growth,
    iso_time,
    read_smart,
    validate_device,
)
from stallscope.sources.smart_trend import drive_levels, forecast_drive
from stallscope.store.paths import state_dir

__all__ = [
    "MAX_CHECKS",
    "WINDOW_S",
    "Check",
    "HealthState",
    "check_drives",
    "default_state_path",
    "pick_baseline",
]

STATE_VERSION = 1
MAX_CHECKS = 64  #: per drive; older checks are dropped
MAX_DRIVES = 512
WINDOW_S = 30 * 86400.0  #: growth is reported against the oldest check this recent


@dataclass(frozen=True)
class Check:
    """One past check of one drive: Unix time and its counters."""

    ts: float
    counters: Mapping[str, int]
    #: values the forecast follows (smart_trend.drive_levels); absent in older files
    levels: Mapping[str, float] = field(default_factory=dict)


def default_state_path(env: Mapping[str, str] | None = None) -> Path:
    """``$STALLSCOPE_STATE_DIR/smart.json``, else ``$XDG_STATE_HOME/stallscope/smart.json``,
    else ``~/.local/state/stallscope/smart.json``."""
    return state_dir(env) / "smart.json"


def pick_baseline(checks: list[Check], now: float, window_s: float = WINDOW_S) -> Check | None:
    """The check growth is measured from: the oldest within ``window_s`` before ``now``, else
    the newest before ``now`` (pure)."""
    past = sorted((c for c in checks if c.ts < now), key=lambda c: c.ts)
    if not past:
        return None
    recent = [c for c in past if c.ts >= now - window_s]
    return recent[0] if recent else past[-1]


def _parse_state(doc: object) -> dict[str, list[Check]]:
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
        raise ValueError("not a stallscope SMART state file (version 1)")
    drives = doc.get("drives")
    if not isinstance(drives, dict):
        raise ValueError("'drives' is not an object")
    out: dict[str, list[Check]] = {}
    for key, entry in drives.items():
        checks = entry.get("checks") if isinstance(entry, dict) else None
        if not isinstance(key, str) or not isinstance(checks, list):
            raise ValueError(f"bad entry for {key!r}")
        parsed = []
        for c in checks:
            if not isinstance(c, dict) or not isinstance(c.get("ts"), (int, float)):
                raise ValueError(f"bad check for {key!r}")
            counters = c.get("counters")
            if not isinstance(counters, dict):
                raise ValueError(f"bad counters for {key!r}")
            levels = c.get("levels")
            parsed.append(Check(float(c["ts"]), {
                str(k): v for k, v in counters.items()
                if isinstance(v, int) and not isinstance(v, bool)}, {
                str(k): float(v) for k, v in (levels if isinstance(levels, dict) else {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}))
        out[key] = parsed
    return out


@dataclass
class HealthState:
    """Past checks per drive identity; :meth:`load`, :meth:`observe`, :meth:`save`."""

    path: Path
    drives: dict[str, list[Check]] = field(default_factory=dict)
    note: str | None = None  #: set when the file was damaged and started afresh

    @classmethod
    def load(cls, path: Path | None = None) -> HealthState:
        p = path or default_state_path()
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return cls(p)
        except OSError as exc:
            return cls(p, note=f"could not read {p} ({exc.strerror}); growth starts afresh")
        try:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return cls(p, _parse_state(json.loads(data.decode("utf-8"))))
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            bad = p.with_name(p.name + ".bad")
            try:
                os.replace(p, bad)
            except OSError:
                bad = p
            return cls(p, note=f"{p} was damaged ({exc}); kept as {bad}, growth starts afresh")

    def baseline(self, key: str, now: float, window_s: float = WINDOW_S) -> Check | None:
        return pick_baseline(self.drives.get(key, []), now, window_s)

    def record(self, key: str, ts: float, counters: Mapping[str, int],
               levels: Mapping[str, float] | None = None) -> None:
        checks = self.drives.setdefault(key, [])
        checks.append(Check(ts, dict(counters), dict(levels or {})))
        checks.sort(key=lambda c: c.ts)
        del checks[:-MAX_CHECKS]
        if len(self.drives) > MAX_DRIVES:  # forget the drives not seen for longest
            stale = sorted(self.drives, key=lambda k: self.drives[k][-1].ts if self.drives[k]
                           else 0.0)
            for k in stale[: len(self.drives) - MAX_DRIVES]:
                del self.drives[k]

    def observe(self, drive: DriveHealth, now: float,
                window_s: float = WINDOW_S) -> DriveHealth:
        """Judge ``drive`` against its baseline check and record this check.

        Drives without counters or identity (unknown verdicts) are returned unchanged."""
        key = drive.identity()
        if key is None or not drive.counters:
            return drive
        base = self.baseline(key, now, window_s)
        growth: dict[str, Growth] = {}
        if base is not None:
            growth = compute_growth(base.counters, drive.counters, iso_time(base.ts))
        levels = drive_levels(drive)
        history = [(c.ts, c.levels) for c in self.drives.get(key, []) if c.levels and c.ts < now]
        self.record(key, now, drive.counters, levels)
        judged = apply_growth(drive, growth)
        fc = forecast_drive([*history, (now, levels)], drive.attributes)
        return replace(judged, forecast=tuple(fc)) if fc else judged

    def to_json(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "drives": {
            k: {"checks": [{"ts": c.ts, "counters": dict(c.counters),
                            **({"levels": dict(c.levels)} if c.levels else {})} for c in v]}
            for k, v in self.drives.items()}}

    def save(self) -> None:
        """Write atomically; raise OSError if the directory cannot be written."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".smart.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_json(), f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def check_drives(devices: Sequence[str], *, device_type: str | None = None,
                 smartctl: Sequence[str] = ("smartctl",), use_state: bool = True,
                 state_path: Path | None = None,
                 save: bool = True) -> tuple[list[DriveHealth], list[str]]:
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
                extra.append(f"{disk} is a {info.get('kind')} device: virtual disks rarely "
                             "pass SMART through")
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
            notes.append(f"could not save {state.path} ({exc.strerror}): growth will not be "
                         "tracked; set STALLSCOPE_STATE_DIR to a writable directory")
    return drives, notes
