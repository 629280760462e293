"""`stallscope compare`: which of run A's fixes run B applied (the loader setting each fix names,
as B's probe recorded it), and that fix's own estimate set beside the measured speed-up; A's
ceiling only when no fix matches, and said to be one. The real before/after runs are in
test_scenarios.py (test_the_top_fix_delivers_what_it_promised)."""

from __future__ import annotations

from typing import Any

from test_diagnose import T0, run

from stallscope.cli.compare import applied_fix, compare
from stallscope.store import StepRow

DOC_A: dict[str, Any] = {
    "run": "a", "verdict": "input_bound.prep",
    "findings": [{"kind": "input_bound.prep", "est_speedup": 1.83, "fixes": [
        {"action": "make per-sample work cheaper", "why": "..."},
        {"action": "num_workers 1 → 2 (2 physical cores)", "why": "...",
         "expected_speedup": 1.32, "change": {"num_workers": 2}}]}]}


def test_the_fix_b_applied_is_found_by_its_setting() -> None:
    fix = applied_fix(DOC_A, {"num_workers": 1}, {"num_workers": 2})
    assert fix is not None and fix["expected_speedup"] == 1.32
    assert applied_fix(DOC_A, {"num_workers": 1}, {"num_workers": 4}) is None  # another change
    assert applied_fix(DOC_A, {"num_workers": 2}, {"num_workers": 2}) is None  # nothing changed
    assert applied_fix(DOC_A, {}, {}) is None


def _data(workers: int, step_s: float) -> Any:
    steps = [StepRow(0, i, T0 + i * step_s, step_s / 2, step_s / 2, samples=32)
             for i in range(50)]
    data = run([], steps, config={"loader": {"num_workers": workers}})
    return data


def test_compare_checks_the_applied_fix_against_its_own_estimate() -> None:
    doc_b = {"run": "b", "verdict": "compute_bound", "findings": []}
    out = compare(DOC_A, doc_b, _data(1, 0.2), _data(2, 0.16))
    assert out["speedup"] == 1.25
    assert out["applied_fix"] == "num_workers 1 → 2 (2 physical cores)"
    assert out["estimated_speedup"] == 1.32 and "ceiling" not in out
    assert out["delivered_share"] == round(0.25 / 0.32, 3)
    # B changed something no fix names: A's ceiling, flagged as one
    out = compare(DOC_A, doc_b, _data(1, 0.2), _data(1, 0.1))
    assert "applied_fix" not in out and out["ceiling"] is True
    assert out["estimated_speedup"] == 1.83
