"""`stallscope compare`: which of run A's fixes run B applied (the loader setting each fix names,
as B's probe recorded it), and that fix's own estimate set beside the measured speed-up; A's
ceiling only when no fix matches, and said to be one. The real before/after runs are in
test_scenarios.py (test_the_top_fix_delivers_what_it_promised)."""

from __future__ import annotations

from typing import Any

import pytest
from diagnose_inputs import T0, run

from stallscope.cli.compare import _ROWS, applied_fix, compare
from stallscope.store import StepRow

DOC_A: dict[str, Any] = {
    "run": "a",
    "verdict": "input_bound.prep",
    "findings": [
        {
            "kind": "input_bound.prep",
            "est_speedup": 1.83,
            "fixes": [
                {"action": "make per-sample work cheaper", "why": "..."},
                {
                    "action": "num_workers 1 → 2 (2 physical cores)",
                    "why": "...",
                    "expected_speedup": 1.32,
                    "change": {"num_workers": 2},
                },
            ],
        }
    ],
}


def test_the_fix_b_applied_is_found_by_its_setting() -> None:
    fix = applied_fix(DOC_A, {"num_workers": 1}, {"num_workers": 2})
    assert fix is not None and fix["expected_speedup"] == 1.32
    assert applied_fix(DOC_A, {"num_workers": 1}, {"num_workers": 4}) is None  # another change
    assert applied_fix(DOC_A, {"num_workers": 2}, {"num_workers": 2}) is None  # nothing changed
    assert applied_fix(DOC_A, {}, {}) is None


def _data(workers: int, step_s: float) -> Any:
    steps = [StepRow(0, i, T0 + i * step_s, step_s / 2, step_s / 2, samples=32) for i in range(50)]
    data = run([], steps, config={"loader": {"num_workers": workers}})
    return data


def test_compare_checks_the_applied_fix_against_its_own_estimate() -> None:
    doc_b = {"run": "b", "verdict": "compute_bound", "findings": []}
    out = compare(DOC_A, doc_b, _data(1, 0.2), _data(2, 0.16))
    assert out["speedup"] == 1.25
    assert out["applied_fix"] == "num_workers 1 → 2 (2 physical cores)"
    assert out["estimated_speedup"] == 1.32 and "ceiling" not in out
    assert out["delivered_share"] == round(0.25 / 0.32, 3)
    # B changed something no fix names: A's data-wait ceiling (its whole stall of 50% gone:
    # ×2.00), flagged and named as such; never the top finding's own estimate (1.83 here: on
    # a real run that was cpu_contention's run-queue estimate, issue 49)
    out = compare(DOC_A, doc_b, _data(1, 0.2), _data(1, 0.1))
    assert "applied_fix" not in out and out["ceiling"] is True
    assert out["estimated_speedup"] == 2.0
    assert out["measured_against"] == "A's data-wait ceiling (the whole stall gone)"


def test_no_change_never_reads_as_a_negative_zero() -> None:
    """Issue 49: `compare` of workers 1 → 2 that changed nothing printed "-0% of it"."""
    from stallscope.cli.compare import no_negative_zero
    from stallscope.units import pct

    doc_b = {"run": "b", "verdict": "compute_bound", "findings": []}
    out = compare(DOC_A, doc_b, _data(1, 0.2), _data(1, 0.20001))
    assert out["delivered_share"] == 0.0 and str(out["delivered_share"]) == "0.0"
    assert pct(out["delivered_share"]) == "0%" and pct(-0.0001) == "0%"
    assert no_negative_zero(-0.0) == 0.0 and str(no_negative_zero(-0.0)) == "0.0"


def test_a_fix_that_delivered_little_says_why_from_run_b() -> None:
    """ "31% of the expected gain delivered" said nothing more, though run B's host CPU was at
    97.5%: the reasons B itself shows are given."""
    doc_b = {
        "run": "b",
        "verdict": "input_bound.prep",
        "findings": [{"kind": "input_bound.prep"}, {"kind": "cpu_contention"}],
        "signals": {"host_cpu_median_pct": 97.5, "stall_fraction": 0.33},
    }
    out = compare(DOC_A, doc_b, _data(1, 0.2), _data(2, 0.19))
    assert out["delivered_share"] < 0.7
    why = " | ".join(out["shortfall"])
    assert "host CPU was at 97.5%" in why and "cpu_contention" in why
    assert "still waited for data 33%" in why
    # a host full of a nice-19 job's CPU had room: its cores were the training's to take
    niced = {**doc_b["signals"], "niced_others_cpu_cores": 1.9, "logical_cores": 2}
    out = compare(DOC_A, {**doc_b, "signals": niced}, _data(1, 0.2), _data(2, 0.19))
    why = " | ".join(out["shortfall"])
    assert "host CPU" not in why and "cpu_contention" in why, why
    # a fix that delivered what it promised needs no excuse
    ok = compare(DOC_A, {**doc_b, "verdict": "compute_bound"}, _data(1, 0.2), _data(2, 0.152))
    assert ok["delivered_share"] >= 0.7 and "shortfall" not in ok


def test_without_the_probe_compare_says_what_would_give_throughput() -> None:
    doc_b = {"run": "b", "verdict": "compute_bound", "findings": []}
    out = compare(DOC_A, doc_b, run([]), run([]))
    assert "speedup" not in out
    assert "stallscope.watch(loader)" in out["no_throughput"]
    assert "neither run" in out["no_throughput"]
    out = compare(DOC_A, doc_b, _data(1, 0.2), run([]))
    assert "run B has none" in out["no_throughput"]


def test_without_the_probe_the_applied_fix_is_found_from_the_worker_processes() -> None:
    """A fresh-clone trial: two runs without the probe (0 then 2 workers) were never matched
    to A's "num_workers → N" fix: their loader settings were unknown. The worker processes each
    run had stand in for num_workers, and compare says so."""
    doc_a = {**DOC_A, "signals": {"workers": 1}}
    doc_b = {"run": "b", "verdict": "compute_bound", "findings": [], "signals": {"workers": 2}}
    out = compare(doc_a, doc_b, run([]), run([]))
    assert out["num_workers_from_processes"] == ["a", "b"]
    other = compare(doc_a, {**doc_b, "signals": {"workers": 4}}, run([]), run([]))
    assert "num_workers_from_processes" not in other  # 4 is not the fix's 2
    # a probe's own settings come first
    probed = compare(doc_a, doc_b, _data(1, 0.2), _data(2, 0.15))
    assert probed["applied_fix"].startswith("num_workers 1 → 2")
    assert "num_workers_from_processes" not in probed


# --- an agent's store: one training at a time -------------------------------------------------


def _agent_store(tmp_path: Any) -> Any:
    """An agent's run directory that followed two trainings: r-big (two processes, 20 points
    each) and r-small (one process, 5 points)."""
    import time as _time

    from stallscope.metrics import Point
    from stallscope.store import RunStore, base_meta, new_run_dir, write_meta

    run = new_run_dir(tmp_path, "agent")
    write_meta(
        run,
        base_meta(
            ["stallscope", "agent"],
            start=_time.time() - 60,
            interval_s=1.0,
            pid=None,
            agent={"listen": "127.0.0.1:10127"},
        ),
    )
    store = RunStore(run / "run.db")
    t0 = _time.time() - 50
    procs = {
        "11": ("r-big", "main", 20),
        "12": ("r-big", "worker", 20),
        "21": ("r-small", "main", 5),
    }
    for pid, (rid, role, n) in procs.items():
        store.upsert_entity("procs", pid, {"run": rid, "role": role, "ppid": 1}, t0)
        for i in range(n):
            store.add_points(t0 + i, [Point("procs.cpu_pct", pid, 50.0)])
    for i in range(20):
        store.add_points(t0 + i, [Point("host.cpu_pct", "", 30.0)])
    store.finish_and_close()
    return run


def test_an_agent_store_is_read_one_training_at_a_time(tmp_path: Any) -> None:
    import subprocess

    from conftest import stallscope_argv

    from stallscope.analysis.rundata import load_run
    from stallscope.errors import UsageError

    run = _agent_store(tmp_path)
    data = load_run(run)
    assert data.meta["training"] == "r-big"
    assert data.meta["trainings"] == {"r-big": 40, "r-small": 5}
    assert {e["entity"] for e in data.entities if e["source"] == "procs"} == {"11", "12"}
    assert ("procs.cpu_pct", "21") not in data.series and ("host.cpu_pct", "") in data.series
    small = load_run(run, "r-s")  # a prefix
    assert {e["entity"] for e in small.entities if e["source"] == "procs"} == {"21"}
    with pytest.raises(
        UsageError,
        match=r"no training 'x' in this agent store \(it followed: "
        r"r-big, r-small\)",
    ):
        load_run(run, "x")
    with pytest.raises(UsageError, match="more than one training 'r-'"):
        load_run(run, "r-")
    r = subprocess.run(
        stallscope_argv("diagnose", str(run)), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert (
        "agent store: training r-big (of 2 it followed: the one with the most process "
        "samples; another with --run-id r-small)" in r.stdout
    )
    r = subprocess.run(
        stallscope_argv("show", str(run), "--run-id", "r-small"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "agent store: training r-small" in r.stdout, r.stderr
    r = subprocess.run(
        stallscope_argv("show", str(run), "--run-id", "nope"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no training 'nope'" in r.stderr


@pytest.mark.slow
def test_attaching_to_a_trainer_with_the_probe_joins_its_steps(tmp_path: Any) -> None:
    """`run --pid` on a trainer that has a standalone probe (stallscope.watch, no stallscope
    run): the probe writes to its own run; the attached run copies its steps as they come, so
    its diagnosis is the probe's (not "no probe, add one")."""
    import json
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from conftest import ROOT, stallscope_argv, training_finding

    from stallscope.store import RunStore

    pytest.importorskip("torch")
    env = {**os.environ, "STALLSCOPE_OUT": str(tmp_path / "probe-runs")}
    trainer = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "train_cpu.py"),
            "--max-seconds",
            "8",
            "--epochs",
            "1000",
            "--files",
            "300",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "probe-runs").glob("*/run.db")):  # the probe's run is up
            assert trainer.poll() is None and time.monotonic() < deadline, "no probe run"
            time.sleep(0.2)
        r = subprocess.run(
            stallscope_argv(
                "run",
                "--pid",
                str(trainer.pid),
                "--interval",
                "1",
                "--no-stacks",
                "--out",
                str(tmp_path / "runs"),
            ),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        trainer.wait(timeout=60)
    finally:
        trainer.kill()
    assert r.returncode == 0, r.stderr[-3000:]
    [probe_run] = list((tmp_path / "probe-runs").iterdir())
    assert f"has the probe, reporting to {probe_run}" in r.stderr, r.stderr
    [run_dir] = list((tmp_path / "runs").iterdir())
    theirs, ours = (RunStore(Path(d) / "run.db", readonly=True) for d in (probe_run, run_dir))
    try:
        n_theirs, n_ours = len(theirs.steps()), len(ours.steps())
    finally:
        theirs.close()
        ours.close()
    # every step, once; 8 s of training made 19 steps on a slow CI machine, more on a quiet one
    assert n_theirs >= 10 and n_ours == n_theirs, (n_theirs, n_ours)
    d = subprocess.run(
        stallscope_argv("diagnose", str(run_dir), "--json"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(d.stdout)
    assert doc["stall_source"] == "probe", doc["stall_source"]
    assert training_finding(doc)["kind"].startswith("input_bound"), doc["findings"]


def test_every_row_that_sums_up_a_series_says_how() -> None:
    """CPU, GPU and disk rows say whether they are a mean or a median (compare's CPU rows are
    means, show's are medians: unlabeled, the two disagreed without a word)."""
    for label, key, _unit in _ROWS:
        if key.endswith(("_pct", "_ms_median")):
            assert "(mean" in label or "(median" in label, label
