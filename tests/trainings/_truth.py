"""What the held-out trainings of this folder share: how each one measures its own data wait
(the truth stallscope's figure is checked against), the loop that trains for a given time, the
closing lines the tests read, the common options, and the slow CPU transform.

Not a training, and no stallscope code either: a training imports it as a user's script imports
a helper module of its own project (``python torch_prep.py`` puts this folder on ``sys.path``).

The data wait is the time spent getting batches, ``iter(loader)`` and every ``next()`` on it,
over the training loop's wall time; a training prints it last, as
``data wait: 87.3% of 15.1 s (measured by the trainer)`` (``rank 1 data wait: ...`` for a rank),
and tests/scenarios/test_scenarios_zero_code.py reads that line.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


def arguments(
    doc: str, *, seconds: float = 15.0, workers: int | None = None, batch_size: int | None = None
) -> argparse.ArgumentParser:
    """A training's options: ``--seconds`` of training, and ``--workers`` (DataLoader worker
    processes) and ``--batch-size`` where a default is given. Described by the first line of
    the training's docstring ``doc``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=seconds, help="seconds of training")
    if workers is not None:
        ap.add_argument("--workers", type=int, default=workers, help="DataLoader workers")
    if batch_size is not None:
        ap.add_argument("--batch-size", type=int, default=batch_size)
    ap.add_argument(
        "--start-when",
        metavar="FILE",
        help="before the training loop, wait until FILE exists (a test attaching to the "
        "training from outside says when it watches)",
    )
    return ap


def start_when(path: str | None, timeout: float = 120.0) -> None:
    """Wait until ``path`` exists (``--start-when``), at most ``timeout`` seconds."""
    if path is None:
        return
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


class DataWait:
    """The time a training spends getting its batches: each ``with wait:`` block (an
    ``iter(loader)``, a ``next(it)`` and the binding of its batch, which frees the one before)
    is added to ``seconds``, whether it returns or raises (``StopIteration`` ends an epoch);
    ``first`` is when the first block began (``time.perf_counter()``), None before."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.first: float | None = None
        self._t = 0.0

    def __enter__(self) -> DataWait:
        self._t = time.perf_counter()
        if self.first is None:
            self.first = self._t
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._t


class TimedBatches:
    """A loader handed to a framework's trainer (Lightning, the HF ``Trainer``) that iterates
    it, every epoch of it timed by ``timer``: ``timer.first`` is when the trainer first asked for
    a batch."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.timer = DataWait()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        with self.timer:
            it = iter(self.loader)
        while True:
            try:
                with self.timer:
                    batch = next(it)
            except StopIteration:
                return
            yield batch


def truth(wait: float, wall: float, rank: int | None = None) -> str:
    """The line a training ends with: ``wait`` seconds of data wait over ``wall`` seconds."""
    who = "" if rank is None else f"rank {rank} "
    return f"{who}data wait: {100 * wait / wall:.1f}% of {wall:.1f} s (measured by the trainer)"


def report(steps: int, wait: float, wall: float, loss: Any = None) -> None:
    """The two closing lines of a training: its steps (and its last loss, when given), then
    :func:`truth`."""
    if hasattr(loss, "detach"):
        loss = loss.detach()
    last = "" if loss is None else f", last loss {float(loss):.3f}"
    print(f"{steps} steps{last}", flush=True)
    print(truth(wait, wall), flush=True)


@dataclass
class Trained:
    """What :func:`train_for` did: steps, data wait and wall time (seconds) of the loop, and
    what the last step returned (its loss)."""

    steps: int
    wait: float
    wall: float
    last: Any


def train_for(
    seconds: float,
    loader: Iterable[Any],
    step: Callable[[Any], Any],
    *,
    new_epoch: Callable[[int], None] | None = None,
    stop: Callable[[bool], bool] | None = None,
) -> Trained:
    """Epoch after epoch over ``loader``, ``step(batch)`` on every batch, until ``seconds`` of
    training have passed (checked after each step). ``new_epoch(epoch)`` runs before each epoch
    (a DistributedSampler's ``set_epoch``); ``stop(out_of_time)`` decides from this process's
    answer whether to stop (ranks that stop together). The wall time is taken before the loop
    lets go of the loader's iterator."""
    wait = DataWait()
    steps, epoch, last = 0, 0, None
    start = time.perf_counter()
    while True:
        if new_epoch is not None:
            new_epoch(epoch)
        with wait:
            it = iter(loader)
        while True:
            try:
                with wait:
                    batch = next(it)
            except StopIteration:
                break
            last = step(batch)
            steps += 1
            done = time.perf_counter() - start >= seconds
            if stop is not None:
                done = stop(done)
            if done:
                return Trained(steps, wait.seconds, time.perf_counter() - start, last)
        epoch += 1


def classify_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[Any], Any]:
    """The training step of an image classifier as a user writes one: forward, cross-entropy,
    backward, optimizer step; returns the loss."""
    import torch.nn.functional as F

    def step(batch: Any) -> Any:
        x, y = batch
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def blur(x: np.ndarray, rounds: int) -> np.ndarray:
    """A heavy CPU transform of an image ``x`` (channels × height × width): ``rounds`` of a
    4-neighbour blur and a tone curve (~0.3 ms a round at 3×96×96)."""
    for _ in range(rounds):
        x = 0.25 * (np.roll(x, 1, 1) + np.roll(x, -1, 1) + np.roll(x, 1, 2) + np.roll(x, -1, 2))
        x = np.tanh(1.5 * x + 0.1)
    return x


class BlurredImages(Dataset):
    """Random 3×96×96 images, each blurred and tone-mapped ``rounds`` times when it is read."""

    def __init__(self, n: int = 2048, size: int = 96, rounds: int = 100, classes: int = 10):
        self.n, self.size, self.rounds, self.classes = n, size, rounds, classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(i)
        x = blur(rng.random((3, self.size, self.size), dtype=np.float32), self.rounds)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), i % self.classes
