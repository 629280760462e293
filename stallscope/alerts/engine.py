"""The alert engine: rules evaluated over time-ordered points, with a pending time (``for_s``),
hysteresis (``clear_below`` / ``clear_above``), a cooldown and a confirmation count.

Pure: :meth:`AlertEngine.evaluate` takes one sample's time and points and returns the
transitions (an alert firing or clearing, and whether to notify), so ``stallscope alerts
replay`` runs the very same code over a stored run that the live sink runs on each sample.

Per (rule, entity) the state is ``ok`` → ``pending`` (the condition holds, for less than
``for_s``) → ``firing`` → ``ok`` once the clear condition holds. Notifications: one when an
alert fires, one when that alert clears. A new firing within ``cooldown_s`` of the previous
firing (notified or not) is recorded as a run event but not notified, and then neither is its
clearing: flapping input sends one firing and one clearing, then nothing until it has been quiet
for ``cooldown_s``. Actions with side effects wait until the condition has
held for ``confirm`` consecutive evaluations as well as ``for_s`` seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from stallscope.alerts.rules import Rule
from stallscope.metrics import Point

__all__ = ["AlertEngine", "Transition"]

State = Literal["ok", "pending", "firing"]


@dataclass(frozen=True)
class Transition:
    """An alert changed state."""

    ts: float
    rule: Rule
    entity: str
    state: Literal["firing", "cleared"]
    value: float
    notify: bool  #: send it (False: inside the cooldown, or the clearing of an unsent firing)

    def summary(self) -> str:
        ent = f" on {self.entity}" if self.entity else ""
        if self.state == "firing":
            return (f"{self.rule.name}{ent} firing: {self.rule.metric} = {self.value:g} "
                    f"({self.rule.describe()})")
        return f"{self.rule.name}{ent} cleared: {self.rule.metric} = {self.value:g}"


@dataclass
class _Track:
    state: State = "ok"
    since: float = 0.0  #: when the condition started to hold
    count: int = 0  #: consecutive evaluations it held
    notified: bool = False  #: the current firing was notified


class AlertEngine:
    """Evaluates rules sample after sample."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = tuple(rules)
        self._by_metric: dict[str, list[Rule]] = {}
        for r in self.rules:
            self._by_metric.setdefault(r.metric, []).append(r)
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._last_fired: dict[tuple[str, str], float] = {}

    @property
    def metrics(self) -> set[str]:
        """The metrics the rules read (replay loads only these)."""
        return set(self._by_metric)

    def firing(self) -> list[tuple[str, str]]:
        """(rule name, entity) of the alerts firing now."""
        return [k for k, t in self._tracks.items() if t.state == "firing"]

    def evaluate(self, ts: float, points: Iterable[Point]) -> list[Transition]:
        out: list[Transition] = []
        by_metric = self._by_metric
        for p in points:
            rules = by_metric.get(p.name)
            if not rules:
                continue
            for rule in rules:
                if rule.entity is not None and rule.entity != p.entity:
                    continue
                t = self._step(rule, p.entity, ts, p.value)
                if t is not None:
                    out.append(t)
        return out

    def _step(self, rule: Rule, entity: str, ts: float, v: float) -> Transition | None:
        key = (rule.name, entity)
        tr = self._tracks.get(key)
        if tr is None:
            tr = self._tracks[key] = _Track()
        if tr.state == "firing":
            if rule.cleared(v):
                tr.state, tr.count = "ok", 0
                notify, tr.notified = tr.notified, False
                return Transition(ts, rule, entity, "cleared", v, notify)
            return None
        if not rule.condition(v):
            tr.state, tr.count = "ok", 0
            return None
        if tr.state == "ok":
            tr.state, tr.since, tr.count = "pending", ts, 0
        tr.count += 1
        if ts - tr.since < rule.for_s or tr.count < rule.confirm:
            return None
        tr.state = "firing"
        last = self._last_fired.get(key)
        # notified only after cooldown_s without any firing: a flapping alert sends its first
        # firing and that firing's clearing, then stays quiet until it has calmed down
        tr.notified = last is None or ts - last >= rule.cooldown_s
        self._last_fired[key] = ts
        return Transition(ts, rule, entity, "firing", v, tr.notified)
