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

The package's rooms: :mod:`~stallscope.tools.pack.scan` (the input), :mod:`~stallscope.tools.
pack.plan` (orders and cuts, pure), :mod:`~stallscope.tools.pack.manifest` (the shard set on
disk), :mod:`~stallscope.tools.pack.write` (:func:`pack`) and :mod:`~stallscope.tools.pack.
verify` (:func:`verify`).
"""

from __future__ import annotations

from stallscope.tools.data import MANIFEST_NAME
from stallscope.tools.pack.manifest import FORMAT, ShardRecord, read_manifest
from stallscope.tools.pack.plan import (
    DEFAULT_LOADER_WORKERS,
    DEFAULT_RANKS,
    auto_shard_bytes,
    human_bytes,
    layout_warnings,
    parse_size,
    plan_shards,
)
from stallscope.tools.pack.scan import (
    DatasetSource,
    PackError,
    SourceFile,
    make_key,
    open_source,
    parse_filelist,
    scan_imagefolder,
)
from stallscope.tools.pack.verify import VerifyResult, verify
from stallscope.tools.pack.write import PackProgress, PackResult, pack

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
