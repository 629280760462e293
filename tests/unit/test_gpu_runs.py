"""Five GPU trainings recorded on a real NVIDIA H200 under ``stallscope run --interval 1``
(tests/fixtures/gpu-h200/SOURCE.md): each gets the verdict its trainer's own timer supports and
a data-wait share within 0.05 of it, with start-up and exit told apart from the training.

At eb68999 these read: compute-noprobe input_bound.prep 0.549 (the exit's 30-s worker joins
counted as data), compute-probe and compute-nopersistent insufficient_data (GPU figures taken
over the whole process), prep-noprobe 0.644, prep-probe 0.939 (the first step left out)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES

from stallscope.analysis.diagnose import diagnose_run

RUNS = FIXTURES / "gpu-h200" / "runs"

#: run -> (verdict, the trainer's own data-wait share, pinned persistent workers)
TRUTH = {
    "compute-noprobe": ("compute_bound", 0.005, True),
    "compute-probe": ("compute_bound", 0.017, True),
    "compute-nopersistent": ("compute_bound", 0.005, False),
    "prep-noprobe": ("input_bound.prep", 0.432, True),
    "prep-probe": ("input_bound.prep", 0.864, True),
}


def _diagnose(name: str, tmp_path: Path) -> dict[str, Any]:
    run = tmp_path / name
    shutil.copytree(RUNS / name, run)  # reading a WAL store writes beside it: never in the repo
    return diagnose_run(run)


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_recorded_gpu_run_verdict_and_share(name: str, tmp_path: Path) -> None:
    verdict, truth, _ = TRUTH[name]
    doc = _diagnose(name, tmp_path)
    assert doc["verdict"] == verdict, [(f["kind"], f["summary"]) for f in doc["findings"]]
    assert abs(doc["stall_fraction"] - truth) <= 0.05, (doc["stall_fraction"], truth)
    sig = doc["signals"]
    assert sig["window_source"] == ("probe" if "-probe" in name else "stacks")
    # the trainers' loops ran 25 s (20 s without persistent workers)
    assert abs(sig["window_s"] - (20 if "nopersistent" in name else 25)) <= 1.5, sig["window_s"]
    assert 10 <= sig["startup_s"] <= 14, sig["startup_s"]
    json.dumps(doc)  # the document stays JSON


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_recorded_gpu_run_exit_is_its_own_phase(name: str, tmp_path: Path) -> None:
    """With pin_memory and persistent workers the exit joined each worker for 5 s (6 workers:
    30 s; 3 workers: 15 s): slow_exit, after the verdict, naming PyTorch's behaviour; without
    persistent workers the exit took 1.4 s and nothing is said."""
    _, _, pinned = TRUTH[name]
    doc = _diagnose(name, tmp_path)
    sig = doc["signals"]
    kinds = [f["kind"] for f in doc["findings"]]
    if not pinned:
        assert sig["exit_s"] < 5, sig["exit_s"]
        assert "slow_exit" not in kinds
        return
    workers = 6 if name.startswith("compute") else 3
    assert abs(sig["exit_s"] - 5 * workers) <= 2.5, sig["exit_s"]
    assert kinds[0] != "slow_exit" and "slow_exit" in kinds
    f = next(f for f in doc["findings"] if f["kind"] == "slow_exit")
    assert "persistent_workers" in f["summary"] and "5 s for each worker" in f["summary"]
    assert any("del loader" in x["action"] for x in f["fixes"])
    assert "_clean_up_worker" in f["evidence"]["exit_stacks"][0]["stack"]


def test_compute_probe_reads_the_gpu_side_of_each_step(tmp_path: Path) -> None:
    """The probe's CUDA events: the GPU was busy 99% between the steps' events; NVML's
    utilization over the window's steady state is 98%, after a 4-s warm-up (the first step, 4.3
    s of cuDNN autotuning); the process-wide median was 0%."""
    doc = _diagnose("compute-probe", tmp_path)
    sig = doc["signals"]
    assert sig["gpu_busy_share"] >= 0.95
    assert sig["gpu_util_median_pct"] >= 90
    assert 2 <= sig["gpu_warmup_s"] <= 6
    # all steps count, as the trainer's own timer: the steady share is labelled apart
    assert sig["steady_stall_fraction"] < sig["stall_fraction"]
    top = doc["findings"][0]
    assert top["kind"] == "compute_bound"
    assert "bf16" in top["fixes"][0]["action"]


def test_prep_probe_gpu_waits_between_steps(tmp_path: Path) -> None:
    doc = _diagnose("prep-probe", tmp_path)
    assert doc["signals"]["gpu_busy_share"] < 0.2  # 3.4 s busy of 24 s between steps
    assert doc["signals"].get("gpu_warmup_s") is None  # never busy: nothing to leave out


# --- the GPU check's nine trainings (tests/fixtures/gpu-h200/session3, benchmarks/gpu_check.py) ---
SESSION3 = FIXTURES / "gpu-h200" / "session3"
#: training-mode -> (the trainer's own verdict, its own data-wait share), from table.txt there
CHECK_TRUTH = {
    "input-run": ("input_bound.prep", 0.906),
    "input-probe": ("input_bound.prep", 0.891),
    "input-pid": ("input_bound.prep", 0.907),
    "compute-run": ("compute_bound", 0.015),
    "compute-probe": ("compute_bound", 0.031),
    "compute-pid": ("compute_bound", 0.007),
    "host-run": ("host_bound", 0.001),
    "host-probe": ("host_bound", 0.034),
    "host-pid": ("host_bound", 0.001),
}


@pytest.mark.parametrize("name", sorted(CHECK_TRUTH))
def test_gpu_check_training_verdict_and_share(name: str, tmp_path: Path) -> None:
    """Each of the GPU check's trainings on a lent H200 (ResNet-18 fed by a slow transform,
    ResNet-50 on a uint8 pool, a launch-bound MLP), under ``stallscope run``, the probe and
    ``run --pid``: the verdict its own timer supports, the share within 0.05 of its own."""
    verdict, truth = CHECK_TRUTH[name]
    run = tmp_path / name
    shutil.copytree(SESSION3 / "runs" / name, run)
    doc = diagnose_run(run)
    assert doc["verdict"] == verdict, [(f["kind"], f["summary"]) for f in doc["findings"]]
    assert abs(doc["stall_fraction"] - truth) <= 0.05, (doc["stall_fraction"], truth)
    assert doc["signals"]["window_source"] == ("probe" if name.endswith("-probe") else "stacks")
