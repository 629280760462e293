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

    torchrun --nproc_per_node 2 ddp_starve.py --seconds 15
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
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
            a = x.numpy()
            for _ in range(self.rounds):
                a = 0.25 * (np.roll(a, 1, 1) + np.roll(a, -1, 1) + np.roll(a, 1, 2)
                            + np.roll(a, -1, 2))
                a = np.tanh(1.5 * a + 0.1)
            x = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        return x, self.labels[i]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--slow-rank", type=int, default=1)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ds = Images(rounds=100 if rank == args.slow_rank else 0)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    wait = 0.0
    steps = 0
    start = time.perf_counter()
    done = False
    epoch = 0
    while not done:
        sampler.set_epoch(epoch)
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
            out_of_time = torch.tensor([float(time.perf_counter() - start >= args.seconds)])
            dist.all_reduce(out_of_time, op=dist.ReduceOp.MAX)
            if out_of_time.item():
                done = True
                break
        epoch += 1
    wall = time.perf_counter() - start
    # both lines in one write: the ranks share torchrun's stdout
    print(f"rank {rank}: {steps} steps, last loss {loss.item():.3f}\n"
          f"rank {rank} data wait: {100 * wait / wall:.1f}% of {wall:.1f} s "
          "(measured by the trainer)", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
