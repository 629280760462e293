"""A training loop that loads its own batches, nanoGPT-style: each step its ``get_batch`` opens
the token file as an ``np.memmap`` and slices random windows out of it, on the training thread,
with no DataLoader. Run unmodified under ``stallscope run``; the sampled stacks tell the loading
(``get_batch``, NumPy's memmap) from the model's compute.

    python examples/train_memmap.py --data-dir DIR [--mb 256] [--cold] [--max-seconds 12]

``--cold`` drops the token file from the page cache first (each window then reads from the
disk: a fetch stall where the disk is slow or capped); without it the file is read once first
(cached: the loading costs little and the loop is compute-bound). The loop times its own
``get_batch`` and prints ``data wait: X% of S s`` at the end: the truth the diagnosis is
checked against (tests/scenarios/test_scenarios_memmap.py).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

VOCAB = 4096


def make_tokens(path: Path, mb: int) -> None:
    """``mb`` MB of random uint16 tokens (below :data:`VOCAB`), written once."""
    n = mb * 1_000_000 // 2
    if path.exists() and path.stat().st_size == n * 2:
        return
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        for start in range(0, n, 1 << 22):
            fh.write(rng.integers(0, VOCAB, min(1 << 22, n - start), dtype=np.uint16).tobytes())


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


def get_batch(path: Path, batch: int, block: int, rng: np.random.Generator) -> tuple:
    """nanoGPT's: a fresh memmap every batch (to avoid a memory leak, as its comment says), and
    ``batch`` random windows of ``block`` tokens."""
    import torch

    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = rng.integers(0, len(data) - block - 1, batch)
    x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block].astype(np.int64)) for i in ix])
    return x, y


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--mb", type=int, default=256, help="size of the token file")
    ap.add_argument("--cold", action="store_true", help="drop the file from the page cache")
    ap.add_argument("--max-seconds", type=float, default=12.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    path = Path(args.data_dir) / "train.bin"
    make_tokens(path, args.mb)
    (drop_cache if args.cold else warm)(path)
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, 64),
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, VOCAB),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(1)
    wait = 0.0
    steps = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.max_seconds:
        a = time.perf_counter()
        x, y = get_batch(path, args.batch, args.block, rng)
        wait += time.perf_counter() - a
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
    wall = time.perf_counter() - t0
    print(f"data wait: {100 * wait / wall:.1f}% of {wall:.1f} s ({steps} steps)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
