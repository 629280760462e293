"""A compute-bound PyTorch training: the whole data set sits in memory (a ``TensorDataset``),
the DataLoader runs on the training thread (``num_workers=0``) and only indexes and stacks
tensors, and the model is a small convolutional network that takes most of every step. The
loop hardly ever waits for its next batch.

A held-out training, written as a user writes one: it contains no stallscope code. It measures
its own data wait (the time spent in ``next(iterator)``, over the training loop's wall time)
and prints it at the end as ``data wait: 1.2% of 15.1 s (measured by the trainer)``.

    python torch_compute.py --seconds 15
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    g = torch.Generator().manual_seed(0)
    images = torch.rand(2048, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (2048,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size,
                        shuffle=True, num_workers=0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    wait = 0.0
    steps = 0
    start = time.perf_counter()
    done = False
    while not done:
        it = iter(loader)
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
