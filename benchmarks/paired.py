"""Comparing a tuner's pick with "the grid's best" when the candidates differ by less than one
measurement's noise (``bench_tune.py``, ``bench_autotune.py``).

Two biases make the naive figure too low on a noisy machine:

- **Drift**: the machine's speed moves over minutes. Every round measures the pick and every
  candidate back to back, and the ratio is taken within the round.
- **The winner's curse**: the largest of several noisy figures is biased upwards, so a best
  chosen from the same numbers it is then compared on looks better than it is. In each round the
  grid's best is chosen from the *other* rounds only (leave one out), and the pick is compared
  with that configuration in this round.

``in_sample`` (the best by its median over all rounds, compared on those same rounds) is
returned too, so a reader sees how much the correction moved the figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Paired", "paired_ratio"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Paired(Generic[K]):
    ratio: float  #: median over rounds of pick ÷ (the best chosen without that round)
    per_round: list[float]  #: each round's ratio
    chosen: list[K]  #: each round's best, chosen from the other rounds
    in_sample: float  #: median(pick) ÷ median(best by its own median), the naive figure
    best: K  #: the best by its median over all rounds


def paired_ratio(pick: Sequence[float], candidates: Mapping[K, Sequence[float]]) -> Paired[K]:
    """``pick[i]`` and ``candidates[k][i]`` were measured in round ``i``; at least 2 rounds."""
    n = len(pick)
    if n < 2 or not candidates or any(len(v) != n for v in candidates.values()):
        raise ValueError("paired_ratio needs ≥ 2 rounds, with every candidate in every round")
    per_round: list[float] = []
    chosen: list[K] = []
    for i in range(n):
        best = max(
            candidates,
            key=lambda k: statistics.median([x for j, x in enumerate(candidates[k]) if j != i]),
        )
        chosen.append(best)
        per_round.append(pick[i] / candidates[best][i])
    overall = max(candidates, key=lambda k: statistics.median(candidates[k]))
    return Paired(
        ratio=statistics.median(per_round),
        per_round=per_round,
        chosen=chosen,
        in_sample=statistics.median(pick) / statistics.median(candidates[overall]),
        best=overall,
    )
