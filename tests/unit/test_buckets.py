"""Bucket packs (stallscope/store/buckets.py): the 1-minute buckets of one series and hour in
one blob and back, nothing rounded."""

from __future__ import annotations

import random
import zlib

import pytest

from stallscope.store.buckets import FORMAT, pack, unpack


def _buckets(count: int, seed: int, width: float = 60.0) -> list[tuple[int, int, float]]:
    """Buckets in time order with gaps, negative times, one sample to many, every kind of
    double a mean can be (noise, whole numbers, tiny and huge, negative, zero)."""
    rng = random.Random(seed)
    k = rng.randrange(-(1 << 40), 1 << 40)
    out = []
    for _ in range(count):
        v = rng.choice(
            [rng.random(), float(rng.randrange(100)), 1e-300 * rng.random(), -1e300, 0.0, -0.0]
        )
        out.append((k, rng.choice([1, 12, 60, (1 << 60) - 1]), v))
        k += 1 + rng.choice([0, 0, 0, 3, 1000])
    return out


@pytest.mark.parametrize("count", [1, 2, 60, 1000])
@pytest.mark.parametrize("width", [60.0, 0.5, 7.0])
def test_unpack_gives_back_the_buckets_packed(count: int, width: float) -> None:
    for seed in range(5):
        buckets = _buckets(count, seed, width)
        got = unpack(pack(width, buckets))
        assert got == [(k * width, n, v) for k, n, v in buckets]
        # the same doubles, bit for bit (-0.0 included)
        assert [str(v) for _, _, v in got] == [str(v) for _, _, v in buckets]


def test_an_hour_of_noisy_buckets_takes_about_its_doubles() -> None:
    """An hour of a noisy series: under 7 bytes a bucket (a ``rollup`` row took ~23); a
    constant one: under 48 bytes for the hour."""
    rng = random.Random(1)
    start = 1_700_000_000 // 60
    noisy = [(start + i, 12, 50 + rng.random()) for i in range(60)]
    assert len(pack(60.0, noisy)) / 60 < 7
    assert len(pack(60.0, [(start + i, 12, 700.0) for i in range(60)])) < 48


def test_what_is_not_a_bucket_pack_is_refused() -> None:
    good = pack(60.0, _buckets(10, 1))
    body = zlib.decompress(good[1:])
    bad = [
        b"",
        bytes([FORMAT + 1]) + good[1:],
        good[:-3],
        bytes([FORMAT]) + zlib.compress(b"\x05\x00\x00\x00"),
        bytes([FORMAT]) + zlib.compress(body + b"\x00"),
        bytes([FORMAT]) + zlib.compress(body[:-1]),
        bytes([FORMAT]) + zlib.compress(b"\x00\x00\x00\x00" + body[4:]),  # no bucket
        # a width that is not a finite number
        bytes([FORMAT]) + zlib.compress(body[:4] + b"\x00" * 6 + b"\xf0\x7f" + body[12:]),
    ]
    for blob in bad:
        with pytest.raises(ValueError):
            unpack(blob)
    # a NaN value (a pack of one bucket: its 8 planes are the double's 8 bytes, last)
    one = pack(60.0, [(5, 1, 1.0)])
    raw = bytearray(zlib.decompress(one[1:]))
    raw[-8:] = b"\x00\x00\x00\x00\x00\x00\xf8\x7f"
    with pytest.raises(ValueError):
        unpack(bytes([FORMAT]) + zlib.compress(bytes(raw)))


def test_a_count_a_pack_cannot_hold_is_refused_before_any_allocation() -> None:
    """A damaged (or made-up) pack saying it holds billions of buckets or rows is refused as
    damaged, without asking for memory for them."""
    from stallscope.store import steppack

    head = b"\xff\xff\xff\xff"
    body = zlib.decompress(pack(60.0, _buckets(3, 2))[1:])
    with pytest.raises(ValueError):
        unpack(bytes([FORMAT]) + zlib.compress(head + body[4:]))
    rows = zlib.decompress(steppack.pack([(1, 1.0, 0.1, 0.2, None, None, None, 1, 0, None, 1)])[1:])
    for fmt in (1, 2):
        with pytest.raises(ValueError):
            steppack.unpack(bytes([fmt]) + zlib.compress(head + rows[4:]))
