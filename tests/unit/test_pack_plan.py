"""``stallscope pack``'s pure pieces (stallscope.tools.pack.scan and .plan): keys, sizes, the
cut into shards, the layout's warnings, file lists. Packing real folders:
integration/test_pack.py."""

from __future__ import annotations

import pytest

from stallscope.errors import UsageError
from stallscope.tools.pack import (
    PackError,
    auto_shard_bytes,
    layout_warnings,
    make_key,
    parse_filelist,
    parse_size,
    plan_shards,
)


@pytest.mark.parametrize(
    ("rel", "key", "field", "renamed"),
    [
        ("cat/0001.jpg", "cat/0001", "jpg", False),
        ("cat/IMG_1.JPG", "cat/IMG_1", "jpg", False),
        ("cat/2019.05.01_photo.jpg", "cat/2019_05_01_photo", "jpg", True),
        ("cat/archive.tar.gz", "cat/archive_tar", "gz", True),
        ("v1.2/cat/x.png", "v1.2/cat/x", "png", False),  # dots in folders are fine for wds
        ("cat/README", "cat/README", "bin", False),
    ],
)
def test_make_key(rel: str, key: str, field: str, renamed: bool) -> None:
    assert make_key(rel) == (key, field, renamed)
    # webdataset's own split of the member name must give back our key and field
    from webdataset.tariterators import base_plus_ext

    assert base_plus_ext(f"{key}.{field}") == (key, field)


def test_make_key_strict_and_bad_paths() -> None:
    with pytest.raises(PackError, match="dot"):
        make_key("cat/a.b.jpg", strict=True)
    for bad in ("../x.jpg", "a//b.jpg", "a/./b.jpg"):
        with pytest.raises(PackError):
            make_key(bad)


def test_parse_size() -> None:
    assert parse_size("1GB") == 10**9
    assert parse_size("1.5 gb") == 1_500_000_000
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("100M") == 10**8
    assert parse_size("4096") == 4096
    for bad in ("", "abc", "0", "1XB", "-5MB"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_plan_shards() -> None:
    assert plan_shards([1] * 5, samples_per_shard=2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert plan_shards([40, 40, 40, 200, 10], shard_bytes=100) == [
        range(0, 2),
        range(2, 3),
        range(3, 4),  # bigger than the limit: a shard of its own
        range(4, 5),
    ]
    assert plan_shards([], shard_bytes=100) == []
    with pytest.raises(UsageError):
        plan_shards([1], samples_per_shard=0)


def test_auto_shard_bytes_stays_in_sweet_spot() -> None:
    assert auto_shard_bytes(10**12, 8, 4) == 10**9
    assert auto_shard_bytes(2 * 10**9, 8, 4) == 100 * 10**6
    assert auto_shard_bytes(16 * 10**9, 8, 4) == 500 * 10**6


def test_layout_warnings() -> None:
    good = [300 * 10**6] * 40
    assert layout_warnings(good, 8, 4) == []
    few = layout_warnings([300 * 10**6] * 10, 8, 4)
    assert len(few) == 1 and "10 shard(s)" in few[0] and "22 reader(s) get no shard" in few[0]
    small = layout_warnings([5 * 10**6] * 40 + [10], 8, 4)
    assert len(small) == 1 and "far below" in small[0]
    large = layout_warnings([8 * 10**9] * 40, 8, 4)
    assert len(large) == 1 and "far above" in large[0]
    # too few shards and too small ones: one warning, not two that contradict each other
    both = layout_warnings([5 * 10**6] * 10, 8, 4)
    assert len(both) == 1 and "too small for both one shard per reader" in both[0], both
    assert "22 reader(s) get none" in both[0] and "divided by 32" in both[0]
    assert "defaults" not in both[0]
    guessed = layout_warnings([300 * 10**6] * 10, 8, 4, readers_given=False)
    assert "(the defaults of --ranks and --loader-workers: give yours)" in guessed[0]


def test_parse_filelist_formats_and_errors() -> None:
    csv_rows = parse_filelist("path,label\na/1.jpg,dog\n a/2.jpg , cat\nb/3.jpg,\n", "csv")
    assert [(e.path, e.label) for e in csv_rows] == [
        ("a/1.jpg", "dog"),
        ("a/2.jpg", "cat"),
        ("b/3.jpg", None),
    ]
    jl = parse_filelist('{"path": "a.jpg", "label": 3}\n\n{"path": "b.jpg"}\n', "jsonl")
    assert [(e.path, e.label) for e in jl] == [("a.jpg", "3"), ("b.jpg", None)]
    with pytest.raises(PackError, match="'path' column"):
        parse_filelist("file,label\nx,1\n", "csv")
    with pytest.raises(PackError, match=r":3: empty path"):
        parse_filelist("path,label\na,1\n,2\n", "csv")
    with pytest.raises(PackError, match=r":2: not JSON"):
        parse_filelist('{"path": "a"}\n{oops\n', "jsonl")
    with pytest.raises(PackError, match=r":1: label"):
        parse_filelist('{"path": "a", "label": true}\n', "jsonl")
