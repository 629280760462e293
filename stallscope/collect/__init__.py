"""Collection: one sample of every source, handed to every sink.

``Collector`` samples the sources on an interval (a background thread outside the trainer) and
hands each :class:`Sample` to a list of sinks: the run store (:class:`StoreSink`) today; the
Prometheus registry, the alert engine and the live view plug in the same way. ``Session`` sets up
a whole monitored session (run directory, ``meta.json``, sources, collector, sinks) for
``stallscope run`` and for the standalone probe alike.
"""

from __future__ import annotations

from stallscope.collect.collector import Collector, Event, Sample, take_sample
from stallscope.collect.sinks import Sink, StoreSink

__all__ = ["Collector", "Event", "Sample", "Sink", "StoreSink", "take_sample"]
