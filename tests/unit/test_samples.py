"""A sample's blob (stallscope/store/samples.py): exact values, ids as runs, the writer's path
for a sample of the same series as the last, and what a damaged blob reads as."""

from __future__ import annotations

import math
import random
import struct

from stallscope.metrics import Point
from stallscope.store.samples import KEYS, Packer, ids_of, unpack


def test_values_read_back_exactly_and_ids_as_runs() -> None:
    rng = random.Random(3)
    ids = [*range(5, 305), 900, 901, 2, *range(1000, 1100)]
    values = {i: rng.uniform(-1e300, 1e300) * rng.random() ** 40 for i in ids}
    values[901] = 5e-324  # the smallest subnormal: still exact
    blob = Packer().pack(values)
    got = unpack(blob)
    assert got is not None
    runs, vals = got
    assert list(ids_of(runs)) == ids and list(vals) == list(values.values())
    assert len(runs) == 4 * 2 * 4  # four runs of (first, length)
    assert len(blob) == 9 + len(runs) + 8 * len(ids)


def test_same_series_again_without_a_step_per_point() -> None:
    pts = [Point("host.cpu_pct", f"cpu{i}", i * 0.1) for i in range(10)]
    keys = list(map(KEYS, pts))
    p = Packer()
    assert p.again(keys, pts) is None  # nothing packed yet
    first = p.pack({i + 1: pt.value for i, pt in enumerate(pts)}, keys)
    later = [pt._replace(value=pt.value + 1) for pt in pts]
    again = p.again(list(map(KEYS, later)), later)
    assert again is not None and again[1] == 10
    assert again[0][: len(first) - 80] == first[: len(first) - 80]  # the same header and runs
    got = unpack(again[0])
    assert got is not None and list(got[1]) == [pt.value for pt in later]
    # a value that is not a finite number, or other series: the writer's slower path
    bad = [*later[:-1], later[-1]._replace(value=math.inf)]
    assert p.again(list(map(KEYS, bad)), bad) is None
    assert p.again(list(map(KEYS, later[1:])), later[1:]) is None


def test_damaged_blobs_read_as_none() -> None:
    good = Packer().pack({7: 1.5, 8: 2.5})
    assert unpack(good) is not None
    for bad in (
        good[:-1],
        good + b"\0",
        b"",
        b"\x02" + good[1:],  # another format
        good[:5] + struct.pack("<I", 3) + good[9:] + struct.pack("<d", 1.0),  # runs hold 2
        struct.pack("<BIIIIII2d", 1, 2, 2, 7, 1, 7, 1, 1.0, 2.0),  # id 7 twice
        struct.pack("<BIIII", 1, 1, 0, 7, 0),  # a run of no id
        good[:-8] + struct.pack("<d", math.nan),
        "text",
        None,
        1.5,
    ):
        assert unpack(bad) is None, bad
