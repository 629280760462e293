"""The seam every metric source plugs into.

A source is a thin, stateful reader around pure parsers:

* ``open()`` checks that it can work here (raising :class:`~stallscope.errors.SourceUnavailable`
  with the reason if not);
* ``sample(now)`` returns one JSON-able payload in the shape of the ``snapshot --json`` contract
  (docs/architecture.md), computing rates against its own previous reading. The first
  ``sample`` after ``open`` may return ``None`` for counter-based sources (nothing to diff yet);
* ``read(now)`` returns the same as a typed :class:`Reading`: the payload, its points (metric,
  entity, value) and the attributes of the entities it is about. The collector and the sinks use
  only this, so they never need to know a source's payload shape: a source says how its payload
  becomes points by overriding :meth:`Source.points` and :meth:`Source.entities`;
* ``emit(kind, message)`` tells the run something once (a GPU lost, an NVML error, a file it
  cannot read); the collector turns it into a run event.

Counter-based sources also keep their latest raw cumulative counters (``counters()``, declared
in :mod:`stallscope.metrics` with kind ``"counter"``; :meth:`Source.read` adds them to the
reading's points), so a Prometheus user can compute rates with ``rate()``. Every interval
growth of a counter, in every source, goes through :func:`counter_delta`: a wrap is unwrapped, a
reset gives None and the caller drops that interval for the rates that depend on it rather than
reporting zero.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import le, sub
from typing import Any, ClassVar

from stallscope.metrics import Point, lookup

#: one counter reading as handed out by :meth:`Source.counters`: (metric name, entity, value)
Counter = tuple[str, str, float]


@dataclass(slots=True)
class Reading:
    """One source's sample, typed: what the collector hands to every sink."""

    source: str
    payload: Any  #: the ``snapshot --json`` shape of this source
    points: list[Point]
    #: entity -> attributes (names, ids, device facts) for every entity in this reading
    entities: dict[str, dict[str, Any]]
    #: entities come and go during a run (processes): the store keeps when each was last seen
    transient: bool = False


#: per source, payload key -> metric name (or None: not a metric); filled on first use
_NAMES: dict[str, dict[str, str | None]] = {}
_UNSEEN = object()  #: a payload key not looked up yet
#: ``_new_point(Point, (name, entity, value))``: a point without the NamedTuple's Python-level
#: ``__new__`` (a sample makes ~140 of them; this is half the cost of each)
_new_point = tuple.__new__


def numeric_points(source: str, entity: str, fields: Mapping[str, Any]) -> list[Point]:
    """The numbers of one entity's fields that the vocabulary declares, as points.

    Ids (index, pid) and text are not metrics; None and NaN are not readings."""
    names = _NAMES.get(source)
    if names is None:
        names = _NAMES[source] = {}
    out: list[Point] = []
    for k, v in fields.items():
        name = names.get(k, _UNSEEN)
        if name is _UNSEEN:
            name = names[k] = f"{source}.{k}" if lookup(f"{source}.{k}") is not None else None
        if name is None:
            continue
        t = type(v)
        if t is float:  # the usual case first: a rate or a size, rounded
            if v == v:
                out.append(_new_point(Point, (name, entity, v)))
        elif t is int:
            out.append(_new_point(Point, (name, entity, float(v))))
        elif v is not None and not isinstance(v, (str, list, dict)):
            fv = float(v)
            if fv == fv:
                out.append(_new_point(Point, (name, entity, fv)))
    return out


class Source(abc.ABC):
    """One metric source (gpu, disk, host, procs...)."""

    name: ClassVar[str]
    #: whether this source's entities come and go during a run (see :attr:`Reading.transient`)
    transient_entities: ClassVar[bool] = False

    def open(self) -> None:  # noqa: B027 - optional hook
        """Check the source works here; raise SourceUnavailable(reason) if not."""

    @abc.abstractmethod
    def sample(self, now: float) -> Any:
        """Return one payload (JSON-able), or None while priming counters."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles (NVML, file descriptors)."""

    # --- typed readings -------------------------------------------------------------------------
    def read(self, now: float, *, counters: bool = False) -> Reading | None:
        """One sample as a :class:`Reading`, or None while priming counters. ``counters``: add
        the raw counters (:meth:`counters`) to the points, for sinks that export them."""
        payload = self.sample(now)
        if payload is None:
            return None
        points = self.points(payload)
        if counters:
            points.extend(Point(*c) for c in self.counters())
        return Reading(self.name, payload, points, self.entities(payload), self.transient_entities)

    def points(self, payload: Any) -> list[Point]:
        """The payload's numbers as points; default: one flat dict about the whole host."""
        return numeric_points(self.name, "", payload)

    def entities(self, payload: Any) -> dict[str, dict[str, Any]]:
        """Entity -> attributes for the entities in ``payload``; default: none."""
        return {}

    # --- events ---------------------------------------------------------------------------------
    def emit(self, kind: str, message: str) -> None:
        """Tell the run something (once is enough: the collector drops repeats)."""
        pending: list[tuple[str, str]] | None = self.__dict__.get("_pending_events")
        if pending is None:
            pending = self.__dict__["_pending_events"] = []
        pending.append((kind, message))

    def drain_events(self) -> list[tuple[str, str]]:
        """What :meth:`emit` collected since the last call (the collector calls this)."""
        pending: list[tuple[str, str]] | None = self.__dict__.get("_pending_events")
        if not pending:
            return []
        self.__dict__["_pending_events"] = []
        return pending

    def counters(self) -> list[Counter]:
        """The raw cumulative counters of the latest read, in base units (seconds, bytes,
        counts): ``(metric name, entity, value)`` with the name declared in
        :mod:`stallscope.metrics` as kind ``"counter"``. Kept beside the rates because
        Prometheus users compute their own with ``rate()``. Sources without counters (or
        before their first read) return []."""
        return []


_HALF: dict[int, int] = {32: 1 << 31, 64: 1 << 63}


def counter_delta(prev: int, cur: int, bits: int = 32) -> int | None:
    """How much a cumulative counter grew from ``prev`` to ``cur``; None if it was reset.

    The one place where wrap and reset are decided, for every source. ``bits`` is the width
    the kernel keeps the counter in: 32 for ``/proc/diskstats`` time fields (and every field
    on 32-bit kernels) and ``unsigned long`` counters such as ``/proc/vmstat``; 64 for the
    u64 counters (``/proc/stat`` CPU ticks, ``/proc/PID/io``, schedstat). A counter that went
    down is taken as a wrap when the previous value fits in ``bits`` and the wrapped growth is
    under half the range (serial-number arithmetic: a counter cannot plausibly advance by half
    its range in one interval, whereas a counter that restarted from 0 after being small would
    otherwise read as a huge wrap). Anything else is a reset (device replaced, counters
    cleared, a kernel's per-CPU iowait going backwards): the caller then reports no value for
    that interval instead of a zero rate that never happened.
    """
    if cur >= prev:
        return cur - prev
    half = _HALF.get(bits) or 1 << (bits - 1)
    if prev < half << 1:
        grown = cur + (half << 1) - prev
        if grown < half:
            return grown
    return None


def counter_deltas(
    prev: Sequence[int], cur: Sequence[int], bits: int = 32
) -> tuple[int, ...] | None:
    """:func:`counter_delta` of each pair of fields; None if any of them was reset.

    A whole reading (one CPU line, one device) is one interval: one reset field invalidates
    the rates computed from it. When nothing went down (nearly always) the answer is the plain
    difference, computed in C; that is exactly what :func:`counter_delta` returns for growing
    counters, so this only saves the per-field calls.
    """
    if all(map(le, prev, cur)):
        return tuple(map(sub, cur, prev))
    out: list[int] = []
    for p, c in zip(prev, cur):
        d = counter_delta(p, c, bits)
        if d is None:
            return None
        out.append(d)
    return tuple(out)


class ProcFile:
    """A ``/proc`` or ``/sys`` file kept open and re-read with ``pread`` at offset 0.

    The kernel regenerates such files on every read from the start, so one descriptor serves
    the whole run; this avoids an ``open``/``close`` pair per sample (about 20 µs each).
    """

    __slots__ = ("fd", "path", "size")

    def __init__(self, path: str, size: int = 8192) -> None:
        self.path = path
        self.size = size
        self.fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> bytes:
        """The whole file; grows the buffer when the content did not fit."""
        if self.fd is None:
            raise OSError(f"{self.path} is closed")
        while True:
            data = os.pread(self.fd, self.size, 0)
            if len(data) < self.size:
                return data
            self.size *= 2

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def close_all(files: dict[Any, ProcFile]) -> None:
    """Close every kept descriptor of a source and forget them (its ``close()``)."""
    for f in files.values():
        f.close()
    files.clear()
