"""Whole numbers as byte planes, compressed: what the packs of ``run.db`` are made of (step
rows, :mod:`stallscope.store.steppack`; 1-minute buckets, :mod:`stallscope.store.buckets`).

A column of unsigned 64-bit values is written as a byte giving how many bytes the largest needs
(1-8), then the lowest byte of every value, then the next byte of every value... (a *plane*):
the planes of small or similar values are runs of the same byte, the low planes of noisy ones
are the noise alone. :func:`deflate` compresses the parts of a pack each in deflate blocks of
their own, so that each plane gets its own code (one code across the planes of a pack took
a tenth more bytes for step rows).

Nothing here touches SQLite.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Sequence

__all__ = ["deflate", "from_planes", "planes", "raw_planes", "split", "unzz", "zz"]

_LITTLE = array("H", [1]).tobytes()[0] == 1


def zz(v: int) -> int:
    """Zigzag: 0, -1, 1, -2... as 0, 1, 2, 3... (a signed value under 2**63 as unsigned)."""
    return (v << 1) ^ (v >> 63)


def unzz(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


def planes(values: Sequence[int]) -> bytes:
    """Unsigned 64-bit ``values`` as byte planes: a byte giving how many (1-8), then the lowest
    byte of each value, then the next byte of each..."""
    width = max(1, (max(values, default=0).bit_length() + 7) // 8)
    raw = array("Q", values)
    if raw.itemsize != 8:  # pragma: no cover - every platform Python runs on has 8-byte Q
        raise RuntimeError("array('Q') is not 64-bit here")
    if not _LITTLE:  # pragma: no cover - big-endian
        raw.byteswap()
    b = raw.tobytes()
    return bytes([width]) + b"".join(b[k::8] for k in range(width))


def raw_planes(b: bytes) -> list[bytes]:
    """The 8 planes of 8-byte little-endian values (``b``: their bytes, e.g. doubles')."""
    return [b[k::8] for k in range(8)]


def from_planes(data: bytes, pos: int, count: int) -> tuple[list[int], int]:
    """``count`` values of :func:`planes` at ``pos`` of ``data``, and the position after them;
    ValueError when they are not there."""
    if pos >= len(data):
        raise ValueError("pack ends early")
    width = data[pos]
    pos += 1
    if not 1 <= width <= 8:
        raise ValueError("bad plane width")
    if width * count > len(data) - pos:  # before allocating for a count a damaged pack gives
        raise ValueError("pack ends early")
    buf = bytearray(8 * count)
    for k in range(width):
        plane = data[pos : pos + count]
        if len(plane) != count:
            raise ValueError("pack ends early")
        buf[k::8] = plane
        pos += count
    vals = array("Q")
    vals.frombytes(bytes(buf))
    if not _LITTLE:  # pragma: no cover - big-endian
        vals.byteswap()
    return vals.tolist(), pos


def split(part: bytes) -> list[bytes]:
    """A :func:`planes` part as its width byte and its planes (each compressed on its own)."""
    width = part[0]
    count = (len(part) - 1) // width
    return [part[:1]] + [part[1 + k * count : 1 + (k + 1) * count] for k in range(width)]


def deflate(parts: Iterable[bytes], level: int = 6) -> bytes:
    """The parts one after the other as one zlib stream, each part in deflate blocks of its own
    (its own Huffman code); ``zlib.decompress`` gives back their concatenation."""
    co = zlib.compressobj(level)
    out = [co.compress(p) + co.flush(zlib.Z_BLOCK) for p in parts if p]
    out.append(co.flush())
    return b"".join(out)
