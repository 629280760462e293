"""Benchmark `stallscope pack`: packing speed vs `tar cf`, cold-cache reads of shards vs files.

    .venv/bin/python benchmarks/bench_pack.py [--files 20000] [--dir /tmp] [--json]

1. Generates ``--files`` files of random bytes, 10–200 kB each (uniform), in an ImageFolder
   tree of 100 class folders under a temporary folder of ``--dir`` (a real disk, not tmpfs).
2. Packing, each from a cold page cache (``os.sync()`` then ``posix_fadvise(DONTNEED)`` on every
   file): ``tar cf all.tar -C src .`` followed by an fsync of the tar (stallscope fsyncs every
   shard, so both outputs are on disk when the clock stops), alternating with ``stallscope
   pack`` with its defaults, ``--repeat`` rounds (default 2, best of each); then once
   ``stallscope pack --keep-order`` (reads files in source order, as tar does).
   Goal: pack >= 0.8× tar's MB/s.
3. Reading, each from a cold page cache: the loose files through a map-style Dataset with
   ``DataLoader(shuffle=True, num_workers=W)`` (what an ImageFolder training loop does), and
   the shards through ``stallscope.tools.data.ShardDataset(shuffle_shards=True)`` with the same
   W. Samples
   return their byte count, not their bytes, so the figure is reading, not IPC.
   Goal: shards >= 3× the loose files.

4. As root with cgroup-v1 blkio: both reads again, cold, with the disk capped at
   ``--read-iops`` read requests/s (default 1000; 0 skips), which is how a network or cloud
   volume behaves; also reports how many read requests each reader issued.

Prints MB/s, files/s and the ratios. Steps 1–3 need no root (fadvise works for any reader).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stallscope.tools.pack import pack  # noqa: E402


def generate(root: Path, files: int, min_kb: int, max_kb: int, seed: int) -> tuple[list[Path], int]:
    rng = random.Random(seed)
    paths: list[Path] = []
    total = 0
    for c in range(100):
        (root / f"class_{c:03d}").mkdir(parents=True)
    for i in range(files):
        path = root / f"class_{i % 100:03d}" / f"img_{i:07d}.jpg"
        size = rng.randint(min_kb * 1000, max_kb * 1000)
        path.write_bytes(os.urandom(size))
        paths.append(path)
        total += size
    return paths, total


def evict(paths: list[Path]) -> None:
    """Drop the page-cache pages of ``paths`` (like `dd of=/dev/null iflag=nocache`)."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(paths: list[Path]) -> int | None:
    """Bytes of ``paths`` in the page cache, per util-linux `fincore` (None if missing)."""
    if not shutil.which("fincore"):
        return None
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    return sum(int(line) for line in out.stdout.split())


def time_tar(src: Path, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["tar", "cf", str(out), "-C", str(src), "."], check=True)
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def time_pack(src: Path, dst: Path, workers: int, keep_order: bool) -> float:
    t0 = time.perf_counter()
    pack(str(src), str(dst), workers=workers, shuffle_seed=None if keep_order else 0)
    return time.perf_counter() - t0


class LooseFiles:
    """Map-style dataset over files: one open+read per sample, like torchvision's ImageFolder."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = [str(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> int:
        with open(self.paths[index], "rb") as fh:
            return len(fh.read())


def _sum(batch: list[int]) -> tuple[int, int]:
    return len(batch), sum(batch)


def _payload_len(sample: dict[str, Any]) -> int:
    return len(sample["jpg"])


def _disk_of(path: Path) -> str:
    """``MAJ:MIN`` of the whole disk holding ``path`` (what blkio throttle rules name)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sys_dev = Path("/sys/dev/block") / dev
    if (sys_dev / "partition").exists():
        dev = (sys_dev.resolve().parent / "dev").read_text().strip()
    return dev


@contextlib.contextmanager
def iops_capped(path: Path, iops: int) -> Iterator[Callable[[], int]]:
    """Run the body (and the processes it forks) in a cgroup-v1 blkio group that caps reads of
    ``path``'s disk at ``iops`` requests/s. Yields a function returning the read requests the
    group issued so far (``blkio.throttle.io_serviced``)."""
    base = Path("/sys/fs/cgroup/blkio")
    if os.geteuid() != 0 or not (base / "blkio.throttle.read_iops_device").exists():
        raise RuntimeError("needs root and cgroup-v1 blkio")
    dev = _disk_of(path)
    group = base / f"stallscope-bench-pack-{os.getpid()}"
    group.mkdir()
    try:
        (group / "blkio.throttle.read_iops_device").write_text(f"{dev} {iops}")
        (group / "cgroup.procs").write_text(str(os.getpid()))

        def reads() -> int:
            for line in (group / "blkio.throttle.io_serviced").read_text().splitlines():
                if line.startswith(f"{dev} Read "):
                    return int(line.split()[2])
            return 0

        try:
            yield reads
        finally:
            (base / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        for _ in range(50):  # forked DataLoader workers may take a moment to leave
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def time_loader(dataset: Any, workers: int, batch: int, shuffle: bool) -> tuple[float, int, int]:
    from torch.utils.data import DataLoader

    loader = DataLoader(
        dataset, batch_size=batch, shuffle=shuffle, num_workers=workers, collate_fn=_sum
    )
    t0 = time.perf_counter()
    files = nbytes = 0
    for n, b in loader:
        files += n
        nbytes += b
    return time.perf_counter() - t0, files, nbytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--min-kb", type=int, default=10)
    ap.add_argument("--max-kb", type=int, default=200)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to generate (not tmpfs)")
    ap.add_argument("--workers", type=int, default=4, help="stallscope pack --workers")
    ap.add_argument("--loader-workers", type=int, default=2, help="DataLoader num_workers")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2, help="rounds of tar vs pack (best of)")
    ap.add_argument(
        "--read-iops",
        type=int,
        default=1000,
        help="also time both reads with the disk capped at this many read requests/s "
        "(cgroup-v1 blkio, root), like a cloud or network volume; 0: skip",
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from stallscope.tools.data import ShardDataset

    work = Path(tempfile.mkdtemp(prefix="bench-pack-", dir=args.dir))
    res: dict[str, Any] = {"files": args.files, "cpus": os.cpu_count(), "dir": str(work)}
    try:
        src = work / "src"
        t0 = time.perf_counter()
        paths, total = generate(src, args.files, args.min_kb, args.max_kb, args.seed)
        os.sync()
        res["bytes"] = total
        res["generate_s"] = round(time.perf_counter() - t0, 1)
        log(f"generated {args.files} files, {total / 1e9:.2f} GB in {res['generate_s']} s")

        evict(paths)
        res["resident_after_evict"] = resident_bytes(paths)
        # tar and pack alternate, best of --repeat rounds each: neighbours on a shared
        # machine only ever slow a run down, so the minimum is the least disturbed figure
        tar_runs: list[float] = []
        pack_runs: list[float] = []
        for round_ in range(args.repeat):
            evict(paths)
            tar_runs.append(time_tar(src, work / "all.tar"))
            (work / "all.tar").unlink()
            log(f"tar cf:            {tar_runs[-1]:6.2f} s  {total / tar_runs[-1] / 1e6:7.1f} MB/s")
            if round_:
                shutil.rmtree(work / "shards")
            evict(paths)
            pack_runs.append(time_pack(src, work / "shards", args.workers, keep_order=False))
            log(
                f"pack (shuffled):   {pack_runs[-1]:6.2f} s  "
                f"{total / pack_runs[-1] / 1e6:7.1f} MB/s"
            )
        tar_s, pack_s = min(tar_runs), min(pack_runs)

        evict(paths)
        keep_s = time_pack(src, work / "ordered", args.workers, keep_order=True)
        shutil.rmtree(work / "ordered")
        log(f"pack --keep-order: {keep_s:6.2f} s  {total / keep_s / 1e6:7.1f} MB/s")

        shards = sorted((work / "shards").glob("shard-*.tar"))

        evict(paths)
        loose_s, n1, b1 = time_loader(LooseFiles(paths), args.loader_workers, args.batch, True)
        log(
            f"read loose files:  {loose_s:6.2f} s  {b1 / loose_s / 1e6:7.1f} MB/s "
            f"{n1 / loose_s:8.0f} files/s"
        )
        evict(shards)
        ds = ShardDataset(work / "shards", shuffle_shards=True, transform=_payload_len)
        shard_s, n2, b2 = time_loader(ds, args.loader_workers, args.batch, False)
        log(
            f"read shards:       {shard_s:6.2f} s  {b2 / shard_s / 1e6:7.1f} MB/s "
            f"{n2 / shard_s:8.0f} files/s  ({len(shards)} shards)"
        )
        if (n1, b1) != (n2, b2) or n1 != args.files:
            raise SystemExit(f"read mismatch: files {n1}/{n2}, bytes {b1}/{b2}")

        if args.read_iops:
            try:
                with iops_capped(work, args.read_iops) as reads:
                    evict(paths)
                    r0 = reads()
                    cl_s, _, cl_b = time_loader(
                        LooseFiles(paths), args.loader_workers, args.batch, True
                    )
                    r1 = reads()
                    evict(shards)
                    r2 = reads()
                    cs_s, _, cs_b = time_loader(ds, args.loader_workers, args.batch, False)
                    r3 = reads()
                res["capped"] = {
                    "read_iops": args.read_iops,
                    "read_loose_s": round(cl_s, 2),
                    "read_shards_s": round(cs_s, 2),
                    "read_loose_mb_s": round(cl_b / cl_s / 1e6, 1),
                    "read_shards_mb_s": round(cs_b / cs_s / 1e6, 1),
                    "read_requests_loose": r1 - r0,
                    "read_requests_shards": r3 - r2,
                    "shards_vs_loose": round(cl_s / cs_s, 2),
                }
                log(
                    f"capped at {args.read_iops} IOPS: loose {cl_s:.2f} s "
                    f"({r1 - r0} read requests), shards {cs_s:.2f} s ({r3 - r2} requests)"
                )
            except (RuntimeError, OSError) as exc:
                log(f"IOPS-capped run skipped: {exc}")

        res.update(
            tar_runs_s=[round(t, 2) for t in tar_runs],
            pack_runs_s=[round(t, 2) for t in pack_runs],
            tar_s=round(tar_s, 2),
            pack_s=round(pack_s, 2),
            pack_keep_order_s=round(keep_s, 2),
            tar_mb_s=round(total / tar_s / 1e6, 1),
            pack_mb_s=round(total / pack_s / 1e6, 1),
            pack_keep_order_mb_s=round(total / keep_s / 1e6, 1),
            pack_vs_tar=round(tar_s / pack_s, 2),
            pack_keep_order_vs_tar=round(tar_s / keep_s, 2),
            shards=len(shards),
            loader_workers=args.loader_workers,
            read_loose_s=round(loose_s, 2),
            read_shards_s=round(shard_s, 2),
            read_loose_mb_s=round(b1 / loose_s / 1e6, 1),
            read_shards_mb_s=round(b2 / shard_s / 1e6, 1),
            read_loose_files_s=round(n1 / loose_s),
            read_shards_files_s=round(n2 / shard_s),
            shards_vs_loose=round(loose_s / shard_s, 2),
        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(
            f"pack / tar speed:    {res['pack_vs_tar']:.2f}x  (goal >= 0.8x; "
            f"--keep-order {res['pack_keep_order_vs_tar']:.2f}x)"
        )
        print(
            f"shards / loose read: {res['shards_vs_loose']:.2f}x  (goal >= 3x, cold cache, "
            f"{args.loader_workers} DataLoader workers)"
        )
        if "capped" in res:
            print(
                f"same, disk capped at {args.read_iops} read IOPS: "
                f"{res['capped']['shards_vs_loose']:.2f}x"
            )
    return 0


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
