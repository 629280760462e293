"""Pack a small-file dataset into WebDataset tar shards (``stallscope pack``).

Many small JPEG/PNG files cost a metadata lookup and a random read each, and DataLoader workers
contend on open/read (brief D5). Sequential reads of a few large tar shards avoid both. The
classic equivalent is ``tar cf shard-000000.tar class/*.jpg ...`` per shard plus ``sha256sum``;
this module adds what that lacks:

* the WebDataset layout: one member per field, ``<key>.<field>``, members of a sample adjacent,
  the label as a ``<key>.cls`` member holding the class index as ASCII digits;
* determinism: same input -> byte-identical shards (sorted input, a seeded shuffle, fixed
  mtime/uid/gid/uname/mode in the tar headers, shard boundaries planned from file sizes before
  any byte is written, so ``--workers`` does not change the output);
* crash safety and resume: each shard is written to a hidden ``.shard-NNNNNN.tar.partial``,
  fsynced and renamed; ``manifest.json`` records every finished shard (sample count, bytes,
  sha256) and is itself replaced atomically; a second run keeps the shards that still match
  the manifest and writes the rest;
* verification: :func:`verify` re-reads every shard once, checking size, sha256 and the number
  of samples against the manifest.

Sizes are bytes; ``1GB`` means 10**9 bytes, ``1GiB`` 2**30.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import queue
import random
import re
import stat
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from stallscope import units
from stallscope.errors import StallscopeError, UsageError
from stallscope.tools.data import MANIFEST_NAME, iter_samples
from stallscope.version import __version__

__all__ = [
    "DEFAULT_LOADER_WORKERS",
    "DEFAULT_RANKS",
    "FORMAT",
    "MANIFEST_NAME",
    "DatasetSource",
    "PackError",
    "PackProgress",
    "PackResult",
    "ShardRecord",
    "SourceFile",
    "VerifyResult",
    "auto_shard_bytes",
    "human_bytes",
    "layout_warnings",
    "make_key",
    "open_source",
    "pack",
    "parse_filelist",
    "parse_size",
    "plan_shards",
    "read_manifest",
    "scan_imagefolder",
    "verify",
]

FORMAT = "stallscope-shards"
FORMAT_VERSION = 1
SHARD_NAME = "shard-{:06d}.tar"
_SHARD_RE = re.compile(r"^shard-\d{6}\.tar$")
_PARTIAL_RE = re.compile(r"^\.shard-\d{6}\.tar\.partial$")

#: readers the layout warnings assume unless told: one 8-GPU node, 4 DataLoader workers per rank
DEFAULT_RANKS = 8
DEFAULT_LOADER_WORKERS = 4
#: the shard-size sweet spot (bytes) the automatic size aims for
SWEET_MIN = 100 * 10**6
SWEET_MAX = 10**9
#: sizes "far" from the sweet spot (a factor 4 outside it) draw a warning
WARN_SMALL = 25 * 10**6
WARN_LARGE = 4 * 10**9

#: fixed tar header fields: the same input gives the same bytes on any machine, any day
TAR_MTIME = 0
TAR_MODE = 0o444
#: readahead window of the reader threads, bytes (one file is always allowed, whatever its size)
PREFETCH_BYTES = 64 * 2**20
_BLOCK = tarfile.BLOCKSIZE


class PackError(StallscopeError):
    """Bad packing input or destination; the message names the file and what to do."""


# --------------------------------------------------------------------------------------------
# source -> list of files with keys


@dataclass(frozen=True)
class SourceFile:
    """One input file: becomes the member ``<key>.<field>`` (plus ``<key>.cls`` with a label)."""

    path: str
    key: str
    field: str
    size: int  # bytes, from stat
    mtime_ns: int
    label: int | None


@dataclass(frozen=True)
class DatasetSource:
    """What ``SRC`` holds, in canonical (sorted or listed) order."""

    kind: str  # "imagefolder" | "csv" | "jsonl"
    path: str
    files: tuple[SourceFile, ...]
    classes: tuple[str, ...] | None
    renamed_keys: int = 0  # keys whose dots were replaced by "_"
    notes: tuple[str, ...] = ()  # things the user should hear about (ignored files...)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def make_key(relpath: str, *, strict: bool = False) -> tuple[str, str, bool]:
    """(key, field, renamed) for a file's path relative to the dataset root.

    The field is the last extension, lower-cased (``JPG`` -> ``jpg``; webdataset lower-cases
    fields when reading); a file without extension gets the field ``bin``. webdataset splits
    a member name at the *first* dot of its last component, so dots left in the file stem would
    move part of the name into the field: they are replaced by ``_`` (``renamed`` is True), or
    rejected with ``strict``."""
    parts = relpath.replace(os.sep, "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise PackError(f"{relpath!r}: cannot make a sample key from this path")
    name = parts[-1]
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, "bin"
    renamed = "." in stem
    if renamed:
        if strict:
            raise PackError(
                f"{relpath!r}: the file name has a dot before its extension; webdataset splits "
                "the key at the first dot (drop --strict-keys to replace dots by '_')"
            )
        stem = stem.replace(".", "_")
    key = "/".join([*parts[:-1], stem])
    if any(c in key for c in "\n\r\0"):
        raise PackError(f"{relpath!r}: control characters cannot be part of a sample key")
    return key, ext.lower(), renamed


def _stat(path: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise PackError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise PackError(f"cannot read {path}: not a regular file")
    return st


def _check_unique(files: Sequence[SourceFile]) -> None:
    seen: dict[str, str] = {}
    for f in files:
        other = seen.get(f.key)
        if other is not None:
            raise PackError(
                f"duplicate key {f.key!r}: {other} and {f.path} (a key is the path without its "
                "extension; rename one of them)"
            )
        seen[f.key] = f.path
        if f.field == "cls" and f.label is not None:
            raise PackError(f"{f.path}: the field 'cls' is reserved for the label")


def scan_imagefolder(root: str, *, strict_keys: bool = False) -> DatasetSource:
    """Read an ImageFolder tree: ``root/<class>/**/<file>``, label = index of the class in the
    sorted class names (torchvision's ``ImageFolder`` rule). Unlike torchvision, every file is
    packed whatever its extension; hidden files and folders (``.name``) are skipped, and files
    directly under ``root`` are ignored (they have no class). Like ``find root -type f | sort``."""
    root = os.path.abspath(root)
    prefix = os.path.join(root, "")  # root with one trailing separator
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise PackError(f"cannot read {root}: {exc.strerror or exc}") from exc
    classes = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
    loose = [e.name for e in entries if not e.is_dir() and not e.name.startswith(".")]
    if not classes:
        raise PackError(f"{root}: no class folders (expected {root}/<class>/<file>)")
    files: list[SourceFile] = []
    renamed = 0
    hidden = 0
    empty: list[str] = []
    for index, cls in enumerate(classes):
        before = len(files)
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, cls), followlinks=True):
            hidden += sum(1 for d in dirnames if d.startswith("."))
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    hidden += 1
                    continue
                path = os.path.join(dirpath, name)
                st = _stat(path)
                key, fld, ren = make_key(path[len(prefix) :], strict=strict_keys)
                renamed += ren
                files.append(SourceFile(path, key, fld, st.st_size, st.st_mtime_ns, index))
        if len(files) == before:
            empty.append(cls)
    if not files:
        raise PackError(f"{root}: the class folders hold no files")
    notes = []
    if loose:
        notes.append(f"{len(loose)} file(s) directly under {root} have no class folder: ignored")
    if hidden:
        notes.append(f"{hidden} hidden file(s)/folder(s) skipped")
    if empty:
        notes.append(f"class folder(s) without files keep their index: {', '.join(empty[:5])}")
    _check_unique(files)
    return DatasetSource("imagefolder", root, tuple(files), tuple(classes), renamed, tuple(notes))


@dataclass(frozen=True)
class ListEntry:
    """One row of a file list, as written (before stat)."""

    line: int
    path: str
    label: str | None
    key: str | None


def parse_filelist(text: str, fmt: str, name: str = "file list") -> list[ListEntry]:
    """Parse a file list: ``fmt="csv"`` with a header naming ``path`` (and optionally
    ``label``, ``key``), or ``fmt="jsonl"``, one object ``{"path": ..., "label": ...}`` per line.
    Pure; errors quote the line number."""
    out: list[ListEntry] = []
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip() for h in reader.fieldnames or []]
        if "path" not in header:
            raise PackError(f"{name}: the CSV header must name a 'path' column (got {header})")
        reader.fieldnames = header
        for row in reader:
            line = reader.line_num
            path = (row.get("path") or "").strip()
            if not path:
                raise PackError(f"{name}:{line}: empty path")
            label = (row.get("label") or "").strip() or None
            key = (row.get("key") or "").strip() or None
            out.append(ListEntry(line, path, label, key))
        return out
    if fmt != "jsonl":
        raise UsageError(f"{name}: unknown file-list format {fmt!r}")
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise PackError(f"{name}:{line}: not JSON ({exc})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("path"), str) or not obj["path"]:
            raise PackError(f'{name}:{line}: expected an object with a "path" string')
        label = obj.get("label")
        if isinstance(label, bool) or not isinstance(label, (int, str, type(None))):
            raise PackError(f"{name}:{line}: label must be an integer or a class name")
        key = obj.get("key")
        if key is not None and not isinstance(key, str):
            raise PackError(f"{name}:{line}: key must be a string")
        out.append(ListEntry(line, obj["path"], None if label is None else str(label), key))
    return out


def _labels(entries: Sequence[ListEntry]) -> tuple[list[int | None], tuple[str, ...] | None]:
    """Integer labels stay as they are; class names become indices into their sorted set."""
    given = [e.label for e in entries if e.label is not None]
    if not given:
        return [None] * len(entries), None
    if all(re.fullmatch(r"-?\d+", g) for g in given):
        return [None if e.label is None else int(e.label) for e in entries], None
    names = sorted(set(given))
    index = {n: i for i, n in enumerate(names)}
    return [None if e.label is None else index[e.label] for e in entries], tuple(names)


def read_filelist(path: str, *, strict_keys: bool = False) -> DatasetSource:
    """Read a CSV / JSON-lines file list. Relative paths are relative to the list's folder;
    keys are the ``key`` column if given, else each path relative to the folder all listed
    files share, without extension."""
    path = os.path.abspath(path)
    fmt = "jsonl" if path.endswith((".jsonl", ".ndjson", ".json")) else "csv"
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PackError(f"cannot read {path}: {exc}") from exc
    if not path.endswith((".csv", ".jsonl", ".ndjson", ".json")):
        fmt = "jsonl" if text.lstrip().startswith("{") else "csv"
    entries = parse_filelist(text, fmt, name=path)
    if not entries:
        raise PackError(f"{path}: the file list is empty")
    base = os.path.dirname(path)
    paths = [os.path.normpath(os.path.join(base, e.path)) for e in entries]
    common = os.path.commonpath([os.path.dirname(p) for p in paths])
    labels, classes = _labels(entries)
    files: list[SourceFile] = []
    renamed = 0
    for entry, full, label in zip(entries, paths, labels, strict=True):
        st = _stat(full)
        if entry.key is not None:  # an explicit key has no extension: the file gives the field
            rel = entry.key + (os.path.splitext(os.path.basename(full))[1] or ".bin")
        else:
            rel = os.path.relpath(full, common)
        key, fld, ren = make_key(rel, strict=strict_keys)
        renamed += ren
        files.append(SourceFile(full, key, fld, st.st_size, st.st_mtime_ns, label))
    _check_unique(files)
    return DatasetSource(fmt, path, tuple(files), classes, renamed)


def open_source(src: str, *, strict_keys: bool = False) -> DatasetSource:
    """An ImageFolder tree if ``src`` is a folder, else a CSV / JSON-lines file list."""
    if os.path.isdir(src):
        return scan_imagefolder(src, strict_keys=strict_keys)
    if os.path.isfile(src):
        return read_filelist(src, strict_keys=strict_keys)
    raise PackError(f"{src}: no such folder or file list")


# --------------------------------------------------------------------------------------------
# planning (pure)

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """``"1GB"`` -> 10**9, ``"512MiB"`` -> 512 * 2**20, ``"4096"`` -> 4096 (bytes)."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise UsageError(f"bad size {text!r} (examples: 1GB, 500MB, 512MiB, 1000000)")
    number, unit = float(match.group(1)), match.group(2).lower()
    scale = _UNITS[unit[:1] if unit[:1] in "kmgt" else ""]
    if "i" in unit:
        scale = 2 ** (10 * "bkmgt".index(unit[0]))
    value = int(number * scale)
    if value <= 0:
        raise UsageError(f"bad size {text!r}: must be positive")
    return value


def member_bytes(size: int) -> int:
    """Bytes one tar member of ``size`` data bytes takes: a 512-byte header plus the data
    padded to 512 (long or non-ASCII names add a PAX header; planning ignores that)."""
    return _BLOCK + -(-size // _BLOCK) * _BLOCK


def sample_bytes(f: SourceFile) -> int:
    """Planned tar bytes of one sample, its ``cls`` member included."""
    return member_bytes(f.size) + (member_bytes(8) if f.label is not None else 0)


def auto_shard_bytes(total: int, ranks: int, loader_workers: int) -> int:
    """The default shard size: enough shards for every one of ``ranks × loader_workers``
    readers, kept inside the 100 MB–1 GB sweet spot."""
    return max(SWEET_MIN, min(SWEET_MAX, total // max(1, ranks * loader_workers)))


def plan_shards(
    sizes: Sequence[int], *, shard_bytes: int | None = None, samples_per_shard: int | None = None
) -> list[range]:
    """Cut samples (in order; ``sizes`` = planned tar bytes each) into shards.

    With ``samples_per_shard`` every shard but the last has exactly that many; with
    ``shard_bytes`` a shard ends before the sample that would take it past the limit (a sample
    bigger than the limit gets a shard of its own)."""
    n = len(sizes)
    if samples_per_shard is not None:
        if samples_per_shard < 1:
            raise UsageError("--samples-per-shard must be at least 1")
        return [range(i, min(n, i + samples_per_shard)) for i in range(0, n, samples_per_shard)]
    if shard_bytes is None or shard_bytes < 1:
        raise UsageError("give a positive shard size or samples per shard")
    shards: list[range] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        if i > start and acc + size > shard_bytes:
            shards.append(range(start, i))
            start, acc = i, 0
        acc += size
    if start < n:
        shards.append(range(start, n))
    return shards


def human_bytes(n: float) -> str:
    """Bytes for people (:func:`stallscope.units.size`: SI)."""
    return units.size(n)


def layout_warnings(shard_sizes: Sequence[int], ranks: int, loader_workers: int,
                    readers_given: bool = True) -> list[str]:
    """The known traps of a shard layout (sizes in bytes, in shard order). ``readers_given``:
    the user said how many ranks and workers will read (else the defaults are a guess, and the
    warning says so)."""
    out: list[str] = []
    n = len(shard_sizes)
    readers = ranks * loader_workers
    total = sum(shard_sizes)
    full = list(shard_sizes[:-1]) or list(shard_sizes)  # the last shard is a remainder
    typical = sorted(full)[len(full) // 2] if full else 0
    who = (f"{ranks} rank(s) × {loader_workers} DataLoader worker(s)" if readers_given else
           f"{ranks} rank(s) × {loader_workers} DataLoader worker(s) (the defaults of --ranks "
           "and --loader-workers: give yours)")
    if n < readers and full and typical < WARN_SMALL and total < readers * WARN_SMALL:
        # both traps at once: the dataset is too small for one sizeable shard per reader
        out.append(
            f"the dataset ({human_bytes(total)}) is too small for both one shard per reader "
            f"({who} = {readers} readers) and shards near the 100 MB sweet spot: with "
            f"{n} shard(s), {readers - n} reader(s) get none and sit idle. A dataset this "
            "small fits in memory: load it into RAM rather than streaming shards; to feed "
            f"every reader anyway, --samples-per-shard (your samples divided by {readers})"
        )
        return out
    if n < readers:
        out.append(
            f"{n} shard(s) for {who} = {readers} readers: {readers - n} reader(s) get no "
            "shard and sit idle (fewer loader workers, or a smaller --shard-size / "
            "--samples-per-shard)"
        )
    if full:
        if typical < WARN_SMALL:
            out.append(
                f"shards of ~{human_bytes(typical)} are far below the 100 MB–1 GB sweet spot: many "
                "small files again (per-file opens, short reads)"
            )
        elif typical > WARN_LARGE:
            out.append(
                f"shards of ~{human_bytes(typical)} are far above the 100 MB–1 GB sweet spot: "
                "coarse shuffling, uneven splits across readers, slow resume of a broken shard"
            )
    return out


# --------------------------------------------------------------------------------------------
# writing


@dataclass
class ShardRecord:
    """One shard in the manifest. ``sha256`` is ``sha256sum shard-NNNNNN.tar``; None while the
    shard is not written yet."""

    name: str
    samples: int
    first_key: str
    last_key: str
    bytes: int | None = None
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "samples": self.samples,
            "first_key": self.first_key,
            "last_key": self.last_key,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }


@dataclass
class PackResult:
    """What :func:`pack` did. ``seconds`` and the rates cover this run only."""

    dst: str
    shards: list[ShardRecord]
    samples: int
    source_bytes: int
    written_shards: int
    kept_shards: int
    written_files: int
    written_bytes: int
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def shard_bytes(self) -> int:
        return sum(s.bytes or 0 for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "dst": self.dst,
            "manifest": os.path.join(self.dst, MANIFEST_NAME),
            "pattern": shard_pattern(len(self.shards)),
            "shards": len(self.shards),
            "samples": self.samples,
            "source_bytes": self.source_bytes,
            "shard_bytes": self.shard_bytes,
            "written_shards": self.written_shards,
            "kept_shards": self.kept_shards,
            "seconds": round(self.seconds, 3),
            "files_per_s": round(self.written_files / max(self.seconds, 1e-9), 1),
            "mb_per_s": _mb_per_s(self.written_bytes, self.seconds),
            "warnings": self.warnings,
        }


def _mb_per_s(nbytes: int, seconds: float) -> float:
    """Throughput in MB/s (10**6 bytes) as the results report it, one decimal."""
    return round(nbytes / max(seconds, 1e-9) / 1e6, 1)


class PackProgress:
    """Progress callbacks (no-ops here; the CLI draws a rich bar). ``start`` and ``advance``
    are called from the thread that calls :func:`pack`, ``shard_done`` from the background
    thread that finishes shards."""

    def start(self, phase: str, files: int, nbytes: int) -> None:
        """A phase begins (``"checking"`` kept shards, ``"packing"``): totals to expect."""

    def advance(self, files: int, nbytes: int) -> None:
        """``files`` more files (``nbytes`` source bytes) are done."""

    def shard_done(self, record: ShardRecord) -> None:
        """A shard was renamed into place and recorded in the manifest."""


def shard_pattern(n: int) -> str:
    """Brace pattern of ``n`` shards, as webdataset takes it: ``shard-{000000..000009}.tar``."""
    if n == 1:
        return SHARD_NAME.format(0)
    return f"shard-{{{0:06d}..{n - 1:06d}}}.tar"


class _HashingReader:
    """A read-only file wrapper feeding sha256 with every byte read."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        self.count += len(data)
        return data


def _read_file(f: SourceFile) -> bytes:
    try:
        with open(f.path, "rb", buffering=0) as fh:
            data = fh.read()
    except OSError as exc:
        raise PackError(f"cannot read {f.path}: {exc.strerror or exc}") from exc
    if len(data) != f.size:
        raise PackError(
            f"{f.path} changed while packing ({f.size} bytes when listed, {len(data)} now)"
        )
    return data


def _read_batch(batch: Sequence[SourceFile]) -> list[bytes]:
    return [_read_file(f) for f in batch]


def _batches(
    files: Sequence[SourceFile], max_files: int, max_bytes: int
) -> Iterator[list[SourceFile]]:
    batch: list[SourceFile] = []
    nbytes = 0
    for f in files:
        if batch and (len(batch) >= max_files or nbytes + f.size > max_bytes):
            yield batch
            batch, nbytes = [], 0
        batch.append(f)
        nbytes += f.size
    if batch:
        yield batch


def _prefetch(files: Sequence[SourceFile], workers: int) -> Iterator[tuple[SourceFile, bytes]]:
    """File contents in order, read by ``workers`` threads ahead of the consumer.

    Each task reads a run of consecutive files (up to 16 files / 4 MiB), which keeps the
    per-file cost of handing work between threads small; at most PREFETCH_BYTES are read
    ahead. Threads only read; the order stays fixed."""
    if workers <= 1:
        for f in files:
            yield f, _read_file(f)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stallscope-pack")
    tasks = _batches(files, 16, 4 << 20)
    pending: deque[tuple[list[SourceFile], int, Future[list[bytes]]]] = deque()
    inflight = 0
    try:
        for batch in tasks:
            size = sum(f.size for f in batch)
            while pending and inflight + size > PREFETCH_BYTES:
                done, done_size, fut = pending.popleft()
                inflight -= done_size
                yield from zip(done, fut.result(), strict=True)
            pending.append((batch, size, pool.submit(_read_batch, batch)))
            inflight += size
        while pending:
            done, _, fut = pending.popleft()
            yield from zip(done, fut.result(), strict=True)
    finally:
        for _, _, fut in pending:
            fut.cancel()
        pool.shutdown(wait=True)


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mtime = TAR_MTIME
    ti.mode = TAR_MODE
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: str, doc: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True, ensure_ascii=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: the old manifest stays, no half-written temp file
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(os.path.dirname(path))


def _sha256_file(path: str) -> tuple[int, str]:
    sha = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
            n += len(chunk)
    return n, sha.hexdigest()


def _fingerprint(files: Sequence[SourceFile]) -> str:
    """Identity of the input without reading it: paths, keys, labels, sizes, mtimes."""
    sha = hashlib.sha256()
    for f in files:
        sha.update(
            f"{f.path}\t{f.key}\t{f.field}\t{f.label}\t{f.size}\t{f.mtime_ns}\n".encode(
                "utf-8", "surrogateescape"
            )
        )
    return sha.hexdigest()


def read_manifest(dst: str) -> dict[str, Any]:
    """The manifest of the shard set in ``dst``; PackError when there is none or it is not
    ours."""
    path = os.path.join(dst, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError as exc:
        raise PackError(f"{dst}: not a stallscope shard set (no {MANIFEST_NAME})") from exc
    except (OSError, ValueError) as exc:
        raise PackError(f"{path}: unreadable manifest ({exc})") from exc
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or not isinstance(doc.get("shards"), list)
    ):
        raise PackError(f"{dst}: {MANIFEST_NAME} is not a stallscope shard manifest")
    version = doc.get("version")
    if version != FORMAT_VERSION:
        raise PackError(
            f"{path}: manifest version {version} (this stallscope reads {FORMAT_VERSION})"
        )
    return doc


def _prepare_dst(dst: str, plan_id: str, overwrite: bool) -> dict[str, Any] | None:
    """Check the destination; return the manifest in progress to resume from, if any."""
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise PackError(f"{dst}: exists and is not a folder")
    if not os.path.isdir(dst):
        return None
    names = os.listdir(dst)
    if MANIFEST_NAME not in names:
        # a run killed before its first manifest leaves at most its own temporary files
        if any(not (_PARTIAL_RE.match(n) or n == MANIFEST_NAME + ".tmp") for n in names):
            raise PackError(
                f"{dst}: exists and is not a stallscope shard set (no {MANIFEST_NAME}); "
                "choose a new or empty folder"
            )
        return None
    doc = read_manifest(dst)
    if doc.get("plan") == plan_id:
        return doc
    if not overwrite:
        state = "finished" if doc.get("complete") else "unfinished"
        raise PackError(
            f"{dst}: holds an {state} shard set of other input or options; pass --overwrite "
            "to replace it, or choose another folder"
        )
    for name in names:  # only our own files: shards, partials, the manifest
        if (
            _SHARD_RE.match(name)
            or _PARTIAL_RE.match(name)
            or name in (MANIFEST_NAME, MANIFEST_NAME + ".tmp")
        ):
            os.unlink(os.path.join(dst, name))
    return None


@dataclass
class _Plan:
    """The samples in the order they are written, how they are cut into shards, and the id of
    that plan (input fingerprint, options and cuts): a run resumes only the same plan."""

    files: list[SourceFile]
    sizes: list[int]  #: tar bytes of each sample
    shards: list[range]  #: indices into ``files``, one range per shard
    options: dict[str, Any]
    fingerprint: str
    id: str


def pack(
    src: str,
    dst: str,
    *,
    shard_size: int | None = None,
    samples_per_shard: int | None = None,
    workers: int = 4,
    shuffle_seed: int | None = 0,
    strict_keys: bool = False,
    overwrite: bool = False,
    ranks: int | None = None,
    loader_workers: int | None = None,
    progress: PackProgress | None = None,
) -> PackResult:
    """Pack ``src`` (ImageFolder tree or file list) into WebDataset shards in ``dst``.

    ``shard_size`` (bytes) or ``samples_per_shard`` sets the cut; neither: :func:`auto_shard_bytes`.
    ``shuffle_seed`` orders the samples with ``random.Random(seed)`` (class-sorted shards read
    with a small shuffle buffer give one-class batches); None keeps the source order.
    ``workers`` threads read files ahead of the single tar writer. A ``dst`` holding an
    unfinished run of the same input and options is resumed."""
    progress = progress or PackProgress()
    src_abs, dst_abs = os.path.abspath(src), os.path.abspath(dst)
    _check_args(src_abs, dst_abs, dst, workers, shard_size, samples_per_shard)
    source = open_source(src_abs, strict_keys=strict_keys)
    given = ranks is not None or loader_workers is not None
    ranks = DEFAULT_RANKS if ranks is None else ranks
    loader_workers = DEFAULT_LOADER_WORKERS if loader_workers is None else loader_workers
    plan = _make_plan(source, shard_size, samples_per_shard, shuffle_seed, strict_keys, ranks,
                      loader_workers)
    warnings = _pack_warnings(source, plan, ranks, loader_workers, given)
    previous = _open_dst(dst, dst_abs, plan.id, overwrite)
    files = plan.files
    records = [
        ShardRecord(SHARD_NAME.format(i), len(r), files[r.start].key, files[r.stop - 1].key)
        for i, r in enumerate(plan.shards)
    ]
    doc = _manifest(source, plan)
    done = (set() if previous is None
            else _keep_finished(dst_abs, previous, records, plan.shards, progress))

    def save(complete: bool = False) -> None:
        doc["complete"] = complete
        doc["shards"] = [r.to_json() for r in records]
        _write_json_atomic(os.path.join(dst_abs, MANIFEST_NAME), doc)

    try:
        return _pack_shards(dst_abs, plan.shards, files, records, done, save, workers, progress,
                            source, warnings)
    except OSError as exc:
        # a full disk, an I/O error: nothing half-written stays to hold the space; the
        # finished shards and the manifest that lists them do, so the same command resumes
        _remove_leftovers(dst_abs)
        raise _write_error(exc, dst, dst_abs, records, sum(plan.sizes)) from exc


def _check_args(src_abs: str, dst_abs: str, dst: str, workers: int, shard_size: int | None,
                samples_per_shard: int | None) -> None:
    """The option combinations and folders :func:`pack` refuses before reading anything."""
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    if shard_size is not None and samples_per_shard is not None:
        raise UsageError("give --shard-size or --samples-per-shard, not both")
    if os.path.isdir(src_abs) and (os.path.realpath(dst_abs) + os.sep).startswith(
        os.path.realpath(src_abs) + os.sep
    ):
        raise PackError(f"{dst}: the destination is inside the source folder")


def _make_plan(source: DatasetSource, shard_size: int | None, samples_per_shard: int | None,
               shuffle_seed: int | None, strict_keys: bool, ranks: int,
               loader_workers: int) -> _Plan:
    """Order the samples (seeded shuffle or source order), cut them into shards and name the
    plan; nothing is read but the file list."""
    files = list(source.files)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(files)
    sizes = [sample_bytes(f) for f in files]
    if shard_size is None and samples_per_shard is None:
        limit: int | None = auto_shard_bytes(sum(sizes), ranks, loader_workers)
    else:
        limit = shard_size
    shards = plan_shards(sizes, shard_bytes=limit, samples_per_shard=samples_per_shard)
    options = {
        "shard_size": limit if samples_per_shard is None else None,
        "samples_per_shard": samples_per_shard,
        "shuffle_seed": shuffle_seed,
        "strict_keys": strict_keys,
    }
    fingerprint = _fingerprint(source.files)
    plan_id = hashlib.sha256(
        json.dumps([fingerprint, options, [[r.start, r.stop] for r in shards]]).encode()
    ).hexdigest()
    return _Plan(files, sizes, shards, options, fingerprint, plan_id)


def _pack_warnings(source: DatasetSource, plan: _Plan, ranks: int, loader_workers: int,
                   readers_given: bool = True) -> list[str]:
    """The source's notes, renamed keys, and what the shard layout costs its readers."""
    warnings = list(source.notes)
    if source.renamed_keys:
        warnings.append(
            f"{source.renamed_keys} key(s) had dots in the file name, replaced by '_' "
            "(webdataset splits the field at the first dot); --strict-keys rejects them instead"
        )
    shard_sizes = [sum(plan.sizes[i] for i in r) for r in plan.shards]
    return warnings + layout_warnings(shard_sizes, ranks, loader_workers, readers_given)


def _open_dst(dst: str, dst_abs: str, plan_id: str, overwrite: bool) -> dict[str, Any] | None:
    """Make the destination ready to write (created, cleared of a killed run's leftovers);
    return the manifest in progress of the same plan, to resume from, if any."""
    try:
        previous = _prepare_dst(dst_abs, plan_id, overwrite)
        os.makedirs(dst_abs, exist_ok=True)
        _remove_leftovers(dst_abs)  # leftovers of a killed run are never valid
    except OSError as exc:  # under a file, under /proc, read-only, no permission
        raise PackError(f"cannot create {dst}: {_why(exc, dst_abs)}") from exc
    return previous


def _manifest(source: DatasetSource, plan: _Plan) -> dict[str, Any]:
    """The manifest of ``plan``, not complete yet and with no shard written."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "created_by": f"stallscope {__version__}",
        "complete": False,
        "plan": plan.id,
        "source": {
            "kind": source.kind,
            "path": source.path,
            "files": len(plan.files),
            "bytes": source.total_bytes,
            "classes": list(source.classes) if source.classes is not None else None,
            "fingerprint": plan.fingerprint,
        },
        "options": plan.options,
        "layout": "webdataset: <key>.<field> members, label as <key>.cls (ASCII integer)",
        "pattern": shard_pattern(len(plan.shards)),
        "samples": len(plan.files),
        "shards": [],
    }


def _keep_finished(dst_abs: str, previous: dict[str, Any], records: list[ShardRecord],
                   shards: Sequence[range], progress: PackProgress) -> set[int]:
    """The shards of the manifest in progress that are still on disk as it recorded them
    (size and sha256); their records are filled in, and their indices returned."""
    old = {s.get("name"): s for s in previous["shards"] if isinstance(s, dict)}
    todo = [
        (i, old[r.name])
        for i, r in enumerate(records)
        if r.name in old and old[r.name].get("sha256")
    ]
    progress.start(
        "checking",
        sum(len(shards[i]) for i, _ in todo),
        sum(int(o.get("bytes") or 0) for _, o in todo),
    )
    done: set[int] = set()
    for i, entry in todo:
        path = os.path.join(dst_abs, records[i].name)
        if os.path.isfile(path) and os.path.getsize(path) == entry.get("bytes"):
            nbytes, digest = _sha256_file(path)
            if digest == entry["sha256"]:
                records[i].bytes, records[i].sha256 = nbytes, digest
                done.add(i)
        progress.advance(len(shards[i]), int(entry.get("bytes") or 0))
    return done


def _write_error(exc: OSError, dst: str, dst_abs: str, records: Sequence[ShardRecord],
                 total: int) -> PackError:
    """The one line a failed write ends with: what failed and why, the space the shards need
    when the disk is full, and how to resume."""
    kept = sum(1 for r in records if r.sha256)
    hint = (f"; {kept} finished shard(s) kept: run the same command again to resume"
            if kept else "")
    need = ""
    if exc.errno == errno.ENOSPC:
        hint = f"; free space on {dst} and run the same command again to resume" + (
            f" ({kept} finished shard(s) kept)" if kept else "")
        need = f"; the shards take {human_bytes(total)} in all"
    return PackError(f"cannot write {exc.filename or dst}: {_why(exc, dst_abs)}"
                     f"{need}{hint}")


def _why(exc: OSError, path: str) -> str:
    """The reason of a write error, with the free space when the disk is full."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        with contextlib.suppress(OSError):
            st = os.statvfs(path)
            why += f" ({human_bytes(st.f_bavail * st.f_frsize)} free)"
    return why


def _remove_leftovers(dst: str) -> None:
    """Delete the temporary files of a run (partial shards, the manifest's temp file) and any
    shard the manifest on disk does not list (renamed into place just before the manifest
    could no longer be written): they are never valid, and after a full disk they would keep
    it full."""
    try:
        names = os.listdir(dst)
    except OSError:
        return
    try:
        with open(os.path.join(dst, MANIFEST_NAME), encoding="utf-8") as f:
            doc = json.load(f)
        listed = {s.get("name") for s in doc.get("shards") or [] if s.get("sha256")}
    except (OSError, ValueError, AttributeError):
        listed = set()
    for name in names:
        stray = _SHARD_RE.match(name) is not None and name not in listed
        if stray or _PARTIAL_RE.match(name) or name == MANIFEST_NAME + ".tmp":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(dst, name))


def _pack_shards(
    dst_abs: str,
    plan: Sequence[range],
    files: Sequence[SourceFile],
    records: list[ShardRecord],
    done: set[int],
    save: Callable[..., None],
    workers: int,
    progress: PackProgress,
    source: DatasetSource,
    warnings: list[str],
) -> PackResult:
    save()
    remaining = [i for i in range(len(plan)) if i not in done]
    stream_files = [files[j] for i in remaining for j in plan[i]]
    progress.start("packing", len(stream_files), sum(f.size for f in stream_files))
    t0 = time.perf_counter()
    written_bytes = 0
    stream = _prefetch(stream_files, workers)
    finisher = _Finisher(dst_abs, save, progress)
    try:
        for i in remaining:
            finisher.check()
            tmp, raw = _write_shard(dst_abs, records[i], len(plan[i]), stream, progress)
            finisher.submit(records[i], tmp, raw)
            written_bytes += sum(files[j].size for j in plan[i])
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        finisher.close()  # finishes the shards already written, then raises its own error
    seconds = time.perf_counter() - t0
    save(complete=True)
    return PackResult(
        dst=dst_abs,
        shards=records,
        samples=len(files),
        source_bytes=source.total_bytes,
        written_shards=len(remaining),
        kept_shards=len(done),
        written_files=len(stream_files),
        written_bytes=written_bytes,
        seconds=seconds,
        warnings=warnings,
    )


def _write_shard(
    dst: str,
    record: ShardRecord,
    count: int,
    stream: Iterator[tuple[SourceFile, bytes]],
    progress: PackProgress,
) -> tuple[str, IO[bytes]]:
    """Write one shard from the next ``count`` files of ``stream`` to its temporary name.

    Returns the temporary path and the still open file for :class:`_Finisher`; on any error
    the temporary file is removed."""
    tmp = os.path.join(dst, f".{record.name}.partial")
    # a big buffer: one write(2) per 8 MiB, so the writer rarely gives up the GIL (each
    # syscall does, and reader threads then delay it getting it back)
    raw = open(tmp, "wb", buffering=8 << 20)  # handed over to the finisher, which closes it
    try:
        tar = tarfile.TarFile(
            fileobj=raw,
            mode="w",
            format=tarfile.PAX_FORMAT,
            encoding="utf-8",
            copybufsize=4 << 20,  # one copy per member, not 16 kB pieces
        )
        for _ in range(count):
            f, data = next(stream)
            tar.addfile(_tarinfo(f"{f.key}.{f.field}", len(data)), io.BytesIO(data))
            if f.label is not None:
                label = str(f.label).encode("ascii")
                tar.addfile(_tarinfo(f"{f.key}.cls", len(label)), io.BytesIO(label))
            progress.advance(1, len(data))
        tar.close()  # end-of-archive blocks and record padding; leaves ``raw`` open
        raw.flush()
    except BaseException:
        # close() may fail too (its flush on a full disk); the file goes anyway
        with contextlib.suppress(OSError):
            raw.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp, raw


class _Finisher:
    """Completes written shards in order on a background thread, so that the writer goes on
    with the next shard meanwhile: fsync, sha256 of the bytes as stored (read back from the
    page cache), rename to the final name, fsync of the folder, manifest update. At most two
    shards wait, which bounds the data not yet on disk."""

    def __init__(self, dst: str, save: Callable[[], None], progress: PackProgress) -> None:
        self.dst = dst
        self.save = save
        self.progress = progress
        self.queue: queue.Queue[tuple[ShardRecord, str, IO[bytes]] | None] = queue.Queue(2)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="stallscope-pack-finish")
        self.thread.start()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, record: ShardRecord, tmp: str, raw: IO[bytes]) -> None:
        self.queue.put((record, tmp, raw))

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        self.check()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            record, tmp, raw = item
            try:
                if self.error is None:
                    self._finish(record, tmp, raw)
            except BaseException as exc:  # handed to the writer thread by check()/close()
                self.error = exc
            finally:
                try:
                    raw.close()
                except OSError as exc:
                    self.error = self.error or exc
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _finish(self, record: ShardRecord, tmp: str, raw: IO[bytes]) -> None:
        os.fsync(raw.fileno())
        nbytes, digest = _sha256_file(tmp)
        record.bytes, record.sha256 = nbytes, digest
        os.replace(tmp, os.path.join(self.dst, record.name))
        _fsync_dir(self.dst)
        self.save()
        self.progress.shard_done(record)


# --------------------------------------------------------------------------------------------
# verification


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`; ``problems`` is empty when every check passed."""

    dst: str
    shards: int
    checked: int
    samples: int
    bytes: int
    seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "dst": self.dst,
            "ok": self.ok,
            "shards": self.shards,
            "checked": self.checked,
            "samples": self.samples,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "mb_per_s": _mb_per_s(self.bytes, self.seconds),
            "problems": self.problems,
        }


def verify(dst: str, progress: PackProgress | None = None) -> VerifyResult:
    """Re-read every shard of ``dst`` once: size, sha256 (as ``sha256sum``) and sample count
    must match the manifest, and the tar must parse to the end."""
    progress = progress or PackProgress()
    dst = os.path.abspath(dst)
    doc = read_manifest(dst)
    shards = doc["shards"]
    problems: list[str] = []
    if not doc.get("complete"):
        written = sum(1 for s in shards if s.get("sha256"))
        problems.append(
            f"packing unfinished: {written} of {len(shards)} shards written (run pack again)"
        )
    todo = [s for s in shards if s.get("sha256")]
    progress.start(
        "verifying", sum(int(s["samples"]) for s in todo), sum(int(s["bytes"]) for s in todo)
    )
    t0 = time.perf_counter()
    samples = nbytes = 0
    for entry in todo:
        name = entry["name"]
        path = os.path.join(dst, name)
        if not os.path.isfile(path):
            problems.append(f"{name}: missing")
            continue
        size = os.path.getsize(path)
        count = 0
        try:
            with open(path, "rb", buffering=0) as raw:
                reader = _HashingReader(raw)
                for _ in iter_samples(reader, url=name):  # type: ignore[arg-type]
                    count += 1
                while reader.read(1 << 20):  # record padding after the end-of-archive blocks
                    pass
        except StallscopeError as exc:
            problems.append(str(exc))
            continue
        samples += count
        nbytes += size
        progress.advance(count, size)
        if size != entry["bytes"]:
            problems.append(f"{name}: {size} bytes, manifest says {entry['bytes']}")
        if count != entry["samples"]:
            problems.append(f"{name}: {count} samples, manifest says {entry['samples']}")
        if reader.sha.hexdigest() != entry["sha256"]:
            problems.append(f"{name}: sha256 differs from the manifest (content corrupted)")
    listed = {s["name"] for s in shards}
    strays = sorted(n for n in os.listdir(dst) if _SHARD_RE.match(n) and n not in listed)
    if strays:
        problems.append(f"shard file(s) not in the manifest: {', '.join(strays[:5])}")
    return VerifyResult(
        dst, len(shards), len(todo), samples, nbytes, time.perf_counter() - t0, problems
    )
