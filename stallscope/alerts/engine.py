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

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from stallscope.alerts.rulefile import TREND_MIN_POINTS, TREND_MIN_SPAN, Rule
from stallscope.metrics import Point
from stallscope.stats import fit_line

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

    #: the values of the rule's ``also`` metrics at the transition
    others: tuple[tuple[str, float], ...] = ()

    def summary(self) -> str:
        ent = f" on {self.entity}" if self.entity else ""
        what = (
            f"{self.rule.metric} slope = {self.value:g}/min"
            if self.rule.trend_s is not None
            else f"{self.rule.metric} = {self.value:g}"
        )
        what += "".join(f", {m} = {v:g}" for m, v in self.others)
        if self.state == "firing":
            return f"{self.rule.name}{ent} firing: {what} ({self.rule.describe()})"
        return f"{self.rule.name}{ent} cleared: {what}"


@dataclass
class _Track:
    state: State = "ok"
    since: float = 0.0  #: when the condition started to hold
    count: int = 0  #: consecutive evaluations it held
    notified: bool = False  #: the current firing was notified
    #: trend rules: the (ts, value) of the window
    window: deque[tuple[float, float]] = field(default_factory=deque)


class AlertEngine:
    """Evaluates rules sample after sample."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = tuple(rules)
        self._by_metric: dict[str, list[Rule]] = {}
        for r in self.rules:
            self._by_metric.setdefault(r.metric, []).append(r)
        self._also_metrics = {a.metric for r in self.rules for a in r.also}
        #: every metric a rule reads: a sample's other points (most of them) are passed over
        #: in one pass
        self._read = frozenset(self._by_metric) | self._also_metrics
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._last_fired: dict[tuple[str, str], float] = {}

    @property
    def metrics(self) -> set[str]:
        """The metrics the rules read (replay loads only these)."""
        return set(self._by_metric) | self._also_metrics

    def firing(self) -> list[tuple[str, str]]:
        """(rule name, entity) of the alerts firing now."""
        # a copy first: the agent's HTTP thread asks while the collector's thread evaluates
        return [k for k, t in list(self._tracks.items()) if t.state == "firing"]

    def evaluate(self, ts: float, points: Iterable[Point]) -> list[Transition]:
        out: list[Transition] = []
        by_metric = self._by_metric
        read = self._read
        pts = [p for p in points if p[0] in read]  # p[0]: the name, without a getter call
        seen: dict[tuple[str, str], float] | None = None
        if self._also_metrics:  # values of this sample, for conditions across metrics
            seen = {(p.name, p.entity): p.value for p in pts if p.name in self._also_metrics}
        for p in pts:
            rules = by_metric.get(p.name)
            if not rules:
                continue
            for rule in rules:
                if rule.entity is not None and rule.entity != p.entity:
                    continue
                others: tuple[tuple[str, float], ...] = ()
                also_ok = True
                if rule.also and seen is not None:
                    vals = [seen.get((a.metric, p.entity)) for a in rule.also]
                    also_ok = all(a.holds(v) for a, v in zip(rule.also, vals, strict=True))
                    others = tuple(
                        (a.metric, v) for a, v in zip(rule.also, vals, strict=True) if v is not None
                    )
                t = self._step(rule, p.entity, ts, p.value, also_ok, others)
                if t is not None:
                    out.append(t)
        return out

    def _step(
        self,
        rule: Rule,
        entity: str,
        ts: float,
        v: float,
        also_ok: bool = True,
        others: tuple[tuple[str, float], ...] = (),
    ) -> Transition | None:
        key = (rule.name, entity)
        tr = self._tracks.get(key)
        if tr is None:
            tr = self._tracks[key] = _Track()
        steady = True
        if rule.trend_s is not None:
            win = tr.window
            win.append((ts, v))
            while win and win[0][0] < ts - rule.trend_s:
                win.popleft()
            if len(win) < TREND_MIN_POINTS or ts - win[0][0] < TREND_MIN_SPAN * rule.trend_s:
                return None  # not enough history to call it a trend
            line = fit_line(win)
            v = round(line.slope * 60.0, 3)
            steady = line.r2 >= rule.min_r2
        if tr.state == "firing":
            if rule.cleared(v) or not also_ok:
                tr.state, tr.count = "ok", 0
                notify, tr.notified = tr.notified, False
                return Transition(ts, rule, entity, "cleared", v, notify, others)
            return None
        if not (rule.condition(v) and also_ok and steady):
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
        return Transition(ts, rule, entity, "firing", v, tr.notified, others)
