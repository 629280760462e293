"""`stallscope pack`: layout, determinism, resume, verify, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, stallscope_argv

from stallscope.errors import StallscopeError
from stallscope.tools.pack import (
    MANIFEST_NAME,
    PackError,
    PackProgress,
    make_key,
    pack,
    read_manifest,
    verify,
)

# names a real dataset throws at a packer: dots, unicode, > 100 chars (PAX header), nesting,
# upper-case and missing extensions
ODD_NAMES = [
    "n01440764_10026.JPEG",
    "2019.05.01_photo.jpg",
    "ünïcødé-猫.png",
    "x" * 120 + ".jpg",
    "sub/dir.v2/inner.webp",
    "noext",
]


def make_imagefolder(root: Path, classes: int = 3, per_class: int = 10, seed: int = 1) -> Path:
    """Random files of 0–6 kB in root/<class>/...; returns root."""
    rng = random.Random(seed)
    for c in range(classes):
        folder = root / f"class_{c:02d}"
        for i in range(per_class):
            path = folder / f"img_{i:04d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(rng.randrange(0, 6000)))
    return root


def expected_samples(root: Path) -> dict[str, tuple[str, bytes, int]]:
    """key -> (field, bytes, class index), straight from the files (the test's own reading)."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    out: dict[str, tuple[str, bytes, int]] = {}
    for index, cls in enumerate(classes):
        for path in (root / cls).rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                key, field, _ = make_key(path.relative_to(root).as_posix())
                out[key] = (field, path.read_bytes(), index)
    return out


def shard_bytes(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.glob("shard-*.tar"))}


# ---------------------------------------------------------------------------- round trip


def test_webdataset_reads_back_every_sample(tmp_path: Path) -> None:
    import webdataset as wds

    src = make_imagefolder(tmp_path / "src", classes=3, per_class=12)
    for i, name in enumerate(ODD_NAMES):
        path = src / "class_01" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i]) * (100 + i))
    (src / "loose.txt").write_text("not in a class folder")
    (src / "class_00" / ".DS_Store").write_bytes(b"junk")
    expected = expected_samples(src)  # neither the loose file nor the hidden one

    dst = tmp_path / "shards"
    result = pack(str(src), str(dst), samples_per_shard=7, workers=3)
    assert result.samples == len(expected) == 42
    assert len(result.shards) == 6
    assert any("no class folder" in w for w in result.warnings)
    assert any("hidden" in w for w in result.warnings)
    assert any("1 key(s) had dots" in w for w in result.warnings)

    urls = [str(dst / s.name) for s in result.shards]
    seen: dict[str, int] = {}
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        key = sample["__key__"]
        seen[key] = seen.get(key, 0) + 1
        field, data, label = expected[key]
        assert sorted(k for k in sample if not k.startswith("__")) == sorted([field, "cls"])
        assert sample[field] == data, key
        assert int(sample["cls"]) == label
    assert seen == dict.fromkeys(expected, 1)

    manifest = read_manifest(str(dst))
    assert manifest["complete"] is True
    assert manifest["source"]["classes"] == ["class_00", "class_01", "class_02"]
    assert [s["samples"] for s in manifest["shards"]] == [7] * 6
    for entry in manifest["shards"]:
        raw = (dst / entry["name"]).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == entry["sha256"]
        assert len(raw) == entry["bytes"]
    # fixed tar headers: nothing about the packing machine or time leaks into the shards
    with tarfile.open(dst / "shard-000000.tar") as tar:
        for member in tar.getmembers():
            assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (
                0,
                0,
                0,
                "",
                "",
            )


def test_file_lists_csv_and_jsonl(tmp_path: Path) -> None:
    import webdataset as wds

    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    (data / "b").mkdir()
    files = {"a/1.png": b"one", "a/2.png": b"two", "b/3.png": b"three"}
    for rel, content in files.items():
        (data / rel).write_bytes(content)
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\ndata/a/1.png,zebra\ndata/a/2.png,ant\ndata/b/3.png,zebra\n")
    dst = tmp_path / "from-csv"
    pack(str(listing), str(dst), samples_per_shard=2, shuffle_seed=None)
    got = {
        s["__key__"]: (s["png"], int(s["cls"]))
        for s in wds.WebDataset(
            [str(p) for p in sorted(dst.glob("*.tar"))], shardshuffle=False, empty_check=False
        )
    }
    # class names -> index in sorted order (ant=0, zebra=1); keys relative to the common folder
    assert got == {"a/1": (b"one", 1), "a/2": (b"two", 0), "b/3": (b"three", 1)}
    assert read_manifest(str(dst))["source"]["classes"] == ["ant", "zebra"]

    jl = tmp_path / "list.jsonl"
    rows = [
        {"path": str(data / "a/1.png"), "label": 7},
        {"path": "data/b/3.png", "label": 2, "key": "custom/k3"},
    ]
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dst2 = tmp_path / "from-jsonl"
    pack(str(jl), str(dst2), shuffle_seed=None)
    got2 = {
        s["__key__"]: int(s["cls"])
        for s in wds.WebDataset(
            [str(dst2 / "shard-000000.tar")], shardshuffle=False, empty_check=False
        )
    }
    assert got2 == {"a/1": 7, "custom/k3": 2}


# ---------------------------------------------------------------------------- determinism


def test_same_input_same_bytes(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=4, per_class=25)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    pack(str(src), str(a), shard_size=30_000, workers=1)
    pack(str(src), str(b), shard_size=30_000, workers=6)
    # a copy elsewhere, new mtimes, files created in another order
    copy = tmp_path / "copy"
    for path in sorted(src.rglob("*"), reverse=True):
        if path.is_file():
            target = copy / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    pack(str(copy), str(c), shard_size=30_000, workers=2)
    sa, sb, sc = shard_bytes(a), shard_bytes(b), shard_bytes(c)
    assert len(sa) > 3
    assert sa == sb == sc
    assert (a / MANIFEST_NAME).read_bytes() == (b / MANIFEST_NAME).read_bytes()
    # another seed gives another order, same samples
    d = tmp_path / "d"
    pack(str(src), str(d), shard_size=30_000, shuffle_seed=1)
    assert shard_bytes(d) != sa


# ---------------------------------------------------------------------------- resume


class _Interrupt(PackProgress):
    """Raises KeyboardInterrupt once ``after`` files are packed (mid-shard)."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.files = 0
        self.phase = ""

    def start(self, phase: str, files: int, nbytes: int) -> None:
        self.phase = phase

    def advance(self, files: int, nbytes: int) -> None:
        if self.phase == "packing":
            self.files += files
            if self.files >= self.after:
                raise KeyboardInterrupt


def test_resume_after_interruption(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=20)
    ref = tmp_path / "ref"
    pack(str(src), str(ref), samples_per_shard=8)

    dst = tmp_path / "dst"
    with pytest.raises(KeyboardInterrupt):
        pack(str(src), str(dst), samples_per_shard=8, progress=_Interrupt(after=20))
    # shards 0 and 1 finished; shard 2 was being written and is gone, not left half-written
    assert sorted(p.name for p in dst.iterdir()) == [
        MANIFEST_NAME,
        "shard-000000.tar",
        "shard-000001.tar",
    ]
    doc = read_manifest(str(dst))
    assert doc["complete"] is False
    assert [bool(s["sha256"]) for s in doc["shards"]] == [True, True, False, False, False]
    assert not verify(str(dst)).ok

    # a finished shard damaged meanwhile must be rewritten, not kept
    damaged = dst / "shard-000001.tar"
    raw = bytearray(damaged.read_bytes())
    raw[700] ^= 0xFF
    damaged.write_bytes(bytes(raw))

    result = pack(str(src), str(dst), samples_per_shard=8)
    assert (result.kept_shards, result.written_shards) == (1, 4)
    assert shard_bytes(dst) == shard_bytes(ref)
    assert verify(str(dst)).ok
    # a third run has nothing to write
    again = pack(str(src), str(dst), samples_per_shard=8)
    assert (again.kept_shards, again.written_shards) == (5, 0)


_KILL_SCRIPT = """
import sys, time
from stallscope.tools.pack import PackProgress, pack

class Hang(PackProgress):
    n = 0
    def advance(self, files, nbytes):
        self.n += files
        if self.n == int(sys.argv[3]):
            open(sys.argv[4], "w").close()
            time.sleep(600)

pack(sys.argv[1], sys.argv[2], samples_per_shard=8, progress=Hang())
"""


def test_resume_after_sigkill(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=20)
    ref = tmp_path / "ref"
    pack(str(src), str(ref), samples_per_shard=8)
    dst, marker = tmp_path / "dst", tmp_path / "hung"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_SCRIPT, str(src), str(dst), "21", str(marker)], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "packer exited before the kill point"
            assert time.monotonic() < deadline, "packer never reached the kill point"
            time.sleep(0.02)
        # shards 0 and 1 are finished in the background while the writer hangs in shard 2
        while [bool(s["sha256"]) for s in read_manifest(str(dst))["shards"]][:2] != [True, True]:
            assert time.monotonic() < deadline, "shards 0 and 1 never finished"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    names = sorted(p.name for p in dst.iterdir())
    # the shard in flight exists only under its hidden temporary name
    assert names == [
        ".shard-000002.tar.partial",
        MANIFEST_NAME,
        "shard-000000.tar",
        "shard-000001.tar",
    ]

    out = subprocess.run(
        stallscope_argv("pack", str(src), str(dst), "--samples-per-shard", "8", "--json"),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    report = json.loads(out.stdout)
    assert (report["kept_shards"], report["written_shards"]) == (2, 3)
    assert shard_bytes(dst) == shard_bytes(ref)
    assert not list(dst.glob(".*partial"))


# ---------------------------------------------------------------------------- verify


def test_verify_catches_corruption(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=10)
    dst = tmp_path / "dst"
    pack(str(src), str(dst), samples_per_shard=5)
    ok = verify(str(dst))
    assert ok.ok and ok.samples == 20 and ok.checked == 4

    shard = dst / "shard-000002.tar"
    raw = bytearray(shard.read_bytes())
    raw[600] ^= 0x01  # one bit in the first member's data
    shard.write_bytes(bytes(raw))
    bad = verify(str(dst))
    assert bad.problems == [
        "shard-000002.tar: sha256 differs from the manifest (content corrupted)"
    ]

    (dst / "shard-000003.tar").write_bytes(raw[:1024])  # truncated
    (dst / "shard-000000.tar").unlink()
    problems = verify(str(dst)).problems
    assert problems[0] == "shard-000000.tar: missing"
    assert any(p.startswith("shard-000003.tar") for p in problems)

    cli = subprocess.run(
        stallscope_argv("pack", "--verify", str(dst), "--no-progress"),
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1
    assert "FAIL shard-000002.tar: sha256 differs" in cli.stdout


def test_verify_cli_json_ok(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=5)
    dst = tmp_path / "dst"
    cli = subprocess.run(
        stallscope_argv(
            "pack", str(src), str(dst), "--verify", "--json", "--samples-per-shard", "4"
        ),
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    report = json.loads(cli.stdout)
    assert report["shards"] == 3 and report["samples"] == 10
    assert report["verify"]["ok"] is True and report["verify"]["samples"] == 10
    # the warning, on stderr: 10 tiny samples can fill neither 32 readers nor 100 MB shards,
    # and the readers are the defaults the user never gave
    # (the files' bytes, as the summary's "N of files" says them: issue 49 read "the dataset
    # (41 MB)" beside "42 MB in shards" as two figures for the same bytes)
    assert (
        "the dataset's files (" in cli.stderr
        and "too small for both one shard per" in cli.stderr
        and "the defaults of --ranks and --loader-workers: give yours" in cli.stderr
    )


# ---------------------------------------------------------------------------- bad input


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        stallscope_argv("pack", *args, "--no-progress"), capture_output=True, text=True
    )


def _one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stallscope: error: "), proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_cli_unreadable_file(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=3)
    (src / "class_01" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    dst = tmp_path / "dst"
    _one_line_error(_cli(str(src), str(dst)), "cannot read")
    assert not dst.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_cli_permission_denied(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=3)
    (src / "class_00" / "img_0001.jpg").chmod(0)
    dst = tmp_path / "dst"
    _one_line_error(_cli(str(src), str(dst)), "Permission denied")
    assert not any(dst.glob("*.tar")) and not any(dst.glob(".*partial"))


def test_read_failure_mid_shard_leaves_no_partial(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=10)
    victim = sorted(src.rglob("*.jpg"))
    dst = tmp_path / "dst"

    class DeleteAll(PackProgress):
        def start(self, phase: str, files: int, nbytes: int) -> None:
            if phase == "packing":  # after planning, before reading: files vanish
                for path in victim[5:]:
                    path.unlink()

    with pytest.raises(PackError, match=r"cannot read .*No such file"):
        pack(str(src), str(dst), samples_per_shard=50, workers=2, progress=DeleteAll())
    assert sorted(p.name for p in dst.iterdir()) == [MANIFEST_NAME]


def test_cli_duplicate_key(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=3)
    (src / "class_00" / "img_0001.png").write_bytes(b"same key as img_0001.jpg")
    dst = tmp_path / "dst"
    _one_line_error(_cli(str(src), str(dst)), "duplicate key 'class_00/img_0001'")
    assert not dst.exists()
    # dots replaced by '_' can collide with an existing name too
    (src / "class_00" / "img_0001.png").unlink()
    (src / "class_01" / "a.b.jpg").write_bytes(b"1")
    (src / "class_01" / "a_b.jpg").write_bytes(b"2")
    _one_line_error(_cli(str(src), str(dst)), "duplicate key 'class_01/a_b'")
    _one_line_error(_cli(str(src), str(dst), "--strict-keys"), "dot before its extension")


def test_cli_destination_checks(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=3)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.pdf").write_bytes(b"precious")
    _one_line_error(_cli(str(src), str(foreign)), "not a stallscope shard set")
    assert sorted(p.name for p in foreign.iterdir()) == ["thesis.pdf"]

    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_line_error(_cli(str(src), str(afile)), "not a folder")

    _one_line_error(_cli(str(src), str(src / "shards")), "inside the source")

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".shard-000000.tar.partial").write_bytes(b"left by a run killed early")
    assert _cli(str(src), str(empty)).returncode == 0  # an empty folder is fine

    # a shard set of other options is not silently replaced
    _one_line_error(
        _cli(str(src), str(empty), "--samples-per-shard", "2"), "other input or options"
    )
    assert _cli(str(src), str(empty), "--samples-per-shard", "2", "--overwrite").returncode == 0
    assert read_manifest(str(empty))["options"]["samples_per_shard"] == 2
    assert len(list(empty.glob("shard-*.tar"))) == 3

    _one_line_error(_cli(str(tmp_path / "missing"), str(tmp_path / "o")), "no such folder")
    bad = _cli(str(src), str(tmp_path / "o"), "--shard-size", "lots")
    assert bad.returncode == 2 and "bad size 'lots'" in bad.stderr
    _one_line_error(_cli("--verify", str(foreign)), "not a stallscope shard set")


def test_errors_are_stallscope_errors() -> None:
    assert issubclass(PackError, StallscopeError)
