"""A DistributedDataParallel training on the CPU (gloo) in which one rank starves: launched
with ``torchrun --nproc_per_node 2``, every rank trains the same small model on its shard of
an in-memory data set, but rank 1's Dataset runs a heavy CPU transform on every sample (~30 ms,
a slow augmentation only that node's config turns on) while rank 0's returns its samples as
they are. The all-reduce in every backward pass makes rank 0 wait for rank 1, and rank 1 waits
for its DataLoader worker: rank 1 is the straggler.

A held-out training, written as a user writes one: it contains no stallscope code. Each rank
measures its own data wait (the time spent in ``next(iterator)``, over the training loop's
wall time) and prints it at the end as ``rank 1 data wait: 87.3% of 15.1 s (measured by the
trainer)``. The ranks stop together: each step they all-reduce whether any one is out of time.

What the trainings here share (the timing, the loop, the closing lines, the options) is in
``_truth.py`` beside it, which holds no stallscope code either.

    torchrun --nproc_per_node 2 ddp_starve.py --seconds 15
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from _truth import arguments, blur, classify_step, train_for, truth
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Images(Dataset):
    """Random 3×96×96 images; with ``rounds`` > 0 each is blurred and tone-mapped that many
    times when it is read."""

    def __init__(self, n: int = 1024, size: int = 96, rounds: int = 0, classes: int = 10):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, size, size, generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.rounds = rounds

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i]
        if self.rounds:
            a = blur(x.numpy(), self.rounds)
            x = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        return x, self.labels[i]


def main() -> int:
    ap = arguments(__doc__, workers=1, batch_size=16)
    ap.add_argument("--slow-rank", type=int, default=1)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ds = Images(rounds=100 if rank == args.slow_rank else 0)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    step = classify_step(model, opt)

    def any_out_of_time(mine: bool) -> bool:
        out_of_time = torch.tensor([float(mine)])
        dist.all_reduce(out_of_time, op=dist.ReduceOp.MAX)
        return bool(out_of_time.item())

    run = train_for(args.seconds, loader, step, new_epoch=sampler.set_epoch, stop=any_out_of_time)
    # both lines in one write: the ranks share torchrun's stdout
    print(
        f"rank {rank}: {run.steps} steps, last loss {run.last.item():.3f}\n"
        f"{truth(run.wait, run.wall, rank=rank)}",
        flush=True,
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
