"""The node agent (``stallscope agent``): the sources sampled continuously through the
:class:`~stallscope.collect.Collector`, exposed to Prometheus on ``/metrics``, answered on a
read-only JSON API and kept in a bounded local run store. See docs/agent.md."""

from __future__ import annotations

from stallscope.agent.config import AgentConfig, load_config
from stallscope.agent.exporter import PrometheusSink

__all__ = ["AgentConfig", "PrometheusSink", "load_config"]
