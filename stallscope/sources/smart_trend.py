"""When will a drive cross its threshold? A least-squares line through SMART checks over time.

From a drive's past checks (the SMART state file of ``stallscope disk``, or several saved
``smartctl --json`` documents of one drive) each tracked value gets a straight-line fit against
time; where the line heads for the value's threshold, the forecast says when it gets there at the
current rate: "available_spare falls below its threshold 10% in ~23 days (-2.0 %/day over 5
checks in 12 days)". Pure: no I/O.

Tracked values and thresholds (docs/disk-health.md):

- medium-defect counters (``Reallocated_Sector_Ct`` 5, ``Current_Pending_Sector`` 197,
  ``Offline_Uncorrectable`` 198, ``Reported_Uncorrect`` 187, NVMe ``media_errors``, SAS grown
  defects and uncorrected errors): the count at which the verdict turns "failing"
  (:data:`~stallscope.sources.health.MEDIUM_FAIL_AT`);
- NVMe ``percentage_used``: 100% of rated endurance;
- NVMe ``available_spare``: the drive's own ``available_spare_threshold`` (else 10%).

A forecast needs :data:`MIN_CHECKS` checks spanning at least :data:`MIN_SPAN_S` and a slope
towards the threshold; a value already past it has no forecast (the verdict says so), nor has
one that would take more than :data:`HORIZON_DAYS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stallscope.sources.health import MEDIUM_FAIL_AT, WEAR_FAILING_PCT, DriveHealth
from stallscope.stats import fit_line

__all__ = ["HORIZON_DAYS", "MIN_CHECKS", "MIN_SPAN_S", "Forecast", "drive_levels", "fit_line",
           "forecast", "forecast_drive"]

MIN_CHECKS = 3
MIN_SPAN_S = 86400.0  #: one day: a day-to-day rate, not minutes of noise
HORIZON_DAYS = 5 * 365.0
DEFAULT_SPARE_THRESHOLD = 10


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
        what = (f"reaches {self.threshold:g}" if self.rising
                else f"falls below its threshold {self.threshold:g}")
        unit = "%" if self.name in ("percentage_used", "available_spare") else ""
        when = f"~{self.days:.0f} days" if self.days >= 2 else f"~{self.days * 24:.0f} hours"
        return (f"at the current rate, {self.name} ({self.now:g}{unit} now) {what}{unit} in "
                f"{when} ({self.per_day:+.3g}{unit}/day over {self.checks} checks in "
                f"{self.span_days:.3g} days)")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "now": self.now, "threshold": self.threshold,
                "direction": "rising" if self.rising else "falling",
                "per_day": round(self.per_day, 6), "days": round(self.days, 2),
                "checks": self.checks, "span_days": round(self.span_days, 3),
                "text": self.text()}


def forecast(name: str, points: Sequence[tuple[float, float]], threshold: float, *,
             rising: bool) -> Forecast | None:
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
    return Forecast(name, now_v, float(threshold), rising, per_day, days, len(pts),
                    span / 86400.0)


def drive_levels(drive: DriveHealth) -> dict[str, float]:
    """The values of one check that forecasts follow: medium counters and NVMe wear/spare."""
    out = {k: float(v) for k, v in drive.counters.items() if k in MEDIUM_FAIL_AT}
    for k in ("percentage_used", "available_spare"):
        v = drive.attributes.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def forecast_drive(history: Sequence[tuple[float, Mapping[str, float]]],
                   attributes: Mapping[str, Any]) -> list[Forecast]:
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
            thr = float(th) if isinstance(th, int) and 0 < th <= 100 else \
                DEFAULT_SPARE_THRESHOLD
            f = forecast(k, pts, thr, rising=False)
        elif k == "percentage_used":
            f = forecast(k, pts, WEAR_FAILING_PCT, rising=True)
        else:
            f = forecast(k, pts, MEDIUM_FAIL_AT[k], rising=True)
        if f is not None:
            out.append(f)
    return sorted(out, key=lambda f: f.days)
