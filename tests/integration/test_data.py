"""stallscope.tools.data: reading shards, splitting over DDP ranks × DataLoader workers."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from hypothesis import given
from hypothesis import strategies as st

from stallscope.errors import ParseError, UsageError
from stallscope.tools.data import (
    equal_quota,
    iter_samples,
    key_and_field,
    load_shard_set,
    reader_assignment,
)
from stallscope.tools.pack import pack


def make_imagefolder(root: Path, classes: int, per_class: int, seed: int = 3) -> Path:
    rng = random.Random(seed)
    for c in range(classes):
        folder = root / f"c{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            (folder / f"{i:05d}.bin").write_bytes(rng.randbytes(rng.randrange(1, 300)))
    return root


@pytest.fixture
def even_shards(tmp_path: Path) -> tuple[Path, set[str]]:
    """12 shards of 10 samples each (120 samples)."""
    src = make_imagefolder(tmp_path / "src", classes=4, per_class=30)
    dst = tmp_path / "shards"
    pack(str(src), str(dst), samples_per_shard=10)
    keys = {f"c{c}/{i:05d}" for c in range(4) for i in range(30)}
    return dst, keys


def test_key_and_field_matches_webdataset() -> None:
    from webdataset.tariterators import base_plus_ext

    names = ["a/b.jpg", "a.b/c.d.e", "x.JPG", "noext", "dir/", "d.v1/k.seg.png", ".hidden"]
    for name in names:
        ours = key_and_field(name)
        theirs = base_plus_ext(name)
        if theirs == (None, None):
            assert ours is None, name
        else:
            assert ours == (theirs[0], theirs[1].lower()), name


def test_iter_samples_reads_a_webdataset_writer_tar() -> None:
    import webdataset as wds

    buf = io.BytesIO()
    with wds.TarWriter(buf) as sink:
        sink.write({"__key__": "s/0", "jpg": b"\xff\xd8", "cls": 3})
        sink.write({"__key__": "s/1", "txt": "hello", "cls": 4})
    buf.seek(0)
    samples = list(iter_samples(buf, url="mem"))
    assert [s["__key__"] for s in samples] == ["s/0", "s/1"]
    assert samples[0]["jpg"] == b"\xff\xd8" and samples[0]["cls"] == b"3"
    assert samples[1]["txt"] == b"hello"


def _tar_bytes(fmt: int) -> bytes:
    """A tar with what other writers put in: long and non-ASCII names (PAX headers, GNU long
    names or the ustar prefix field), directories, links, an empty member."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        folder = tarfile.TarInfo("d" * 60 + "/" + "e" * 60)
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        names = [
            "d" * 60 + "/" + "e" * 60 + "/k1.jpg",  # > 100 chars, splits into the ustar prefix
            "d" * 60 + "/" + "e" * 60 + "/k1.cls",
            "short/k2.txt",
            "short/k2.empty",
        ]
        if fmt != tarfile.USTAR_FORMAT:
            names += ["ünï/猫.png", "x" * 150 + ".bin"]  # ustar cannot hold these
        for i, name in enumerate(names):
            data = bytes([i]) * (0 if name.endswith("empty") else 700 + i)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("short/k2.lnk")
        link.type = tarfile.SYMTYPE
        link.linkname = "k2.txt"
        tar.addfile(link)
    return buf.getvalue()


class _Pipe(io.RawIOBase):
    """A non-seekable stream over bytes (forces the stream-mode reader)."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        chunk = self.inner.read(len(b))
        b[: len(chunk)] = chunk
        return len(chunk)


@pytest.mark.parametrize(
    "fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT], ids=str
)
def test_fast_and_stream_readers_agree_with_tarfile(fmt: int) -> None:
    raw = _tar_bytes(fmt)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        truth = [
            (m.name, tar.extractfile(m).read())  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        ]
    expected: list[dict[str, Any]] = []
    for name, data in truth:
        key, field = key_and_field(name) or ("", "")
        if not expected or expected[-1]["__key__"] != key:
            expected.append({"__key__": key, "__url__": "u"})
        expected[-1][field] = data
    fast = list(iter_samples(io.BytesIO(raw), url="u"))
    stream = list(iter_samples(_Pipe(raw), url="u"))  # type: ignore[arg-type]
    assert fast == stream == expected
    assert len(expected) >= 2


def test_iter_samples_errors() -> None:
    for stream in (io.BytesIO(b"not a tar at all" * 64), _Pipe(b"not a tar at all" * 64)):
        with pytest.raises(ParseError, match="not a readable tar"):
            list(iter_samples(stream, url="junk"))  # type: ignore[arg-type]
    raw = bytearray(_tar_bytes(tarfile.PAX_FORMAT))
    raw[148] ^= 0x01  # bad checksum in the first header: the standard decoder rejects it
    with pytest.raises(ParseError, match="not a readable tar"):
        list(iter_samples(io.BytesIO(bytes(raw))))
    whole = _tar_bytes(tarfile.GNU_FORMAT)
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        cut = next(m for m in tar.getmembers() if m.isfile()).offset_data + 100
    for stream in (io.BytesIO(whole[:cut]), _Pipe(whole[:cut])):  # cut inside a member's data
        with pytest.raises(ParseError):
            list(iter_samples(stream))  # type: ignore[arg-type]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("k.a.txt", "k.A.TXT"):  # the same field once lower-cased
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    with pytest.raises(ParseError, match="repeats field"):
        list(iter_samples(buf))


@given(
    n=st.integers(min_value=0, max_value=60),
    world=st.integers(min_value=1, max_value=8),
    workers=st.integers(min_value=1, max_value=6),
)
def test_reader_assignment_partitions_shards(n: int, world: int, workers: int) -> None:
    got = [
        i
        for r in range(world)
        for w in range(workers)
        for i in reader_assignment(n, r, world, w, workers)
    ]
    assert sorted(got) == list(range(n))
    sizes = [
        len(reader_assignment(n, r, world, w, workers))
        for r in range(world)
        for w in range(workers)
    ]
    assert max(sizes) - min(sizes) <= 1  # balanced to one shard
    with pytest.raises(UsageError):
        reader_assignment(n, world, world, 0, workers)


def test_equal_quota() -> None:
    # 5 shards over 2 ranks × 2 workers: reader (0,0) gets shards 0 and 4
    assert equal_quota([10, 10, 10, 10, 7], 2, 2) == 10
    assert equal_quota([10, 10, 10, 9], 2, 2) == 9
    assert equal_quota([10, 10, 10], 2, 2) == 0


def _collect(dataset: Any, num_workers: int) -> list[str]:
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
    return [sample["__key__"] for sample in loader]


@pytest.mark.torch
def test_dataloader_ranks_x_workers_cover_every_sample_once(
    even_shards: tuple[Path, set[str]],
) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from stallscope.tools.data import ShardDataset

    dst, keys = even_shards
    world = 3
    per_rank = []
    for rank in range(world):
        ds = ShardDataset(dst, rank=rank, world_size=world, equalize=False)
        per_rank.append(_collect(ds, num_workers=2))
    every = Counter(k for got in per_rank for k in got)
    assert set(every) == keys and set(every.values()) == {1}
    assert [len(g) for g in per_rank] == [40, 40, 40]


@pytest.mark.torch
def test_equalize_gives_every_rank_the_same_count(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from stallscope.tools.data import ShardDataset

    src = make_imagefolder(tmp_path / "src", classes=1, per_class=47)
    dst = tmp_path / "shards"
    pack(str(src), str(dst), samples_per_shard=5)  # 10 shards: 9 of 5 samples, 1 of 2
    counts = load_shard_set(dst).counts
    assert counts == (5,) * 9 + (2,)
    runs = [
        _collect(ShardDataset(dst, rank=r, world_size=2, shuffle_shards=True, seed=7), 2)
        for r in range(2)
    ]
    # 4 readers of 2-3 shards; with seed 7 the 2-sample shard lands with a two-shard reader,
    # which has 7 samples: every reader yields 7
    assert [len(r) for r in runs] == [14, 14]
    assert len(set(runs[0]) | set(runs[1])) == 28  # nothing read twice


@pytest.mark.torch
def test_shuffling_is_seeded_and_changes_per_epoch(even_shards: tuple[Path, set[str]]) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from stallscope.tools.data import ShardDataset

    dst, keys = even_shards

    def epoch(e: int, seed: int = 0) -> list[str]:
        ds = ShardDataset(dst, shuffle_shards=True, shuffle_buffer=16, seed=seed)
        ds.set_epoch(e)
        return _collect(ds, num_workers=2)

    first, again, second = epoch(0), epoch(0), epoch(1)
    assert first == again
    assert first != second
    assert sorted(first) == sorted(second) == sorted(keys)
    assert epoch(0, seed=1) != first


@pytest.mark.torch
def test_idle_reader_warns_and_yields_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from stallscope.tools.data import ShardDataset

    src = make_imagefolder(tmp_path / "src", classes=1, per_class=4)
    dst = tmp_path / "shards"
    pack(str(src), str(dst), samples_per_shard=4)  # one shard
    ds = ShardDataset(dst, rank=1, world_size=2, equalize=False)
    with pytest.warns(UserWarning, match="has no shard"):
        assert list(ds) == []
    labelled = list(ShardDataset(dst, rank=0, world_size=1, transform=lambda s: s["cls"]))
    assert labelled == [0, 0, 0, 0]


@pytest.mark.torch
def test_plain_tar_list_reads_without_counts(even_shards: tuple[Path, set[str]]) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from stallscope.tools.data import ShardDataset

    dst, keys = even_shards
    paths = sorted(str(p) for p in dst.glob("shard-*.tar"))
    # no manifest, no counts: DDP splitting still works, equalizing is off by default
    got = [s["__key__"] for r in range(2) for s in ShardDataset(paths, rank=r, world_size=2)]
    assert sorted(got) == sorted(keys)
    with pytest.raises(UsageError, match="equalize needs per-shard counts"):
        list(ShardDataset(paths, rank=0, world_size=2, equalize=True))


def test_load_shard_set_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a shard directory"):
        load_shard_set(tmp_path)
    with pytest.raises(UsageError, match="no shards"):
        load_shard_set([])
    assert load_shard_set(["a.tar", "b.tar"]).counts is None


def test_core_modules_do_not_import_torch() -> None:
    pytest.importorskip("torch")  # without torch this would pass whatever the modules import
    code = (
        "import sys, stallscope.tools.data, stallscope.tools.pack, stallscope.cli.pack\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
