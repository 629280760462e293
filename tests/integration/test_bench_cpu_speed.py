"""benchmarks/cpu_speed.py: each core's speed on a fixed loop, per slice of CPU time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from cpu_speed import CoreSpeed, measure, summary


def test_every_usable_core_is_measured_in_slices() -> None:
    speeds = measure(1.2, slice_s=0.2)
    assert [s.cpu for s in speeds] == sorted(os.sched_getaffinity(0))
    for s in speeds:
        assert len(s.rates) >= 3, s  # 1.2 s in 0.2-s slices
        assert all(r > 0 for r in s.rates), s
        assert s.spread >= 0
    line = summary(speeds)
    assert line.count("spread") == len(speeds), line


def test_spread_is_the_range_over_the_median() -> None:
    assert CoreSpeed(0, [800.0, 1000.0, 1400.0]).spread == pytest.approx(0.6)
    assert CoreSpeed(1, [1000.0] * 4).spread == 0.0
    assert CoreSpeed(2, []).spread == 0.0


def test_bad_seconds_is_one_line_and_status_2() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cpu_speed.py"), "--seconds", "-1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "--seconds takes a number of seconds above 0 and under 3600"


def test_a_core_it_cannot_pin_to_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a core outside the machine: the probe's sched_setaffinity fails in the child
    import cpu_speed

    monkeypatch.setattr(cpu_speed.os, "sched_getaffinity", lambda _pid: {4095})
    got = cpu_speed.line(0.5)
    assert got.startswith("CPU speed: not measured (the speed probe on cpu 4095 exited 1: "), got
    assert "Invalid argument" in got and "\n" not in got, got
