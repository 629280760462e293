"""Checking a shard set (:func:`verify`): every shard re-read once, its size, sha256 and sample
count against the manifest, its tar parsed to the end."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import IO, Any

from stallscope.errors import StallscopeError
from stallscope.tools.data import iter_samples
from stallscope.tools.pack.manifest import SHARD_RE, read_manifest
from stallscope.tools.pack.write import PackProgress, mb_per_s

__all__ = ["VerifyResult", "verify"]


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
            "mb_per_s": mb_per_s(self.bytes, self.seconds),
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
    strays = sorted(n for n in os.listdir(dst) if SHARD_RE.match(n) and n not in listed)
    if strays:
        problems.append(f"shard file(s) not in the manifest: {', '.join(strays[:5])}")
    return VerifyResult(
        dst, len(shards), len(todo), samples, nbytes, time.perf_counter() - t0, problems
    )
