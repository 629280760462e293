"""A PyTorch training whose DataLoader workers cannot keep up: each sample goes through a heavy
CPU transform (repeated blur and tone curve on a small image, ~30 ms a sample) and the model is
tiny, so the training loop mostly waits for its next batch (input-bound on the CPU transform).

A held-out training, written as a user writes one: it contains no stallscope code. It measures
its own data wait (the time spent in ``next(iterator)``, over the training loop's wall time)
and prints it at the end as ``data wait: 87.3% of 15.1 s (measured by the trainer)``.

    python torch_prep.py --workers 1 --seconds 15
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class BlurredImages(Dataset):
    """Random 3×96×96 images, each blurred and tone-mapped ``rounds`` times when it is read."""

    def __init__(self, n: int = 2048, size: int = 96, rounds: int = 100, classes: int = 10):
        self.n, self.size, self.rounds, self.classes = n, size, rounds, classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        x = rng.random((3, self.size, self.size), dtype=np.float32)
        for _ in range(self.rounds):
            x = 0.25 * (np.roll(x, 1, 1) + np.roll(x, -1, 1) + np.roll(x, 1, 2)
                        + np.roll(x, -1, 2))
            x = np.tanh(1.5 * x + 0.1)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), i % self.classes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()

    loader = DataLoader(BlurredImages(), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    model = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    wait = 0.0
    steps = 0
    start = time.perf_counter()
    done = False
    while not done:
        t = time.perf_counter()
        it = iter(loader)
        wait += time.perf_counter() - t
        while True:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            finally:
                wait += time.perf_counter() - t
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            if time.perf_counter() - start >= args.seconds:
                done = True
                break
    wall = time.perf_counter() - start
    print(f"{steps} steps, last loss {loss.item():.3f}", flush=True)
    print(f"data wait: {100 * wait / wall:.1f}% of {wall:.1f} s "
          "(measured by the trainer)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
