"""A PyTorch training whose DataLoader workers cannot keep up: each sample goes through a heavy
CPU transform (repeated blur and tone curve on a small image, ~30 ms a sample) and the model is
tiny, so the training loop mostly waits for its next batch (input-bound on the CPU transform).

A held-out training, written as a user writes one: it contains no stallscope code. It measures
its own data wait (the time spent in ``next(iterator)``, over the training loop's wall time)
and prints it at the end as ``data wait: 87.3% of 15.1 s (measured by the trainer)``.

What the trainings here share (the timing, the loop, the closing lines, the options) is in
``_truth.py`` beside it, which holds no stallscope code either.

    python torch_prep.py --workers 1 --seconds 15
"""

from __future__ import annotations

import torch
from _truth import BlurredImages, arguments, classify_step, report, start_when, train_for
from torch import nn
from torch.utils.data import DataLoader


def main() -> int:
    args = arguments(__doc__, workers=1, batch_size=16).parse_args()

    loader = DataLoader(
        BlurredImages(),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    model = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    step = classify_step(model, opt)

    start_when(args.start_when)
    run = train_for(args.seconds, loader, step)
    report(run.steps, run.wait, run.wall, loss=run.last)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
