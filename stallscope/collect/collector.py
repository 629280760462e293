"""The collector: samples every open source on an interval, in a background thread outside the
trainer, and hands each time-aligned :class:`Sample` to every sink.

It never looks inside a source's payload: each source turns its own reading into points and
entity attributes (:meth:`~stallscope.sources.base.Source.read`), and the few metrics computed
from several sources at once are declared in :mod:`stallscope.collect.derived`.

It records its own cost per sample (CPU seconds of its thread, wall seconds) as the
``collector.cpu_s`` / ``collector.wall_s`` metrics, so users see what monitoring costs. A source
that fails is reported once as an event and retried; after repeated failures it is turned off
(and that is reported too). A sink that fails is reported once as an event and the other sinks
go on. Nothing a source or a sink does stops the collector.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stallscope.collect.derived import DERIVED, Deriver
from stallscope.collect.sinks import Sink
from stallscope.metrics import Point
from stallscope.sources.base import Reading, Source

__all__ = ["MAX_FAILURES", "Collector", "Event", "Sample", "take_sample"]

#: consecutive failures after which a source is switched off for the rest of the run
MAX_FAILURES = 5


@dataclass(frozen=True)
class Event:
    """Something said once in a run: a source unavailable, a GPU lost, a sink failing."""

    ts: float
    source: str
    kind: str  #: "unavailable", "note", "error", "disabled", "gpu_lost", "sink_error"...
    message: str


@dataclass
class Sample:
    """One sample of every source, at one time: what every sink receives."""

    ts: float
    readings: dict[str, Reading] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)  #: every source's points + derived + cost
    cpu_s: float = 0.0  #: the collector's CPU seconds for this sample
    wall_s: float = 0.0
    #: sources that gave their raw counters but no reading yet (their first read: rates need
    #: two), so Prometheus has node_exporter's counters from the first scrape
    primed: set[str] = field(default_factory=set)

    @property
    def payloads(self) -> dict[str, Any]:
        """Per source, its reading in the ``snapshot --json`` shape."""
        return {name: r.payload for name, r in self.readings.items()}


class Collector:
    """Background sampler handing samples to sinks."""

    def __init__(
        self,
        sources: Sequence[Source],
        sinks: Sequence[Sink] = (),
        *,
        interval: float = 5.0,
        warmup: tuple[float, float] | None = None,
        unavailable: dict[str, str] | None = None,
        derived: Sequence[Deriver] = DERIVED,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sources = list(sources)
        self.sinks = list(sinks)
        self.interval = interval
        #: (interval, seconds): sample this often at the start of a run, then every ``interval``
        self.warmup = warmup
        self.derived = tuple(derived)
        self._want_counters = any(s.wants_counters for s in self.sinks)
        self.clock = clock
        self.samples = 0  #: samples handed to the sinks
        self._sink_cpu_s = self._sink_wall_s = 0.0  #: what the sinks took for the last sample
        #: (thread id, its CPU seconds) at the end of the last sample handed to the sinks
        self._mark: tuple[int | None, float] = (None, 0.0)
        self.failures: dict[str, int] = {}
        self.events: list[Event] = []  #: everything said, in order (also handed to the sinks)
        self._said: set[tuple[str, str]] = set()
        self._sink_failed: set[int] = set()
        self._stop = threading.Event()
        #: the sampling thread sleeps in poll() on this pipe, which :meth:`halt` writes to: a
        #: wake-up costs it half what ``Event.wait`` did (~75 against ~130 µs of CPU after a
        #: 0.25-s sleep, a lock made and a futex with a timeout each time)
        self._wake: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        now = clock()
        for sink in self.sinks:
            sink.bind(self.say)
        for name, reason in (unavailable or {}).items():
            self.say(now, name, "unavailable", reason)
        for src in self.sources:
            self._drain(now, src)

    # --- events said once -----------------------------------------------------------------------
    def say(self, ts: float, source: str, kind: str, message: str) -> None:
        """Record an event once (the same source and message again is not repeated)."""
        if (source, message) in self._said:
            return
        self._said.add((source, message))
        ev = Event(ts, source, kind, message)
        self.events.append(ev)
        for sink in self.sinks:
            try:
                sink.event(ev)
            except Exception as exc:  # a sink that cannot take events: said through the others
                self._sink_error(ts, sink, exc)

    def _drain(self, now: float, src: Source) -> None:
        for kind, message in src.drain_events():
            self.say(now, src.name, kind, message)

    # --- one sample -----------------------------------------------------------------------------
    def sample_once(self) -> Sample:
        """Sample every source now and hand the sample to every sink."""
        with self._lock:
            return self._sample_locked()

    def _sample_locked(self) -> Sample:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        now = self.clock()
        sample = Sample(now)
        points = sample.points
        counters = self._want_counters
        for src in list(self.sources):
            try:
                reading = src.read(now, counters=counters)
            except Exception as exc:  # a broken source must not stop the others: report it
                self._failed(now, src, exc)
                continue
            finally:
                self._drain(now, src)
            self.failures[src.name] = 0
            if reading is None:
                if counters:
                    raw = self._raw_counters(now, src)
                    if raw:
                        sample.primed.add(src.name)
                        points.extend(raw)
                continue
            sample.readings[src.name] = reading
            points.extend(reading.points)
        for derive in self.derived:
            points.extend(derive(sample.readings))
        if not sample.readings:
            # priming: no rates yet; the raw counters go to the sinks that export them
            if sample.primed:
                for sink in self.sinks:
                    if sink.wants_counters:
                        try:
                            sink.write(sample)
                        except Exception as exc:  # as below
                            self._sink_error(now, sink, exc)
            return sample
        # the sample's own cost: sources and derived points, plus what the sinks took for the
        # previous sample (the store, the alerts, the exposition: the point is written by
        # them, so their share is counted one sample late), plus, on the collector's own
        # thread, what that thread spent since then (waking up, its loop): all of its CPU is
        # sampling, and the point says what one sample costs the monitor's process
        sample.cpu_s = time.thread_time() - cpu0 + self._sink_cpu_s + self._between(cpu0)
        sample.wall_s = time.perf_counter() - wall0 + self._sink_wall_s
        points.append(Point("collector.cpu_s", "", sample.cpu_s))
        points.append(Point("collector.wall_s", "", sample.wall_s))
        cpu1, wall1 = time.thread_time(), time.perf_counter()
        for sink in self.sinks:
            try:
                sink.write(sample)
            except Exception as exc:  # one failing sink never stops the others or sampling
                self._sink_error(now, sink, exc)
        end = time.thread_time()
        self._sink_cpu_s = end - cpu1
        self._sink_wall_s = time.perf_counter() - wall1
        self._mark = (threading.get_ident(), end)
        self.samples += 1
        return sample

    def _between(self, cpu0: float) -> float:
        """This thread's CPU seconds from the end of its previous sample to ``cpu0``: the
        collector thread's wake-up and loop (0 on another thread, or for the first sample)."""
        ident, end = self._mark
        if ident != threading.get_ident() or cpu0 < end:
            return 0.0
        return cpu0 - end

    def _raw_counters(self, now: float, src: Source) -> list[Point]:
        """A priming source's raw counters (its first read: no interval for rates yet)."""
        try:
            return [Point(*c) for c in src.counters()]
        except Exception as exc:  # counters are a bonus: a failure costs only them
            self.say(now, src.name, "error", f"counters: {type(exc).__name__}: {exc}")
            return []

    def _sink_error(self, ts: float, sink: Sink, exc: BaseException) -> None:
        if id(sink) in self._sink_failed:
            return
        self._sink_failed.add(id(sink))
        self.say(
            ts,
            f"sink:{sink.name}",
            "sink_error",
            f"{sink.name} sink failed: {type(exc).__name__}: {exc} (the other sinks go on)",
        )

    def _failed(self, now: float, src: Source, exc: BaseException) -> None:
        n = self.failures.get(src.name, 0) + 1
        self.failures[src.name] = n
        self.say(now, src.name, "error", f"{type(exc).__name__}: {exc}")
        if n >= MAX_FAILURES:
            self.sources.remove(src)
            self.say(
                now,
                src.name,
                "disabled",
                f"{src.name} source turned off after {n} failures in a row",
            )
            try:
                src.close()
            except Exception as close_exc:  # closing a broken source may fail too: say so
                self.say(now, src.name, "error", f"close failed: {close_exc}")

    # --- thread ---------------------------------------------------------------------------------
    def start(self) -> None:
        # prime counter-based sources so the first handed-over sample is a full interval
        self.sample_once()
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._loop, name="stallscope-collector", daemon=True)
        self._thread.start()

    def interval_at(self, elapsed_s: float) -> float:
        """Seconds to the next sample, ``elapsed_s`` after the start: the warm-up interval
        first (short runs get enough samples to show their shape), then the configured one
        (long runs stay cheap and small)."""
        if self.warmup is not None and elapsed_s < self.warmup[1]:
            return min(self.warmup[0], self.interval)
        return self.interval

    def _loop(self) -> None:
        assert self._wake is not None
        poller = select.poll()
        poller.register(self._wake[0], select.POLLIN)
        t0 = time.monotonic()
        next_t = t0 + self.interval_at(0.0)
        while not self._stop.is_set():
            wait_s = next_t - time.monotonic()
            if wait_s > 0:
                poller.poll(wait_s * 1000.0)  # the pipe is written to only by halt()
                if self._stop.is_set():
                    break
            self.sample_once()
            step = self.interval_at(next_t - t0)
            next_t += step
            if next_t < time.monotonic():  # fell behind (suspend, overload): skip, don't burst
                next_t = time.monotonic() + step

    def halt(self) -> None:
        """Stop the sampling thread (nothing else: :meth:`stop` ends the collector)."""
        self._stop.set()
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"x")
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._wake is not None and (self._thread is None or not self._thread.is_alive()):
            for fd in self._wake:
                os.close(fd)
            self._wake = None

    def stop(self, final_sample: bool = True) -> None:
        """Stop the thread; take one last sample so the tail of the run is not lost; close the
        sources and the sinks."""
        self.halt()
        if final_sample:
            self.sample_once()
        for src in self.sources:
            try:
                src.close()
            except Exception as exc:  # report, don't hide
                self.say(self.clock(), src.name, "error", f"close failed: {exc}")
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                self._sink_error(self.clock(), sink, exc)


def take_sample(
    sources: Sequence[Source], interval: float, sleep: Callable[[float], None] = time.sleep
) -> dict[str, Any]:
    """One sample of every source over ``interval`` seconds (for ``snapshot``)."""
    now = time.time()
    for src in sources:
        src.sample(now)
    sleep(interval)
    now = time.time()
    out: dict[str, Any] = {}
    for src in sources:
        out[src.name] = src.sample(now)
    return out
