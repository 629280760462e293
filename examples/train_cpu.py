"""A small CPU training run to watch with stallscope (the default demo).

It writes synthetic images (raw uint8 CHW files, one per sample) into a temporary folder,
reads them back through a PyTorch DataLoader with worker processes, applies a per-sample CPU
transform, and trains a small convolutional network on them.

    stallscope run -- python examples/train_cpu.py

As it comes (the demo), one worker's transform cannot keep up with the model: an input-bound
(prep) run. Knobs reproduce the classic bottlenecks (see docs/scenarios.md):
  --prep-cost N      extra CPU work per sample (N blur passes; default 20, 0 for none)
  --workers N        DataLoader worker processes (default 1)
  --model heavy      a wider network: compute-bound (the healthy case)
  --data-dir DIR     read (and create if missing) the files there, e.g. on a throttled device
  --cold             evict the files from the page cache before each epoch (fetch from storage)
  --autotune         let stallscope.watch(loader, autotune=True) set the worker count
  --tail-share F --tail-times K   a share F of the samples (a fixed set) costs K times the
                     others' transform: slow samples that hold up their batch (head of line)
  --no-in-order      DataLoader(in_order=False): batches handed over as they are ready
  --start-method M   the workers' start method: fork (Linux's default), spawn, forkserver
  --step-ms MS       each step also waits MS ms, as for a GPU's kernels: a step that leaves
                     the CPU to the loader (default 0)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset


class FileImages(Dataset[tuple[torch.Tensor, int]]):
    """Images stored one per file as raw uint8 (C, H, W) bytes; label in the file name."""

    def __init__(
        self, root: Path, size: int, prep_cost: int, tail_share: float = 0.0, tail_times: int = 1
    ) -> None:
        self.files = sorted(root.glob("*.bin"))
        self.size = size
        self.prep_cost = prep_cost
        self.kernel = torch.ones(3, 1, 3, 3) / 9.0
        # a fixed share of the samples (the same ones every epoch) whose transform costs
        # tail_times the others': a few slow samples (large images, long clips)
        rng = np.random.default_rng(1)
        slow = rng.permutation(len(self.files))[: round(tail_share * len(self.files))]
        self.slow = frozenset(int(i) for i in slow)
        self.tail_times = tail_times

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path = self.files[i]
        raw = np.fromfile(path, dtype=np.uint8).reshape(3, self.size, self.size)
        x = torch.from_numpy(raw.astype(np.float32) / 255.0)
        if torch.rand(1).item() < 0.5:  # random horizontal flip
            x = x.flip(-1)
        passes = self.prep_cost * (self.tail_times if i in self.slow else 1)
        for _ in range(passes):  # stand-in for JPEG decode + augmentation
            x = F.conv2d(x.unsqueeze(0), self.kernel, padding=1, groups=3).squeeze(0)
        label = int(path.stem.split("_")[1])
        return (x - 0.5) / 0.25, label


class ThreadedImages(FileImages):
    """The same samples, each batch's decoded on a thread pool in the trainer's own process
    (``__getitems__``, which a DataLoader calls for a whole batch): loading on threads with
    ``num_workers=0``, as a threaded JPEG decoder does. The convolutions release the GIL, so the
    threads do run in parallel."""

    def __init__(self, root: Path, size: int, prep_cost: int, threads: int) -> None:
        super().__init__(root, size, prep_cost)
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="decode")
        return list(self._pool.map(self.__getitem__, indices))


class _WorkerInit:
    """A worker's start-up work (a picklable callable: works with every start method)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, _worker_id: int) -> None:
        if self.seconds > 0:
            time.sleep(self.seconds)


def make_files(root: Path, n: int, size: int, classes: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    have = len(list(root.glob("*.bin")))
    if have >= n:
        return
    rng = np.random.default_rng(0)
    for i in range(have, n):
        label = i % classes
        img = rng.integers(0, 256, size=(3, size, size), dtype=np.uint8)
        img[label % 3] //= 2  # give each class a learnable tint
        img.tofile(root / f"{i:07d}_{label}.bin")
    # written pages must reach the disk before they can be evicted (--cold): pay for that here,
    # not in the first epoch, where a sync of fresh files behind a read throttle takes seconds
    os.sync()


def evict(root: Path) -> None:
    """Drop the dataset's pages from the page cache so reads hit the device."""
    os.sync()  # dirty pages (just-written files) are not dropped until written back
    for p in root.glob("*.bin"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def model_for(kind: str, classes: int) -> nn.Module:
    width = {"tiny": 8, "small": 16, "heavy": 96}[kind]
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, width * 2, 3, padding=1),
        nn.ReLU(),
    ]
    if kind == "heavy":
        layers += [
            nn.Conv2d(width * 2, width * 2, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width * 2, width * 2, 3, padding=1),
            nn.ReLU(),
        ]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width * 2, classes)]
    return nn.Sequential(*layers)


def _count(text: str) -> int:
    """A number of threads: 0 or more."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--size", type=int, default=64, help="image side in pixels")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--data-dir", type=Path, help="dataset folder (default: a temp folder)")
    # the defaults are the README's demo: one DataLoader worker whose transform is too slow for
    # the model, so the run shows what stallscope is for (the trainer waits for data about half
    # the time; the diagnosis names the worker's CPU as the bottleneck). Scenarios set their own.
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=0, help="stop after this long")
    ap.add_argument(
        "--prep-cost",
        type=int,
        default=20,
        help="extra CPU passes per sample (default 20: an expensive transform; 0 for none)",
    )
    ap.add_argument("--model", choices=("tiny", "small", "heavy"), default="small")
    ap.add_argument("--cold", action="store_true", help="evict files before each epoch")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in the trainer")
    ap.add_argument(
        "--decode-threads",
        type=_count,
        default=0,
        metavar="N",
        help="with --workers 0: decode each batch on N threads of the trainer's own "
        "process (loading on threads, not worker processes)",
    )
    ap.add_argument("--no-probe", action="store_true", help="do not use stallscope.watch")
    ap.add_argument(
        "--autotune",
        action="store_true",
        help="stallscope.watch(loader, autotune=True): let stallscope set "
        "num_workers and prefetch_factor between epochs",
    )
    ap.add_argument(
        "--no-persistent",
        action="store_true",
        help="restart the DataLoader workers every epoch (persistent_workers=False)",
    )
    ap.add_argument(
        "--worker-init-s",
        type=float,
        default=0.0,
        metavar="S",
        help="each worker spends S s setting up when it starts (opening a database, "
        "loading an index): paid every epoch without persistent workers",
    )
    ap.add_argument(
        "--tail-share",
        type=float,
        default=0.0,
        metavar="F",
        help="this share of the samples (a fixed set) is slow (default 0: none)",
    )
    ap.add_argument(
        "--tail-times",
        type=int,
        default=1,
        metavar="K",
        help="a slow sample's transform costs K times the others' (default 1)",
    )
    ap.add_argument(
        "--no-in-order",
        action="store_true",
        help="DataLoader(in_order=False): hand batches over as they are ready, "
        "not in the sampler's order (PyTorch >= 2.6)",
    )
    ap.add_argument(
        "--start-method",
        choices=("fork", "spawn", "forkserver"),
        help="the workers' start method (DataLoader multiprocessing_context; default: the "
        "platform's, fork on Linux)",
    )
    ap.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="each step also waits MS ms (a stand-in for a GPU's step: the CPU is "
        "left to the loader; default 0)",
    )
    ap.add_argument(
        "--shm-fill",
        type=int,
        default=0,
        metavar="MIB",
        help="occupy this much of /dev/shm while training (shm-pressure demo)",
    )
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    tmp = None
    root = args.data_dir
    if root is None:
        tmp = tempfile.mkdtemp(prefix="stallscope-demo-")
        root = Path(tmp)
    shm_file = Path("/dev/shm") / f"stallscope-demo-{os.getpid()}"
    try:
        if args.shm_fill:
            with shm_file.open("wb") as f:
                for _ in range(args.shm_fill):
                    f.write(b"\0" * 1048576)
        t0 = time.perf_counter()
        make_files(root, args.files, args.size, args.classes)
        print(
            f"dataset: {args.files} files in {root} ({time.perf_counter() - t0:.1f} s)", flush=True
        )
        ds = (
            ThreadedImages(root, args.size, args.prep_cost, args.decode_threads)
            if args.decode_threads and not args.workers
            else FileImages(root, args.size, args.prep_cost, args.tail_share, args.tail_times)
        )
        # in_order=False only where it is asked for: the DataLoader's own default otherwise
        extra: dict[str, Any] = {"in_order": False} if args.no_in_order and args.workers else {}
        if args.start_method and args.workers:
            extra["multiprocessing_context"] = args.start_method
        loader = DataLoader(
            ds,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            persistent_workers=args.workers > 0 and not args.no_persistent,
            worker_init_fn=_WorkerInit(args.worker_init_s) if args.workers else None,
            **extra,
        )
        watch = None
        if not args.no_probe:
            try:
                from stallscope import watch
            except ImportError:
                watch = None
        model = model_for(args.model, args.classes)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        start = time.perf_counter()
        step = 0
        wait_total = 0.0  # the trainer's own measure of its data wait (ground truth for tests)
        for epoch in range(args.epochs):
            if args.cold:
                evict(root)
            batches = watch(loader, autotune=args.autotune) if watch is not None else loader
            seen, loss_sum, t_ep = 0, 0.0, time.perf_counter()
            it = iter(batches)
            while True:
                t_wait = time.perf_counter()
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                wait_total += time.perf_counter() - t_wait
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                if args.step_ms:  # the device's share of the step: the host only waits
                    time.sleep(args.step_ms / 1000)
                seen += len(y)
                loss_sum += loss.item() * len(y)
                step += 1
                if args.max_seconds and time.perf_counter() - start > args.max_seconds:
                    break
            dt = time.perf_counter() - t_ep
            print(
                f"epoch {epoch}: loss {loss_sum / max(seen, 1):.3f}, {seen / dt:.0f} "
                f"samples/s, {step} steps",
                flush=True,
            )
            if args.max_seconds and time.perf_counter() - start > args.max_seconds:
                break
        wall = time.perf_counter() - start
        print(
            f"data wait: {100 * wait_total / wall:.1f}% of {wall:.1f} s (measured by the trainer)",
            flush=True,
        )
    finally:
        shm_file.unlink(missing_ok=True)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
