"""A run's throughput in samples per second, from the best evidence it holds.

* ``probe``: the probe's per-step records (``stallscope.watch``, the framework callbacks):
  each rank's samples over its steps' wall time, ranks added together;
* ``counted_batches``: the DataLoader batches ``stallscope run`` counted inside a PyTorch
  trainer with no stallscope code (:mod:`stallscope.sources.stacks.batches`), over the
  training window.

``show``, ``run``'s end summary and ``compare`` read it from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stallscope.analysis.stacks import batch_throughput, trainer_phases

if TYPE_CHECKING:
    from stallscope.analysis.rundata import RunData

__all__ = ["COUNTED_BATCHES", "PROBE_STEPS", "SOURCE_TEXT", "throughput"]

PROBE_STEPS, COUNTED_BATCHES = "probe", "counted_batches"
#: each source in words, for text output
SOURCE_TEXT = {
    PROBE_STEPS: "the probe's steps",
    COUNTED_BATCHES: "the DataLoader batches counted inside the trainer",
}


def throughput(data: RunData) -> tuple[float | None, str | None]:
    """(samples per second, its source); (None, None) where the run holds neither."""
    if data.steps:
        by_rank: dict[int, tuple[int, float]] = {}
        for s in data.steps:
            n, wall = by_rank.get(s.rank, (0, 0.0))
            by_rank[s.rank] = (n + (s.samples or 0), wall + s.wait_s + s.host_s)
        rates = [n / wall for n, wall in by_rank.values() if wall > 0 and n > 0]
        if rates:
            return round(sum(rates), 2), PROBE_STEPS
    win = data.window()
    if win.source == "run":
        return None, None
    rate = batch_throughput(trainer_phases(data.stacks, data.roles()), win.seconds)
    return (rate, COUNTED_BATCHES) if rate is not None else (None, None)
