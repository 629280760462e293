"""The shared-memory scenario of tests/scenarios/test_scenarios.py, in the parallel pass: what it
checks (a small /dev/shm filled to ~90% is named, a large one is not) does not depend on CPU
time, so it need not run alone (scripts/test.sh runs the `exclusive` tests one at a time)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from test_scenarios import CONSTRAIN, run_scenario

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow]


def test_shm_pressure(tmp_path: Path) -> None:
    """A 64 MiB /dev/shm (Docker's default) that the run fills to ~90%, in a private mount
    namespace so the machine's /dev/shm is untouched."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small /dev/shm in a private namespace needs root")
    doc = run_scenario(
        "shm",
        tmp_path,
        ["--workers", "2", "--model", "tiny", "--shm-fill", "52"],
        before=[sys.executable, CONSTRAIN, "--shm-size", "64m", "--"],
        may_crash=True,
    )
    kinds = [f["kind"] for f in doc["findings"]]
    assert "shm_pressure" in kinds
    shm = next(f for f in doc["findings"] if f["kind"] == "shm_pressure")
    assert shm["evidence"]["shm_total_mib"] == 64
    assert shm["evidence"]["shm_peak_share"] >= 0.8
    assert shm["fixes"][0]["action"].startswith("enlarge /dev/shm")
    # apply the first fix: the same run with a 1 GiB /dev/shm runs clean, without the finding
    after = run_scenario(
        "shm-fixed",
        tmp_path / "fixed",
        ["--workers", "2", "--model", "tiny", "--shm-fill", "52"],
        before=[sys.executable, CONSTRAIN, "--shm-size", "1g", "--"],
    )
    assert "shm_pressure" not in [f["kind"] for f in after["findings"]], after["findings"]
