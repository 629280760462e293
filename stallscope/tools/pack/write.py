"""Writing a shard set (:func:`pack`): files read ahead by threads, one tar writer, each shard
finished (fsync, sha256, rename, manifest) on a background thread; a run resumes the shards
a killed one finished, and a failed write says why and how to resume."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import queue
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from stallscope.errors import UsageError
from stallscope.tools.data import MANIFEST_NAME
from stallscope.tools.pack.manifest import (
    SHARD_NAME,
    ShardRecord,
    fsync_dir,
    new_manifest,
    prepare_dst,
    remove_leftovers,
    sha256_file,
    shard_pattern,
    write_json_atomic,
)
from stallscope.tools.pack.plan import (
    DEFAULT_LOADER_WORKERS,
    DEFAULT_RANKS,
    human_bytes,
    make_plan,
    pack_warnings,
)
from stallscope.tools.pack.scan import DatasetSource, PackError, SourceFile, open_source

__all__ = [
    "PREFETCH_BYTES",
    "TAR_MODE",
    "TAR_MTIME",
    "PackProgress",
    "PackResult",
    "mb_per_s",
    "pack",
]

#: fixed tar header fields: the same input gives the same bytes on any machine, any day
TAR_MTIME = 0
TAR_MODE = 0o444
#: readahead window of the reader threads, bytes (one file is always allowed, whatever its size)
PREFETCH_BYTES = 64 * 2**20


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
            "mb_per_s": mb_per_s(self.written_bytes, self.seconds),
            "warnings": self.warnings,
        }


def mb_per_s(nbytes: int, seconds: float) -> float:
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
    plan = make_plan(
        source, shard_size, samples_per_shard, shuffle_seed, strict_keys, ranks, loader_workers
    )
    warnings = pack_warnings(source, plan, ranks, loader_workers, given)
    previous = _open_dst(dst, dst_abs, plan.id, overwrite)
    files = plan.files
    records = [
        ShardRecord(SHARD_NAME.format(i), len(r), files[r.start].key, files[r.stop - 1].key)
        for i, r in enumerate(plan.shards)
    ]
    doc = new_manifest(source, plan)
    done = (
        set()
        if previous is None
        else _keep_finished(dst_abs, previous, records, plan.shards, progress)
    )

    def save(complete: bool = False) -> None:
        doc["complete"] = complete
        doc["shards"] = [r.to_json() for r in records]
        write_json_atomic(os.path.join(dst_abs, MANIFEST_NAME), doc)

    try:
        return _pack_shards(
            dst_abs, plan.shards, files, records, done, save, workers, progress, source, warnings
        )
    except OSError as exc:
        # a full disk, an I/O error: nothing half-written stays to hold the space; the
        # finished shards and the manifest that lists them do, so the same command resumes
        remove_leftovers(dst_abs)
        raise _write_error(exc, dst, dst_abs, records, sum(plan.sizes)) from exc


def _check_args(
    src_abs: str,
    dst_abs: str,
    dst: str,
    workers: int,
    shard_size: int | None,
    samples_per_shard: int | None,
) -> None:
    """The option combinations and folders :func:`pack` refuses before reading anything."""
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    if shard_size is not None and samples_per_shard is not None:
        raise UsageError("give --shard-size or --samples-per-shard, not both")
    if os.path.isdir(src_abs) and (os.path.realpath(dst_abs) + os.sep).startswith(
        os.path.realpath(src_abs) + os.sep
    ):
        raise PackError(f"{dst}: the destination is inside the source folder")


def _open_dst(dst: str, dst_abs: str, plan_id: str, overwrite: bool) -> dict[str, Any] | None:
    """Make the destination ready to write (created, cleared of a killed run's leftovers);
    return the manifest in progress of the same plan, to resume from, if any."""
    try:
        previous = prepare_dst(dst_abs, plan_id, overwrite)
        os.makedirs(dst_abs, exist_ok=True)
        remove_leftovers(dst_abs)  # leftovers of a killed run are never valid
    except OSError as exc:  # under a file, under /proc, read-only, no permission
        raise PackError(f"cannot create {dst}: {_why(exc, dst_abs)}") from exc
    return previous


def _keep_finished(
    dst_abs: str,
    previous: dict[str, Any],
    records: list[ShardRecord],
    shards: Sequence[range],
    progress: PackProgress,
) -> set[int]:
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
            nbytes, digest = sha256_file(path)
            if digest == entry["sha256"]:
                records[i].bytes, records[i].sha256 = nbytes, digest
                done.add(i)
        progress.advance(len(shards[i]), int(entry.get("bytes") or 0))
    return done


def _write_error(
    exc: OSError, dst: str, dst_abs: str, records: Sequence[ShardRecord], total: int
) -> PackError:
    """The one line a failed write ends with: what failed and why, the space the shards need
    when the disk is full, and how to resume."""
    kept = sum(1 for r in records if r.sha256)
    hint = f"; {kept} finished shard(s) kept: run the same command again to resume" if kept else ""
    need = ""
    if exc.errno == errno.ENOSPC:
        hint = f"; free space on {dst} and run the same command again to resume" + (
            f" ({kept} finished shard(s) kept)" if kept else ""
        )
        need = f"; the shards take {human_bytes(total)} in all"
    return PackError(f"cannot write {exc.filename or dst}: {_why(exc, dst_abs)}{need}{hint}")


def _why(exc: OSError, path: str) -> str:
    """The reason of a write error, with the free space when the disk is full."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        with contextlib.suppress(OSError):
            st = os.statvfs(path)
            why += f" ({human_bytes(st.f_bavail * st.f_frsize)} free)"
    return why


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
        nbytes, digest = sha256_file(tmp)
        record.bytes, record.sha256 = nbytes, digest
        os.replace(tmp, os.path.join(self.dst, record.name))
        fsync_dir(self.dst)
        self.save()
        self.progress.shard_done(record)
