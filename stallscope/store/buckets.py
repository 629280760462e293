"""The 1-minute buckets of ``run.db`` packed: the buckets of one series and one hour in one
compressed blob (``rollup_packs``, schema version 6), and reading them back.

A day of a 9-process tree's 497 series is ~680,000 buckets: 15.9 MB as ``rollup`` rows (~23
bytes each), 4.1 MB packed. A pack holds its buckets' times as whole multiples of the bucket's
width (``ts = k * width``, as :meth:`~stallscope.store.db.RunStore.downsample` makes them: the
width and the first ``k`` once, then each ``k`` after the previous one's plus one), their
sample counts, and their values as the 8 bytes of the double (nothing is rounded: a packed
bucket reads exactly as its row did), in byte planes (:mod:`stallscope.store.planes`),
zlib-compressed (in one code: a pack's planes are too short for a code each).

The buckets of an hour are packed once the hour is wholly older than what
:meth:`~stallscope.store.db.RunStore.downsample` folds (:func:`pack_buckets`, in its
transaction: ~0.1 s of CPU once an hour for 500 series); the newer ones stay ``rollup`` rows,
as do buckets a pack cannot hold as they are (a time that is not a whole multiple of the width,
a value a reader would skip): readers read packs and rows as one.
"""

from __future__ import annotations

import itertools
import math
import operator
import sqlite3
import struct
import zlib
from array import array
from collections.abc import Collection, Sequence
from typing import Any

from stallscope.store.planes import from_planes, planes, raw_planes

__all__ = ["FORMAT", "PACK_S", "pack", "pack_buckets", "packed", "packed_span", "unpack"]

#: the first byte of a pack: its layout
FORMAT = 1
#: the time a pack covers (seconds): the buckets of one series whose start is in one hour
PACK_S = 3600
#: whole multiples of the width a pack holds (a double's exact integers)
_K_MAX = 1 << 53
_N_MAX = 1 << 60

#: a pack's head: how many buckets, their width, the first one's ``k``
_HEAD = struct.Struct("<Idq")
#: a bucket as a pack holds it: (k, n, v), its time ``k * width``
Bucket = tuple[int, int, float]


def pack(width: float, buckets: Sequence[Bucket]) -> bytes:
    """The buckets (in time order, at least one; ``k`` under 2**53, ``n`` from 1 to 2**60) of
    ``width`` seconds as one blob."""
    ks, ns, vs = zip(*buckets)
    return _pack(width, ks, ns, vs)


def _pack(width: float, ks: Sequence[int], ns: Sequence[int], vs: Sequence[float]) -> bytes:
    """:func:`pack` of the buckets' columns."""
    parts = [
        _HEAD.pack(len(ks), width, ks[0]),
        planes([b - a - 1 for a, b in itertools.pairwise(ks)]),
        planes(ns),
        *raw_planes(_doubles(vs)),
    ]
    # a window of 1 kB for the ~600 bytes of an hour: half the CPU of zlib's default (its
    # 256 kB of state), the same bytes
    co = zlib.compressobj(6, zlib.DEFLATED, 10, 4)
    return bytes([FORMAT]) + co.compress(b"".join(parts)) + co.flush()


def _doubles(values: Sequence[float]) -> bytes:
    b = array("d", values)
    if array("H", [1]).tobytes()[0] != 1:  # pragma: no cover - big-endian
        b.byteswap()
    return b.tobytes()


def unpack(blob: bytes) -> list[tuple[float, int, float]]:
    """The buckets of one pack as (ts, n, v); ValueError when it is not one this code can
    read (a value or time that is not a finite number included)."""
    if not isinstance(blob, bytes) or not blob or blob[0] != FORMAT:
        raise ValueError("not a bucket pack of a known format")
    try:
        body = zlib.decompress(blob[1:])
    except zlib.error as exc:
        raise ValueError(f"damaged bucket pack: {exc}") from exc
    if len(body) < _HEAD.size:
        raise ValueError("damaged bucket pack")
    count, width, k = _HEAD.unpack_from(body)
    if not 0 < 10 * count <= len(body):  # a bucket takes 10 bytes at least
        raise ValueError("damaged bucket pack")
    dk, pos = from_planes(body, _HEAD.size, count - 1)
    ns, pos = from_planes(body, pos, count)
    raw = bytearray(8 * count)
    for i in range(8):
        raw[i::8] = body[pos : pos + count]  # ValueError where it ends early
        pos += count
    if pos != len(body):
        raise ValueError("damaged bucket pack")
    vs = array("d")
    vs.frombytes(bytes(raw))
    if array("H", [1]).tobytes()[0] != 1:  # pragma: no cover - big-endian
        vs.byteswap()
    out: list[tuple[float, int, float]] = []
    for d, n, v in zip([-1, *dk], ns, vs):
        k += d + 1
        ts = k * width
        if not (math.isfinite(ts) and math.isfinite(v)) or n < 1:
            raise ValueError("damaged bucket pack")
        out.append((ts, n, v))
    return out


def _has_packs(db: sqlite3.Connection) -> bool:
    return bool(
        db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='rollup_packs'"
        ).fetchone()
    )


#: SQL: a ``rollup`` row a pack holds as it is (``:w`` the width): a readable bucket (a known
#: series' whole number, at least one sample, a finite value) whose time is a whole multiple of
#: the width that a double holds exactly (as downsample() makes them: one made another way stays
#: a row)
_PACKABLE = (
    f"typeof(series) = 'integer' AND typeof(n) = 'integer' AND n >= 1 AND n < {_N_MAX} "
    "AND typeof(ts) = 'real' AND typeof(v) IN ('real', 'integer') AND abs(v) < 9e999 "
    f"AND abs(ts / :w) < {_K_MAX} AND CAST(round(ts / :w) AS INTEGER) * :w = ts"
)


def pack_buckets(
    db: sqlite3.Connection, before: float, width: float, max_ids: Collection[int]
) -> int:
    """Pack the ``rollup`` rows of every hour wholly before ``before`` into ``rollup_packs``,
    one pack a series and hour, inside the caller's transaction; returns how many rows. A row
    of an hour packed already (a sample that came late) goes into its pack (into its bucket as
    :meth:`~stallscope.store.db.RunStore.downsample` merges: the max for ``max_ids``, else the
    mean by sample count); a row a pack cannot hold stays, as do the rows of an hour whose pack
    cannot be read or has another width."""
    cut = math.floor(before / PACK_S) * PACK_S
    # checked and sorted by SQLite (a few hundredths of a second for an hour of 500 series)
    rows = db.execute(
        "SELECT series, ts, CAST(round(ts / :w) AS INTEGER), n, v FROM rollup "
        f"WHERE ts < :c AND {_PACKABLE} ORDER BY series, ts",
        {"w": width, "c": cut},
    ).fetchall()
    if not rows:
        return 0
    (stay,) = db.execute("SELECT COUNT(*) FROM rollup WHERE ts < ?", (cut,)).fetchone()
    stay -= len(rows)
    groups = _by_hour(rows)
    hours = ",".join(str(h) for h in {h for h, _ in groups})  # whole numbers
    old = {
        (h, sid): data
        for h, sid, data in db.execute(
            f"SELECT ts, series, data FROM rollup_packs WHERE ts IN ({hours})"
        )
    }
    packs: list[tuple[int, int, bytes]] = []
    for (hour, sid), part in groups.items():
        _, _, ks, ns, vs = zip(*part)
        if (hour, sid) in old:  # a sample that came late for a packed hour
            merged = _merge(old[(hour, sid)], width, list(zip(ks, ns, vs)), sid in max_ids)
            if merged is None:
                stay += len(part)
                continue
            ks, ns, vs = zip(*sorted(merged))
        packs.append((hour, sid, _pack(width, ks, ns, vs)))
    db.executemany("INSERT OR REPLACE INTO rollup_packs VALUES(?, ?, ?)", packs)
    if not stay:
        db.execute("DELETE FROM rollup WHERE ts < ?", (cut,))
    else:  # the rows packed, by key
        db.executemany(
            "DELETE FROM rollup WHERE ts=? AND series=?",
            [(r[1], sid) for hour, sid, _ in packs for r in groups[(hour, sid)]],
        )
    return len(rows) - stay


def _by_hour(rows: list[Any]) -> dict[tuple[int, int], list[Any]]:
    """``rollup`` rows (series, ts, ...) in (series, ts) order by (hour, series)."""
    out: dict[tuple[int, int], list[Any]] = {}
    for sid, group in itertools.groupby(rows, key=operator.itemgetter(0)):
        part = list(group)
        first, last = (math.floor(part[i][1] / PACK_S) * PACK_S for i in (0, -1))
        if first == last:  # the usual: the hour just folded
            out[(first, sid)] = part
            continue
        for hour, sub in itertools.groupby(part, key=lambda r: math.floor(r[1] / PACK_S)):
            out[(hour * PACK_S, sid)] = list(sub)
    return out


def _merge(blob: bytes, width: float, buckets: list[Bucket], is_max: bool) -> list[Bucket] | None:
    """A pack's buckets with ``buckets`` folded in, None where the pack cannot be read or has
    another width (its rows then stay rows)."""
    try:
        body_width = _HEAD.unpack_from(zlib.decompress(blob[1:]))[1]
        have = unpack(blob)
    except (ValueError, zlib.error, struct.error, TypeError):
        return None
    if body_width != width:
        return None
    by_k = {round(ts / width): (n, v) for ts, n, v in have}
    for k, n, v in buckets:
        if k in by_k:
            n0, v0 = by_k[k]
            v = max(v0, v) if is_max else (v0 * n0 + v * n) / (n0 + n)
            n += n0
        by_k[k] = (n, v)
    return [(k, n, v) for k, (n, v) in by_k.items()]


def packed(
    db: sqlite3.Connection, ids: Collection[int] | None = None
) -> tuple[list[tuple[int, list[tuple[float, float]]]], int]:
    """The packs (of the series ``ids``, or every one) in (hour, series) order as (series,
    [(ts, v)...]), and how many packs could not be read (left out); nothing before schema
    version 6."""
    if not _has_packs(db):
        return [], 0
    q = "SELECT series, data FROM rollup_packs"
    if ids is not None:  # whole numbers, never user input
        q += f" WHERE series IN ({','.join(str(int(i)) for i in ids)})"
    out: list[tuple[int, list[tuple[float, float]]]] = []
    bad = 0
    for sid, data in db.execute(q + " ORDER BY ts, series"):
        try:
            buckets = unpack(data)
        except ValueError:
            bad += 1
            continue
        if type(sid) is not int:
            bad += 1
            continue
        out.append((sid, [(ts, v) for ts, _, v in buckets]))
    return out, bad


def packed_span(db: sqlite3.Connection) -> tuple[float, float] | None:
    """The first and last bucket time of the packs that can be read (those of the first and
    last hour; a few hundred packs read), None without one."""
    if not _has_packs(db):
        return None
    ends: list[float] = []
    for order, pick in (("ASC", min), ("DESC", max)):
        for (hour,) in db.execute(f"SELECT DISTINCT ts FROM rollup_packs ORDER BY ts {order}"):
            times = []
            for sid, data in db.execute(
                "SELECT series, data FROM rollup_packs WHERE ts=?", (hour,)
            ).fetchall():
                try:
                    times += [ts for ts, _, _ in unpack(data)] if isinstance(sid, int) else []
                except ValueError:
                    continue
            if times:
                ends.append(pick(times))
                break
    return (ends[0], ends[1]) if len(ends) == 2 else None
