"""DataLoader auto-tuning: ``stallscope.tune(dataset_or_factory)`` and ``stallscope tune``.

Measures the training step's rate (the consumer) and each candidate configuration's delivered
rate (the producer) in short trials, searching ``num_workers`` (up to the usable cores),
``prefetch_factor``, ``pin_memory`` (with a GPU) and optionally ``batch_size``; stops once the
input keeps up with the step. The order: :mod:`stallscope.tuner.search`; docs/tune.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stallscope.tuner.measure import Trial
from stallscope.tuner.search import Progress, Search, TuneResult, usable_cores
from stallscope.tuner.target import Target, call_text, load, target_of

__all__ = ["DEFAULT_BUDGET_S", "Trial", "TuneResult", "load", "tune", "usable_cores"]

#: the default time budget, seconds
DEFAULT_BUDGET_S = 120.0


def tune(
    dataset_or_factory: Any,
    *,
    step_fn: Callable[[Any], Any] | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    batch_size: int | None = None,
    max_workers: int | None = None,
    start_method: str | None = None,
    batch_sizes: Sequence[int] = (),
    progress: Progress | None = None,
) -> TuneResult:
    """Find DataLoader keyword arguments that feed ``step_fn`` fastest.

    ``dataset_or_factory``: a Dataset, a DataLoader (its configuration is the baseline), or a
    function taking DataLoader keyword arguments and returning a DataLoader. ``step_fn(batch)``:
    one training step; without it the tuner maximises the loader's own rate. ``budget_s``: time
    for all trials. ``start_method``: ``"fork"``, ``"spawn"`` or ``"forkserver"`` for the
    workers (default: the platform's). ``batch_sizes``: batch sizes to try at the best
    configuration (they change the training, so only when asked)."""
    if budget_s <= 0:
        raise ValueError("budget_s must be positive")
    target: Target = target_of(dataset_or_factory, batch_size=batch_size)
    search = Search(
        target,
        step_fn=step_fn,
        budget_s=budget_s,
        max_workers=max_workers,
        start_method=start_method,
        batch_sizes=tuple(batch_sizes),
        progress=progress,
    )
    return search.run()


def recommendation(target: Any, config: dict[str, Any]) -> str:
    """The DataLoader call for ``config`` on ``target``, as code."""
    return call_text(target_of(target), config)
