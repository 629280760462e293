"""The TRAINING panel's source (stallscope/live/training.py) on real run directories: the steps
that arrive are read incrementally, figures cover the last 10 s, and when the run followed ends
the panel moves to the next running run (it used to stay on the finished one)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from stallscope.live import training
from stallscope.live.training import TrainingWatch
from stallscope.store import RunStore, StepRow
from stallscope.store.index import record_run
from stallscope.store.rundir import base_meta, write_meta


def _run(root: Path, name: str, pid: int) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    write_meta(
        run_dir,
        base_meta(
            ["python", "train.py"],
            start=time.time(),
            interval_s=1.0,
            pid=pid,
            monitor_pid=os.getpid(),
        ),
    )
    store = RunStore(run_dir / "run.db")
    store.set_probe(0, pid, {}, 0, 0)
    store.close()
    record_run(run_dir)
    return run_dir


def _steps(run_dir: Path, first: int, n: int, now: float, wait: float, host: float) -> None:
    store = RunStore(run_dir / "run.db")
    store.add_steps(
        StepRow(0, first + i, now - (n - i) * (wait + host), wait, host, samples=32)
        for i in range(n)
    )
    store.close()


def _finish(run_dir: Path) -> None:
    meta_path = run_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["end"] = time.time()
    meta["exit_code"] = 0
    write_meta(run_dir, meta)


def test_live_figures_then_the_next_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training, "FIND_EVERY_S", 0.0)
    monkeypatch.setattr(training, "VERDICT_EVERY_S", 3600.0)  # no diagnosis here
    me = os.getpid()
    a = _run(tmp_path, "a", me)
    now = time.time()
    _steps(a, 0, 20, now, wait=0.3, host=0.1)
    w = TrainingWatch(me)
    v = w.view(now)
    assert v is not None and v.run_id == "a" and v.steps == 20
    assert abs((v.wait_share or 0) - 0.75) < 0.01
    assert v.samples_s is not None and v.steps_s is not None
    _steps(a, 20, 5, now + 1, wait=0.0, host=0.2)  # only the new ones are read
    v = w.view(now + 1)
    assert v is not None and v.steps == 25
    # the run ends and another starts: the panel follows the new one
    _finish(a)
    b = _run(tmp_path, "b", me)
    _steps(b, 0, 4, time.time(), wait=0.0, host=0.25)
    v = w.view(time.time())
    assert v is not None and v.run_id == "b" and v.steps == 4 and v.wait_share == 0.0
    w.close()


def test_no_run_no_panel(tmp_path: Path) -> None:
    assert TrainingWatch(None).view() is None


def test_a_process_no_run_watches_is_sampled_or_says_why(tmp_path: Path) -> None:
    """``top --pid`` on a training no run watches: its stacks, sampled by py-spy; a process
    py-spy cannot sample (not Python) gets one line saying why."""
    w = TrainingWatch(os.getpid())
    try:
        v = w.view()
        assert v is not None and v.sampled_only and v.stack_note is None
        assert v.run_id == f"pid {os.getpid()} (sampled by py-spy, no run)"
    finally:
        w.stop()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        w = TrainingWatch(sleeper.pid)
        v = w.view()
        assert v is not None and v.stack_note is not None and "CPython" in v.stack_note
        w.stop()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_panel_shows_phase_shares_without_a_probe() -> None:
    from stallscope.live.training import TrainingView
    from stallscope.live.view import ViewState, render

    t = TrainingView(
        run_id="r1",
        phases={"data": 0.83, "compute": 0.12, "other": 0.05},
        phase_rank=1,
        verdict="straggler_rank",
        reason="Rank 1 holds the job back",
    )
    text = [ln.plain for ln in render(None, ViewState(training=t), 120, None)]
    assert not any("TRAINING" in ln for ln in text)  # no sample yet: only the first line
    from stallscope.live.view import _training_lines

    lines = [ln.plain for ln in _training_lines(ViewState(training=t), 120)]
    assert lines[0].startswith(
        "TRAINING  data 83% · compute 12% · other 5% (sampled stacks, rank 1, last 10 s)"
    ), lines
    assert lines[1].startswith("verdict  straggler_rank  Rank 1 holds"), lines
    refused = TrainingView(run_id="pid 7", stack_note="cannot sample pid 7: refused")
    [line] = [ln.plain for ln in _training_lines(ViewState(training=refused), 120)]
    assert line == "TRAINING  stacks not sampled: cannot sample pid 7: refused"


def test_the_panel_names_the_rank_the_others_wait_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two DDP ranks with communication timed: for 25 frames they keep pace, then rank 0
    waits 30% of its step in the all-reduce for rank 1: the panel names rank 1 within a few
    frames, with the gap."""
    from stallscope.live.view import ViewState, _training_lines

    monkeypatch.setattr(training, "VERDICT_EVERY_S", 3600.0)
    me = os.getpid()
    run = _run(tmp_path, "ddp", me)
    store = RunStore(run / "run.db")
    store.set_probe(1, me, {}, 0, 0)
    w = TrainingWatch(me)
    now, step, named = time.time(), 0, None
    for frame in range(40):
        gap = 0.0 if frame < 25 else 0.3
        rows = []
        for _ in range(5):
            step += 1
            rows += [
                StepRow(0, step, now + frame, 0.0, 0.1, comm_s=0.01 + gap * 0.1),
                StepRow(1, step, now + frame, 0.0, 0.1, comm_s=0.01),
            ]
        store.add_steps(rows)
        v = w.view(now + frame)
        assert v is not None
        if v.waited_for:
            named = (frame, v.waited_for)
            break
    store.close()
    assert named is not None and 25 <= named[0] <= 29 and set(named[1]) == {1}, named
    lines = [ln.plain for ln in _training_lines(ViewState(training=v), 140)]
    assert any(
        ln.startswith(
            "straggler  rank 1: the other ranks wait for it in the all-reduce, 30 points more"
        )
        for ln in lines
    ), lines
    w.close()


def test_keys_are_split_with_their_escape_sequences() -> None:
    from stallscope.live.app import DOWN, ESC, UP, split_keys

    assert split_keys("j\x1b[Bk\x1b[A") == ["j", DOWN, "k", UP]
    assert split_keys("\x1bOB") == [DOWN]  # application cursor mode
    assert split_keys("\x1b") == [ESC] and split_keys("\x1b[5~q") == ["q"]  # PgUp skipped
    assert split_keys("\r") == ["\r"]


def test_the_pick_moves_through_the_last_frame_s_order() -> None:
    from stallscope.live.view import ViewState, move_selection

    st = ViewState(order=["30", "10", "20"])
    move_selection(st, 1)
    assert st.selected == "30"
    move_selection(st, 1)
    move_selection(st, 1)
    move_selection(st, 1)
    assert st.selected == "20"  # stays at the end
    st.order = ["20", "30", "10"]  # another sort: the pick is the process, not the row
    move_selection(st, -1)
    assert st.selected == "20"
