"""Alert rules: the TOML file format, its validation, and the shipped defaults.

A rules file holds ``[[alerts]]`` tables and optionally an ``[smtp]`` table::

    [[alerts]]
    name = "gpu_hot"
    metric = "gpu.temp_c"          # a metric of stallscope.metrics (docs/architecture.md)
    entity = "gpu0"                # optional: only this GPU / disk / process
    above = 85                     # or below =
    for_s = 30                     # how long the condition must hold before it fires
    clear_below = 80               # or clear_above = (hysteresis; default: the condition ends)
    severity = "critical"          # critical | warning | info
    cooldown_s = 600               # at most one "firing" notification per cooldown
    confirm = 3                    # optional: consecutive evaluations before actions run
    actions = [{webhook = "http://127.0.0.1:9000/hook"},
               {command = ["/usr/local/bin/backup", "--now"]},
               {email = "ops@example.org"}, {log = true}]

    [smtp]
    host = "127.0.0.1"
    port = 25
    from = "stallscope@example.org"
    starttls = false
    user = "alerts"                # optional, with password_env naming an environment variable
    password_env = "STALLSCOPE_SMTP_PASSWORD"

Actions are defined here only, in a local file the user controls; nothing else (no API, no
endpoint) can add or run one. Validation reports every problem, one line each, naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stallscope.errors import UsageError
from stallscope.metrics import lookup
from stallscope.tomlfile import TomlFileError, read_toml

__all__ = [
    "DEFAULT_RULES",
    "FINDING_PREFIX",
    "Action",
    "Also",
    "Rule",
    "RulesFile",
    "Smtp",
    "finding_metric",
    "load_rules",
    "parse_rules",
]

Severity = Literal["critical", "warning", "info"]
_SEVERITIES = ("critical", "warning", "info")
_RULE_KEYS = {
    "name",
    "metric",
    "finding",
    "entity",
    "above",
    "below",
    "for_s",
    "clear_below",
    "clear_above",
    "severity",
    "cooldown_s",
    "confirm",
    "actions",
    "enabled",
    "also",
    "trend_s",
    "min_r2",
}
_ALSO_KEYS = {"metric", "above", "below"}
#: a trend rule needs this many points in its window, spanning this share of it
TREND_MIN_POINTS = 10
TREND_MIN_SPAN = 0.8
_ACTIONS = ("webhook", "command", "email", "log", "probe")
_SMTP_KEYS = {"host", "port", "from", "starttls", "user", "password_env", "timeout_s"}


#: the prefix of the pseudo-metric a ``finding`` rule reads: ``finding:input_bound.fetch``,
#: valued the finding's confidence in the run's diagnosis so far (0 while absent)
FINDING_PREFIX = "finding:"


def finding_metric(kind: str) -> str:
    return FINDING_PREFIX + kind


@dataclass(frozen=True)
class Action:
    kind: str  #: "webhook", "command", "email", "probe" or "log"
    target: Any = None  #: URL, argv list, address, callback name; None for log


@dataclass(frozen=True)
class Also:
    """A further condition on the same entity in the same sample (``also = [{...}]``)."""

    metric: str
    above: float | None = None
    below: float | None = None

    def holds(self, v: float | None) -> bool:
        if v is None:
            return False
        return (
            v > self.above
            if self.above is not None
            else (self.below is not None and v < self.below)
        )

    def describe(self) -> str:
        op = f"> {self.above:g}" if self.above is not None else f"< {self.below:g}"
        return f"{self.metric} {op}"


@dataclass(frozen=True)
class Rule:
    name: str
    metric: str
    above: float | None = None
    below: float | None = None
    entity: str | None = None
    for_s: float = 0.0
    clear_below: float | None = None
    clear_above: float | None = None
    severity: Severity = "warning"
    cooldown_s: float = 600.0
    confirm: int = 1
    actions: tuple[Action, ...] = (Action("log"),)
    #: further conditions on the same entity, all of which must hold too
    also: tuple[Also, ...] = ()
    #: when set, the value is the metric's least-squares slope per minute over this many
    #: seconds, and the condition also needs the fit's r² ≥ ``min_r2`` (steady growth)
    trend_s: float | None = None
    min_r2: float = 0.8

    @property
    def threshold(self) -> float:
        v = self.above if self.above is not None else self.below
        assert v is not None
        return v

    def condition(self, v: float) -> bool:
        """The alert's condition holds for value ``v``."""
        if self.above is not None:
            return v > self.above
        return self.below is not None and v < self.below

    def cleared(self, v: float) -> bool:
        """A firing alert clears at ``v`` (hysteresis when clear_below/clear_above is set)."""
        if self.clear_below is not None:
            return v < self.clear_below
        if self.clear_above is not None:
            return v > self.clear_above
        return not self.condition(v)

    def describe(self) -> str:
        op = f"> {self.above:g}" if self.above is not None else f"< {self.below:g}"
        if self.metric.startswith(FINDING_PREFIX):
            kind = self.metric[len(FINDING_PREFIX) :]
            return f"the diagnosis so far finds {kind} (confidence {op}; recomputed every 30 s)" + (
                f" for {self.for_s:g} s" if self.for_s else ""
            )
        where = f"{self.metric}" + (f"[{self.entity}]" if self.entity else "")
        if self.trend_s is not None:
            where += f" slope per minute over {self.trend_s:g} s (linear fit r² ≥ {self.min_r2:g})"
        more = "".join(f" and {a.describe()}" for a in self.also)
        clear = (
            f", clears < {self.clear_below:g}"
            if self.clear_below is not None
            else f", clears > {self.clear_above:g}"
            if self.clear_above is not None
            else ""
        )
        return f"{where} {op}{more}" + (f" for {self.for_s:g} s" if self.for_s else "") + clear


@dataclass(frozen=True)
class Smtp:
    host: str = "127.0.0.1"
    port: int = 25
    sender: str = "stallscope@localhost"
    starttls: bool = False
    user: str | None = None
    password_env: str | None = None
    timeout_s: float = 10.0


@dataclass(frozen=True)
class RulesFile:
    rules: tuple[Rule, ...]
    smtp: Smtp | None = None
    source: str = ""  #: where the rules came from, for messages
    problems: tuple[str, ...] = field(default=())


#: the shipped defaults: on unless a rules file says otherwise (a rule of the same name replaces
#: the default; ``enabled = false`` turns one off)
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("gpu_hot", "gpu.temp_c", above=85, for_s=30, clear_below=80, severity="critical"),
    Rule("gpu_throttled", "gpu.throttle_serious", above=0.5, for_s=10, severity="warning"),
    Rule("gpu_health", "gpu.health_problem", above=0.5, severity="critical", cooldown_s=3600),
    Rule(
        "shm_nearly_full",
        "host.shm_used_pct",
        above=90,
        for_s=10,
        clear_below=80,
        severity="critical",
    ),
    Rule("host_swapping", "host.swap_in_kb_s", above=0, for_s=30, severity="warning"),
    Rule(
        "disk_saturated",
        "disk.util_pct",
        above=90,
        for_s=60,
        clear_below=70,
        severity="warning",
        also=(Also("disk.r_await_ms", above=50),),
    ),
    Rule("smart_failing", "smart.failing", above=0.5, severity="critical", cooldown_s=86400),
    Rule(
        "smart_defects_growing",
        "smart.medium_growth",
        above=0,
        severity="critical",
        cooldown_s=86400,
    ),
    Rule("smart_threshold_soon", "smart.days_left", below=30, severity="warning", cooldown_s=86400),
    Rule(
        "data_wait_high", "probe.wait_pct", above=30, for_s=120, clear_below=20, severity="warning"
    ),
    Rule(
        "gpu_memory_growing",
        "gpu.mem_used_mib",
        above=50,
        trend_s=600,
        for_s=120,
        severity="warning",
    ),
    Rule(
        "rank_slow", "probe.rank_slowdown", above=1.5, for_s=60, clear_below=1.2, severity="warning"
    ),
    Rule("rank_waited_for", "probe.waited_for", above=0.5, severity="warning"),
)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _runnable(program: str) -> bool:
    """``program`` (a path, or a name looked up on PATH) is an executable file."""
    import os
    import shutil

    if "/" in program:
        return os.path.isfile(program) and os.access(program, os.X_OK)
    return shutil.which(program) is not None


def _parse_action(i: int, j: int, a: Any, problems: list[str]) -> Action | None:
    where = f"alerts[{i}].actions[{j}]"
    if not isinstance(a, dict) or len(a) != 1:
        problems.append(f"{where}: an action is a table with one key, one of {', '.join(_ACTIONS)}")
        return None
    ((kind, target),) = a.items()
    if kind not in _ACTIONS:
        problems.append(f"{where}: unknown action {kind!r} (known: {', '.join(_ACTIONS)})")
        return None
    if kind == "probe" and not (isinstance(target, str) and target.strip()):
        problems.append(
            f"{where}.probe: the name of a callback the trainer registers with "
            "stallscope.on_alert(name, fn)"
        )
        return None
    if kind == "webhook" and not (
        isinstance(target, str) and target.startswith(("http://", "https://"))
    ):
        problems.append(f"{where}.webhook: must be an http:// or https:// URL")
        return None
    if kind == "command" and not (
        isinstance(target, list) and target and all(isinstance(x, str) and x for x in target)
    ):
        problems.append(
            f"{where}.command: must be a non-empty list of strings (argv; it is "
            "never run through a shell)"
        )
        return None
    if kind == "command" and not _runnable(target[0]):
        problems.append(
            f"{where}.command: {str(target[0])[:200]!r} is not a program this "
            "user can run (not on PATH, or not an executable file)"
        )
        return None
    if kind == "email" and not (
        isinstance(target, str) and "@" in target and "\n" not in target and "\r" not in target
    ):
        problems.append(f"{where}.email: must be an address")
        return None
    if kind == "log" and target is not True:
        problems.append(f"{where}.log: must be true")
        return None
    return Action(kind, tuple(target) if isinstance(target, list) else target)


def _parse_rule(i: int, t: Any, problems: list[str]) -> Rule | None:
    if not isinstance(t, dict):
        problems.append(f"alerts[{i}]: must be a table")
        return None
    n0 = len(problems)
    name, where = _rule_name(i, t, problems)
    for k in sorted(set(t) - _RULE_KEYS):
        problems.append(f"{where}: unknown key {k!r} (known: {', '.join(sorted(_RULE_KEYS))})")
    metric, t = _rule_metric(where, t, problems)
    _check_thresholds(where, t, problems)
    sev = t.get("severity", "warning")
    if sev not in _SEVERITIES:
        problems.append(f"{where}.severity: one of {', '.join(_SEVERITIES)}, got {sev!r}")
    confirm = t.get("confirm", 1)
    if not isinstance(confirm, int) or isinstance(confirm, bool) or not 1 <= confirm <= 1000:
        problems.append(f"{where}.confirm: an integer from 1 to 1000, got {confirm!r}")
    also = _parse_also(where, t.get("also", []), problems)
    trend_s, min_r2 = _rule_trend(where, t, problems)
    entity = t.get("entity")
    if entity is not None and not isinstance(entity, str):
        problems.append(f"{where}.entity: must be a string such as 'gpu0' or 'nvme0n1'")
    actions = _parse_actions(i, where, t.get("actions", []), problems)
    if "enabled" in t and not isinstance(t["enabled"], bool):
        problems.append(f"{where}.enabled: must be true or false")
    if len(problems) > n0:
        return None
    if not any(a.kind == "log" for a in actions):
        actions.insert(0, Action("log"))  # every alert is recorded as a run event
    return Rule(
        name=str(name),
        metric=str(metric),
        above=t.get("above"),
        below=t.get("below"),
        entity=entity,
        for_s=float(t.get("for_s", 0)),
        clear_below=t.get("clear_below"),
        clear_above=t.get("clear_above"),
        severity=sev,
        cooldown_s=float(t.get("cooldown_s", 600)),
        confirm=int(confirm),
        actions=tuple(actions),
        also=also,
        trend_s=float(trend_s) if trend_s is not None else None,
        min_r2=float(min_r2),
    )


def _rule_name(i: int, t: dict[str, Any], problems: list[str]) -> tuple[str, str]:
    """(name, where): the rule's name (``#i`` when it has none) and the prefix of its
    problems, ``alerts[i] (name)``."""
    name = t.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"alerts[{i}].name: required, a non-empty string")
        name = f"#{i}"
    return name, f"alerts[{i}] ({name})"


def _rule_metric(where: str, t: dict[str, Any], problems: list[str]) -> tuple[Any, dict[str, Any]]:
    """(metric, table): the metric a rule reads, and the table with ``above = 0`` added for a
    ``finding`` rule that gives no threshold (its value is the finding's confidence)."""
    metric = t.get("metric")
    if "finding" in t:
        from stallscope.analysis.diagnose.model import KINDS

        kind = t["finding"]
        if "metric" in t:
            problems.append(f"{where}: give one of 'metric' or 'finding', not both")
        elif not isinstance(kind, str) or kind not in KINDS:
            problems.append(
                f"{where}.finding: {kind!r} is not a finding kind (one of {', '.join(KINDS)})"
            )
        else:
            # the value is the finding's confidence in the diagnosis so far, 0 while absent
            metric = finding_metric(kind)
            if "above" not in t and "below" not in t:
                t = {**t, "above": 0}
        for k in ("trend_s", "also"):
            if k in t:
                problems.append(f"{where}.{k}: not with 'finding'")
    elif not isinstance(metric, str) or lookup(metric) is None:
        problems.append(
            f"{where}.metric: {metric!r} is not a metric of the vocabulary{_did_you_mean(metric)}"
        )
    return metric, t


def _did_you_mean(name: Any) -> str:
    """`` (did you mean gpu.temp_c?)`` for a misspelt metric, else where the names are."""
    import difflib

    from stallscope.metrics import METRICS

    names = [f"{m.source}.{m.key}" for m in METRICS if m.kind != "counter"]
    close = (
        difflib.get_close_matches(name, names, n=2, cutoff=0.75) if isinstance(name, str) else []
    )
    if close:
        return f" (did you mean {' or '.join(close)}?)"
    return " (`stallscope alerts metrics` lists them, e.g. gpu.temp_c, disk.util_pct)"


def _check_thresholds(where: str, t: dict[str, Any], problems: list[str]) -> None:
    """One of above/below, numbers where numbers go, and a clear level on the right side."""
    if ("above" in t) == ("below" in t):
        problems.append(f"{where}: give exactly one of 'above' or 'below'")
    for k in ("above", "below", "clear_below", "clear_above", "for_s", "cooldown_s"):
        if k in t and not _num(t[k]):
            problems.append(f"{where}.{k}: must be a number, got {t[k]!r}")
    for k in ("for_s", "cooldown_s"):
        if _num(t.get(k)) and t[k] < 0:
            problems.append(f"{where}.{k}: must be ≥ 0")
    if "clear_below" in t and "clear_above" in t:
        problems.append(f"{where}: give at most one of 'clear_below' or 'clear_above'")
    if _num(t.get("above")) and _num(t.get("clear_below")) and t["clear_below"] > t["above"]:
        problems.append(f"{where}.clear_below: must not be above 'above' ({t['above']})")
    if _num(t.get("below")) and _num(t.get("clear_above")) and t["clear_above"] < t["below"]:
        problems.append(f"{where}.clear_above: must not be below 'below' ({t['below']})")


def _rule_trend(where: str, t: dict[str, Any], problems: list[str]) -> tuple[Any, Any]:
    """(trend_s, min_r2) of a trend rule; trend_s None for a rule on the value itself."""
    trend_s = t.get("trend_s")
    if trend_s is not None and not (_num(trend_s) and trend_s > 0):
        problems.append(f"{where}.trend_s: a positive number of seconds, got {trend_s!r}")
    min_r2 = t.get("min_r2", 0.8)
    if not (_num(min_r2) and 0 <= min_r2 <= 1):
        problems.append(f"{where}.min_r2: a number from 0 to 1, got {min_r2!r}")
    if "min_r2" in t and trend_s is None:
        problems.append(f"{where}.min_r2: only with trend_s")
    return trend_s, min_r2


def _parse_actions(i: int, where: str, raw: Any, problems: list[str]) -> list[Action]:
    """The rule's valid actions; each invalid one is a problem."""
    if not isinstance(raw, list):
        problems.append(f"{where}.actions: must be a list of tables")
        return []
    actions: list[Action] = []
    for j, a in enumerate(raw):
        act = _parse_action(i, j, a, problems)
        if act is not None:
            actions.append(act)
    return actions


def _parse_also(where: str, raw: Any, problems: list[str]) -> tuple[Also, ...]:
    if not isinstance(raw, list):
        problems.append(
            f'{where}.also: a list of tables like {{metric = "disk.r_await_ms", above = 50}}'
        )
        return ()
    out = []
    for j, a in enumerate(raw):
        at = f"{where}.also[{j}]"
        if not isinstance(a, dict):
            problems.append(f"{at}: must be a table with metric and above or below")
            continue
        for k in sorted(set(a) - _ALSO_KEYS):
            problems.append(f"{at}: unknown key {k!r} (known: above, below, metric)")
        m = a.get("metric")
        if not isinstance(m, str) or lookup(m) is None:
            problems.append(
                f"{at}.metric: {m!r} is not a metric of the vocabulary{_did_you_mean(m)}"
            )
            continue
        if ("above" in a) == ("below" in a) or not all(
            _num(a[k]) for k in ("above", "below") if k in a
        ):
            problems.append(f"{at}: give exactly one of 'above' or 'below', a number")
            continue
        out.append(Also(m, above=a.get("above"), below=a.get("below")))
    return tuple(out)


def _parse_smtp(t: Any, problems: list[str]) -> Smtp | None:
    if not isinstance(t, dict):
        problems.append("smtp: must be a table")
        return None
    for k in sorted(set(t) - _SMTP_KEYS):
        problems.append(f"smtp: unknown key {k!r} (known: {', '.join(sorted(_SMTP_KEYS))})")
    port = t.get("port", 25)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        problems.append(f"smtp.port: a port number, got {port!r}")
    for k in ("host", "from", "user", "password_env"):
        if k in t and not isinstance(t[k], str):
            problems.append(f"smtp.{k}: must be a string")
    if "starttls" in t and not isinstance(t["starttls"], bool):
        problems.append("smtp.starttls: must be true or false")
    if "timeout_s" in t and not (_num(t["timeout_s"]) and t["timeout_s"] > 0):
        problems.append("smtp.timeout_s: a positive number of seconds")
    if problems:
        return None
    return Smtp(
        host=t.get("host", "127.0.0.1"),
        port=port,
        sender=t.get("from", "stallscope@localhost"),
        starttls=t.get("starttls", False),
        user=t.get("user"),
        password_env=t.get("password_env"),
        timeout_s=float(t.get("timeout_s", 10.0)),
    )


def parse_rules(doc: dict[str, Any], source: str = "", *, defaults: bool = True) -> RulesFile:
    """Rules from a parsed TOML document, merged over the shipped defaults; ``problems`` lists
    everything wrong (one line each, naming the key)."""
    problems: list[str] = []
    for k in sorted(set(doc) - {"alerts", "smtp"}):
        problems.append(f"unknown table or key {k!r} (known: alerts, smtp)")
    raw = doc.get("alerts", [])
    if not isinstance(raw, list):
        problems.append("alerts: must be an array of tables ([[alerts]])")
        raw = []
    rules: dict[str, Rule] = {r.name: r for r in DEFAULT_RULES} if defaults else {}
    names: set[str] = set()
    for i, t in enumerate(raw):
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            if t["name"] in names:
                problems.append(f"alerts[{i}].name: {t['name']!r} is used twice")
            names.add(t["name"])
            if t.get("enabled") is False:  # `name = "..."` + `enabled = false` turns one off
                for k in sorted(set(t) - _RULE_KEYS):
                    problems.append(f"alerts[{i}] ({t['name']}): unknown key {k!r}")
                rules.pop(t["name"], None)
                continue
        rule = _parse_rule(i, t, problems)
        if rule is not None:
            rules[rule.name] = rule
    smtp = _parse_smtp(doc["smtp"], problems) if "smtp" in doc else None
    if (
        smtp is None
        and not problems
        and any(a.kind == "email" for r in rules.values() for a in r.actions)
    ):
        problems.append("an email action needs an [smtp] table (host, port, from)")
    return RulesFile(tuple(rules.values()), smtp, source, tuple(problems))


def load_rules(path: str | Path, *, defaults: bool = True) -> RulesFile:
    """Read and validate a rules file; raises UsageError (one line per problem) when wrong."""
    p = Path(path)
    try:
        doc = read_toml(p)
    except TomlFileError as exc:
        raise UsageError(f"{p}: {exc}") from None
    rf = parse_rules(doc, str(p), defaults=defaults)
    if rf.problems:
        raise UsageError("\n".join(f"{p}: {line}" for line in rf.problems))
    return rf
