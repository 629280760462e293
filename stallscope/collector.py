"""The collector: samples every open source on an interval, in a background thread outside the
trainer, and writes time-aligned points into the run store.

It records its own cost per sample (CPU seconds of its thread, wall seconds) as the
``collector.cpu_s`` / ``collector.wall_s`` metrics, so users see what monitoring costs. A source
that fails is reported once as an event and retried; after repeated failures it is turned off
(and that is reported too). Nothing a source does stops the collector.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from stallscope.sources.base import Source
from stallscope.store import Point, RunStore, iter_points_from_payload

__all__ = ["Collector", "take_sample"]

#: consecutive failures after which a source is switched off for the rest of the run
MAX_FAILURES = 5


class Collector:
    """Background sampler writing into a :class:`RunStore`."""

    def __init__(
        self,
        store: RunStore,
        sources: Sequence[Source],
        *,
        interval: float = 5.0,
        unavailable: dict[str, str] | None = None,
        keep_full_s: float = 3600.0,
        bucket_s: float = 60.0,
        on_sample: Callable[[float, dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.sources = list(sources)
        self.interval = interval
        self.keep_full_s = keep_full_s
        self.bucket_s = bucket_s
        self.on_sample = on_sample
        self.clock = clock
        self.samples = 0
        self.store_errors = 0  #: samples or events that could not be written
        self.failures: dict[str, int] = {}
        self._said: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._known_entities: set[tuple[str, str]] = set()
        now = clock()
        for name, reason in (unavailable or {}).items():
            self.say(now, name, "unavailable", reason)
        for src in self.sources:
            for note in getattr(src, "notes", []):
                self.say(now, src.name, "note", note)

    # --- events said once -----------------------------------------------------------------------
    def say(self, ts: float, source: str, kind: str, message: str) -> None:
        if (source, message) in self._said:
            return
        self._said.add((source, message))
        try:
            self.store.add_event(ts, source, kind, message)
        except (sqlite3.Error, OSError) as exc:
            self._store_failed(exc)

    # --- one sample -----------------------------------------------------------------------------
    def sample_once(self) -> dict[str, Any]:
        """Sample every source now, store the points, return the payloads by source."""
        with self._lock:
            return self._sample_locked()

    def _sample_locked(self) -> dict[str, Any]:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        now = self.clock()
        payloads: dict[str, Any] = {}
        points: list[Point] = []
        for src in list(self.sources):
            try:
                payload = src.sample(now)
            except Exception as exc:  # a broken source must not stop the others: report it
                self._failed(now, src, exc)
                continue
            self.failures[src.name] = 0
            if payload is None:
                continue
            payloads[src.name] = payload
            points.extend(iter_points_from_payload(src.name, payload))
            try:
                self._entities(now, src, payload)
            except (sqlite3.Error, OSError) as exc:
                self._store_failed(exc)
            for note in getattr(src, "notes", []):
                self.say(now, src.name, "note", note)
        points.extend(_trainer_gpu_points(payloads))
        cost_cpu = time.thread_time() - cpu0
        cost_wall = time.perf_counter() - wall0
        if payloads:
            points.append(Point("collector.cpu_s", "", cost_cpu))
            points.append(Point("collector.wall_s", "", cost_wall))
            try:
                self.store.add_points(now, points)
                self.samples += 1
                if self.samples % 60 == 0:
                    self.store.downsample(now - self.keep_full_s, self.bucket_s)
            except (sqlite3.Error, OSError) as exc:  # disk full, locked too long, I/O error
                self._store_failed(exc)
        if self.on_sample is not None:
            self.on_sample(now, payloads)
        return payloads

    def _store_failed(self, exc: BaseException) -> None:
        """The store cannot be written: say it once on stderr (where else?), count the rest;
        the next interval tries again."""
        self.store_errors += 1
        if self.store_errors == 1:
            sys.stderr.write(f"stallscope: cannot write to {self.store.path}: {exc} "
                             "(samples are lost until it can)\n")

    def _failed(self, now: float, src: Source, exc: BaseException) -> None:
        n = self.failures.get(src.name, 0) + 1
        self.failures[src.name] = n
        self.say(now, src.name, "error", f"{type(exc).__name__}: {exc}")
        if n >= MAX_FAILURES:
            self.sources.remove(src)
            self.say(now, src.name, "disabled",
                     f"{src.name} source turned off after {n} failures in a row")
            try:
                src.close()
            except Exception as close_exc:  # closing a broken source may fail too: say so
                self.say(now, src.name, "error", f"close failed: {close_exc}")

    def _entities(self, now: float, src: Source, payload: Any) -> None:
        if src.name == "gpu":
            for g in payload:
                ent = f"gpu{g.get('index', 0)}"
                if (src.name, ent) not in self._known_entities:
                    self._known_entities.add((src.name, ent))
                    attrs = {k: g.get(k) for k in ("name", "uuid", "pcie_gen_max",
                                                    "pcie_width_max", "mem_total_mib")}
                    self.store.upsert_entity(src.name, ent, attrs, now)
        elif src.name == "procs":
            known = getattr(src, "known", {})
            for pid in payload:
                ent = str(pid)
                if (src.name, ent) not in self._known_entities and int(pid) in known:
                    self._known_entities.add((src.name, ent))
                    self.store.upsert_entity(src.name, ent, known[int(pid)], now)
            self.store.touch_entities(src.name, list(payload), now)
        elif src.name == "disk":
            for dev in payload:
                if (src.name, dev) not in self._known_entities:
                    self._known_entities.add((src.name, dev))
                    self.store.upsert_entity(src.name, dev, {}, now)

    # --- thread ---------------------------------------------------------------------------------
    def start(self) -> None:
        # prime counter-based sources so the first stored sample is a full interval
        self.sample_once()
        self._thread = threading.Thread(target=self._loop, name="stallscope-collector",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_t = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self.sample_once()
            next_t += self.interval
            if next_t < time.monotonic():  # fell behind (suspend, overload): skip, don't burst
                next_t = time.monotonic() + self.interval

    def stop(self, final_sample: bool = True) -> None:
        """Stop the thread; take one last sample so the tail of the run is not lost."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if final_sample:
            self.sample_once()
        for src in self.sources:
            try:
                src.close()
            except Exception as exc:  # report, don't hide
                self.say(self.clock(), src.name, "error", f"close failed: {exc}")


def _trainer_gpu_points(payloads: dict[str, Any]) -> list[Point]:
    """Per GPU, the memory the trainer's processes hold: tells the diagnosis which GPUs this run
    uses (a node's other GPUs, idle or busy with other jobs, must not count)."""
    gpus, procs = payloads.get("gpu"), payloads.get("procs")
    if not gpus or procs is None:
        return []
    out = []
    for g in gpus:
        used = sum(float(p.get("used_mib") or 0) for p in g.get("processes") or []
                   if str(p.get("pid")) in procs)
        out.append(Point("gpu.trainer_mem_mib", f"gpu{g.get('index', 0)}", used))
    return out


def take_sample(sources: Sequence[Source], interval: float,
                sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
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
