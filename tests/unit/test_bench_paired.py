"""benchmarks/paired.py: the pick against the grid's best, round by round, with the best chosen
from the other rounds."""

from __future__ import annotations

import random
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from paired import paired_ratio


def test_drift_cancels_within_a_round() -> None:
    # the machine slows by half between rounds; the pick is 0.9 of the best in every round
    speed = [1.0, 0.5, 0.8, 0.6, 1.0]
    best = [1000 * s for s in speed]
    pick = [900 * s for s in speed]
    other = [950 * s for s in speed]
    r = paired_ratio(pick, {"a": best, "b": other})
    assert r.ratio == pytest.approx(0.9)
    assert r.per_round == pytest.approx([0.9] * 5)
    assert r.chosen == ["a"] * 5 and r.best == "a"


def test_equal_candidates_do_not_bias_the_ratio_down() -> None:
    # three configurations as fast as the pick, each round ±8% noise: the naive figure (the
    # best chosen on the numbers it is compared on) is biased low; leave-one-out is not
    rng = random.Random(7)
    naive, loo = [], []
    for _ in range(400):

        def draw() -> list[float]:
            return [1000 * (1 + rng.gauss(0, 0.08)) for _ in range(5)]

        r = paired_ratio(draw(), {k: draw() for k in "abc"})
        naive.append(r.in_sample)
        loo.append(r.ratio)
    mean_naive = sum(naive) / len(naive)
    mean_loo = sum(loo) / len(loo)
    assert mean_naive < 0.98, mean_naive
    assert abs(mean_loo - 1.0) < abs(mean_naive - 1.0), (mean_loo, mean_naive)


def test_a_slower_pick_is_still_found_slower() -> None:
    rng = random.Random(3)
    rounds = 5
    best = [1000 * (1 + rng.gauss(0, 0.05)) for _ in range(rounds)]
    pick = [0.8 * b * (1 + rng.gauss(0, 0.05)) for b in best]
    r = paired_ratio(pick, {"best": best, "worse": [0.7 * b for b in best]})
    assert 0.7 < r.ratio < 0.9


@pytest.mark.parametrize(
    "pick, cands", [([1.0], {"a": [1.0]}), ([1.0, 2.0], {}), ([1.0, 2.0], {"a": [1.0]})]
)
def test_bad_shapes_are_refused(pick: list[float], cands: dict[str, list[float]]) -> None:
    with pytest.raises(ValueError):
        paired_ratio(pick, cands)
