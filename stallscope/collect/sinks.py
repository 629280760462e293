"""Sinks: where each sample goes. The run store is one; the Prometheus registry, the alert
engine and the live view are others, each a class with ``write(sample)``.

A sink must not block for long (it runs on the collector's thread) and may raise: the collector
reports the failure once as a run event and goes on with the other sinks.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stallscope.metrics import lookup

if TYPE_CHECKING:
    from stallscope.collect.collector import Event, Sample
    from stallscope.store import RunStore

__all__ = ["HOLD_BELOW_S", "Sink", "StoreSink"]

#: samples less than this far apart are written two to a transaction (each one's row held back
#: until the next: :meth:`~stallscope.store.RunStore.add_points` ``hold``); a crash then loses
#: at most the one sample held, less than this much of the run
HOLD_BELOW_S = 1.0

log = logging.getLogger("stallscope.collect")


class Sink:
    """Base of every sink; ``event`` and ``close`` are optional."""

    name = "sink"
    #: whether this sink wants the sources' raw counters among the points (Prometheus does;
    #: the run store keeps the rates derived from them, and building counters costs CPU)
    wants_counters = False

    def write(self, sample: Sample) -> None:
        raise NotImplementedError

    def event(self, event: Event) -> None:
        """Something said once in the run (see :class:`~stallscope.collect.Event`)."""

    def bind(self, say: Callable[[float, str, str, str], None]) -> None:
        """Called once by the collector with its ``say(ts, source, kind, message)``, for a sink
        that has things of its own to record as run events (the alert engine)."""

    def close(self) -> None:
        """The collector stopped."""


def _stored(name: str) -> bool:
    """Counters are for Prometheus (``rate()`` over its own windows); the run store keeps the
    rates derived from them, which is what the summary and the diagnosis read."""
    m = lookup(name)
    return m is not None and m.kind != "counter"


class StoreSink(Sink):
    """Writes samples, entities and events into a run's ``run.db``.

    A store that cannot be written (disk full, file deleted, locked too long) is said once on
    stderr (the run's events live in the store, so they cannot say it) and counted; the next
    sample tries again. Old samples are downsampled every ``downsample_every`` samples so a long
    run's file stays bounded."""

    name = "store"

    def __init__(
        self,
        store: RunStore,
        *,
        keep_full_s: float = 3600.0,
        bucket_s: float = 60.0,
        downsample_every: int = 60,
    ) -> None:
        self.store = store
        self.keep_full_s = keep_full_s
        self.bucket_s = bucket_s
        self.downsample_every = downsample_every
        self.errors = 0  #: samples or events that could not be written
        self.written = 0
        self._known: dict[tuple[str, str], dict[str, Any]] = {}  #: attributes as stored
        #: per transient source, the entities of its latest reading and that sample's time
        self._present: dict[str, tuple[tuple[str, ...], float]] = {}
        #: the metrics whose points are stored (:func:`_stored`), and those left out, as met
        self._kept: set[str] = set()
        self._left: set[str] = set()
        self._last_ts: float | None = None  #: the previous sample's time

    def write(self, sample: Sample) -> None:
        every, kept = sample.points, self._kept
        points = [p for p in every if p[0] in kept]  # p[0]: the name, without a getter call
        if len(points) != len(every):  # counters left out, or a metric not met before
            left = self._left
            if any(p[0] not in kept and p[0] not in left for p in every):
                for p in every:
                    if p[0] not in kept and p[0] not in left:
                        (kept if _stored(p[0]) else left).add(p[0])
                points = [p for p in every if p[0] in kept]
        last, self._last_ts = self._last_ts, sample.ts
        held = self.store.held
        try:
            touch = self._entities(sample)
            # the next sample is due within HOLD_BELOW_S: this one waits for it (one commit
            # for both); a sample at a longer interval is written at once
            hold = last is not None and 0.0 < sample.ts - last < HOLD_BELOW_S
            self.store.add_points(sample.ts, points, touch, hold=hold)
            self.written += 1
            if self.written % self.downsample_every == 0:
                self.store.downsample(sample.ts - self.keep_full_s, self.bucket_s)
                self.store.pack_steps(sample.ts)
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc, 1 + held)  # a row held back is lost with this one

    def _entities(self, sample: Sample) -> list[tuple[str, list[str], float]]:
        """Store new or changed entities; returns the last-seen times to write with the
        sample's points: (source, entities, time).

        A transient entity (a process) gets its last-seen time when it is gone (the previous
        sample's time), and every entity still there every ``downsample_every`` samples and at
        :meth:`close`: one write when something changes rather than a row a sample (the
        commit then leaves the entities table alone; a run killed outright keeps times at most
        that many samples old)."""
        touch: list[tuple[str, list[str], float]] = []
        checkpoint = (self.written + 1) % self.downsample_every == 0
        known = self._known
        for name, reading in sample.readings.items():
            for ent, attrs in reading.entities.items():
                was = known.get((name, ent))
                # the same object (a source hands out what it keeps): unchanged, not compared
                if was is not attrs and was != attrs:  # new, or changed (a reused pid)
                    known[(name, ent)] = attrs
                    self.store.upsert_entity(name, ent, attrs, sample.ts)
            if reading.transient:
                before, before_ts = self._present.get(name, ((), 0.0))
                gone = [e for e in before if e not in reading.entities]
                if gone:
                    touch.append((name, gone, before_ts))
                self._present[name] = (tuple(reading.entities), sample.ts)
                if checkpoint and reading.entities:
                    touch.append((name, list(reading.entities), sample.ts))
        return touch

    def close(self) -> None:
        """Write the sample held back, if any, and the last-seen time of every transient
        entity still present."""
        try:
            self.store.flush()
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
        if not self._present:
            return
        try:
            for name, (present, ts) in self._present.items():
                if present:
                    self.store.touch_entities(name, list(present), ts)
            self._present = {}
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)

    def event(self, event: Event) -> None:
        try:
            self.store.add_event(event.ts, event.source, event.kind, event.message)
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException, lost: int = 1) -> None:
        first = not self.errors
        self.errors += lost
        if first:
            log.warning(
                "cannot write to %s: %s (samples are lost until it can)", self.store.path, exc
            )
