"""A compute-bound PyTorch training: the whole data set sits in memory (a ``TensorDataset``),
the DataLoader runs on the training thread (``num_workers=0``) and only indexes and stacks
tensors, and the model is a small convolutional network that takes most of every step. The
loop hardly ever waits for its next batch.

A held-out training, written as a user writes one: it contains no stallscope code. It measures
its own data wait (the time spent in ``next(iterator)``, over the training loop's wall time)
and prints it at the end as ``data wait: 1.2% of 15.1 s (measured by the trainer)``.

What the trainings here share (the timing, the loop, the closing lines, the options) is in
``_truth.py`` beside it, which holds no stallscope code either.

    python torch_compute.py --seconds 15
"""

from __future__ import annotations

import torch
from _truth import arguments, classify_step, report, train_for
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> int:
    args = arguments(__doc__, batch_size=32).parse_args()

    g = torch.Generator().manual_seed(0)
    images = torch.rand(2048, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (2048,), generator=g)
    loader = DataLoader(
        TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True, num_workers=0
    )
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    step = classify_step(model, opt)

    run = train_for(args.seconds, loader, step)
    report(run.steps, run.wait, run.wall, loss=run.last)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
