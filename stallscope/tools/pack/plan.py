"""The plan of a pack (pure, nothing written): sizes parsed, samples ordered and cut into shards,
the default shard size, and the warnings a shard layout earns for the readers it will have."""

from __future__ import annotations

import hashlib
import json
import random
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stallscope import units
from stallscope.errors import UsageError
from stallscope.tools.pack.scan import DatasetSource, SourceFile

__all__ = [
    "DEFAULT_LOADER_WORKERS",
    "DEFAULT_RANKS",
    "SWEET_MAX",
    "SWEET_MIN",
    "WARN_LARGE",
    "WARN_SMALL",
    "Plan",
    "auto_shard_bytes",
    "human_bytes",
    "input_fingerprint",
    "layout_warnings",
    "make_plan",
    "member_bytes",
    "pack_warnings",
    "parse_size",
    "plan_shards",
    "sample_bytes",
]

#: readers the layout warnings assume unless told: one 8-GPU node, 4 DataLoader workers per rank
DEFAULT_RANKS = 8
DEFAULT_LOADER_WORKERS = 4
#: the shard-size sweet spot (bytes) the automatic size aims for
SWEET_MIN = 100 * 10**6
SWEET_MAX = 10**9
#: sizes "far" from the sweet spot (a factor 4 outside it) draw a warning
WARN_SMALL = 25 * 10**6
WARN_LARGE = 4 * 10**9
#: a tar block: a member's header, and the unit its data is padded to
_BLOCK = tarfile.BLOCKSIZE
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


def layout_warnings(
    shard_sizes: Sequence[int], ranks: int, loader_workers: int, readers_given: bool = True
) -> list[str]:
    """The known traps of a shard layout (sizes in bytes, in shard order). ``readers_given``:
    the user said how many ranks and workers will read (else the defaults are a guess, and the
    warning says so)."""
    out: list[str] = []
    n = len(shard_sizes)
    readers = ranks * loader_workers
    total = sum(shard_sizes)
    full = list(shard_sizes[:-1]) or list(shard_sizes)  # the last shard is a remainder
    typical = sorted(full)[len(full) // 2] if full else 0
    who = (
        f"{ranks} rank(s) × {loader_workers} DataLoader worker(s)"
        if readers_given
        else f"{ranks} rank(s) × {loader_workers} DataLoader worker(s) (the defaults of --ranks "
        "and --loader-workers: give yours)"
    )
    if n < readers and full and typical < WARN_SMALL and total < readers * WARN_SMALL:
        # both traps at once: the dataset is too small for one sizeable shard per reader
        out.append(
            f"the dataset's files ({human_bytes(total)}) are too small for both one shard per "
            "reader "
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


@dataclass
class Plan:
    """The samples in the order they are written, how they are cut into shards, and the id of
    that plan (input fingerprint, options and cuts): a run resumes only the same plan."""

    files: list[SourceFile]
    sizes: list[int]  #: tar bytes of each sample
    shards: list[range]  #: indices into ``files``, one range per shard
    options: dict[str, Any]
    fingerprint: str
    id: str


def make_plan(
    source: DatasetSource,
    shard_size: int | None,
    samples_per_shard: int | None,
    shuffle_seed: int | None,
    strict_keys: bool,
    ranks: int,
    loader_workers: int,
) -> Plan:
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
    fingerprint = input_fingerprint(source.files)
    plan_id = hashlib.sha256(
        json.dumps([fingerprint, options, [[r.start, r.stop] for r in shards]]).encode()
    ).hexdigest()
    return Plan(files, sizes, shards, options, fingerprint, plan_id)


def pack_warnings(
    source: DatasetSource, plan: Plan, ranks: int, loader_workers: int, readers_given: bool = True
) -> list[str]:
    """The source's notes, renamed keys, and what the shard layout costs its readers."""
    warnings = list(source.notes)
    if source.renamed_keys:
        warnings.append(
            f"{source.renamed_keys} key(s) had dots in the file name, replaced by '_' "
            "(webdataset splits the field at the first dot); --strict-keys rejects them instead"
        )
    shard_sizes = [sum(plan.sizes[i] for i in r) for r in plan.shards]
    return warnings + layout_warnings(shard_sizes, ranks, loader_workers, readers_given)


def input_fingerprint(files: Sequence[SourceFile]) -> str:
    """Identity of the input without reading it: paths, keys, labels, sizes, mtimes."""
    sha = hashlib.sha256()
    for f in files:
        sha.update(
            f"{f.path}\t{f.key}\t{f.field}\t{f.label}\t{f.size}\t{f.mtime_ns}\n".encode(
                "utf-8", "surrogateescape"
            )
        )
    return sha.hexdigest()
