"""A shard set on disk: the shards' names, ``manifest.json`` (read, written atomically, built from
a plan) and its shard records, and the clean-up of a killed or failed run's leftovers."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from stallscope.tools.data import MANIFEST_NAME
from stallscope.tools.pack.plan import Plan
from stallscope.tools.pack.scan import DatasetSource, PackError
from stallscope.version import __version__

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "PARTIAL_RE",
    "SHARD_NAME",
    "SHARD_RE",
    "ShardRecord",
    "fsync_dir",
    "new_manifest",
    "prepare_dst",
    "read_manifest",
    "remove_leftovers",
    "sha256_file",
    "shard_pattern",
    "write_json_atomic",
]

FORMAT = "stallscope-shards"
FORMAT_VERSION = 1
SHARD_NAME = "shard-{:06d}.tar"
SHARD_RE = re.compile(r"^shard-\d{6}\.tar$")
PARTIAL_RE = re.compile(r"^\.shard-\d{6}\.tar\.partial$")


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


def shard_pattern(n: int) -> str:
    """Brace pattern of ``n`` shards, as webdataset takes it: ``shard-{000000..000009}.tar``."""
    if n == 1:
        return SHARD_NAME.format(0)
    return f"shard-{{{0:06d}..{n - 1:06d}}}.tar"


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str, doc: dict[str, Any]) -> None:
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
    fsync_dir(os.path.dirname(path))


def sha256_file(path: str) -> tuple[int, str]:
    sha = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
            n += len(chunk)
    return n, sha.hexdigest()


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


def prepare_dst(dst: str, plan_id: str, overwrite: bool) -> dict[str, Any] | None:
    """Check the destination; return the manifest in progress to resume from, if any."""
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise PackError(f"{dst}: exists and is not a folder")
    if not os.path.isdir(dst):
        return None
    names = os.listdir(dst)
    if MANIFEST_NAME not in names:
        # a run killed before its first manifest leaves at most its own temporary files
        if any(not (PARTIAL_RE.match(n) or n == MANIFEST_NAME + ".tmp") for n in names):
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
            SHARD_RE.match(name)
            or PARTIAL_RE.match(name)
            or name in (MANIFEST_NAME, MANIFEST_NAME + ".tmp")
        ):
            os.unlink(os.path.join(dst, name))
    return None


def new_manifest(source: DatasetSource, plan: Plan) -> dict[str, Any]:
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


def remove_leftovers(dst: str) -> None:
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
        stray = SHARD_RE.match(name) is not None and name not in listed
        if stray or PARTIAL_RE.match(name) or name == MANIFEST_NAME + ".tmp":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(dst, name))
