"""A small DistributedDataParallel run on the CPU (gloo), to watch with stallscope, in which one
rank's input pipeline is slower than the others' (a straggler), or computes more per step.

    stallscope run -- torchrun --nproc-per-node 2 examples/train_ddp.py --slow-rank 1
    stallscope run -- torchrun --nproc-per-node 2 examples/train_ddp.py --heavy-rank 1

Every rank trains the same CNN as examples/train_cpu.py on its shard of synthetic images; the
all-reduce makes each step as long as the slowest rank's, so step times are equal everywhere
and only where each rank spends its step (waiting for data or computing) tells the straggler.
Each rank prints its own measured data-wait share.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_cpu import FileImages, make_files, model_for


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--data-dir", type=Path, help="dataset folder (default: a temp folder)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--prep-cost", type=int, default=0, help="transform cost on every rank")
    ap.add_argument("--slow-rank", type=int, default=-1, help="this rank's transform is slow")
    ap.add_argument("--slow-cost", type=int, default=40, help="the slow rank's transform cost")
    ap.add_argument(
        "--heavy-rank",
        type=int,
        default=-1,
        help="this rank computes more per step (a straggler by compute)",
    )
    ap.add_argument(
        "--heavy-extra", type=int, default=2, help="extra forward passes per step on the heavy rank"
    )
    ap.add_argument("--model", choices=("tiny", "small", "heavy"), default="small")
    ap.add_argument("--no-probe", action="store_true")
    args = ap.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    root = args.data_dir or Path(tempfile.gettempdir()) / f"stallscope-ddp-{os.getppid()}"
    if rank == 0:
        make_files(root, args.files, args.size, args.classes)
    dist.barrier()
    cost = args.slow_cost if rank == args.slow_rank else args.prep_cost
    ds = FileImages(root, args.size, cost)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    batches_of = loader
    if not args.no_probe:
        from stallscope import watch

        batches_of = watch(loader)  # type: ignore[assignment]
    model = DistributedDataParallel(model_for(args.model, args.classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = time.perf_counter()
    wait_total, steps, epoch = 0.0, 0, 0
    done = torch.zeros(1)
    while True:
        sampler.set_epoch(epoch)
        it = iter(batches_of)
        while True:
            t_wait = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            wait_total += time.perf_counter() - t_wait
            opt.zero_grad()
            if rank == args.heavy_rank:  # more work on this rank only (no effect on training)
                with torch.no_grad():
                    for _ in range(args.heavy_extra):
                        model.module(x)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            # every rank stops at the same step: rank 0 decides and tells the others
            done.fill_(1.0 if rank == 0 and time.perf_counter() - start > args.max_seconds else 0.0)
            dist.all_reduce(done)
            if done.item() > 0:
                break
        if done.item() > 0:
            break
        epoch += 1
    wall = time.perf_counter() - start
    print(
        f"rank {rank}: data wait: {100 * wait_total / wall:.1f}% of {wall:.1f} s, {steps} steps "
        "(measured by the trainer)",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
