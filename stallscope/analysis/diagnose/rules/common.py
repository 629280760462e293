"""What every diagnosis rule shares: the stall thresholds, the speed-up bound and small
formatters."""

from __future__ import annotations

from collections.abc import Callable

from stallscope.analysis.diagnose.model import Finding, RunData
from stallscope.analysis.facts import Facts

STALL_WARN = 0.15  #: data wait share of step time from which input is called a bottleneck


STALL_CRIT = 0.40


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _workers_now(fx: Facts) -> int | None:
    nw = fx.loader.config.get("num_workers")
    if nw is None and fx.loader.workers:
        return fx.loader.workers
    return int(nw) if nw is not None else None


Rule = Callable[[RunData, Facts], list[Finding]]


def pack_command(data: RunData) -> str | None:
    """`stallscope pack` for this run's dataset (``run --data``), as it runs when pasted; None
    when the run does not know where its dataset is."""
    import shlex

    src = data.meta.get("data")
    if not isinstance(src, str) or not src.strip() or "\n" in src:
        return None
    dst = src.rstrip("/") + "-shards"
    return f"stallscope pack {shlex.quote(src)} {shlex.quote(dst)}"


def pid_to_look_at(data: RunData, role: str) -> str | None:
    """A pid of the run's ``role`` ("worker", "main") to point py-spy at; None if none."""
    pids = sorted((p for p, r in data.roles().items() if r == role), key=lambda p: (len(p), p))
    return pids[0] if pids else None
