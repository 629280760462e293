"""stallscope.stats: the one percentile, median and line fit, and their edge-case rules."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from stallscope.stats import fit_line, median, percentile, weighted_median


@pytest.mark.parametrize("q", [0, 5, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear(q: float) -> None:
    rng = random.Random(q)
    xs = [rng.uniform(-5, 50) for _ in range(37)]
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_and_median_of_nothing_are_nan() -> None:
    assert math.isnan(percentile([], 50))
    assert math.isnan(median([]))


def test_median_even_and_odd() -> None:
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    assert median(x for x in (1.0, 9.0)) == 5.0  # any iterable


def test_line_recovers_slope_and_fit() -> None:
    pts = [(t, 3.0 + 0.5 * t) for t in range(10)]
    line = fit_line(reversed(pts))  # order does not matter
    assert line.slope == pytest.approx(0.5)
    assert line.r2 == pytest.approx(1.0)
    assert line.at(20) == pytest.approx(13.0)
    _slope, intercept = np.polyfit([t for t, _ in pts], [v for _, v in pts], 1)
    assert line.at(0) == pytest.approx(intercept)


def test_noisy_line_r2_matches_numpy() -> None:
    rng = random.Random(7)
    pts = [(float(t), 2.0 * t + rng.gauss(0, 5)) for t in range(50)]
    r = np.corrcoef([t for t, _ in pts], [v for _, v in pts])[0, 1]
    assert fit_line(pts).r2 == pytest.approx(r * r)


def test_flat_line_rule() -> None:
    """The agreed rule: identical values are explained completely (slope 0, r2 1); points at
    one single time have no line (slope 0, r2 0)."""
    flat = fit_line([(t, 7.0) for t in range(5)])
    assert (flat.slope, flat.r2, flat.at(100)) == (0.0, 1.0, 7.0)
    vertical = fit_line([(1.0, v) for v in range(5)])
    assert (vertical.slope, vertical.r2) == (0.0, 0.0)
    with pytest.raises(ValueError):
        fit_line([])


def test_paths_follow_the_environment() -> None:
    from pathlib import Path

    from stallscope.store.paths import DEFAULT_OUT, default_out, state_dir

    assert state_dir({"STALLSCOPE_STATE_DIR": "/x", "XDG_STATE_HOME": "/s"}) == Path("/x")
    assert state_dir({"XDG_STATE_HOME": "/s", "HOME": "/h"}) == Path("/s/stallscope")
    assert state_dir({"HOME": "/h"}) == Path("/h/.local/state/stallscope")
    assert default_out({}) == DEFAULT_OUT == "stallscope-runs"
    assert default_out({"STALLSCOPE_OUT": "/runs"}) == "/runs"


def test_weighted_median_is_the_median_of_the_values_repeated() -> None:
    """A row of n short steps counts n times (store/db.py): the weighted median must be what
    median() gives on the values repeated, odd and even totals alike."""
    rng = random.Random(7)
    for trial in range(300):
        pairs = [
            (rng.choice([rng.uniform(0, 9), 1.0, 2.0]), rng.randint(0, 5))
            for _ in range(rng.randint(1, 12))
        ]
        flat = [v for v, w in pairs for _ in range(w)]
        got = weighted_median(pairs)
        if flat:
            assert got == pytest.approx(median(flat)), (trial, pairs)
        else:
            assert math.isnan(got)
    assert weighted_median([(5.0, 1), (1.0, 1)]) == 3.0
    assert weighted_median([(5.0, 3), (1.0, 1)]) == 5.0
    assert math.isnan(weighted_median([]))
