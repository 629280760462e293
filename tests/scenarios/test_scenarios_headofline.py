"""Slow samples that hold up the batches (input_bound.head_of_line, issue 52): a dataset whose
per-sample cost has a heavy tail (2% of the samples 41× slower) read by two DataLoader workers
in order, beside one with the same mean cost and no tail. The trainer's step stands in for a
GPU's (``--step-ms``: it waits, the CPU is left to the loader), so a worker held up by a slow
sample leaves a core idle that ``in_order=False`` puts to work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import training_finding
from test_scenarios import FIX_SECONDS, compare_fix, run_scenario

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

#: small batches of small images, a light model, a 16 ms device step: each step a record of
#: its own (probe/buffer.py GROUP_S), so the bursts are seen step by step
BASE = ["--size", "32", "--batch-size", "4", "--model", "tiny", "--step-ms", "16", "--workers", "2"]
TAIL = [*BASE, "--prep-cost", "60", "--tail-share", "0.02", "--tail-times", "41"]
#: the same mean cost with no tail: 60 × (1 + 0.02 × 40) passes for every sample
FLAT = [*BASE, "--prep-cost", "108"]
#: the measured speed-up of in_order=False against the finding's estimate
WITHIN = 0.25
#: a host this busy (median CPU %) left the fixed run no core to spare: the gain is the host's
FULL_HOST_PCT = 95.0


def _busy_host(doc: dict[str, Any]) -> bool:
    """Other processes kept a core busy: the idle core in_order=False would use was not there
    (the rule then rightly promises nothing)."""
    from stallscope.analysis.facts.build import OTHERS_BUSY_CORES

    return (doc["signals"].get("others_cpu_cores") or 0.0) >= OTHERS_BUSY_CORES


def test_slow_samples_hold_up_the_batches_and_in_order_false_fixes_it(tmp_path: Path) -> None:
    a = run_scenario("head-of-line", tmp_path / "a", TAIL, seconds=FIX_SECONDS)
    if _busy_host(a):
        pytest.skip(f"other processes kept {a['signals']['others_cpu_cores']} cores busy")
    top = training_finding(a)
    assert top["kind"] == "input_bound.head_of_line", a["findings"]
    kinds = [f["kind"] for f in a["findings"]]
    assert "input_bound.prep" not in kinds, kinds  # the same wait, told once
    ev = top["evidence"]
    assert ev["wait_top_share"] >= 0.7 and ev["worker_idle_share"] > 0, ev
    # the workers timed each batch (sources/stacks/fetches.py): a heavy tail, and the estimate
    # simulated over it
    assert ev["batches_timed"] >= 40 and ev["batch_cost_p99_ms"] >= 5 * ev["batch_cost_p50_ms"], ev
    assert ev["simulated_speedup"] is not None and top["est_speedup"] <= ev["cores_estimate"], ev
    fix = top["fixes"][0]
    assert fix["change"] == {"in_order": False}, top["fixes"]
    assert "order" in fix["why"] and fix["expected_speedup"] == top["est_speedup"]
    assert [f["action"].split(" ")[0] for f in top["fixes"][1:3]] == [
        "prefetch_factor",
        "precompute",
    ]
    b = run_scenario(
        "head-of-line-fixed", tmp_path / "b", [*TAIL, "--no-in-order"], seconds=FIX_SECONDS
    )
    assert b["verdict"] != "input_bound.head_of_line", b["findings"]
    est = fix["expected_speedup"]
    cmp = compare_fix("fix-delivery-head-of-line", a, b, est)
    assert cmp["applied_fix"] == fix["action"], cmp
    got = cmp["speedup"]
    if _busy_host(b):
        pytest.skip(f"the fixed run shared the host: x{got} measured against x{est}")
    if b["signals"]["host_cpu_median_pct"] >= FULL_HOST_PCT and abs(got / est - 1) > WITHIN:
        # measured 2026-11-29 on the shared 2-core machine: x1.07 against x1.52, the fixed
        # run's host 98% busy (its workers got 1.35 cores of the 1.74 the estimate counted,
        # each batch costing 11% more CPU among the run-queue waits)
        pytest.xfail(
            f"every core of the host was busy in the fixed run: x{got} measured against x{est}"
        )
    assert abs(got / est - 1) <= WITHIN, (est, got, cmp)


def test_the_same_mean_cost_without_a_tail_is_ordinary_prep(tmp_path: Path) -> None:
    doc = run_scenario("head-of-line-flat", tmp_path, FLAT, seconds=FIX_SECONDS)
    kinds = [f["kind"] for f in doc["findings"]]
    assert "input_bound.head_of_line" not in kinds, doc["findings"]
    sig = doc["signals"]  # the workers timed their batches alike: no tail to hold them up
    assert sig["batches_timed"] >= 40 and sig["batch_cost_p99_ms"] < 5 * sig["batch_cost_p50_ms"]
    assert training_finding(doc)["kind"] == "input_bound.prep", doc["findings"]


def test_an_unmodified_trainer_with_the_tail_is_head_of_line(tmp_path: Path) -> None:
    """The same tail with no stallscope code in the trainer (no probe): the sampled stacks give
    the wait, the batches the in-trainer sampler timed on the DataLoader show it comes in
    bursts, the workers' own timing the tail. Before, this read as input_bound.prep ("make
    per-sample work cheaper"): the bursts were the probe's alone."""
    doc = run_scenario("head-of-line-no-probe", tmp_path, [*TAIL, "--no-probe"], seconds=12)
    if _busy_host(doc):
        pytest.skip(f"other processes kept {doc['signals']['others_cpu_cores']} cores busy")
    sig = doc["signals"]
    assert sig["stall_source"] == "stacks" and sig["step_timing_source"] == "counted_batches"
    assert abs(doc["stall_fraction"] - doc["trainer_wait"]) <= 0.05, (
        doc["stall_fraction"],
        doc["trainer_wait"],
    )
    top = training_finding(doc)
    assert top["kind"] == "input_bound.head_of_line", doc["findings"]
    ev = top["evidence"]
    assert ev["wait_top_share"] >= 0.7 and ev["batches_timed"] >= 40, ev
    assert top["fixes"][0]["change"] == {"in_order": False}, top["fixes"]
