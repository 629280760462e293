"""What a metric is (:class:`Metric`, declared with :func:`_M`), the :class:`Point` sources
produce, and each source's entity label (:data:`SOURCE_LABEL`); the tables themselves are the
other modules of :mod:`stallscope.metrics`, one per source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

#: gauge: a level; rate: per-second growth of a counter over one interval (in a payload);
#: counter: the raw cumulative counter itself (from ``Source.counters()``, never in a payload)
Kind = Literal["gauge", "rate", "counter"]


@dataclass(frozen=True)
class Metric:
    source: str  #: "disk", "gpu", "host", "procs", "collector"
    key: str  #: key in the source's payload, e.g. "r_await_ms"
    unit: str  #: human unit: "ms", "%", "kB/s", "MiB", "W", ...
    help: str  #: one line; names the classic equivalent
    kind: Kind = "gauge"
    prom: str = ""  #: Prometheus name (base units), "" = not exported
    prom_scale: float = 1.0  #: multiply the stored value by this to get the Prometheus unit
    #: what a downsampled bucket keeps for reading back: "mean", or "max" where a mean is not
    #: a value the metric can take (bitmasks, link generations)
    rollup: str = "mean"
    #: computed by the collector from several sources' payloads, not read by the source itself
    derived: bool = False
    #: the Prometheus label whose value is the entity: "device", "gpu", "pid", "cpu", "mode",
    #: "rank"; "" for a metric about the whole host (no entity). How each is spelled, both
    #: ways, is :data:`stallscope.labels.ENTITY_LABELS`
    label: str = ""

    @property
    def name(self) -> str:
        """Store name: ``<source>.<key>``."""
        return f"{self.source}.{self.key}"


class Point(NamedTuple):
    """One number: metric ``name`` (``source.key``) about ``entity`` (``vda``, ``gpu0``, a pid,
    ``cpu3``, ``""`` for the host as a whole), as sources produce it and sinks consume it."""

    name: str
    entity: str
    value: float


#: the entity label of each source's metrics (:mod:`stallscope.labels` holds how each is
#: spelled); a metric of another shape says its own (``host.cpu_core_pct``: ``cpu``)
SOURCE_LABEL = {
    "disk": "device",
    "gpu": "gpu",
    "procs": "pid",
    "smart": "device",
    "probe": "rank",
    "stacks": "pid",
    "host": "",
    "collector": "",
}


def _M(
    source: str,
    key: str,
    unit: str,
    help: str,
    kind: Kind = "gauge",
    prom: str = "",
    prom_scale: float = 1.0,
    *,
    rollup: str = "mean",
    derived: bool = False,
    label: str | None = None,
) -> Metric:
    return Metric(
        source,
        key,
        unit,
        help,
        kind,
        prom,
        prom_scale,
        rollup,
        derived,
        SOURCE_LABEL[source] if label is None else label,
    )
