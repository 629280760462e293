"""GPU trainings with their own truth, for benchmarks/gpu_check.py: each measures its data wait
(time in ``next()`` on its loader over the loop's wall time) and prints
``data wait: 12.3% of 15.0 s (measured by the trainer)``.

    python benchmarks/gpu_trainer.py input   [--seconds 15] [--probe]  # slow CPU transform
    python benchmarks/gpu_trainer.py compute [--seconds 15] [--probe]  # a busy GPU (ResNet-50)
    python benchmarks/gpu_trainer.py host    [--seconds 15] [--probe]  # launch-bound tiny MLP

``--probe`` wraps the loader with ``stallscope.watch``. Uses torchvision's ResNet-18 (input) and
ResNet-50 (compute) when it imports, else plain convolutional networks. On an H200 the first
version of ``compute`` (random float images made per sample by 4 workers) was input-bound by its
own measure (39% data wait): its images now come from a uint8 pool, made float on the GPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    """3x``size``x``size`` uint8 images from a pool made once (as if decoded into RAM);
    ``cost_ms`` of CPU work per sample (a slow transform). The GPU makes them float."""

    def __init__(self, n: int, size: int, cost_ms: float) -> None:
        self.n, self.cost_ms = n, cost_ms
        self.pool = torch.randint(0, 256, (32, 3, size, size), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        end = time.perf_counter() + self.cost_ms / 1e3
        x = 0.0
        while time.perf_counter() < end:
            x += math.sqrt(i + 1.0)
        return self.pool[i % len(self.pool)], i % 10


def conv_model(big: bool) -> nn.Module:
    """torchvision's ResNet-50 (``big``) or ResNet-18, else a plain convolutional network."""
    try:
        from torchvision.models import resnet18, resnet50

        return (resnet50 if big else resnet18)(num_classes=10)
    except Exception:  # torchvision missing, or not importable beside this torch
        width = 256 if big else 64
        return nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3),
            nn.ReLU(),
            *[
                m
                for _ in range(8 if big else 6)
                for m in (nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
            ],
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, 10),
        )


def _fail(why: str) -> int:
    """One line on stderr, exit status 2, as the CLI does."""
    sys.stderr.write(f"gpu_trainer: error: {why}\n")
    return 2


def _device(name: str) -> torch.device | None:
    """``--device`` as a device this machine has; None, said in one line, for a name torch does
    not know (a RuntimeError) or a CUDA device that is not here (an AssertionError from a torch
    built without CUDA, a RuntimeError from one with no GPU)."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        _fail(f"--device {name[:100]!r}: not a device torch knows (cuda, cuda:1, cpu)")
        return None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            _fail("no CUDA GPU here (torch sees none); --device cpu for a dry run")
            return None
        if dev.index is not None and dev.index >= count:
            _fail(f"--device {name}: this machine has {count} CUDA device(s)")
            return None
    elif dev.type != "cpu":
        _fail(f"--device {name[:100]!r}: only cuda and cpu are supported")
        return None
    return dev


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("input", "compute", "host"))
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run")
    args = ap.parse_args()
    dev = _device(args.device)
    if dev is None:
        return 2
    if not (math.isfinite(args.seconds) and 0 < args.seconds <= 86400):
        return _fail(f"--seconds must be above 0 and at most 86400, got {args.seconds:g}")
    if args.kind == "host":  # batches already on the GPU, a tiny model: launches dominate
        model: nn.Module = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)).to(dev)
        xs = torch.rand(4096, 32, device=dev)
        ys = torch.randint(0, 4, (4096,), device=dev)
        loader: object = [(xs[i : i + 16], ys[i : i + 16]) for i in range(0, 4096, 16)]
    else:
        model = conv_model(args.kind == "compute").to(dev)
        size, cost, workers, batch = (
            (112, 12.0, 2, 32) if args.kind == "input" else (224, 0.0, 6, 128)
        )
        loader = DataLoader(
            Images(1_000_000, size, cost),
            batch_size=batch,
            num_workers=workers,
            pin_memory=dev.type == "cuda",
            persistent_workers=True,
        )
    if args.probe:
        import stallscope

        loader = stallscope.watch(loader)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    wait, steps = 0.0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        it = iter(loader)  # type: ignore[call-overload]
        while time.perf_counter() - start < args.seconds:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - t
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if x.dtype == torch.uint8:
                x = x.float().div_(255)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if steps % 10 == 0:
                loss.item()
            steps += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    print(f"{args.kind}: {steps} steps", flush=True)
    print(
        f"data wait: {100 * wait / wall:.1f}% of {wall:.1f} s (measured by the trainer)", flush=True
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
