"""The input of ``stallscope pack``: an ImageFolder tree or a file list, read into the files to
pack, each with its WebDataset key, field and label. Nothing is read but names and sizes."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from stallscope.errors import StallscopeError, UsageError

__all__ = [
    "DatasetSource",
    "ListEntry",
    "PackError",
    "SourceFile",
    "make_key",
    "open_source",
    "parse_filelist",
    "read_filelist",
    "scan_imagefolder",
]


class PackError(StallscopeError):
    """Bad packing input or destination; the message names the file and what to do."""


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
