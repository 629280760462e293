"""The fetch stall for real: cold files read through a cgroup blkio throttle of 2 MB/s, run under
`stallscope run` with the probe and without it, and the first fix (the limit lifted) measured.

These runs are bound by the throttled reads, not by the CPU: they ran the same with a CPU hog
beside the suite, so the one without the probe shares the machine in the parallel pass (the
other scenario trainings measure CPU-bound work and run alone:
tests/scenarios/test_scenarios.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import make_demo_files, training_finding
from test_scenarios import CONSTRAIN, FETCH_SECONDS, compare_fix, run_scenario

from stallscope.analysis.diagnose.rules.common import STALL_WARN

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def fetch_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 files for the fetch scenarios, written once (each run evicts them from the page
    cache before every epoch: --cold)."""
    data = tmp_path_factory.mktemp("fetch") / "data"
    make_demo_files(data, 3000)
    return data


@pytest.mark.exclusive
def test_fetch_stall(tmp_path: Path, throttled_group: str, fetch_data: Path) -> None:
    """Cold files on a device whose reads are capped at 2 MB/s (cgroup blkio throttle).

    It runs alone: once in the parallel pass its workers read as in D state in 10% of samples
    (98-100% alone, beside two CPU hogs too, and in the run without the probe beside it), for a
    cause not found yet."""
    data = fetch_data
    doc = run_scenario(
        "fetch",
        tmp_path,
        ["--data-dir", str(data), "--files", "3000", "--cold", "--workers", "2", "--model", "tiny"],
        wrap=[
            sys.executable,
            CONSTRAIN,
            "--read-bps",
            "2000000",
            "--data",
            str(data),
            "--cgroup",
            throttled_group,
            "--",
        ],
        data=data,
        seconds=FETCH_SECONDS,
    )
    assert training_finding(doc)["kind"] == "input_bound.fetch", doc["findings"]
    assert doc["stall_fraction"] >= 0.3
    # the session read the limit of the trainer's cgroup, named by the disk source's device
    limits = json.loads((Path(doc["run"]) / "meta.json").read_text()).get("read_limits")
    assert limits is not None and list(limits.values()) == [2000000], limits
    ev = training_finding(doc)["evidence"]
    assert ev["read_limit_kb_s"] == pytest.approx(2000000 / 1024, abs=0.1)
    assert ev["worker_d_share"] >= 0.25, ev
    assert ev["score_fetch"] > ev["score_prep"]
    top = training_finding(doc)
    assert "lift the I/O limit" in top["fixes"][0]["action"], top["fixes"]
    # apply the first fix: the same cold reads with the limit lifted, and measure (unthrottled,
    # its pace is steady within seconds, 8 are enough: the speed-up is several times, its floor
    # 1.5)
    after = run_scenario(
        "fetch-fixed",
        tmp_path / "fixed",
        ["--data-dir", str(data), "--files", "3000", "--cold", "--workers", "2", "--model", "tiny"],
        data=data,
        seconds=8,
    )
    # the verdict follows the trainer's own measure of its wait: 11% here unthrottled, but cold
    # reads of a slower disk (CI's, 2 cores) left a real fetch stall above the 15% line once
    seen, truth = after["stall_fraction"], after["trainer_wait"]
    assert truth is not None and abs(seen - truth) <= 0.05, (seen, truth)
    assert seen < doc["stall_fraction"], (seen, doc["stall_fraction"])
    called = training_finding(after)["kind"]
    if truth < STALL_WARN - 0.03:
        assert called != "input_bound.fetch", (truth, after["findings"])
    elif truth > STALL_WARN + 0.03:
        assert called == "input_bound.fetch", (truth, after["findings"])
    est = top["est_speedup"]
    got = compare_fix("fix-delivery-fetch", doc, after, est)["speedup"]
    assert got >= 1.5, (est, got)  # a 2 MB/s cap lifted: several times faster


def test_fetch_stall_without_probe(tmp_path: Path, throttled_group: str, fetch_data: Path) -> None:
    """The fetch stall of an unmodified script (no stallscope code): named, with the data-wait
    share from the training thread's sampled stacks within 0.05 of the trainer's own figure."""
    data = fetch_data
    doc = run_scenario(
        "fetch-no-probe",
        tmp_path,
        [
            "--data-dir",
            str(data),
            "--files",
            "3000",
            "--cold",
            "--workers",
            "2",
            "--model",
            "tiny",
            "--no-probe",
        ],
        wrap=[
            sys.executable,
            CONSTRAIN,
            "--read-bps",
            "2000000",
            "--data",
            str(data),
            "--cgroup",
            throttled_group,
            "--",
        ],
        data=data,
        seconds=FETCH_SECONDS,
    )
    print(f"fetch, no code: trainer {doc['trainer_wait']}, stallscope {doc['stall_fraction']}")
    assert training_finding(doc)["kind"] == "input_bound.fetch", doc["findings"]
    assert doc["stall_source"] == "stacks"
    assert abs(doc["stall_fraction"] - doc["trainer_wait"]) <= 0.05, doc["trainer_wait"]
