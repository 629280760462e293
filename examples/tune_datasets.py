"""Datasets with a known bottleneck, to try ``stallscope tune`` on (and to benchmark it).

    stallscope tune examples/tune_datasets.py:cpu_heavy --step examples/tune_datasets.py:step
    stallscope tune examples/tune_datasets.py:small_files --budget 60
    stallscope tune examples/tune_datasets.py:mixed --json

* ``cpu_heavy``: a CPU-heavy per-sample transform (numpy blur passes over a 3×64×64 image, ~2 ms
  per sample on one core): more workers help until the cores run out.
* ``small_files``: 4,000 small files (12 KiB), each evicted from the page cache before it is
  read (``posix_fadvise(DONTNEED)``), so every read goes to the device: latency-bound reads
  that parallel workers overlap.
* ``mixed``: cold small files and half the transform of ``cpu_heavy``.
* ``loader``: ``cpu_heavy`` inside a DataLoader as a user would have written it (1 worker,
  no persistent workers): the baseline is the configuration as given.
* ``step``: a training step of a small convolutional network (the consumer), for ``--step``.

The files go to ``$STALLSCOPE_TUNE_DATA`` (default: a folder in the system temp directory),
written once and reused.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

SIZE = 64
#: blur passes of cpu_heavy: about 2 ms of CPU per sample
PASSES = 60


class Blurred(Dataset[tuple[torch.Tensor, int]]):
    """Synthetic images with ``passes`` blur passes each (the stand-in for decode + augment)."""

    def __init__(
        self, n: int = 4096, passes: int = 24, files: Path | None = None, cold: bool = False
    ) -> None:
        self.n = n
        self.passes = passes
        self.files = sorted(files.glob("*.bin"))[:n] if files is not None else None
        if self.files is not None:
            self.n = len(self.files)
        self.cold = cold

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.files is not None:
            raw = _read(self.files[i], self.cold)
            arr = np.frombuffer(raw, dtype=np.uint8)[: 3 * SIZE * SIZE]
            arr = np.resize(arr, 3 * SIZE * SIZE).reshape(3, SIZE, SIZE)
        else:
            arr = np.random.default_rng(i).integers(0, 256, (3, SIZE, SIZE), dtype=np.uint8)
        x = arr.astype(np.float32) / 255.0
        for _ in range(self.passes):  # numpy: one thread, like most decoders and augmenters
            x = (x + np.roll(x, 1, axis=1) + np.roll(x, 1, axis=2)) / 3.0
        return torch.from_numpy(x), i % 10


def _read(path: Path, cold: bool) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        if cold:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def data_dir(n: int = 4000, size: int = 12 << 10) -> Path:
    root = Path(
        os.environ.get("STALLSCOPE_TUNE_DATA")
        or Path(tempfile.gettempdir()) / "stallscope-tune-data"
    )
    root.mkdir(parents=True, exist_ok=True)
    have = len(list(root.glob("*.bin")))
    if have < n:
        rng = np.random.default_rng(0)
        for i in range(have, n):
            (root / f"{i:06d}.bin").write_bytes(rng.integers(0, 256, size, np.uint8).tobytes())
        os.sync()  # written pages must be clean before they can be evicted
    return root


def cpu_heavy() -> Blurred:
    return Blurred(passes=PASSES)


def small_files() -> Blurred:
    return Blurred(passes=0, files=data_dir(), cold=True)


def mixed() -> Blurred:
    return Blurred(passes=PASSES // 2, files=data_dir(), cold=True)


def loader() -> DataLoader[Any]:
    return DataLoader(cpu_heavy(), batch_size=32, num_workers=1, shuffle=True)


def failing() -> Dataset[Any]:
    """A dataset whose items fail in a worker (for the tests)."""
    return _Failing()


class _Failing(Dataset[Any]):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> Any:
        if torch.utils.data.get_worker_info() is not None:
            raise ValueError(f"sample {i} is corrupt")
        return torch.zeros(3)


_model: nn.Module | None = None


def step(batch: Any) -> None:
    """One training step of a small CNN on the batch (forward, backward, no optimiser)."""
    global _model
    if _model is None:
        torch.manual_seed(0)
        _model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
    x, y = batch
    loss = F.cross_entropy(_model(x), y)
    loss.backward()
