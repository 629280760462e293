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

What the trainings here share (the timing, the loop, the closing lines, the options) is in
``_truth.py`` beside it, which holds no stallscope code either.

    python lightning_train.py --seconds 15
"""

from __future__ import annotations

import time
import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from _truth import BlurredImages, TimedBatches, arguments, report
from torch import nn
from torch.utils.data import DataLoader


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
        loader = DataLoader(
            BlurredImages(),
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.workers,
            persistent_workers=self.workers > 0,
        )
        self.timed = TimedBatches(loader)
        return self.timed

    def on_train_end(self) -> None:
        self.end = time.perf_counter()


def main() -> int:
    args = arguments(__doc__, workers=1, batch_size=16).parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    pl.seed_everything(0, verbose=False)
    model = TinyClassifier(args.workers, args.batch_size)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1000,
        max_time={"seconds": args.seconds},
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    timer = model.timed.timer
    report(trainer.global_step, timer.seconds, model.end - timer.first)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
