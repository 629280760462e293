"""Change detection on series with known change points, and on stationary noise of several
shapes (heavy tails included): every shift found within a stated delay, no false alarm."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from stallscope.analysis.changes import detect_changes

Noise = Callable[[random.Random], float]


def _gauss(r: random.Random) -> float:
    return r.gauss(0.0, 1.0)


def _laplace(r: random.Random) -> float:  # scale 1: MAD-based scale ≈ 0.69 × ... heavier tails
    return r.expovariate(1.0) * (1 if r.random() < 0.5 else -1)


def _student_t2(r: random.Random) -> float:  # infinite variance
    return r.gauss(0.0, 1.0) / math.sqrt(r.gammavariate(1.0, 2.0) / 2.0)


def _lognormal(r: random.Random) -> float:  # skewed, like latencies
    return math.exp(r.gauss(0.0, 1.0))


SHAPES: dict[str, Noise] = {
    "gauss": _gauss,
    "laplace": _laplace,
    "student_t2": _student_t2,
    "lognormal": _lognormal,
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_alarm_on_stationary_noise(shape: str, seed: int) -> None:
    r = random.Random(seed)
    xs = [50.0 + SHAPES[shape](r) for _ in range(10_000)]
    assert detect_changes(list(range(10_000)), xs) == []


@pytest.mark.parametrize("shape", ["gauss", "laplace", "student_t2"])
@pytest.mark.parametrize("shift, within", [(2.0, 40), (4.0, 15), (-4.0, 15)])
def test_every_shift_is_found_within_a_stated_delay(shape: str, shift: float, within: int) -> None:
    """A step of `shift` noise scale units at sample 500 (10 seeds each)."""
    noise = SHAPES[shape]
    for seed in range(10):
        r = random.Random(1000 + seed)
        xs = [50.0 + noise(r) + (shift if i >= 500 else 0.0) for i in range(1000)]
        changes = detect_changes([float(i) for i in range(1000)], xs)
        assert len(changes) == 1, (seed, changes)
        c = changes[0]
        assert 500 <= c.detected_ts <= 500 + within, (seed, c)
        assert abs(c.start_ts - 500) <= within, (seed, c)  # dated near where it began
        assert c.direction == ("up" if shift > 0 else "down")
        assert abs((c.after - c.before) - shift) < 0.6 * abs(shift), c  # before/after right


def test_several_changes_and_an_explanation() -> None:
    r = random.Random(7)
    levels = [10.0] * 300 + [30.0] * 300 + [12.0] * 300
    xs = [v + r.gauss(0, 1) for v in levels]
    changes = detect_changes([float(i) for i in range(len(xs))], xs)
    assert [c.direction for c in changes] == ["up", "down"]
    assert changes[0].describe("ms").startswith("shifted up from 10.1 ms to 30")
    # a flat series (an idle GPU at 0%) and a short one give nothing
    assert detect_changes(list(range(500)), [0.0] * 500) == []
    assert detect_changes([0, 1, 2], [1.0, 50.0, 1.0]) == []


def test_diagnose_reports_when_the_run_changed_pace() -> None:
    from stallscope.analysis.diagnose import diagnose
    from stallscope.analysis.rundata import RunData
    from stallscope.store import Series, StepRow

    r = random.Random(3)
    t0 = 1_763_712_000.0
    steps, t = [], t0
    for i in range(600):
        wait = 0.002 + abs(r.gauss(0, 0.0005)) + (0.040 if i >= 300 else 0.0)  # loader slows
        host = 0.050 + r.gauss(0, 0.002)
        steps.append(StepRow(0, i, t, wait, host))
        t += wait + host
    temps = Series(
        "gpu.temp_c",
        "gpu0",
        [t0 + i for i in range(200)],
        [60 + r.gauss(0, 0.5) + (15 if i >= 120 else 0) for i in range(200)],
    )
    data = RunData(
        meta={"start": t0, "end": t}, series={("gpu.temp_c", "gpu0"): temps}, steps=steps
    )
    doc = diagnose(data)
    got = {(c["metric"], c["entity"], c["direction"]) for c in doc["changes"]}
    assert ("data_wait_share", "rank0", "up") in got
    assert ("step_ms", "rank0", "up") in got
    assert ("gpu.temp_c", "gpu0", "up") in got
    temp = next(c for c in doc["changes"] if c["metric"] == "gpu.temp_c")
    assert 115 <= temp["start_s"] <= 125 and 74 <= temp["after"] <= 76


def test_a_blip_is_no_change_and_a_change_says_when_it_ended_and_why() -> None:
    """Issue 40: a 1.2-s stall read as a lasting shift ("step_ms shifted up from 61 ms to 127
    ms"), and autotune's switches as changes with no cause. A shift must last, the line says
    when a level ended, and a change at a known turning point names it."""
    from stallscope.analysis.diagnose import changes
    from stallscope.analysis.rundata import RunData
    from stallscope.store import StepRow

    r = random.Random(5)
    t0 = 1_763_712_000.0

    def run(hosts: list[float], epochs: list[int], events: list[dict]) -> list[dict]:
        steps, t = [], t0
        for i, (host, ep) in enumerate(zip(hosts, epochs, strict=True)):
            wait = 0.001 + abs(r.gauss(0, 0.0002))
            steps.append(StepRow(0, i, t, wait, host + r.gauss(0, 0.002), epoch=ep))
            t += wait + host
        return changes(RunData(meta={"start": t0, "end": t}, series={}, steps=steps, events=events))

    # 600 steps of 61 ms with a 1.2-s stall (20 steps at 127 ms) in the middle: no change
    hosts = [0.061] * 300 + [0.127] * 20 + [0.061] * 300
    assert [c for c in run(hosts, [0] * 620, []) if c["metric"] == "step_ms"] == []
    # a slower level from step 300 to 500 (~12 s at 61 ms): a change, and when it ended
    hosts = [0.061] * 300 + [0.127] * 200 + [0.061] * 300
    got = [c for c in run(hosts, [0] * 800, []) if c["metric"] == "step_ms"]
    assert got and got[0]["direction"] == "up" and got[0]["ended_s"] is not None, got
    assert "back " in got[0]["summary"] and "s later" in got[0]["summary"]
    # the same shift at an epoch boundary is named after it
    got = [
        c
        for c in run([0.061] * 300 + [0.127] * 300, [0] * 300 + [1] * 300, [])
        if c["metric"] == "step_ms"
    ]
    assert got and got[0]["cause"] == "the start of epoch 1", got
    assert got[0]["summary"].endswith("(at the start of epoch 1)")
