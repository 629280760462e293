"""What a tuning found: :class:`TuneResult`, and the bound of its best configuration in words
(:func:`bound_text`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stallscope.loadermodel import CPU_BOUND_SHARE
from stallscope.tuner.measure import Trial


@dataclass
class TuneResult:
    """What :func:`stallscope.tune` found. ``best`` holds the recommended DataLoader keyword
    arguments; ``trials`` every configuration tried, in order."""

    best: dict[str, Any]
    samples_per_s: float | None
    baseline: dict[str, Any]
    trials: list[Trial]
    recommendation: str
    bound: str
    stopped: str
    step_ms: float | None = None
    cores: int = 0
    budget_s: float = 0.0
    seconds: float = 0.0
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    #: the position in ``trials`` of the trial ``best`` comes from
    best_index: int | None = None
    #: the model's rate for the recommended worker count, predicted from the calibration
    #: (the baseline and one worker) before a trial measured it, over the baseline's rate;
    #: None where the pick is one of the calibration's own configurations or no model ran
    predicted_speedup: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "samples_per_s": _r(self.samples_per_s),
            "baseline": self.baseline,
            "speedup": _r(self.samples_per_s / self.baseline["samples_per_s"])
            if self.samples_per_s and self.baseline.get("samples_per_s")
            else None,
            "predicted_speedup": _r(self.predicted_speedup),
            "recommendation": self.recommendation,
            "bound": self.bound,
            "stopped": self.stopped,
            "step_ms": _r(self.step_ms),
            "cores": self.cores,
            "budget_s": self.budget_s,
            "seconds": _r(self.seconds),
            "interrupted": self.interrupted,
            "notes": self.notes,
            "trials": [t.as_dict() for t in self.trials],
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def tree_share(t: Trial, cores: int) -> float:
    """The share of the usable cores the trainer and its workers used in ``t``."""
    return (t.cpu_pct or 0.0) / (100.0 * cores) if cores else 0.0


def bound_text(
    best: Trial | None,
    trials: list[Trial],
    *,
    keeps_up: bool,
    step_ms: float | None,
    cores: int,
    max_workers: int,
) -> str:
    """What bounds the best configuration, in words: the training step (the input keeps up,
    ``keeps_up``), the CPU (the usable cores busy, or the step slowed by the workers beside
    it), the storage, or the pipeline as a whole. ``step_ms``: the step alone per batch."""
    if best is None or not best.samples_per_s:
        return "no configuration ran: see the trials"
    rate = best.samples_per_s
    w = best.config.get("num_workers", 0)
    where = f"{rate:,.0f} samples/s with num_workers={w}"
    if keeps_up:
        if best.step_ms and step_ms and best.step_ms > 1.3 * step_ms:
            # the input keeps up only because the step itself slowed: they share the CPU
            return (
                f"CPU-bound: the input keeps up at {where} (data wait "
                f"{100 * (best.data_wait_share or 0):.1f}%), but the training step "
                f"slowed from {step_ms:.0f} to {best.step_ms:.0f} ms per batch "
                f"with the workers beside it on the {cores} usable cores. A "
                "cheaper transform, decoding once ahead of time, or more cores would "
                "go further"
            )
        step = f" ({step_ms:.1f} ms per batch)" if step_ms is not None else ""
        return (
            f"the training step{step} is now the limit, not the input: {where}, data "
            f"wait {100 * (best.data_wait_share or 0):.1f}%"
        )
    per = best.cpu_ms_per_sample
    per_text = f" ({per:.1f} ms of CPU per sample)" if per is not None else ""
    busy = best.worker_cpu_pct or 0.0 if w else best.cpu_pct or 0.0
    share = tree_share(best, cores)
    slowed = [
        t
        for t in trials
        if t.status in ("ok", "cut")
        and t.step_ms
        and step_ms
        and t.config.get("num_workers", 0) > w
        and t.step_ms > 1.3 * step_ms
    ]
    if share >= CPU_BOUND_SHARE or slowed or (w and w >= max_workers and busy >= 60):
        why = (
            f"; with more workers the step slows from {step_ms:.0f} to "
            f"{slowed[0].step_ms:.0f} ms per batch"
            if slowed and step_ms and slowed[0].step_ms
            else ""
        )
        return (
            f"CPU-bound: the pipeline saturates at {where}, the {cores} usable "
            f"cores busy ({best.cpu_pct or 0:.0f}% CPU) with loading{per_text} and the "
            f"training step{why}. A cheaper transform, decoding once ahead of time, or "
            "more cores would go further"
        )
    if w and busy < 50 and (best.read_mb_s or 0) > 0.5:
        return (
            f"storage-bound, reading {best.read_mb_s:.0f} MB/s from storage: the "
            f"workers wait on reads ({busy:.0f}% CPU each) and the pipeline saturates "
            f"at {where}; pack the small files into shards (stallscope pack SRC DST) "
            "or cache the dataset on a faster disk"
        )
    return f"the pipeline saturates at {where}{per_text}"
