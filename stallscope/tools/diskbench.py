"""Read benchmark of the filesystem that holds a path: what a data loader can get from it.

Four figures, each at queue depth 1 (one reader, like one DataLoader worker), measured in a
temporary directory on that filesystem — never on the raw device, never as root:

* ``seq_cached_mb_s`` -- sequential 1 MiB reads of a file already in the page cache
  (``hdparm -T``); bounded by memory bandwidth and the CPU.
* ``seq_cold_mb_s`` -- the same from the device: ``O_DIRECT``, or ``posix_fadvise(DONTNEED)``
  where the filesystem refuses ``O_DIRECT`` (``hdparm -t``).
* ``rand_iops`` and ``rand_lat_us`` -- 4 KiB reads at random aligned offsets, ``O_DIRECT``,
  with latency percentiles (``fio --rw=randread --bs=4k --direct=1``).
* ``small_files_per_s`` -- open + read + close of a directory of 100 KiB files whose pages were
  dropped first: what an ImageFolder-style dataset costs per sample.

MB means 10^6 bytes (as fio's ``bw_bytes`` and hdparm print). Two engines run the same
:class:`BenchPlan`: the built-in one (:func:`run_builtin`) and fio (:func:`run_fio`,
``--output-format=json``); :func:`compare` sets them side by side. :func:`classify` names the
device class from sysfs and :func:`judge` flags figures far below what a healthy device of that
class delivers (both in :mod:`stallscope.tools.diskclass`, re-exported here). Temporary files
are removed on every exit, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

from stallscope.errors import ParseError, SourceUnavailable, UsageError
from stallscope.tools.diskclass import HEALTHY, Expectation, classify, compare, judge

__all__ = [
    "HEALTHY",
    "BenchPlan",
    "BenchReport",
    "BenchResult",
    "Expectation",
    "classify",
    "compare",
    "fio_argv",
    "judge",
    "parse_fio",
    "parse_size",
    "percentiles",
    "run_builtin",
    "run_fio",
]

KiB = 1024
MiB = 1024 * KiB
MB = 1_000_000
#: progress callback: (phase name, fraction done 0..1)
Progress = Callable[[str, float], None]
PHASES = ("prepare", "seq_cold", "rand4k", "seq_cached", "small_files")
_PCTS = (50.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True)
class BenchPlan:
    """What both engines run. Sizes in bytes, durations in seconds."""

    size_bytes: int = 256 * MiB  #: the test file for sequential and random reads
    seconds: float = 2.0  #: duration of each timed phase (seq cold, random, seq cached)
    seq_block: int = MiB
    rand_block: int = 4 * KiB
    small_files: int = 1000
    small_file_bytes: int = 100 * KiB

    def __post_init__(self) -> None:
        if self.size_bytes < self.seq_block or self.size_bytes % self.rand_block:
            raise UsageError(
                f"bench size must be ≥ {self.seq_block // MiB} MiB and a "
                f"multiple of {self.rand_block} bytes (got {self.size_bytes})"
            )
        if not 0.05 <= self.seconds <= 600:
            raise UsageError(f"bench phase duration must be 0.05–600 s (got {self.seconds})")
        if not 1 <= self.small_files <= 1_000_000:
            raise UsageError(f"small-file count must be 1–1000000 (got {self.small_files})")

    @property
    def disk_bytes(self) -> int:
        """Space the plan needs on the filesystem."""
        return self.size_bytes + self.small_files * self.small_file_bytes


@dataclass(frozen=True)
class BenchResult:
    """One engine's figures (MB = 10^6 bytes; latency in microseconds)."""

    engine: str  #: "builtin" or "fio"
    seq_cached_mb_s: float
    seq_cold_mb_s: float
    rand_iops: float
    rand_lat_us: Mapping[str, float]  #: "p50", "p90", "p99", "p99.9", "mean"
    small_files_per_s: float
    cold_method: str  #: "O_DIRECT" or "fadvise" (when the filesystem refuses O_DIRECT)
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["rand_lat_us"] = dict(self.rand_lat_us)
        d["notes"] = list(self.notes)
        return d


def parse_size(text: str) -> int:
    """``"256M"``, ``"1G"``, ``"64MiB"``, ``"4096"`` -> bytes (binary multiples)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KiB, "M": MiB, "G": 1024 * MiB, "T": 1024 * 1024 * MiB}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMGT" and t else t
    try:
        val = float(num)
    except ValueError:
        raise UsageError(f"not a size: {text!r} (e.g. 256M, 1G)") from None
    if not math.isfinite(val) or val <= 0:
        raise UsageError(f"not a size: {text!r} (e.g. 256M, 1G)")
    return int(val * mult)


def percentiles(samples: Sequence[float], pcts: Sequence[float] = _PCTS) -> dict[str, float]:
    """Nearest-rank percentiles of ``samples`` as ``{"p50": ..., "p99.9": ...}``."""
    if not samples:
        return {}
    s = sorted(samples)
    out = {}
    for p in pcts:
        rank = max(1, math.ceil(round(p * len(s) / 100.0, 9)))  # 99.9% of 1000 is 999
        out[f"p{p:g}"] = float(s[rank - 1])
    return out


# --- interruption and cleanup ---------------------------------------------------------------


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt while benchmarking, so ``finally`` blocks
    remove the temporary files (only possible from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _workdir(directory: str, plan: BenchPlan) -> Iterator[str]:
    if not os.path.isdir(directory):
        raise UsageError(f"not a directory: {directory}")
    try:
        st = os.statvfs(directory)
    except OSError as exc:
        raise UsageError(f"cannot inspect {directory}: {exc.strerror}") from None
    free = st.f_bavail * st.f_frsize
    if free < plan.disk_bytes * 1.1 + 64 * MiB:
        raise UsageError(
            f"{directory} has {free / MiB:.0f} MiB free; the bench needs "
            f"{plan.disk_bytes * 1.1 / MiB:.0f} MiB (use a smaller --size)"
        )
    try:
        work = tempfile.mkdtemp(prefix=".stallscope-bench-", dir=directory)
    except OSError as exc:
        raise UsageError(
            f"cannot write in {directory} ({exc.strerror}): the bench needs a "
            "writable directory on the filesystem to test"
        ) from None
    try:
        with _interruptible():
            yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _Ticker:
    """Calls progress at most every 0.1 s."""

    def __init__(self, progress: Progress | None, phase: str) -> None:
        self.progress, self.phase, self.last = progress, phase, 0.0

    def __call__(self, frac: float, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (force or now - self.last >= 0.1):
            self.last = now
            self.progress(self.phase, min(1.0, max(0.0, frac)))


# --- built-in engine -----------------------------------------------------------------------


def _fill(buf: mmap.mmap, counter: int) -> None:
    # a fresh stamp per block so no layer can deduplicate or compress the file away
    buf[:16] = counter.to_bytes(8, "little") + os.urandom(8)


def _write_file(
    path: str, size: int, block: bytes, tick: _Ticker | None, base: float, span: float
) -> None:
    buf = mmap.mmap(-1, len(block))
    buf[:] = block
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        done = 0
        while done < size:
            n = min(len(block), size - done)
            _fill(buf, done)
            os.write(fd, memoryview(buf)[:n])
            done += n
            if tick:
                tick(base + span * done / size)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
        buf.close()


def _open_direct(path: str) -> int | None:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None
    buf = mmap.mmap(-1, 4096)
    try:
        os.preadv(fd, [buf], 0)
    except OSError:
        os.close(fd)
        return None
    finally:
        buf.close()
    return fd


def _drop(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _seq(
    fd: int, size: int, block: int, seconds: float, tick: _Ticker, drop_on_wrap: bool
) -> float:
    """Read ``fd`` sequentially in ``block`` pieces for ``seconds``; bytes/s."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # as fio's fadvise_hint does
    buf = mmap.mmap(-1, block)
    try:
        off = total = 0
        t0 = time.perf_counter()
        el = 0.0
        while el < seconds:
            if off >= size:
                off = 0
                if drop_on_wrap:
                    _drop(fd)
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                off = size
                continue
            off += n
            total += n
            el = time.perf_counter() - t0
            tick(el / seconds)
        return total / el if el > 0 else 0.0
    finally:
        buf.close()


def _rand(
    fd: int, size: int, block: int, seconds: float, tick: _Ticker
) -> tuple[float, list[float]]:
    """4 KiB reads at random aligned offsets for ``seconds``: (IOPS, latencies in µs)."""
    buf = mmap.mmap(-1, block)
    iov = [buf]
    preadv = os.preadv
    clock = time.perf_counter_ns
    blocks = size // block
    rng = random.Random()
    lat: list[int] = []
    add = lat.append
    try:
        t0 = clock()
        end = t0 + int(seconds * 1e9)
        now = t0
        while now < end:
            # offsets drawn in batches, outside the timed reads, to keep Python's share of
            # each read small (its CPU time competes with the I/O path on a busy machine)
            for off in [b * block for b in rng.choices(range(blocks), k=256)]:
                a = clock()
                preadv(fd, iov, off)
                now = clock()
                add(now - a)
                if now >= end:
                    break
            tick((now - t0) / (end - t0))
        el = (now - t0) / 1e9
    finally:
        buf.close()
    return (len(lat) / el if el > 0 else 0.0), [x / 1000.0 for x in lat]


def _small_files(work: str, plan: BenchPlan, block: bytes, prep: _Ticker, tick: _Ticker) -> float:
    d = os.path.join(work, "small")
    os.mkdir(d)
    names = [os.path.join(d, f"f{i:06d}.bin") for i in range(plan.small_files)]
    data = bytearray(block[: plan.small_file_bytes].ljust(plan.small_file_bytes, b"\0"))
    for i, name in enumerate(names):
        data[:8] = i.to_bytes(8, "little")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        prep(0.8 * (i + 1) / len(names))
    os.sync()  # one flush for all (per-file fsync would cost minutes on an HDD)
    for name in names:
        fd = os.open(name, os.O_RDONLY)
        try:
            _drop(fd)
        finally:
            os.close(fd)
    prep(1.0, force=True)
    buf = mmap.mmap(-1, plan.small_file_bytes + 4096)
    try:
        t0 = time.perf_counter()
        for i, name in enumerate(names):
            fd = os.open(name, os.O_RDONLY)
            try:
                _drop(fd)  # cold for sure, as fio's invalidate=1 does at each open
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # fio's fadvise_hint
                # one read: a short read already tells EOF (as fio's bs=filesize does)
                os.readv(fd, [buf])
            finally:
                os.close(fd)
            if i % 64 == 0:
                tick((i + 1) / len(names))
        el = time.perf_counter() - t0
    finally:
        buf.close()
    return len(names) / el if el > 0 else 0.0


def run_builtin(directory: str, plan: BenchPlan, progress: Progress | None = None) -> BenchResult:
    """Run ``plan`` with the built-in engine in a temporary directory under ``directory``.

    Equivalent: ``hdparm -Tt`` (sequential cached/cold) and ``fio --rw=randread --bs=4k
    --direct=1`` (random), without root and without opening the raw device."""
    block = os.urandom(MiB)
    notes: list[str] = []
    with _workdir(directory, plan) as work:
        prep = _Ticker(progress, "prepare")
        path = os.path.join(work, "seq.dat")
        _write_file(path, plan.size_bytes, block, prep, 0.0, 1.0)
        prep(1.0, force=True)

        dfd = _open_direct(path)
        method = "O_DIRECT" if dfd is not None else "fadvise"
        if dfd is None:
            notes.append(
                "the filesystem refuses O_DIRECT: cold reads use posix_fadvise(DONTNEED) instead"
            )
            dfd = os.open(path, os.O_RDONLY)
            _drop(dfd)
        try:
            t = _Ticker(progress, "seq_cold")
            cold = _seq(
                dfd,
                plan.size_bytes,
                plan.seq_block,
                plan.seconds,
                t,
                drop_on_wrap=method != "O_DIRECT",
            )
            t(1.0, force=True)
            if method != "O_DIRECT":
                _drop(dfd)
            os.posix_fadvise(dfd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead, as fio
            t = _Ticker(progress, "rand4k")
            iops, lat = _rand(dfd, plan.size_bytes, plan.rand_block, plan.seconds, t)
            t(1.0, force=True)
        finally:
            os.close(dfd)

        fd = os.open(path, os.O_RDONLY)
        try:
            t = _Ticker(progress, "seq_cached")
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            warm_buf = mmap.mmap(-1, plan.seq_block)
            try:  # make sure every page is in: one full pass
                off = 0
                while off < plan.size_bytes:
                    n = os.preadv(fd, [warm_buf], off)
                    if n <= 0:
                        break
                    off += n
            finally:
                warm_buf.close()
            cached = _seq(fd, plan.size_bytes, plan.seq_block, plan.seconds, t, False)
            t(1.0, force=True)
        finally:
            os.close(fd)
        os.unlink(path)  # free its pages before the small-file phase

        small = _small_files(
            work, plan, block, _Ticker(progress, "prepare"), _Ticker(progress, "small_files")
        )
        if progress:
            progress("small_files", 1.0)

    lat_summary = percentiles(lat)
    if lat:
        lat_summary["mean"] = sum(lat) / len(lat)
    return BenchResult(
        "builtin", cached / MB, cold / MB, iops, lat_summary, small, method, tuple(notes)
    )


# --- fio engine ----------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def fio_argv(
    work: str, plan: BenchPlan, *, fio: str = "fio", direct: bool = True, output: str | None = None
) -> list[str]:
    """The fio command line running ``plan`` in ``work`` (same phases, same order as the
    built-in engine; each job ``stonewall``-ed so they run one after another)."""
    # fio splits --filename/--directory at ':' (several files); a colon in PATH is escaped
    work = work.replace(":", "\\:")
    data = os.path.join(work, "seq.dat")
    d = "1" if direct else "0"
    size = str(plan.size_bytes)
    rt = _ms(plan.seconds)
    argv = [fio, "--output-format=json"]
    if output:
        argv.append(f"--output={output}")
    argv += ["--ioengine=psync", "--iodepth=1"]
    argv += [
        "--name=seq_cold",
        f"--filename={data}",
        f"--size={size}",
        "--rw=read",
        f"--bs={plan.seq_block}",
        f"--direct={d}",
        "--time_based",
        f"--runtime={rt}",
        "--stonewall",
    ]
    argv += [
        "--name=rand4k",
        f"--filename={data}",
        f"--size={size}",
        "--rw=randread",
        f"--bs={plan.rand_block}",
        f"--direct={d}",
        "--time_based",
        f"--runtime={rt}",
        "--norandommap",
        "--randrepeat=0",
        "--percentile_list=50:90:99:99.9",
        "--stonewall",
    ]
    argv += [
        "--name=warm",
        f"--filename={data}",
        f"--size={size}",
        "--rw=read",
        f"--bs={plan.seq_block}",
        "--direct=0",
        "--invalidate=0",
        "--stonewall",
    ]
    argv += [
        "--name=seq_cached",
        f"--filename={data}",
        f"--size={size}",
        "--rw=read",
        f"--bs={plan.seq_block}",
        "--direct=0",
        "--invalidate=0",
        "--time_based",
        f"--runtime={rt}",
        "--stonewall",
    ]
    small = os.path.join(work, "small")
    argv += [
        "--name=small_files",
        f"--directory={small}",
        f"--nrfiles={plan.small_files}",
        f"--filesize={plan.small_file_bytes}",
        f"--size={plan.small_files * plan.small_file_bytes}",
        "--rw=read",
        f"--bs={plan.small_file_bytes}",
        "--direct=0",
        "--invalidate=1",
        "--openfiles=1",
        "--file_service_type=sequential",
        "--stonewall",
    ]
    return argv


def _job(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    jobs = doc.get("jobs")
    if isinstance(jobs, list):
        for j in jobs:
            if isinstance(j, dict) and j.get("jobname") == name:
                read = j.get("read")
                if isinstance(read, dict):
                    return read
    raise ParseError(f"fio output has no read results for job {name!r}")


def _num(d: Mapping[str, Any], key: str, job: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ParseError(f"fio job {job!r}: {key!r} is {v!r}, not a number")
    return float(v)


def parse_fio(doc: Mapping[str, Any], plan: BenchPlan, *, direct: bool = True) -> BenchResult:
    """fio's ``--output-format=json`` for :func:`fio_argv`'s jobs -> :class:`BenchResult`
    (pure). Bandwidth from ``read.bw_bytes``; IOPS from ``read.iops``; latency percentiles
    from ``read.clat_ns.percentile`` (psync: completion latency is the whole read); files/s
    from ``io_bytes / filesize / runtime``."""
    cold = _job(doc, "seq_cold")
    rand = _job(doc, "rand4k")
    cached = _job(doc, "seq_cached")
    small = _job(doc, "small_files")
    lat: dict[str, float] = {}
    clat = rand.get("clat_ns")
    pct = clat.get("percentile") if isinstance(clat, dict) else None
    if isinstance(pct, dict):
        for p in _PCTS:
            v = pct.get(f"{p:.6f}")
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                lat[f"p{p:g}"] = v / 1000.0
    lat_ns = rand.get("lat_ns")
    if isinstance(lat_ns, dict) and isinstance(lat_ns.get("mean"), (int, float)):
        lat["mean"] = float(lat_ns["mean"]) / 1000.0
    runtime_ms = _num(small, "runtime", "small_files")
    files = _num(small, "io_bytes", "small_files") / plan.small_file_bytes
    return BenchResult(
        "fio",
        seq_cached_mb_s=_num(cached, "bw_bytes", "seq_cached") / MB,
        seq_cold_mb_s=_num(cold, "bw_bytes", "seq_cold") / MB,
        rand_iops=_num(rand, "iops", "rand4k"),
        rand_lat_us=lat,
        small_files_per_s=files / (runtime_ms / 1000.0) if runtime_ms > 0 else 0.0,
        cold_method="O_DIRECT" if direct else "fadvise",
        notes=("fio's runtime has 1 ms resolution: small-file rates from short runs are rough",)
        if 0 < runtime_ms < 100
        else (),
    )


def run_fio(
    directory: str, plan: BenchPlan, progress: Progress | None = None, *, fio: str = "fio"
) -> BenchResult:
    """Run ``plan`` through fio (``fio --output-format=json``, an argv list) in a temporary
    directory under ``directory``; SourceUnavailable when fio is not installed."""
    exe = shutil.which(fio)
    if exe is None:
        raise SourceUnavailable(f"{fio} is not installed (apt install fio): --engine fio needs it")
    with _workdir(directory, plan) as work:
        direct = True
        probe = os.path.join(work, "probe")
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
        pfd = _open_direct(probe)
        if pfd is None:
            direct = False
        else:
            os.close(pfd)
        os.unlink(probe)
        os.mkdir(os.path.join(work, "small"))  # fio does not create --directory
        out = os.path.join(work, "fio.json")
        argv = fio_argv(work, plan, fio=exe, direct=direct, output=out)
        # rough schedule for the progress bar: layout, three timed phases, small files
        expect = 3 * plan.seconds + plan.disk_bytes / (200 * MB) + 1.0
        t0 = time.monotonic()
        with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as p:
            try:
                while True:
                    try:
                        p.wait(timeout=0.1)
                        break
                    except subprocess.TimeoutExpired:
                        if progress:
                            progress("fio", min(0.99, (time.monotonic() - t0) / expect))
            except BaseException:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                raise
            err = p.stderr.read().decode("utf-8", "replace") if p.stderr else ""
        if p.returncode != 0:
            first = err.strip().splitlines()[-1] if err.strip() else "no message"
            raise SourceUnavailable(f"fio failed (exit {p.returncode}): {first}")
        if progress:
            progress("fio", 1.0)
        try:
            with open(out, encoding="utf-8") as f:
                text = f.read()
            doc = json.loads(text[text.index("{") :])  # fio may print notes before the JSON
        except (OSError, ValueError) as exc:
            raise ParseError(f"fio wrote no readable JSON ({exc})") from None
    res = parse_fio(doc, plan, direct=direct)
    if not direct:
        res = BenchResult(
            **{
                **asdict(res),
                "notes": (*res.notes, "the filesystem refuses O_DIRECT: fio ran with --direct=0"),
            }
        )
    return res


@dataclass
class BenchReport:
    """Everything ``disk --bench`` reports about one path."""

    path: str
    mount_point: str
    fstype: str
    devices: list[str]
    device_class: str
    plan: BenchPlan
    results: list[BenchResult] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        exp = HEALTHY.get(self.device_class)
        out: dict[str, Any] = {
            "path": self.path,
            "mount_point": self.mount_point,
            "fstype": self.fstype,
            "devices": self.devices,
            "class": self.device_class,
            "healthy": None
            if exp is None
            else {
                "label": exp.label,
                "seq_cold_mb_s": list(exp.seq_cold_mb_s),
                "rand_iops": list(exp.rand_iops),
                "small_files_per_s": list(exp.small_files_per_s),
                "note": exp.note,
            },
            "plan": asdict(self.plan),
            "flags": self.flags,
        }
        for r in self.results:
            out[r.engine] = r.to_json()
        if len(self.results) == 2:
            out["compare"] = compare(self.results[0], self.results[1])
        return out
