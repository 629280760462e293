"""A drive's past checks: the SMART state file, the baseline growth is judged from, and the trend.

**The state file.** One small JSON file (default ``~/.local/state/stallscope/smart.json``;
``$STALLSCOPE_STATE_DIR`` or ``$XDG_STATE_HOME/stallscope`` move it) holds, per drive identity
(serial, else model + capacity), the last :data:`MAX_CHECKS` checks: their time and counters.
Writes are atomic (temporary file + rename). A damaged file is set aside as ``smart.json.bad``
and a fresh one started, with a note saying so; it never stops a check.

**Growth** is measured against a *baseline* check (:func:`pick_baseline`): the oldest check within
the last :data:`WINDOW_S` (30 days), or, when there is none that recent, the latest check before
now. So "Reallocated_Sector_Ct 1 → 304 since 2026-11-20" keeps being reported for a month after
it happened, however often ``stallscope disk`` runs, instead of vanishing at the next check.

**The trend.** When will a drive cross its threshold? Each tracked value of a drive's past checks
(the state file, or several saved ``smartctl --json`` documents of one drive:
:func:`explain_series`) gets a least-squares line against time (:func:`stallscope.stats.fit_line`);
where the line heads for the value's threshold, the forecast says when it gets there at the
current rate: "available_spare falls below its threshold 10% in ~23 days (-2.0 %/day over 5
checks in 12 days)". Tracked values and thresholds (docs/disk-health.md):

- medium-defect counters (``Reallocated_Sector_Ct`` 5, ``Current_Pending_Sector`` 197,
  ``Offline_Uncorrectable`` 198, ``Reported_Uncorrect`` 187, NVMe ``media_errors``, SAS grown
  defects and uncorrected errors): the count at which the verdict turns "failing"
  (:data:`~stallscope.sources.smart.parse.MEDIUM_FAIL_AT`);
- NVMe ``percentage_used``: 100% of rated endurance;
- NVMe ``available_spare``: the drive's own ``available_spare_threshold`` (else 10%).

A forecast needs :data:`MIN_CHECKS` checks spanning at least :data:`MIN_SPAN_S` and a slope
towards the threshold; a value already past it has no forecast (the verdict says so), nor has
one that would take more than :data:`HORIZON_DAYS`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stallscope.sources.smart.parse import (
    MEDIUM_FAIL_AT,
    WEAR_FAILING_PCT,
    DriveHealth,
    Growth,
    iso_time,
)
from stallscope.sources.smart.verdict import apply_growth, compute_growth
from stallscope.stats import fit_line
from stallscope.store.paths import state_dir

__all__ = [
    "HORIZON_DAYS",
    "MAX_CHECKS",
    "MIN_CHECKS",
    "MIN_SPAN_S",
    "WINDOW_S",
    "Check",
    "Forecast",
    "HealthState",
    "default_state_path",
    "drive_levels",
    "explain_series",
    "forecast",
    "forecast_drive",
    "pick_baseline",
]

STATE_VERSION = 1
MAX_CHECKS = 64  #: per drive; older checks are dropped
MAX_DRIVES = 512
WINDOW_S = 30 * 86400.0  #: growth is reported against the oldest check this recent
MIN_CHECKS = 3
MIN_SPAN_S = 86400.0  #: one day: a day-to-day rate, not minutes of noise
HORIZON_DAYS = 5 * 365.0
DEFAULT_SPARE_THRESHOLD = 10


# --- the trend ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Forecast:
    """One value heading for its threshold."""

    name: str  #: the counter or NVMe field
    now: float  #: the latest value
    threshold: float
    rising: bool  #: True: crosses by rising to the threshold; False: by falling below it
    per_day: float  #: fitted rate, units per day
    days: float  #: days from the latest check until the line reaches the threshold
    checks: int
    span_days: float

    def text(self) -> str:
        what = (
            f"reaches {self.threshold:g}"
            if self.rising
            else f"falls below its threshold {self.threshold:g}"
        )
        unit = "%" if self.name in ("percentage_used", "available_spare") else ""
        when = f"~{self.days:.0f} days" if self.days >= 2 else f"~{self.days * 24:.0f} hours"
        return (
            f"at the current rate, {self.name} ({self.now:g}{unit} now) {what}{unit} in "
            f"{when} ({self.per_day:+.3g}{unit}/day over {self.checks} checks in "
            f"{self.span_days:.3g} days)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "now": self.now,
            "threshold": self.threshold,
            "direction": "rising" if self.rising else "falling",
            "per_day": round(self.per_day, 6),
            "days": round(self.days, 2),
            "checks": self.checks,
            "span_days": round(self.span_days, 3),
            "text": self.text(),
        }


def forecast(
    name: str, points: Sequence[tuple[float, float]], threshold: float, *, rising: bool
) -> Forecast | None:
    """When the fitted line through ``points`` ((unix time, value), any order) reaches
    ``threshold`` going up (``rising``) or falls below it; None when it does not head there,
    is already past it, or the checks are too few or too close together."""
    pts = sorted(points)
    if len(pts) < MIN_CHECKS:
        return None
    span = pts[-1][0] - pts[0][0]
    if span < MIN_SPAN_S:
        return None
    now_v = pts[-1][1]
    if (rising and now_v >= threshold) or (not rising and now_v < threshold):
        return None
    line = fit_line(pts)
    fitted = line.at(pts[-1][0])
    per_day = line.slope * 86400.0
    if (rising and per_day <= 0) or (not rising and per_day >= 0):
        return None
    # from the fitted line's current value, not the last reading: one odd reading must not
    # move the date by itself
    gap = threshold - fitted
    days = max(0.0, gap / per_day)
    if days > HORIZON_DAYS:
        return None
    return Forecast(name, now_v, float(threshold), rising, per_day, days, len(pts), span / 86400.0)


def drive_levels(drive: DriveHealth) -> dict[str, float]:
    """The values of one check that forecasts follow: medium counters and NVMe wear/spare."""
    out = {k: float(v) for k, v in drive.counters.items() if k in MEDIUM_FAIL_AT}
    for k in ("percentage_used", "available_spare"):
        v = drive.attributes.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def forecast_drive(
    history: Sequence[tuple[float, Mapping[str, float]]], attributes: Mapping[str, Any]
) -> list[Forecast]:
    """Forecasts for one drive from its checks ((unix time, :func:`drive_levels`), oldest
    first or not); ``attributes`` of the latest check give the spare threshold. Soonest first."""
    series: dict[str, list[tuple[float, float]]] = {}
    for ts, levels in history:
        for k, v in levels.items():
            series.setdefault(k, []).append((ts, v))
    out = []
    for k, pts in series.items():
        if k == "available_spare":
            th = attributes.get("available_spare_threshold")
            thr = float(th) if isinstance(th, int) and 0 < th <= 100 else DEFAULT_SPARE_THRESHOLD
            f = forecast(k, pts, thr, rising=False)
        elif k == "percentage_used":
            f = forecast(k, pts, WEAR_FAILING_PCT, rising=True)
        else:
            f = forecast(k, pts, MEDIUM_FAIL_AT[k], rising=True)
        if f is not None:
            out.append(f)
    return sorted(out, key=lambda f: f.days)


# --- the state file -----------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One past check of one drive: Unix time and its counters."""

    ts: float
    counters: Mapping[str, int]
    #: values the forecast follows (drive_levels); absent in older files
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
            parsed.append(
                Check(
                    float(c["ts"]),
                    {
                        str(k): v
                        for k, v in counters.items()
                        if isinstance(v, int) and not isinstance(v, bool)
                    },
                    {
                        str(k): float(v)
                        for k, v in (levels if isinstance(levels, dict) else {}).items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)
                    },
                )
            )
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

    def record(
        self,
        key: str,
        ts: float,
        counters: Mapping[str, int],
        levels: Mapping[str, float] | None = None,
    ) -> None:
        checks = self.drives.setdefault(key, [])
        checks.append(Check(ts, dict(counters), dict(levels or {})))
        checks.sort(key=lambda c: c.ts)
        del checks[:-MAX_CHECKS]
        if len(self.drives) > MAX_DRIVES:  # forget the drives not seen for longest
            stale = sorted(
                self.drives, key=lambda k: self.drives[k][-1].ts if self.drives[k] else 0.0
            )
            for k in stale[: len(self.drives) - MAX_DRIVES]:
                del self.drives[k]

    def observe(self, drive: DriveHealth, now: float, window_s: float = WINDOW_S) -> DriveHealth:
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
        return {
            "version": STATE_VERSION,
            "drives": {
                k: {
                    "checks": [
                        {
                            "ts": c.ts,
                            "counters": dict(c.counters),
                            **({"levels": dict(c.levels)} if c.levels else {}),
                        }
                        for c in v
                    ]
                }
                for k, v in self.drives.items()
            },
        }

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


# --- saved documents of one drive ------------------------------------------------------------


def explain_series(drives: Sequence[DriveHealth]) -> list[DriveHealth]:
    """Saved documents -> one record per drive, growth between its checks applied.

    Documents of one drive (same serial, or same model + capacity when the serial is missing
    or redacted) are checks of that drive, ordered by their ``local_time`` (oldest first;
    ties keep the given order). Each drive's latest check is returned, with growth measured
    from its earliest check. Documents that identify no drive are returned as they are."""
    groups: dict[str, list[tuple[int, DriveHealth]]] = {}
    order: list[str | int] = []
    loose: dict[int, DriveHealth] = {}
    for i, dr in enumerate(drives):
        key = dr.identity() if dr.counters or dr.smart_passed is not None else None
        if key is None:
            loose[i] = dr
            order.append(i)
            continue
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((i, dr))
    out: list[DriveHealth] = []
    for item in order:
        if isinstance(item, int):
            out.append(loose[item])
            continue
        checks = sorted(groups[item], key=lambda p: (p[1].checked_at or 0.0, p[0]))
        first, last = checks[0][1], checks[-1][1]
        if len(checks) == 1:
            out.append(last)
            continue
        since = (
            iso_time(first.checked_at)
            if first.checked_at is not None
            else (first.source or "the first check")
        )
        judged = apply_growth(last, compute_growth(first.counters, last.counters, since))
        history = [(c.checked_at, drive_levels(c)) for _i, c in checks if c.checked_at is not None]
        out.append(replace(judged, forecast=tuple(forecast_drive(history, last.attributes))))
    return out
