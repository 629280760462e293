"""A training loop fed by a thread loader: a ThreadPoolExecutor prefetches batches into a queue,
no DataLoader, and the loop takes them with ``queue.get``. Run unmodified under
``stallscope run``; the in-process sampler samples the loader threads too.

    python examples/train_threads.py --data-dir DIR [--threads 4] [--prep python|numpy|none]
        [--cold] [--workers N] [--step-ms MS] [--max-seconds 12]

Each batch is ``--batch`` files of the data folder read whole (``--cold``: dropped from the page
cache first, each epoch: a fetch stall where the disk is slow or capped) and prepared:
``python`` loops over the bytes in Python (holding the GIL: more threads cannot help),
``numpy`` sorts them with NumPy (which releases the GIL), ``none`` does nothing. ``--workers
N`` loads the same batches with a DataLoader and N worker processes instead of threads;
``--loader torchdata`` with torchdata's nodes (``ParallelMapper`` on ``--threads`` threads, then
a ``Prefetcher``: a loader of threads and queues of its own, not a DataLoader). The
loop times its own wait for batches and prints ``data wait: X% of S s`` at the end: the truth
the diagnosis is checked against (tests/scenarios/test_scenarios_threads.py). ``--step-ms MS``
makes each step also wait MS ms, as a GPU's kernels would, the GIL released: without it, a CPU
training step in Python competes with Python prep for the GIL, and the loader's cost shows as
a slower step rather than as a wait for data.
"""

from __future__ import annotations

import argparse
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

FILE_KB = 64


def make_files(folder: Path, n: int) -> list[Path]:
    """``n`` files of FILE_KB random bytes, written once."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = [folder / f"{i:05d}.bin" for i in range(n)]
    for p in paths:
        if not p.exists() or p.stat().st_size != FILE_KB * 1024:
            p.write_bytes(rng.integers(0, 256, FILE_KB * 1024, dtype=np.uint8).tobytes())
    return paths


def drop_cache(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_file(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def prepare(raw: bytes, prep: str, cost: int) -> np.ndarray:
    """One sample's preparation (see the module docstring)."""
    if prep == "python":
        acc = 0
        for _ in range(cost):
            for b in raw[:2048]:
                acc = (acc * 31 + b) & 0xFFFF
        return np.frombuffer(raw[:1024], dtype=np.uint8).astype(np.float32) + acc % 2
    arr = np.frombuffer(raw, dtype=np.uint8).astype(np.float32)
    if prep == "numpy":
        for _ in range(cost):
            arr = np.sort(arr, kind="stable")
    return arr[:1024]


def load_batch(paths: list[Path], prep: str, cost: int) -> np.ndarray:
    return np.stack([prepare(read_file(p), prep, cost) for p in paths])


class Files:
    """The same batches for a DataLoader (``--workers``): item i is batch i."""

    def __init__(self, batches: list[list[Path]], prep: str, cost: int) -> None:
        self.batches, self.prep, self.cost = batches, prep, cost

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> np.ndarray:
        return load_batch(self.batches[i], self.prep, self.cost)


def thread_batches(pool: ThreadPoolExecutor, batches: list[list[Path]], args: Any) -> Any:
    """Batches from the pool, in order, ``2 × threads`` in flight (a bounded queue of
    futures)."""
    q: queue.Queue[Any] = queue.Queue()
    ahead = 2 * args.threads
    it = iter(batches)
    for b in [next(it, None) for _ in range(ahead)]:
        if b is not None:
            q.put(pool.submit(load_batch, b, args.prep, args.cost))
    while not q.empty():
        fut = q.get()
        nxt = next(it, None)
        if nxt is not None:
            q.put(pool.submit(load_batch, nxt, args.prep, args.cost))
        yield fut.result()


def torchdata_batches(batches: list[list[Path]], args: Any) -> Any:
    """The same batches through torchdata's nodes: ``ParallelMapper`` on ``--threads`` threads
    (in order), a ``Prefetcher`` of ``2 × threads``, read by a ``Loader``."""
    import torchdata.nodes as tn

    def load(b: list[Path]) -> np.ndarray:
        return load_batch(b, args.prep, args.cost)

    node: Any = tn.IterableWrapper(batches)
    node = tn.ParallelMapper(node, load, num_workers=args.threads, method="thread")
    node = tn.Prefetcher(node, prefetch_factor=2 * args.threads)
    return tn.Loader(node)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--cold", action="store_true", help="drop the files from the page cache")
    ap.add_argument("--threads", type=int, default=4, help="loader threads")
    ap.add_argument("--workers", type=int, default=0, help="a DataLoader's worker processes")
    ap.add_argument(
        "--loader",
        choices=("pool", "torchdata"),
        default="pool",
        help="the thread loader: a ThreadPoolExecutor of our own, or torchdata's nodes",
    )
    ap.add_argument("--prep", choices=("python", "numpy", "none"), default="none")
    ap.add_argument("--cost", type=int, default=1, help="passes of the preparation")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-seconds", type=float, default=12.0)
    ap.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="each step also waits MS ms, as for a GPU's kernels (the GIL is released meanwhile)",
    )
    args = ap.parse_args()
    paths = make_files(Path(args.data_dir), args.files)
    if args.max_seconds <= 0:
        return 0
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = [paths[i : i + args.batch] for i in range(0, len(paths), args.batch)]
    pool = ThreadPoolExecutor(args.threads, thread_name_prefix="loader")
    wait = 0.0
    steps = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.max_seconds:
        if args.cold:
            drop_cache(paths)
        if args.workers:
            loader: Any = torch.utils.data.DataLoader(
                Files(batches, args.prep, args.cost), batch_size=None, num_workers=args.workers
            )
        elif args.loader == "torchdata":
            loader = torchdata_batches(batches, args)
        else:
            loader = thread_batches(pool, batches, args)
        a = time.perf_counter()
        for x in loader:
            wait += time.perf_counter() - a
            out = model(torch.as_tensor(x) / 255.0)
            opt.zero_grad(set_to_none=True)
            out.mean().backward()
            opt.step()
            if args.step_ms:  # the device's share of the step: the host only waits
                time.sleep(args.step_ms / 1000)
            steps += 1
            if time.perf_counter() - t0 >= args.max_seconds:
                break
            a = time.perf_counter()
    wall = time.perf_counter() - t0
    pool.shutdown(cancel_futures=True)
    print(f"data wait: {100 * wait / wall:.1f}% of {wall:.1f} s ({steps} steps)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
