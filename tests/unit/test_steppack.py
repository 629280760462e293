"""Step packs (stallscope/store/steppack.py): rows of one rank packed into one blob and back."""

from __future__ import annotations

import random
import zlib

import pytest

from stallscope.store.steppack import FORMAT, PackRow, pack, unpack, us


def _rows(count: int, seed: int) -> list[PackRow]:
    """Rows as the store keeps them (times whole microseconds), with gaps in the step numbers,
    NULLs in every nullable column, negative and large values."""
    rng = random.Random(seed)
    rows: list[PackRow] = []
    step, t = rng.randrange(0, 1 << 40), 1.7e9 + rng.random()
    for _ in range(count):
        n = rng.choice([1, 1, 2, 3, 700])
        step += n + rng.choice([0, 0, 0, 5, -3])
        t += rng.random() * 0.05

        def q(x: float) -> float:
            return us(x) / 1e6

        def maybe(x: float) -> float | None:
            return None if rng.random() < 0.3 else q(x)

        rows.append(
            (
                step,
                q(t),
                q(rng.random() * 0.01),
                q(rng.gauss(0.02, 0.05)),  # negative at times: kept as they are
                maybe(rng.random() * 1e-3),
                maybe(rng.random() * 0.02),
                maybe(rng.random()),
                None if rng.random() < 0.3 else rng.randrange(0, 1 << 20),
                None if rng.random() < 0.3 else rng.randrange(-2, 40),
                maybe(rng.random() * 1e3),
                n,
            )
        )
    return rows


@pytest.mark.parametrize("count", [1, 2, 1000])
def test_unpack_gives_back_the_rows_packed(count: int) -> None:
    for seed in range(5):
        rows = _rows(count, seed)
        assert unpack(pack(rows)) == rows


def test_step_times_are_whole_microseconds_rounded_as_sqlite_rounds() -> None:
    assert [us(x) for x in (0.0, 1e-6, 0.0000015, -0.0000015, 0.01, 1.7e9 + 0.1234565)] == [
        0,
        1,
        2,
        -2,
        10000,
        1700000000123457,
    ]
    for x in (0.01, 0.04, 0.002, 1.7e9 + 0.123456, 123.456789):
        assert us(x) / 1e6 == x  # a time on the microsecond grid comes back the same float


def test_a_pack_is_a_few_bytes_a_row() -> None:
    """10-ms steps two a row, their times noisy to the microsecond: under 8 bytes a row (SQLite
    rows take ~70)."""
    rng = random.Random(0)
    rows: list[PackRow] = []
    t = 1.7e9
    for i in range(20000):
        w, h = us(rng.lognormvariate(-7.6, 0.5) * 2), us(rng.gauss(0.019, 0.0006))
        t = us(t) / 1e6 + w / 1e6
        rows.append((2 * i + 1, t, w / 1e6, h / 1e6, None, None, None, 128, 0, None, 2))
        t += h / 1e6 + rng.random() * 2e-6
    assert len(pack(rows)) / len(rows) < 8


def test_what_is_not_a_pack_is_refused() -> None:
    good = pack(_rows(10, 1))
    bad = [
        b"",
        bytes([FORMAT + 1]) + good[1:],
        good[:-3],
        bytes([FORMAT]) + zlib.compress(b"\x05\x00\x00\x00\x09"),
        bytes([FORMAT]) + zlib.compress(zlib.decompress(good[1:]) + b"\x00"),
    ]
    for blob in bad:
        with pytest.raises(ValueError):
            unpack(blob)


#: a pack of format 1, as schema versions 4 and 5 wrote them, and its rows
FORMAT_1 = bytes.fromhex(
    "01789c63666060600462160685c0437e42af1918b819189814148afcfc12981b181a2c0a2d1899189916322c"
    "e467e0674a6460780594bec8c0c00ed4e6d8e8c8c8c8c8ccc420c8c0a0cec0c8c4c20400dcf00b00"
)
FORMAT_1_ROWS: list[PackRow] = [
    (0, 100.0, 0.01, 0.04, 0.002, 0.03, 0.001, 32, 0, None, 1),
    (2, 100.06, 0.01, 0.08, None, None, None, 64, 0, 0.005, 2),
    (3, 100.15, 0.012345, 0.04, 0.002, None, None, 32, 1, None, 1),
]


def test_a_pack_of_the_first_format_reads_as_it_did() -> None:
    """A store of schema version 4 or 5 keeps its packs of format 1: read as they are; packs
    made now are of format 2 and read the same rows."""
    assert FORMAT == 2 and FORMAT_1[0] == 1
    assert unpack(FORMAT_1) == FORMAT_1_ROWS
    assert unpack(pack(FORMAT_1_ROWS)) == FORMAT_1_ROWS
    damaged = FORMAT_1[:1] + zlib.compress(zlib.decompress(FORMAT_1[1:])[:-1])
    with pytest.raises(ValueError):
        unpack(damaged)


def test_ten_ms_steps_take_under_six_bytes_a_row_with_their_device_timing() -> None:
    """The probe's rows at 100 steps/s: two steps a row, every sixth pair of steps timed on the
    device (a row each, with its GPU times), times noisy to the microsecond: under 5.6 bytes a
    row (format 1 took 6.3)."""
    rng = random.Random(0)
    rows: list[PackRow] = []
    t, step = 1.7e9, 0
    while len(rows) < 20000:
        timed = step % 6 < 2
        n = 1 if timed else 2
        w = us(sum(rng.lognormvariate(-7.6, 0.5) for _ in range(n))) / 1e6
        h = us(sum(rng.gauss(0.0194, 0.0003) for _ in range(n))) / 1e6
        h2d = us(sum(0.0002 + rng.random() * 5e-5 for _ in range(n))) / 1e6
        busy = us(rng.gauss(0.0085, 0.0002)) / 1e6 if timed else None
        idle = us(rng.random() * 0.001) / 1e6 if timed else None
        step += n
        t = us(t + w + rng.random() * 2e-6) / 1e6
        rows.append((step, t, w, h, h2d, busy, idle, 64 * n, step // 20000, None, n))
        t += h
    assert unpack(pack(rows)) == rows
    assert len(pack(rows)) / len(rows) < 5.6
