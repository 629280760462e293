"""What every diagnosis rule shares: the stall thresholds, the speed-up bound and small formatters.
"""

from __future__ import annotations

from collections.abc import Callable

from stallscope.analysis.diagnose.model import Finding, RunData
from stallscope.analysis.facts import Facts
from stallscope.loadermodel import (
    stall_cap,
)

STALL_WARN = 0.15  #: data wait share of step time from which input is called a bottleneck


STALL_CRIT = 0.40


def _speedup(stall: float | None) -> float:
    """Upper bound if the stall went away entirely: wall / (wall - wait)."""
    return stall_cap(stall)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _workers_now(fx: Facts) -> int | None:
    nw = fx.loader.config.get("num_workers")
    if nw is None and fx.loader.workers:
        return fx.loader.workers
    return int(nw) if nw is not None else None


Rule = Callable[[RunData, Facts], list[Finding]]
