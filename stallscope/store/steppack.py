"""Step rows packed: many rows of one rank in one compressed blob (``run.db``'s ``step_packs``).

At 100 steps/s a day of step rows is ~5.8 million rows (two 10-ms steps a row, every device-timed
step a row of its own), ~70 bytes each as SQLite rows: 400 MB. Packed they take ~6 bytes. A
pack holds the rows column by column, each value a whole number (step numbers and counts as
they are, times in microseconds: a packed row's times are kept to the microsecond, see
:func:`us`), each column as the differences that stay small (a row's step number after the one
before it plus its ``n``; its start, ``ts - wait_s``, after the previous row's end,
``ts + host_s``), zigzag-coded, split into byte planes (the low bytes of every value, then the
next ones...), and the whole zlib-compressed.

Nothing here touches SQLite: :func:`pack` and :func:`unpack` are inverse (``unpack(pack(rows))
== rows`` for rows whose times are whole microseconds; tested).
"""

from __future__ import annotations

import itertools
import zlib
from array import array
from collections.abc import Sequence

__all__ = ["FORMAT", "PackRow", "UsRow", "pack", "pack_us", "unpack", "us"]

#: the first byte of a pack: its layout (1: the columns below, zlib)
FORMAT = 1

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


def us(x: float) -> int:
    """Seconds as whole microseconds, rounded as SQLite's ``round(x * 1e6)`` rounds (half away
    from zero), so a time the store rounded on writing (``round(x * 1e6) / 1e6``) gives back the
    same whole number, and ``us(x) / 1e6`` the same float."""
    r = x * 1e6
    return int(r + 0.5) if r >= 0 else -int(-r + 0.5)


def _unzz(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


def _planes(values: list[int]) -> bytes:
    """Unsigned 64-bit ``values`` as byte planes: a byte giving how many (1-8), then the lowest
    byte of each value, then the next byte of each..."""
    width = max(1, (max(values, default=0).bit_length() + 7) // 8)
    raw = array("Q", values)
    if raw.itemsize != 8:  # pragma: no cover - every platform Python runs on has 8-byte Q
        raise RuntimeError("array('Q') is not 64-bit here")
    if array("H", [1]).tobytes()[0] != 1:  # pragma: no cover - big-endian
        raw.byteswap()
    b = raw.tobytes()
    return bytes([width]) + b"".join(b[k::8] for k in range(width))


def _from_planes(data: bytes, pos: int, count: int) -> tuple[list[int], int]:
    width = data[pos]
    pos += 1
    if not 1 <= width <= 8:
        raise ValueError("bad plane width")
    buf = bytearray(8 * count)
    for k in range(width):
        plane = data[pos : pos + count]
        if len(plane) != count:
            raise ValueError("pack ends early")
        buf[k::8] = plane
        pos += count
    vals = array("Q")
    vals.frombytes(bytes(buf))
    if array("H", [1]).tobytes()[0] != 1:  # pragma: no cover - big-endian
        vals.byteswap()
    return vals.tolist(), pos


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


def pack_us(rows: Sequence[UsRow]) -> bytes:
    """:func:`pack` of rows whose times are whole microseconds already."""
    step, t, w, h, h2d, busy, idle, samples, epoch, comm, n = zip(*rows)
    # zigzag inline ((v << 1) ^ (v >> 63): 0, -1, 1, -2... as 0, 1, 2, 3...), NULL as 0 and
    # a value as its zigzag plus one: a call a value was most of the time this takes
    cols = [
        # a row's step number after the previous row's plus its own n
        [step[0] << 1 ^ step[0] >> 63]
        + [((d := b - a - k) << 1) ^ (d >> 63) for a, b, k in zip(step, step[1:], n[1:])],
        # a row's start (ts - wait) after the previous row's end (ts + host)
        [t[0] << 1 ^ t[0] >> 63]
        + [
            ((d := t1 - w1 - t0 - h0) << 1) ^ (d >> 63)
            for t1, w1, t0, h0 in zip(t[1:], w[1:], t, h)
        ],
        [(v << 1) ^ (v >> 63) for v in w],
        [(v << 1) ^ (v >> 63) for v in h],
        *(
            [0 if v is None else ((v << 1) ^ (v >> 63)) + 1 for v in col]
            for col in (h2d, busy, idle, samples, epoch, comm)
        ),
        [(v << 1) ^ (v >> 63) for v in n],
    ]
    body = len(rows).to_bytes(4, "little") + b"".join(_planes(c) for c in cols)
    return bytes([FORMAT]) + zlib.compress(body, 6)


def _opt_s(z: int) -> float | None:
    return None if z == 0 else _unzz(z - 1) / 1e6


def _opt_i(z: int) -> int | None:
    return None if z == 0 else _unzz(z - 1)


def unpack(blob: bytes) -> list[PackRow]:
    """The rows of one pack; ValueError when it is not one this code can read."""
    if not isinstance(blob, bytes) or not blob or blob[0] != FORMAT:
        raise ValueError("not a step pack of a known format")
    try:
        body = zlib.decompress(blob[1:])
    except zlib.error as exc:
        raise ValueError(f"damaged step pack: {exc}") from exc
    count = int.from_bytes(body[:4], "little")
    pos = 4
    cols = []
    for _ in range(_COLUMNS):
        col, pos = _from_planes(body, pos, count)
        cols.append(col)
    if pos != len(body) or count == 0:
        raise ValueError("damaged step pack")
    n = [_unzz(z) for z in cols[10]]
    step = list(itertools.accumulate(_unzz(z) + k for z, k in zip(cols[0], [0, *n[1:]])))
    w = [_unzz(z) for z in cols[2]]
    h = [_unzz(z) for z in cols[3]]
    t = [_unzz(cols[1][0])]
    for i in range(1, count):
        t.append(_unzz(cols[1][i]) + w[i] + t[i - 1] + h[i - 1])
    return list(
        zip(
            step,
            [x / 1e6 for x in t],
            [x / 1e6 for x in w],
            [x / 1e6 for x in h],
            [_opt_s(z) for z in cols[4]],
            [_opt_s(z) for z in cols[5]],
            [_opt_s(z) for z in cols[6]],
            [_opt_i(z) for z in cols[7]],
            [_opt_i(z) for z in cols[8]],
            [_opt_s(z) for z in cols[9]],
            n,
        )
    )
