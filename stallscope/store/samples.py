"""One sample of ``run.db`` in one row: the ``samples`` table (schema version 7), its blob, and
folding old samples into 1-minute buckets.

A sample of a 9-process tree is ~497 points. Schema version 6 and before kept each a ``points``
row (``ts, series, v``: ~27 bytes a point, 497 rows inserted a sample, a quarter of a sample's
CPU); version 7 keeps the sample one ``samples(ts, data)`` row, ``data`` its series ids and
values:

- a header of 9 bytes (little-endian): the format (:data:`FORMAT`), the number of runs of ids,
  the number of points;
- the ids as runs of consecutive ids, ``(first id, length)`` as two unsigned 32-bit integers a
  run (a sample's series were mostly made in the order the sources give them: a few runs for
  hundreds of ids);
- the values, each the 8 bytes of its double in the sample's order of ids (nothing rounded: a
  value reads exactly as written).

~8 bytes a point. The writer keeps the last sample's series and encoded ids (:class:`Packer`):
a sample of the same series in the same order as the one before (the common case) costs one
compare of its keys and the values' bytes, without a step per point in Python.
A blob that cannot be read (not a blob, short or long, another format, run lengths that do not
add up to its count, runs that name an id twice, a value that is not a finite number) is
skipped as a whole; a point of no known series is skipped alone (the readers of
:mod:`stallscope.store.db` count both).
"""

from __future__ import annotations

import functools
import math
import operator
import sqlite3
import struct
import sys
from array import array
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from stallscope.store.rows import Series
from stallscope.store.schema import _finite

__all__ = [
    "FORMAT",
    "KEYS",
    "Packer",
    "fold_samples",
    "ids_of",
    "read_samples",
    "samples_span",
    "unpack",
    "write_sample",
]

#: the first byte of a sample's blob: its layout
FORMAT = 1
_HEAD = struct.Struct("<BII")
#: an array typecode of 4-byte unsigned integers (``I`` on every common platform)
_U32 = next(t for t in "ILH" if array(t).itemsize == 4)
_SWAP = sys.byteorder != "little"
_NUM = (float, int)
#: a point's value (:class:`~stallscope.metrics.Point` ``(name, entity, value)``)
_VALUE = operator.itemgetter(2)
#: a point's series: ``(name, entity)``
KEYS = operator.itemgetter(0, 1)


def _runs(ids: Iterable[int]) -> list[int]:
    """``(first, length)`` pairs, flat, of the runs of consecutive ids in ``ids``."""
    out: list[int] = []
    prev = -2
    for i in ids:
        if i == prev + 1:
            out[-1] += 1
        else:
            out += (i, 1)
        prev = i
    return out


class Packer:
    """Encodes samples for one writer, remembering the last sample's series (their keys, and
    the header and runs of their ids), so that a sample of the same series in the same order as
    the one before (every sample but the first, mostly) is packed without a step per point in
    Python (:meth:`again`)."""

    def __init__(self) -> None:
        self._keys: list[Any] | None = None
        self._key = b""
        self._head = b""

    def again(self, keys: list[Any], points: Sequence[Any]) -> tuple[bytes, int] | None:
        """The blob of a sample whose points (``(name, entity, value)`` each) have the
        ``keys`` (their ``(name, entity)``) of the last sample :meth:`pack` was given them for,
        and its number of points; None where the series differ or a value is not a finite
        number (then :meth:`pack` it)."""
        if keys != self._keys:
            return None
        vals = array("d", map(float, map(_VALUE, points)))
        total = sum(vals)
        if total - total != 0.0:  # inf or NaN (or a sum past the largest double)
            return None
        if _SWAP:
            vals.byteswap()
        return self._head + vals.tobytes(), len(vals)

    def pack(self, values: Mapping[int, float], keys: list[Any] | None = None) -> bytes:
        """The blob of a sample: ``values`` by series id (each a finite float). ``keys``: the
        sample's ``(name, entity)`` a point, where each point is one value of ``values`` in
        their order (for :meth:`again`)."""
        ids = array(_U32, values)
        key = ids.tobytes()
        if key != self._key:
            runs = array(_U32, _runs(ids))
            if _SWAP:
                runs.byteswap()
            self._head = _HEAD.pack(FORMAT, len(runs) // 2, len(ids)) + runs.tobytes()
            self._key = key
        self._keys = keys
        vals = array("d", values.values())
        if _SWAP:
            vals.byteswap()
        return self._head + vals.tobytes()


@functools.lru_cache(maxsize=64)
def ids_of(runs: bytes) -> tuple[int, ...]:
    """The series ids of a sample, from its runs (the bytes :func:`unpack` returns)."""
    pairs = array(_U32, runs)
    if _SWAP:
        pairs.byteswap()
    out: list[int] = []
    for first, n in zip(pairs[::2], pairs[1::2]):
        out += range(first, first + n)
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _distinct(runs: bytes) -> bool:
    """Whether the runs name each id once (runs that overlap: a damaged blob)."""
    ids = ids_of(runs)
    return len(set(ids)) == len(ids)


def unpack(data: Any) -> tuple[bytes, array[float]] | None:
    """A sample's runs of ids (bytes, for :func:`ids_of` and as a key of the same ids) and its
    values; None when ``data`` is not a readable blob of a sample."""
    if not isinstance(data, bytes) or len(data) < _HEAD.size:
        return None
    fmt, nruns, count = _HEAD.unpack_from(data)
    end = _HEAD.size + 8 * nruns
    if fmt != FORMAT or len(data) != end + 8 * count:
        return None
    runs = data[_HEAD.size : end]
    lengths = array(_U32, runs)
    if _SWAP:
        lengths.byteswap()
    if sum(lengths[1::2]) != count or 0 in lengths[1::2] or not _distinct(runs):
        return None
    vals = array("d", data[end:])
    if _SWAP:
        vals.byteswap()
    total = sum(vals)
    if total - total != 0.0 and not all(math.isfinite(v) for v in vals):
        return None  # NaN or inf: never written
    return runs, vals


def write_sample(db: sqlite3.Connection, ts: float, blob: bytes) -> None:
    """One sample's row; a sample already there at ``ts`` (two writes of one time) keeps its
    points and takes these, as rows of points did."""
    try:
        db.execute("INSERT INTO samples VALUES(?, ?)", (ts, blob))
    except sqlite3.IntegrityError:
        row = db.execute("SELECT data FROM samples WHERE ts=?", (ts,)).fetchone()
        merged: dict[int, float] = {}
        for got in (unpack(row[0]) if row is not None else None, unpack(blob)):
            if got is not None:
                merged.update(zip(ids_of(got[0]), got[1]))
        db.execute("INSERT OR REPLACE INTO samples VALUES(?, ?)", (ts, Packer().pack(merged)))


def read_samples(db: sqlite3.Connection, targets: dict[int, Series], *, unknown: bool) -> int:
    """Append the points of every sample to the series of ``targets`` (by id), in time order;
    returns how many samples could not be read (:func:`unpack`), and with ``unknown`` the
    points of series not in ``targets`` too."""
    bad = 0
    # per list of ids (a few a run): (index of the value, its series), unknown points
    plans: dict[bytes, tuple[list[tuple[int, Series]], int]] = {}
    for ts, data in db.execute("SELECT ts, data FROM samples ORDER BY ts"):
        got = unpack(data) if readable_ts(ts) else None
        if got is None:
            bad += 1
            continue
        runs, vals = got
        plan = plans.get(runs)
        if plan is None:
            ids = ids_of(runs)
            known = [(i, targets[sid]) for i, sid in enumerate(ids) if sid in targets]
            plan = plans[runs] = (known, len(ids) - len(known) if unknown else 0)
        t = float(ts)
        for i, s in plan[0]:
            s.ts.append(t)
            s.v.append(vals[i])
        bad += plan[1]
    return bad


def samples_span(db: sqlite3.Connection) -> tuple[float, float] | None:
    """The first and last time of a readable sample (walking the key from either end past the
    rows that cannot be read), None without one."""
    ends = []
    for order in ("ASC", "DESC"):
        for ts, data in db.execute(
            f"SELECT ts, data FROM samples WHERE {_finite('ts')} ORDER BY ts {order}"
        ):
            if unpack(data) is not None:
                ends.append(float(ts))
                break
    return (ends[0], ends[1]) if len(ends) == 2 else None


def readable_ts(ts: Any) -> bool:
    """Whether a sample's time is a finite number."""
    return type(ts) in _NUM and ts - ts == 0


#: the rollup INSERT of :func:`fold_samples` (a bucket already there: merged as
#: :meth:`~stallscope.store.db.RunStore.downsample` merges a row's points)
_ROLLUP_SQL = """INSERT INTO rollup(ts, series, n, v) VALUES(?1, ?2, ?3, ?4)
    ON CONFLICT(ts, series) DO UPDATE SET
      v = CASE WHEN ?5 THEN MAX(v, excluded.v)
          ELSE (v * n + excluded.v * excluded.n) / (n + excluded.n) END,
      n = n + excluded.n"""


def fold_samples(
    db: sqlite3.Connection, cutoff: float, bucket_s: float, max_ids: Collection[int]
) -> int:
    """Fold the samples before ``cutoff`` into ``bucket_s`` rollup buckets (a bucket's mean,
    its max for a series of ``max_ids``), then delete them (in the caller's transaction).
    A sample that cannot be read is deleted unread. Returns the number of points folded."""
    groups: dict[tuple[float, bytes], list[array[float]]] = {}
    for ts, data in db.execute("SELECT ts, data FROM samples WHERE ts < ? ORDER BY ts", (cutoff,)):
        got = unpack(data)
        if got is None or not readable_ts(ts):
            continue
        bt = int(ts / bucket_s) * bucket_s  # what CAST(ts / b AS INTEGER) * b made
        groups.setdefault((bt, got[0]), []).append(got[1])
    buckets: dict[tuple[float, int], tuple[int, float]] = {}
    folded = 0
    for (bt, runs), arrays in groups.items():
        n = len(arrays)
        for sid, col in zip(ids_of(runs), zip(*arrays)):
            is_max = sid in max_ids
            v = max(col) if is_max else sum(col) / n
            had = buckets.get((bt, sid))
            if had is not None:  # the same bucket in a sample of other ids
                m, w = had
                v = max(v, w) if is_max else (w * m + v * n) / (m + n)
                buckets[(bt, sid)] = (m + n, v)
            else:
                buckets[(bt, sid)] = (n, v)
            folded += n
    db.executemany(
        _ROLLUP_SQL,
        [(bt, sid, n, v, sid in max_ids) for (bt, sid), (n, v) in buckets.items()],
    )
    db.execute("DELETE FROM samples WHERE ts < ?", (cutoff,))
    return folded
