"""The Prometheus exporter: a sink that keeps the latest sample, and a custom collector that
turns it into fresh metric families on every scrape.

Nothing here keeps gauges between scrapes: each scrape builds its families from the latest
:class:`~stallscope.collect.Sample` (a reference swapped atomically by the collector's thread),
so a process that exited or a GPU that fell off the bus simply stops appearing, with no stale
label set left behind.

Names, units and kinds come from :mod:`stallscope.metrics` (``prom``, ``prom_scale``; counters
become ``CounterMetricFamily`` so the exposition says ``_total``; metrics without a ``prom``
name are not exported). Labels come from :mod:`stallscope.labels`, the one map that
``diagnose --prometheus`` reads back with:

* GPU series carry dcgm-exporter's labels, so dashboards join the two: ``gpu`` (NVML index),
  ``UUID``, ``pci_bus_id`` (when known), ``device`` (``nvidia0``), ``modelName``, ``Hostname``
  (:data:`~stallscope.labels.HOST_LABEL`; the ``host_label`` setting spells it otherwise);
* disk series ``device`` (``nvme0n1``, as node_exporter's ``node_disk_*``);
* ``stallscope_host_cpu_seconds_total`` ``mode``; per-core series ``cpu`` (``"3"``);
* process series (the trainings the agent follows, :mod:`stallscope.agent.trainprocs`)
  ``pid``, ``ppid``, ``name`` (comm), ``role`` (main, worker, launcher), ``run``, ``rank``
  (when a probe told) and ``Hostname``;
* throttle reasons one series per NVML reason name: ``stallscope_gpu_throttle_active{reason=
  "sw_power_cap", gpu="0", ...} 1``.

The followed trainings' DataLoader workers' batch costs are one histogram per trainer,
``stallscope_loader_batch_seconds`` (:mod:`stallscope.agent.trainfetches`), and each rank's
step data waits another, ``stallscope_train_step_data_wait_seconds``
(:mod:`stallscope.agent.steps`).

Beside them: ``stallscope_source_up{source}`` (1 when the source gave a reading in the latest
sample), ``stallscope_agent_cpu_seconds_total`` (this process's CPU),
``stallscope_collector_samples_total`` and ``stallscope_collector_last_sample_timestamp_seconds``
(a stuck sampler shows as a timestamp that stops moving). The collector's own cost per sample is
in the vocabulary: ``stallscope_collector_sample_cpu_seconds`` and
``stallscope_collector_sample_wall_seconds``.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric as PromFamily
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from stallscope.agent.trainfetches import BATCH_TIME_HISTOGRAMS, LOADER_HISTOGRAM
from stallscope.collect.sinks import Sink
from stallscope.labels import ENTITY_LABELS, HOST_LABEL, labels_for, row_labels
from stallscope.metrics import METRICS, Metric, lookup

if TYPE_CHECKING:
    from stallscope.agent.steps import RankTotals, StepFollower
    from stallscope.agent.trainfetches import LoaderCosts, TrainerCosts
    from stallscope.collect.collector import Event, Sample

__all__ = ["AGENT_METRICS", "PrometheusSink", "SampleExposition"]

#: what the agent exports beside the vocabulary: (name as exposed, type, help)
AGENT_METRICS: tuple[tuple[str, str, str], ...] = (
    (
        "stallscope_source_up",
        "gauge",
        "1 if the source gave a reading in the latest sample, 0 if it is unavailable or failing",
    ),
    (
        "stallscope_gpu_throttle_active",
        "gauge",
        "1 while NVML reports this clock event (throttle) reason active, 0 otherwise; label "
        "reason is NVML's name (nvidia-smi clocks_event_reasons.*)",
    ),
    (
        "stallscope_agent_cpu_seconds_total",
        "counter",
        "CPU seconds (user+system) the agent process used since it started",
    ),
    (
        "stallscope_collector_samples_total",
        "counter",
        "samples the collector handed to the sinks since the agent started",
    ),
    (
        "stallscope_collector_last_sample_timestamp_seconds",
        "gauge",
        "Unix time of the latest sample (stops moving when sampling is stuck)",
    ),
    LOADER_HISTOGRAM,
    *BATCH_TIME_HISTOGRAMS,
)


def _help(m: Metric) -> str:
    """The vocabulary's help line, plus the conversion when the exported unit differs."""
    text = m.help
    if m.prom_scale != 1.0:
        text += f"; stallscope {m.name} ({m.unit}) x {m.prom_scale:g}"
    return text


class _Families:
    """The families of one scrape, created on first use, in first-use order."""

    def __init__(self) -> None:
        self.by_name: dict[str, PromFamily] = {}

    def get(self, name: str, kind: str, doc: str) -> PromFamily:
        fam = self.by_name.get(name)
        if fam is None:
            fam = (
                CounterMetricFamily(name, doc)
                if kind == "counter"
                else HistogramMetricFamily(name, doc)
                if kind == "histogram"
                else GaugeMetricFamily(name, doc)
            )
            self.by_name[name] = fam
        return fam

    def add(self, fam: PromFamily, labels: Mapping[str, str], value: float) -> None:
        sample_name = fam.name + "_total" if fam.type == "counter" else fam.name
        fam.add_sample(sample_name, dict(labels), value)

    def add_histogram(
        self,
        fam: PromFamily,
        labels: Mapping[str, str],
        buckets: Sequence[tuple[str, float]],
        sum_value: float,
    ) -> None:
        """One histogram: its cumulative ``(le, count)`` buckets (``+Inf`` last), its count
        (the ``+Inf`` bucket's) and sum."""
        for le, count in buckets:
            fam.add_sample(fam.name + "_bucket", {**labels, "le": le}, count)
        fam.add_sample(fam.name + "_count", dict(labels), buckets[-1][1])
        fam.add_sample(fam.name + "_sum", dict(labels), sum_value)


def gpu_labels(
    entity: str, attrs: Mapping[str, Any], hostname: str, host_label: str = HOST_LABEL
) -> dict[str, str]:
    """dcgm-exporter's labels for GPU ``gpuN`` with its entity attributes."""
    return row_labels(ENTITY_LABELS["gpu"], entity, attrs, hostname, host_label)


class SampleExposition(PromCollector):
    """A prometheus_client collector that yields fresh families from the sink's latest
    sample on every ``collect()`` (every scrape)."""

    def __init__(self, sink: PrometheusSink) -> None:
        self.sink = sink
        #: per store name, (metric, help) or None when not exported; filled on first use
        self._exported: dict[str, tuple[Metric, str] | None] = {}

    def describe(self) -> Iterable[PromFamily]:
        return []  # the families depend on the sample: nothing to check at registration

    def _lookup(self, name: str) -> tuple[Metric, str] | None:
        try:
            return self._exported[name]
        except KeyError:
            m = lookup(name)
            found = (m, _help(m)) if m is not None and m.prom else None
            self._exported[name] = found
            return found

    def collect(self) -> Iterator[PromFamily]:
        sink = self.sink
        sample = sink.latest
        fams = _Families()
        owners = sink.gpu_owners() if sink.gpu_owners is not None else {}
        if sample is not None:
            self._points(sample, fams, owners)
            self._throttle(sample, fams, owners)
        if sink.steps is not None:
            self._train_steps(sink.steps, fams)
        if sink.loader is not None:
            self._loader_costs(sink.loader, fams)
        helps = {name: (kind, doc) for name, kind, doc in AGENT_METRICS}
        up = fams.get("stallscope_source_up", *helps["stallscope_source_up"])
        for name, is_up in sink.source_up().items():
            fams.add(up, {"source": name}, 1.0 if is_up else 0.0)
        fams.add(
            fams.get(
                "stallscope_agent_cpu_seconds_total", *helps["stallscope_agent_cpu_seconds_total"]
            ),
            {},
            sink.cpu_clock(),
        )
        fams.add(
            fams.get(
                "stallscope_collector_samples_total", *helps["stallscope_collector_samples_total"]
            ),
            {},
            float(sink.written),
        )
        if sample is not None:
            fams.add(
                fams.get(
                    "stallscope_collector_last_sample_timestamp_seconds",
                    *helps["stallscope_collector_last_sample_timestamp_seconds"],
                ),
                {},
                sample.ts,
            )
        yield from fams.by_name.values()

    def _points(
        self, sample: Sample, fams: _Families, owners: Mapping[str, Mapping[str, str]]
    ) -> None:
        hostname = self.sink.hostname
        entities = {name: r.entities for name, r in sample.readings.items()}
        labels_cache: dict[tuple[str, str, str], dict[str, str]] = {}
        for p in sample.points:
            found = self._lookup(p.name)
            if found is None:
                continue
            m, doc = found
            key = (m.source, m.label, p.entity)
            labels = labels_cache.get(key)
            if labels is None:
                attrs = entities.get(m.source, {}).get(p.entity) or {}
                if m.source == "gpu" and owners:
                    attrs = {**attrs, **owners.get(str(attrs.get("uuid")), {})}
                labels = labels_cache[key] = labels_for(
                    m, p.entity, attrs, hostname, self.sink.host_label
                )
            fams.add(fams.get(m.prom, m.kind, doc), labels, p.value * m.prom_scale)

    def _train_steps(self, follower: StepFollower, fams: _Families) -> None:
        """Per followed run and rank, the probe's step totals (:mod:`stallscope.agent.steps`)."""
        from stallscope.agent.steps import STEP_METRICS

        try:
            runs = follower.poll()
        except (OSError, sqlite3.Error, ValueError):
            return  # an unreadable run costs its step series, never the whole scrape
        if not runs:
            return
        (steps, step_s, wait_s, samples, comm_s, last_ts, first_ts, waits) = (
            fams.get(name, kind, doc) for name, kind, doc in STEP_METRICS
        )
        owners = follower.owners()
        jobs = follower.jobs()
        for run_id, ranks in sorted(runs.items()):
            for rank, t in sorted(ranks.items()):
                labels = {
                    "run": run_id,
                    "rank": str(rank),
                    "train_job": jobs.get(run_id, run_id),
                    self.sink.host_label: self.sink.hostname,
                    **owners.get(run_id, {}),
                }
                fams.add(steps, labels, float(t.steps))
                fams.add(step_s, labels, t.step_s)
                fams.add(wait_s, labels, t.wait_s)
                if t.has_samples:
                    fams.add(samples, labels, float(t.samples))
                if t.has_comm:
                    fams.add(comm_s, labels, t.comm_s)
                if t.last_ts is not None:
                    fams.add(last_ts, labels, t.last_ts)
                if t.first_ts is not None:
                    fams.add(first_ts, labels, t.first_ts)
                fams.add_histogram(waits, labels, _wait_buckets(t), t.wait_s)
        for name in [name for name, fam in fams.by_name.items() if not fam.samples]:
            del fams.by_name[name]  # no run knew its batch size: no empty family

    def _loader_costs(self, loader: LoaderCosts, fams: _Families) -> None:
        """Per trainer of a followed run, its DataLoader workers' batch costs
        (:mod:`stallscope.agent.trainfetches`), labelled as its stacks series."""
        for c in loader.snapshot():
            fams.add_histogram(
                fams.get(*LOADER_HISTOGRAM), self._trainer(c), c.buckets(), round(c.sum_s, 6)
            )
        # the batches each trainer took, as its in-trainer sampler timed them (no probe needed)
        for pair in loader.timed_snapshot():
            for spec, c in zip(BATCH_TIME_HISTOGRAMS, pair):
                fams.add_histogram(fams.get(*spec), self._trainer(c), c.buckets(), c.sum_s)

    def _trainer(self, c: TrainerCosts) -> dict[str, str]:
        """A trainer's labels, as its stacks series carry them."""
        labels = {"pid": str(c.pid), "role": "main", "run": c.run}
        if c.rank is not None:
            labels["rank"] = str(c.rank)
        labels[self.sink.host_label] = self.sink.hostname
        return labels

    def _throttle(
        self, sample: Sample, fams: _Families, owners: Mapping[str, Mapping[str, str]]
    ) -> None:
        reading = sample.readings.get("gpu")
        if reading is None or not isinstance(reading.payload, list):
            return
        from stallscope.sources.gpu import THROTTLE_REASONS

        known = [name for _bit, name in THROTTLE_REASONS]
        fam: PromFamily | None = None
        for g in reading.payload:
            active = g.get("throttle")
            if active is None:
                continue  # NVML has no clock event reasons for this GPU
            if fam is None:
                fam = fams.get("stallscope_gpu_throttle_active", "gauge", AGENT_METRICS[1][2])
            entity = f"gpu{g.get('index', 0)}"
            attrs = reading.entities.get(entity) or {}
            attrs = {**attrs, **owners.get(str(attrs.get("uuid")), {})}
            base = gpu_labels(entity, attrs, self.sink.hostname, self.sink.host_label)
            for reason in [*known, *(r for r in active if r not in known)]:
                fams.add(fam, {"reason": reason, **base}, 1.0 if reason in active else 0.0)


class PrometheusSink(Sink):
    """Keeps the latest sample for the exposition; its :attr:`registry` is private (nothing
    else in the process registers there, so ``/metrics`` is exactly this exposition).

    ``sources``: every source the agent meant to run (the ones that opened and the ones that
    did not), for ``stallscope_source_up``. ``unavailable``: those that did not open, with why.
    """

    name = "prometheus"
    wants_counters = True

    def __init__(
        self,
        sources: Sequence[str],
        unavailable: Mapping[str, str] | None = None,
        *,
        hostname: str | None = None,
        host_label: str = HOST_LABEL,
        cpu_clock: Callable[[], float] = time.process_time,
        steps: StepFollower | None = None,
        loader: LoaderCosts | None = None,
        gpu_owners: Callable[[], Mapping[str, Mapping[str, str]]] | None = None,
    ) -> None:
        self.sources = list(dict.fromkeys([*sources, *(unavailable or {})]))
        self.unavailable = dict(unavailable or {})
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.host_label = host_label
        self.cpu_clock = cpu_clock
        #: the trainings' step totals, read on each scrape (None: not followed)
        self.steps = steps
        #: the trainings' DataLoader workers' batch costs, read by the stacks source (None:
        #: not followed)
        self.loader = loader
        #: GPU UUID -> the namespace, pod and container holding it (the kubelet's
        #: pod-resources API), asked on each scrape; None: not on Kubernetes
        self.gpu_owners = gpu_owners
        self.latest: Sample | None = None
        self.written = 0
        self._lock = threading.Lock()
        #: source -> its latest problem in words (an error, turned off); cleared when it reads
        self._problems: dict[str, str] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.exposition = SampleExposition(self)
        self.registry.register(self.exposition)

    def write(self, sample: Sample) -> None:
        self.latest = sample  # one reference swap: a scrape sees the old or the new sample
        if sample.readings:  # not the counters-only first read (Sample.primed)
            self.written += 1

    def event(self, event: Event) -> None:
        if event.kind in ("error", "disabled", "gpu_lost", "unavailable"):
            with self._lock:
                self._problems[event.source] = event.message

    def source_up(self) -> dict[str, bool]:
        """Per source the agent meant to run: whether the latest sample has its reading."""
        sample = self.latest
        if sample is None:
            return {name: False for name in self.sources}
        return {name: name in sample.readings or name in sample.primed for name in self.sources}

    def health(self) -> dict[str, Any]:
        """Per source: up or down and, when down or troubled, why (``/api/v1/health``)."""
        up = self.source_up()
        with self._lock:
            problems = dict(self._problems)
        sources: dict[str, dict[str, Any]] = {}
        for name, is_up in up.items():
            entry: dict[str, Any] = {"up": is_up}
            reason = self.unavailable.get(name) or problems.get(name)
            if reason and not is_up:
                entry["reason"] = reason
            elif problems.get(name):
                entry["last_problem"] = problems[name]
            sources[name] = entry
        sample = self.latest
        return {
            "sources": sources,
            "samples": self.written,
            "last_sample_ts": None if sample is None else sample.ts,
            "unavailable": dict(self.unavailable),
        }


def _wait_buckets(t: RankTotals) -> list[tuple[str, float]]:
    """A rank's cumulative data-wait buckets (:data:`~stallscope.agent.steps.WAIT_EDGES_S`)."""
    from stallscope.agent.steps import WAIT_EDGES_S

    out, seen = [], 0
    for edge, count in zip(WAIT_EDGES_S, t.wait_counts, strict=False):
        seen += count
        out.append((f"{edge:.6g}", float(seen)))
    out.append(("+Inf", float(seen + t.wait_counts[-1])))
    return out


def exported_metrics() -> list[Metric]:
    """Every vocabulary metric with a Prometheus name (for the documentation table)."""
    return [m for m in METRICS if m.prom]
