"""The TensorFlow fetch stall for real: cold files read one at a time through a cgroup blkio
throttle of 2 MB/s, and its fix (the dataset cached in RAM, reads in parallel) measured.

Bound by the throttled reads, not by the CPU (as the PyTorch fetch scenarios,
tests/test_scenarios_fetch.py): it shares the machine in the parallel pass, while the other
TensorFlow scenarios measure CPU-bound work and run alone (tests/test_scenarios_tf.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import training_finding
from test_scenarios_tf import CONSTRAIN, TRAIN, run_tf, speedup

pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]


def test_fetch_bound_and_its_fix(tmp_path: Path, throttled_group: str) -> None:
    """Cold files read one at a time through a device capped at 2 MB/s: fetch-bound, with
    tf.data fixes; caching the (small) dataset in RAM makes the run faster."""
    data = tmp_path / "data"
    subprocess.run([sys.executable, TRAIN, "--data-dir", str(data), "--files", "1500",
                    "--size", "32", "--epochs", "0"], check=True, capture_output=True)
    wrap = [sys.executable, CONSTRAIN, "--read-bps", "2000000", "--data", str(data),
            "--cgroup", throttled_group, "--"]
    base = ["--data-dir", str(data), "--files", "1500", "--size", "32", "--prep-cost", "0",
            "--cold"]
    a = run_tf("tf-fetch", tmp_path / "a", base, wrap=wrap, data=data)
    top = training_finding(a)
    assert top["kind"] == "input_bound.fetch", top
    actions = [f["action"] for f in top["fixes"]]
    assert any(x.startswith("read files in parallel") for x in actions), actions
    assert any("TFRecord" in x for x in actions), actions
    assert any(x.startswith("add .cache()") for x in actions), actions
    assert not any("num_workers" in x for x in actions), actions
    b = run_tf("tf-fetch-fixed", tmp_path / "b", [*base, "--cache", "--parallel"], wrap=wrap,
               data=data)
    assert speedup("tf-fetch-fix", a, b) >= 1.1
