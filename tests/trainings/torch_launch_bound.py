"""A launch-bound PyTorch training: a tiny two-layer MLP on a small batch, so every step is a
few dozen small operator calls and the time goes to issuing them from Python (on a GPU the
kernels would be done long before the next one is issued: the GPU waits for the CPU). The
batches sit in memory, made once (as a dataset already on the device would be): taking the next
one never makes the step wait.

A held-out training, written as a user writes one: it contains no stallscope code. It prints
``data wait: 0.5% of 8.0 s (measured by the trainer)``.

What the trainings here share (the timing, the loop, the closing lines, the options) is in
``_truth.py`` beside it, which holds no stallscope code either.

    python torch_launch_bound.py --seconds 8
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _truth import arguments, report, train_for
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> int:
    args = arguments(__doc__, seconds=8.0).parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(4096, 32, generator=g), torch.randint(0, 4, (4096,), generator=g)
    batches = list(DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True))
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(batch):
        xb, yb = batch
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()

    run = train_for(args.seconds, batches, step)
    report(run.steps, run.wait, run.wall)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
