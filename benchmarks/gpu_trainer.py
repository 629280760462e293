"""GPU trainings with their own truth, for benchmarks/gpu_check.py: each measures its data wait
(time in ``next()`` on its loader over the loop's wall time) and prints
``data wait: 12.3% of 15.0 s (measured by the trainer)``.

    python benchmarks/gpu_trainer.py input   [--seconds 15] [--probe]  # slow CPU transform
    python benchmarks/gpu_trainer.py compute [--seconds 15] [--probe]  # a busy GPU
    python benchmarks/gpu_trainer.py host    [--seconds 15] [--probe]  # launch-bound tiny MLP

``--probe`` wraps the loader with ``stallscope.watch``. Uses torchvision's ResNet-18 when it
imports, else a plain convolutional network of the same shape of work.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    """Random 3x``size``x``size`` images; ``cost_ms`` of CPU work per sample (a transform)."""

    def __init__(self, n: int, size: int, cost_ms: float) -> None:
        self.n, self.size, self.cost_ms = n, size, cost_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        end = time.perf_counter() + self.cost_ms / 1e3
        x = 0.0
        while time.perf_counter() < end:
            x += math.sqrt(i + 1.0)
        return torch.rand(3, self.size, self.size), i % 10


def conv_model() -> nn.Module:
    try:
        from torchvision.models import resnet18

        return resnet18(num_classes=10)
    except Exception:  # torchvision missing, or not importable beside this torch
        return nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.ReLU(),
            *[m for _ in range(6) for m in (nn.Conv2d(64, 64, 3, padding=1),
                                            nn.BatchNorm2d(64), nn.ReLU())],
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("input", "compute", "host"))
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if args.kind == "host":  # batches already on the GPU, a tiny model: launches dominate
        model: nn.Module = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)).to(dev)
        xs = torch.rand(4096, 32, device=dev)
        ys = torch.randint(0, 4, (4096,), device=dev)
        loader: object = [(xs[i:i + 16], ys[i:i + 16]) for i in range(0, 4096, 16)]
    else:
        model = conv_model().to(dev)
        size, cost, workers, batch = ((112, 12.0, 2, 32) if args.kind == "input"
                                      else (160, 0.0, 4, 128))
        loader = DataLoader(Images(1_000_000, size, cost), batch_size=batch,
                            num_workers=workers, pin_memory=dev.type == "cuda",
                            persistent_workers=True)
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
    print(f"data wait: {100 * wait / wall:.1f}% of {wall:.1f} s (measured by the trainer)",
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
