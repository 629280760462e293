"""A compute-bound PyTorch training whose exit is slow: after its loop it lets go of its
DataLoader while both workers are inside slow samples, so the loader's shutdown joins them for
seconds (on a GPU, ``pin_memory`` with ``persistent_workers`` makes PyTorch's exit join each
worker with a 5-s timeout: pinned memory needs CUDA, so this stands in for it on a CPU).

A held-out training, written as a user writes one: it contains no stallscope code. It measures
its own data wait over its loop and prints ``data wait: 1.2% of 6.0 s (measured by the
trainer)``, then ``exit: joined workers in 5.9 s``.

What the trainings here share (the timing, the loop, the closing lines, the options) is in
``_truth.py`` beside it, which holds no stallscope code either.

    python torch_slow_exit.py --seconds 6 --stuck 8
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from _truth import DataWait, arguments, report
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    """Cheap samples; from ``deadline`` (wall clock) on, each takes ``stuck`` seconds."""

    def __init__(self, n: int, deadline: float, stuck: float) -> None:
        self.n, self.deadline, self.stuck = n, deadline, stuck

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if time.time() >= self.deadline:
            time.sleep(self.stuck)
        return torch.full((64,), float(i % 7)), i % 10


def main() -> int:
    ap = arguments(__doc__, seconds=6.0)
    ap.add_argument("--stuck", type=float, default=8.0)
    args = ap.parse_args()
    model = nn.Sequential(
        nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.time() + 3.0 + args.seconds  # 3 s for the workers to start
    loader = DataLoader(Items(10_000_000, deadline, args.stuck), batch_size=8, num_workers=2)
    it = iter(loader)
    wait, steps = DataWait(), 0
    start = time.perf_counter()
    extra = 2  # batches taken after the deadline (ready before it): one request per worker
    while time.time() < deadline or extra:
        if time.time() >= deadline:
            extra -= 1
        with wait:
            x, y = next(it)
        for _ in range(20):  # compute: the loader keeps up easily
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        steps += 1
    report(steps, wait.seconds, time.perf_counter() - start)
    # both workers are now inside slow samples: letting go of the loader joins them
    t = time.perf_counter()
    del it
    print(f"exit: joined workers in {time.perf_counter() - t:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
