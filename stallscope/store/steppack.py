"""Step rows packed: many rows of one rank in one compressed blob (``run.db``'s ``step_packs``).

At 100 steps/s a day of step rows is ~5.8 million rows (two 10-ms steps a row, every device-timed
step a row of its own), ~70 bytes each as SQLite rows: 400 MB. Packed they take ~5.3 bytes
(format 1 took ~6.3). A pack holds the rows column by column, each value a whole number (step
numbers and counts as they are, times in microseconds: a packed row's times are kept to the
microsecond, see :func:`us`), each column as the differences that stay small (a row's step
number after the one before it plus its ``n``; its start, ``ts - wait_s``, after the previous
row's end, ``ts + host_s``; a duration or a count after ``n`` times the pack's mean per step, so
that rows of one step and of several read alike), a column that may be NULL as which rows have
a value and those values alone, zigzag-coded, split into byte planes
(:mod:`stallscope.store.planes`), each plane compressed on its own (zlib). Format 1 (schema
versions 4 and 5) kept NULL as a value of the column, no mean, one code across the planes: read
as it is.

Nothing here touches SQLite: :func:`pack` and :func:`unpack` are inverse (``unpack(pack(rows))
== rows`` for rows whose times are whole microseconds; tested).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence

from stallscope.store.planes import deflate, from_planes, planes, split, unzz

__all__ = ["FORMAT", "PackRow", "UsRow", "pack", "pack_us", "unpack", "us"]

#: the first byte of a pack: its layout (2: the columns below; 1: the first layout, still read)
FORMAT = 2

#: a packed row: (step, ts, wait_s, host_s, h2d_s, gpu_busy_s, gpu_idle_s, samples, epoch,
#: comm_s, n): :class:`~stallscope.store.rows.StepRow`'s fields after ``rank``, ``comm_s``
#: before ``n``
PackRow = tuple[
    int,
    float,
    float,
    float,
    "float | None",
    "float | None",
    "float | None",
    "int | None",
    "int | None",
    "float | None",
    int,
]

_COLUMNS = 11
#: the columns that may be NULL (indexes into a row), and those of them kept after ``n`` times
#: the pack's mean per step (durations and sample counts; not the epoch)
_OPTIONAL = (4, 5, 6, 7, 8, 9)
_PER_STEP = (4, 5, 6, 7, 9)
#: |n * mean| under this keeps a centred value within 64 bits (packed values are under 2**60)
_CENTRE_MAX = 1 << 61


def us(x: float) -> int:
    """Seconds as whole microseconds, rounded as SQLite's ``round(x * 1e6)`` rounds (half away
    from zero), so a time the store rounded on writing (``round(x * 1e6) / 1e6``) gives back the
    same whole number, and ``us(x) / 1e6`` the same float."""
    r = x * 1e6
    return int(r + 0.5) if r >= 0 else -int(-r + 0.5)


def pack(rows: Sequence[PackRow]) -> bytes:
    """The rows (in step order, at least one) as one blob."""

    def opt(x: float | None) -> int | None:
        return None if x is None else us(x)

    return pack_us(
        [
            (st, us(t), us(w), us(h), opt(a), opt(b), opt(c), sm, ep, opt(cm), n)
            for st, t, w, h, a, b, c, sm, ep, cm, n in rows
        ]
    )


#: a row as :func:`pack_us` takes it: :data:`PackRow` with its times in whole microseconds
#: (what SQL's ``CAST(round(x * 1e6) AS INTEGER)`` gives, so the store converts them in C)
UsRow = tuple[
    int,
    int,
    int,
    int,
    "int | None",
    "int | None",
    "int | None",
    "int | None",
    "int | None",
    "int | None",
    int,
]


def _centre(values: Sequence[int], n: Sequence[int]) -> int:
    """The mean per step of ``values`` (of rows of ``n`` steps), 0 where ``n`` times it could
    leave 64 bits."""
    m = sum(values) // max(1, sum(n))
    return m if max(n, default=1) * abs(m) < _CENTRE_MAX else 0


def pack_us(rows: Sequence[UsRow]) -> bytes:
    """:func:`pack` of rows whose times are whole microseconds already."""
    cols = list(zip(*rows))
    step, t, w, h, n = cols[0], cols[1], cols[2], cols[3], cols[10]
    # zigzag inline ((v << 1) ^ (v >> 63): 0, -1, 1, -2... as 0, 1, 2, 3...): a call a value
    # was most of the time this takes
    parts = [
        # a row's step number after the previous row's plus its own n
        [step[0] << 1 ^ step[0] >> 63]
        + [((d := b - a - k) << 1) ^ (d >> 63) for a, b, k in zip(step, step[1:], n[1:])],
        # a row's start (ts - wait) after the previous row's end (ts + host)
        [t[0] << 1 ^ t[0] >> 63]
        + [
            ((d := t1 - w1 - t0 - h0) << 1) ^ (d >> 63)
            for t1, w1, t0, h0 in zip(t[1:], w[1:], t, h)
        ],
    ]
    # the rows that have a value, per column that may be NULL; the mean per step of each column
    # kept after it (wait and host first)
    present = {c: [i for i, v in enumerate(cols[c]) if v is not None] for c in _OPTIONAL}
    centres = [_centre(w, n), _centre(h, n)]
    for c in _PER_STEP:
        idx = present[c]
        centres.append(_centre([cols[c][i] for i in idx], [n[i] for i in idx]))
    parts.append([(m << 1) ^ (m >> 63) for m in centres])
    for col, m in ((w, centres[0]), (h, centres[1])):
        parts.append([((d := v - k * m) << 1) ^ (d >> 63) for v, k in zip(col, n)])
    body = [len(rows).to_bytes(4, "little")] + [p for c in parts for p in split(planes(c))]
    for c in _OPTIONAL:
        col, idx = cols[c], present[c]
        m = centres[2 + _PER_STEP.index(c)] if c in _PER_STEP else 0
        body.append(bytes(v is not None for v in col))
        vals = [((d := col[i] - n[i] * m) << 1) ^ (d >> 63) for i in idx]
        body += split(planes(vals))
    body += split(planes([(v << 1) ^ (v >> 63) for v in n]))
    return bytes([FORMAT]) + deflate(body)


def _opt_s(z: int) -> float | None:
    return None if z == 0 else unzz(z - 1) / 1e6


def _opt_i(z: int) -> int | None:
    return None if z == 0 else unzz(z - 1)


def unpack(blob: bytes) -> list[PackRow]:
    """The rows of one pack; ValueError when it is not one this code can read."""
    if not isinstance(blob, bytes) or not blob or blob[0] not in (1, FORMAT):
        raise ValueError("not a step pack of a known format")
    try:
        body = zlib.decompress(blob[1:])
    except zlib.error as exc:
        raise ValueError(f"damaged step pack: {exc}") from exc
    count = int.from_bytes(body[:4], "little")
    if not 0 < count <= len(body):  # a row takes a byte a column at least
        raise ValueError("damaged step pack")
    if blob[0] == 1:
        return _unpack_1(body, count)
    return _unpack_2(body, count)


def _rows(
    cols: list[list[int]],
    w: list[int],
    h: list[int],
    opt: list[list[float | int | None]],
    n: list[int],
) -> list[PackRow]:
    """The rows from the decoded columns: ``cols`` the step and start columns (zigzag),
    ``w``, ``h`` in microseconds, ``opt`` the optional columns as read back, ``n``."""
    count = len(w)
    step = list(itertools.accumulate(unzz(z) + k for z, k in zip(cols[0], [0, *n[1:]])))
    t = [unzz(cols[1][0])]
    for i in range(1, count):
        t.append(unzz(cols[1][i]) + w[i] + t[i - 1] + h[i - 1])
    return list(
        zip(
            step,
            [x / 1e6 for x in t],
            [x / 1e6 for x in w],
            [x / 1e6 for x in h],
            *opt,
            n,
        )
    )


def _unpack_1(body: bytes, count: int) -> list[PackRow]:
    """A format-1 pack's rows (every column all its rows, NULL as 0, a value as its zigzag plus
    one)."""
    pos = 4
    cols = []
    for _ in range(_COLUMNS):
        col, pos = from_planes(body, pos, count)
        cols.append(col)
    if pos != len(body):
        raise ValueError("damaged step pack")
    n = [unzz(z) for z in cols[10]]
    opt: list[list[float | int | None]] = [
        [_opt_s(z) for z in cols[4]],
        [_opt_s(z) for z in cols[5]],
        [_opt_s(z) for z in cols[6]],
        [_opt_i(z) for z in cols[7]],
        [_opt_i(z) for z in cols[8]],
        [_opt_s(z) for z in cols[9]],
    ]
    return _rows(cols, [unzz(z) for z in cols[2]], [unzz(z) for z in cols[3]], opt, n)


def _unpack_2(body: bytes, count: int) -> list[PackRow]:
    pos = 4
    cols = []
    for k in (count, count, 2 + len(_PER_STEP), count, count):
        col, pos = from_planes(body, pos, k)
        cols.append(col)
    present: list[bytes] = []
    values: list[list[int]] = []
    for _ in _OPTIONAL:
        flags = body[pos : pos + count]
        pos += count
        if len(flags) != count or flags.strip(b"\x00\x01"):
            raise ValueError("damaged step pack")
        present.append(flags)
        vals, pos = from_planes(body, pos, flags.count(1))
        values.append(vals)
    zn, pos = from_planes(body, pos, count)
    if pos != len(body):
        raise ValueError("damaged step pack")
    n = [unzz(z) for z in zn]
    centres = [unzz(z) for z in cols[2]]
    w = [unzz(z) + k * centres[0] for z, k in zip(cols[3], n)]
    h = [unzz(z) + k * centres[1] for z, k in zip(cols[4], n)]
    opt: list[list[float | int | None]] = []
    for c, flags, vals in zip(_OPTIONAL, present, values):
        m = centres[2 + _PER_STEP.index(c)] if c in _PER_STEP else 0
        it = iter(vals)
        got: list[float | int | None] = [
            unzz(next(it)) + k * m if f else None for f, k in zip(flags, n)
        ]
        opt.append(got if c in (7, 8) else [None if v is None else v / 1e6 for v in got])
    return _rows(cols, w, h, opt, n)
