"""Alerts: rules over the metrics (``[[alerts]]`` in a TOML file), an engine with pending time,
hysteresis and cooldown, and actions (webhook, command, email, the run's events).

The engine runs as a sink of the collector under ``stallscope run --alerts FILE``; ``stallscope
alerts check FILE`` validates a file and ``stallscope alerts replay FILE RUN`` runs the same
engine over a stored run. See docs/alerts.md.
"""

from __future__ import annotations

from stallscope.alerts.engine import AlertEngine, Transition
from stallscope.alerts.rulefile import (
    DEFAULT_RULES,
    Action,
    Rule,
    RulesFile,
    load_rules,
    parse_rules,
)

__all__ = [
    "DEFAULT_RULES",
    "Action",
    "AlertEngine",
    "Rule",
    "RulesFile",
    "Transition",
    "load_rules",
    "parse_rules",
]
