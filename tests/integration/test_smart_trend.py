"""SMART trend fit: on constructed series with a known slope, the forecast gives the day the
line crosses the threshold; it stays silent when there is no trend towards it. Then through the
SMART state file (`stallscope disk` over repeated checks) and saved `smartctl --json` documents
of one drive, in JSON and in the terminal."""

from __future__ import annotations

import copy
import json
import random
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, stallscope_argv

from stallscope.sources.smart import (
    HealthState,
    drive_levels,
    drive_points,
    forecast,
    forecast_drive,
    parse_smartctl,
)
from stallscope.stats import fit_line

DAY = 86400.0
T0 = 1_763_712_000.0
NVME = "smartctl-nvme-null-Samsung_SSD_970_EVO_Plus_250GB-nvme0.json"


def test_spare_falling_two_points_a_day_reaches_10_in_21_days() -> None:
    pts = [(T0 + i * DAY, 60.0 - 2.0 * i) for i in range(5)]  # 60, 58, ..., 52
    f = forecast("available_spare", pts, 10, rising=False)
    assert f is not None
    assert f.per_day == pytest.approx(-2.0) and f.days == pytest.approx(21.0)
    assert f.text() == (
        "at the current rate, available_spare (52% now) falls below its "
        "threshold 10% in ~21 days (-2%/day over 5 checks in 4 days)"
    )


def test_reallocations_rising_ten_a_day_reach_100_in_7_days() -> None:
    pts = [(T0 + i * DAY, 10.0 * (i + 1)) for i in range(3)]  # 10, 20, 30
    f = forecast("Reallocated_Sector_Ct", pts, 100, rising=True)
    assert f is not None and f.days == pytest.approx(7.0) and f.per_day == pytest.approx(10.0)


def test_noisy_series_recovers_the_slope() -> None:
    rng = random.Random(7)
    pts = [(T0 + i * DAY / 4, 3.0 + 0.5 * i / 4 + rng.gauss(0, 0.3)) for i in range(60)]
    assert fit_line(pts).slope * DAY == pytest.approx(0.5, rel=0.1)
    f = forecast("percentage_used", pts, 100, rising=True)
    assert f is not None and f.days == pytest.approx((100 - (3 + 0.5 * 59 / 4)) / 0.5, rel=0.1)


@pytest.mark.parametrize(
    ("pts", "threshold", "rising"),
    [
        ([(T0 + i * DAY, 5.0) for i in range(5)], 100, True),  # flat
        ([(T0 + i * DAY, 50.0 + i) for i in range(5)], 10, False),  # spare going up: fine
        ([(T0, 1.0), (T0 + DAY, 2.0)], 100, True),  # two checks are not a trend
        ([(T0 + i * 600, 1.0 + i) for i in range(10)], 100, True),  # 90 minutes: no daily rate
        ([(T0 + i * DAY, 100.0 + i) for i in range(5)], 100, True),  # already past: the verdict
        ([(T0 + i * DAY, 1.0 + 0.0001 * i) for i in range(5)], 100, True),  # decades away
    ],
)
def test_no_forecast_without_a_trend_towards_the_threshold(
    pts: list[tuple[float, float]], threshold: float, rising: bool
) -> None:
    assert forecast("x", pts, threshold, rising=rising) is None


def _nvme_doc(ts: float, spare: int, used: int) -> dict[str, Any]:
    doc = copy.deepcopy(json.loads((FIXTURES / NVME).read_text()))
    doc["local_time"] = {"time_t": int(ts), "asctime": "constructed"}
    log = doc["nvme_smart_health_information_log"]
    log["available_spare"], log["percentage_used"] = spare, used
    return doc


def test_forecast_drive_uses_the_drives_own_spare_threshold() -> None:
    hist = [(T0 + i * DAY, {"available_spare": 40.0 - 3 * i}) for i in range(4)]
    [f] = forecast_drive(hist, {"available_spare_threshold": 20})
    assert f.threshold == 20 and f.days == pytest.approx((31 - 20) / 3)


def test_state_file_checks_give_a_forecast(tmp_path: Path) -> None:
    state = HealthState.load(tmp_path / "smart.json")
    seen = []
    for i in range(4):  # one check a day, spare 100 -> 97 -> 94 -> 91
        d = parse_smartctl(_nvme_doc(T0 + i * DAY, 100 - 3 * i, 2))
        seen.append(state.observe(d, T0 + i * DAY))
        state.save()
        state = HealthState.load(tmp_path / "smart.json")  # levels survive the file
    assert not seen[0].forecast and not seen[1].forecast  # too few checks yet
    [f] = seen[-1].forecast
    assert f.name == "available_spare" and f.days == pytest.approx((91 - 10) / 3)
    assert seen[-1].to_json()["forecast"][0]["days"] == pytest.approx(27.0)
    assert drive_levels(seen[-1])["available_spare"] == 91
    assert (
        "levels"
        in json.loads((tmp_path / "smart.json").read_text())["drives"].popitem()[1]["checks"][-1]
    )


def test_disk_cli_shows_the_forecast_from_saved_documents(tmp_path: Path) -> None:
    files = []
    for i, (spare, used) in enumerate([(60, 10), (58, 12), (56, 14), (54, 16)]):
        f = tmp_path / f"check{i}.json"
        f.write_text(json.dumps(_nvme_doc(T0 + i * 2 * DAY, spare, used)))
        files.append(str(f))
    r = subprocess.run(
        stallscope_argv("disk", "--smartctl-json", *files, "--json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode in (0, 1), r.stderr
    [drive] = json.loads(r.stdout)["drives"]
    fc = {f["name"]: f for f in drive["forecast"]}
    # spare -1/day from 54 to 10: 44 days; wear +1/day from 16 to 100: 84 days
    assert fc["available_spare"]["days"] == pytest.approx(44.0)
    assert fc["percentage_used"]["days"] == pytest.approx(84.0)
    assert [f["name"] for f in drive["forecast"]] == ["available_spare", "percentage_used"]
    text = subprocess.run(
        stallscope_argv("disk", "--smartctl-json", *files),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "forecast at the current rate, available_spare (54% now) falls below its" in text
    assert "in ~44 days" in text


def test_the_smart_source_reports_days_left() -> None:
    d = parse_smartctl(_nvme_doc(T0, 54, 16))
    assert "days_left" not in drive_points(d)
    fc = forecast_drive(
        [(T0 + i * DAY, {"available_spare": 60.0 - 2 * i}) for i in range(4)],
        {"available_spare_threshold": 10},
    )
    pts = drive_points(replace(d, forecast=tuple(fc)))
    assert pts["days_left"] == pytest.approx((54 - 10) / 2)
