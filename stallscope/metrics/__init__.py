"""The one metric vocabulary: every number stallscope records is declared here once.

Each :class:`Metric` names the source it comes from, its key in that source's payload (the
``snapshot --json`` key), its unit, whether it is a gauge or a rate derived from a counter, the
classic command it replaces, and the Prometheus name in base units with the factor that converts
to it. The run store, JSON output, the report, the agent's Prometheus exporter and the live
view all read this table instead of keeping their own lists. It is declared a module per source
(:mod:`~stallscope.metrics.disk`, :mod:`~stallscope.metrics.gpu`, ...; what a metric is in
:mod:`~stallscope.metrics.base`) and read from here.

Raw counters (kind ``"counter"``) are the cumulative kernel counters the rates are computed
from, kept because Prometheus users expect ``*_total`` counters and take ``rate()``
themselves. They are not in any ``sample()`` payload: a source hands them out through
``Source.counters()`` as ``(name, entity, value)``. Naming scheme:

* the key is the Prometheus name without ``stallscope_<source>_`` (``disk.read_bytes_total``
  is ``stallscope_disk_read_bytes_total``; procs use ``stallscope_proc_`` as their gauges do);
  every counter's Prometheus name, and only a counter's, ends in ``_total``;
* values are already in base units (seconds, bytes, plain counts), so ``prom_scale`` is 1;
* the entity is the value of one Prometheus label, named by :attr:`Metric.label` (set on every
  metric, by source in :data:`SOURCE_LABEL`; :mod:`stallscope.labels` spells it): the device
  for disk (``device``), the pid for procs (``pid``), and the CPU mode for
  ``host.cpu_seconds_total`` (``mode``: ``user``, ``nice``, ``system``, ``idle``,
  ``iowait``, ``irq``, ``softirq``, ``steal``, summed over all CPUs), so
  ``stallscope_host_cpu_seconds_total{mode="iowait"}`` reads like node_exporter's
  ``node_cpu_seconds_total``. Host counters without a label (swap, PSI) have entity "".
* names follow node_exporter where one exists (``node_disk_*``, ``node_cpu_seconds_total``,
  ``node_pressure_*``), and each help line names that equivalent and the ``/proc`` field.

:func:`by_source` lists the payload metrics (gauges and rates) unless asked for counters too,
so "the keys of a payload" stays what it was.
"""

from __future__ import annotations

from stallscope.metrics.base import SOURCE_LABEL, Kind, Metric, Point
from stallscope.metrics.collector import COLLECTOR
from stallscope.metrics.counters import COUNTERS
from stallscope.metrics.disk import DISK
from stallscope.metrics.gpu import GPU
from stallscope.metrics.host import HOST
from stallscope.metrics.procs import PROCS
from stallscope.metrics.smart import SMART
from stallscope.metrics.training import TRAINING

__all__ = ["METRICS", "SOURCE_LABEL", "Kind", "Metric", "Point", "by_source", "lookup"]

#: every metric, in declaration order: each source's payload metrics, then the raw counters,
#: then the collector's own cost
METRICS: tuple[Metric, ...] = (
    *DISK,
    *GPU,
    *HOST,
    *PROCS,
    *TRAINING,
    *SMART,
    *COUNTERS,
    *COLLECTOR,
)

_BY_NAME = {m.name: m for m in METRICS}


def lookup(name: str) -> Metric | None:
    """The metric called ``<source>.<key>``, or None."""
    return _BY_NAME.get(name)


def by_source(source: str, *, counters: bool = False) -> tuple[Metric, ...]:
    """The metrics of one source's payload (gauges and rates), in declaration order; with
    ``counters``, its raw counters too (those come from ``Source.counters()``, not the
    payload, so callers that walk payload keys must not see them by default)."""
    return tuple(m for m in METRICS if m.source == source and (counters or m.kind != "counter"))
