"""A Lightning (``lightning.pytorch``) training of a tiny LightningModule on a slow Dataset: every
sample goes through a heavy CPU transform (repeated blur and tone curve on a small image,
~30 ms a sample) in one DataLoader worker, which cannot keep up with the model, so the fit loop
mostly waits for its next batch (input-bound on the CPU transform). Time-limited with the
Trainer's own ``max_time``; no logger, no checkpoints, no progress bar.

A held-out training, written as a user writes one: it contains no stallscope code. It measures
its own data wait: ``train_dataloader`` returns the DataLoader wrapped in a small iterable that
times each ``next()`` on it; the wait is that time over the wall time of the fit loop (from its
first request for a batch to ``on_train_end``). It prints ``data wait: 87.3% of 15.1 s
(measured by the trainer)`` at the end.

    python lightning_train.py --seconds 15
"""

from __future__ import annotations

import argparse
import time
import warnings

import lightning.pytorch as pl
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


class TimedBatches:
    """A DataLoader, with the time spent getting each batch added up."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.wait = 0.0
        self.first: float | None = None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        t = time.perf_counter()
        if self.first is None:
            self.first = t
        it = iter(self.loader)
        self.wait += time.perf_counter() - t
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                self.wait += time.perf_counter() - t
                return
            self.wait += time.perf_counter() - t
            yield batch


class TinyClassifier(pl.LightningModule):
    def __init__(self, workers: int, batch_size: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
        self.workers, self.batch_size = workers, batch_size
        self.timed: TimedBatches | None = None
        self.end = 0.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        loader = DataLoader(BlurredImages(), batch_size=self.batch_size, shuffle=True,
                            num_workers=self.workers, persistent_workers=self.workers > 0)
        self.timed = TimedBatches(loader)
        return self.timed

    def on_train_end(self) -> None:
        self.end = time.perf_counter()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    pl.seed_everything(0, verbose=False)
    model = TinyClassifier(args.workers, args.batch_size)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1000,
                         max_time={"seconds": args.seconds}, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model)
    timed = model.timed
    wall = model.end - timed.first
    print(f"{trainer.global_step} steps", flush=True)
    print(f"data wait: {100 * timed.wait / wall:.1f}% of {wall:.1f} s (measured by the trainer)",
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
