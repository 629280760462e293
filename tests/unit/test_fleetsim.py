"""The fleet benchmark's simulator (benchmarks/fleetsim.py): steps replayed from the real gloo
records behave as DDP steps do, and an injected slowdown lands where it says."""

from __future__ import annotations

import itertools
import random
import statistics
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from fleetsim import Fault, Job, load_recording, schedule


def test_the_recording_is_real_and_scaled_to_one_median() -> None:
    rec = load_recording()
    assert len(rec.own) == 2 and all(len(r) == 908 for r in rec.own) and len(rec.comm) == 908
    medians = [statistics.median(o for _w, o in r) for r in rec.own]
    assert abs(medians[0] - medians[1]) < 1e-9 and 0.03 < medians[0] < 0.05


def test_every_rank_s_step_is_as_long_as_the_slowest_and_a_slowdown_shows_in_the_others_wait() -> (
    None
):
    rec = load_recording()
    job = Job("j", ["a", "b"], 4, rec, 0.0, seed=3)
    job.faults.append(Fault("j", (5,), ("b",), 30.0, 90.0, 0.3, "compute", "rank"))
    rows = [r for rs in job.steps_until(120.0).values() for r in rs]
    by_step: dict[int, list[tuple]] = {}
    for r in rows:
        by_step.setdefault(r[1], []).append(r)
    assert all(len(v) == 8 for v in by_step.values())  # every rank every step
    for v in by_step.values():
        walls = {round(w + h, 9) for _r, _k, _ts, w, h, _c in v}
        assert len(walls) == 1  # one step time for all: the all-reduce ties them
        assert min(c for *_x, c in v) >= 0.0

    def comm_share(rank: int, lo: float, hi: float) -> float:
        mine = [(w + h, c) for r, _k, ts, w, h, c in rows if r == rank and lo <= ts < hi]
        return sum(c for _s, c in mine) / sum(s for s, _c in mine)

    # during the slowdown rank 5 waits far less than its peers; before it, alike
    assert comm_share(0, 40, 90) - comm_share(5, 40, 90) > 0.15
    assert abs(comm_share(0, 0, 30) - comm_share(5, 0, 30)) < 0.08


def test_the_schedule_never_overlaps_two_slowdowns_of_one_job() -> None:
    job = Job("j", ["a", "b"], 8, load_recording(), 0.0, seed=1)
    faults = schedule(job, random.Random(5), 100.0, 2000.0)
    assert len(faults) >= 8
    for a, b in itertools.pairwise(faults):
        assert a.end <= b.start and 60 <= a.end - a.start <= 90
    assert all(
        f.x in (0.05, 0.1, 0.2, 0.3, 0.5) and f.cause in ("compute", "input") for f in faults
    )
    assert {len(f.nodes) for f in faults if f.scope == "node"} <= {1}


def test_the_replay_keeps_each_step_s_jitter_but_not_the_recording_s_slow_stretches() -> None:
    """Over 20 s of steps (what the straggler rules average), a rank replayed as recorded
    drifts by several percent around its mean, which would show as a straggler no one
    injected; detrended, its slowest and fastest 20 s stay within 3%, and its step-to-step
    spread is kept."""

    def spread_20s(own: list[float]) -> float:
        n, w = len(own), 500  # about 20 s of 38-ms steps
        means = [sum(own[(i + j) % n] for j in range(w)) / w for i in range(0, n, 25)]
        return max(means) / min(means) - 1.0

    raw, clean = load_recording(detrend_steps=0), load_recording()
    for r in range(2):
        raw_own = [o for _w, o in raw.own[r]]
        own = [o for _w, o in clean.own[r]]
        assert spread_20s(raw_own) > 0.06 and spread_20s(own) < 0.03
        assert statistics.pstdev(own) > 0.8 * statistics.pstdev(raw_own)


def test_the_rule_model_flags_a_slowdown_on_its_rank_and_nothing_before() -> None:
    """benchmarks/straggler_rule_model.py, which weighs the straggler rules' parameters: over
    a healthy stretch no activation; a rank 30% slower from minute 5 is flagged, on that rank,
    within 30 s; at a threshold no CUSUM reaches (and without the slower one), only the level
    clause (a minute) can."""
    from straggler_rule_model import Params, activations

    rec = load_recording()
    job = Job("j", ["a", "b"], 4, rec, 0.0, seed=5)
    job.faults.append(Fault("j", (6,), ("b",), 300.0, 390.0, 0.3, "compute", "rank"))
    acts, top, _ = activations(job, 420.0, Params())
    assert acts and all(r == 6 for _t, r in acts), acts
    assert 300.0 < acts[0][0] <= 330.0, acts
    assert 0.15 <= top <= 0.3
    job = Job("j", ["a", "b"], 4, rec, 0.0, seed=5)
    job.faults.append(Fault("j", (6,), ("b",), 300.0, 390.0, 0.3, "compute", "rank"))
    late, _, _ = activations(job, 420.0, Params(threshold=0.99, slow_window_s=0.0))
    assert late and late[0][1] == 6 and late[0][0] >= acts[0][0] + 20, (late, acts)


def test_the_rule_model_finds_a_small_slowdown_with_the_slower_detector() -> None:
    """A 5% slower rank raises its peers' wait by about 0.04 of the step, near the 15-s gap's
    noise: the 15-s CUSUM alone (allowance 0.02) has not flagged it within 40 s of its start;
    the shipped rules' 1-minute CUSUM flags it, on its rank, within its 90 s; the highest
    1-minute CUSUM of the healthy stretch before stays far below its threshold."""
    from straggler_rule_model import Params, activations

    def run(p: Params) -> tuple[list[tuple[float, int]], float]:
        job = Job("j", ["a", "b"], 4, load_recording(), 0.0, seed=3)
        job.faults.append(Fault("j", (2,), ("a",), 600.0, 690.0, 0.05, "compute", "rank"))
        acts, _top, slow_top = activations(job, 720.0, p)
        return acts, slow_top

    alone, _ = run(Params(slow_window_s=0.0))
    assert not [t for t, _r in alone if t <= 640.0], alone
    both, _ = run(Params())
    assert both and all(r == 2 for _t, r in both), both
    assert 600.0 < both[0][0] <= 690.0, both
    job = Job("j", ["a", "b"], 4, load_recording(), 0.0, seed=3)
    _acts, _t, quiet = activations(job, 600.0, Params())
    assert quiet < 0.5 * Params().slow_threshold, quiet
