"""A Hugging Face ``Trainer`` fine-tuning a tiny BERT classifier (randomly initialised from a
config: nothing is downloaded) on a torch Dataset whose ``__getitem__`` is slow: every example
goes through a heavy CPU feature transform (~90 ms) before it is turned into token ids. With the
Trainer's default ``dataloader_num_workers=0`` every batch is built on the training thread
between two steps, so the Trainer mostly waits for its next batch (input-bound on the CPU
transform).

A held-out training, written as a user writes one: it contains no stallscope code. It measures
its own data wait: ``get_train_dataloader`` returns the Trainer's own DataLoader wrapped in a
small iterable that times each ``next()`` on it; the wait is that time over the wall time of the
training loop (from the Trainer's first request for a batch to the end of training). It prints
``data wait: 87.3% of 15.1 s (measured by the trainer)`` at the end. Offline: no hub access, no
reporting, no checkpoints.

What the trainings here share (the timing, the loop, the closing lines, the options) is in
``_truth.py`` beside it, which holds no stallscope code either.

    python hf_trainer.py --seconds 15
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tempfile
import time

import numpy as np
import torch
from _truth import TimedBatches, arguments, blur, truth
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SEQ = 32
VOCAB = 1000


class SlowFeatures(Dataset):
    """Examples whose token ids come out of a heavy CPU transform of a 96×96 signal."""

    def __init__(self, n: int = 4096, rounds: int = 300):
        self.n, self.rounds = n, rounds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng(i)
        x = blur(rng.random((3, 96, 96), dtype=np.float32), self.rounds)
        ids = (np.abs(x.reshape(-1)[: SEQ * 7 : 7]) * 1e4).astype(np.int64) % VOCAB
        return {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": torch.tensor(i % 2),
        }


class TrainerBatches(TimedBatches):
    """The Trainer's DataLoader, timed; every other attribute is the DataLoader's."""

    def __getattr__(self, name: str):
        return getattr(self.loader, name)


class TimedTrainer(Trainer):
    def get_train_dataloader(self):
        self.timed = TrainerBatches(super().get_train_dataloader())
        return self.timed


class StopAfter(TrainerCallback):
    """Stop training after ``seconds`` of it; note when it ended."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = 0.0
        self.end = 0.0

    def on_train_begin(self, args, state, control, **kw):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        if time.perf_counter() - self.start >= self.seconds:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kw):
        self.end = time.perf_counter()


def main() -> int:
    ap = arguments(__doc__, batch_size=8)
    ap.add_argument(
        "--workers", type=int, default=0, help="dataloader_num_workers (the Trainer's default: 0)"
    )
    args = ap.parse_args()

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    stop = StopAfter(args.seconds)
    with tempfile.TemporaryDirectory(prefix="hf-out-") as out:
        targs = TrainingArguments(
            output_dir=out,
            max_steps=100_000,
            per_device_train_batch_size=args.batch_size,
            learning_rate=1e-3,
            dataloader_num_workers=args.workers,
            dataloader_persistent_workers=args.workers > 0,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            seed=0,
        )
        trainer = TimedTrainer(
            model=model, args=targs, train_dataset=SlowFeatures(), callbacks=[stop]
        )
        result = trainer.train()
    timer = trainer.timed.timer
    wall = stop.end - (timer.first if timer.first is not None else stop.start)
    print(f"{result.global_step} steps, loss {result.training_loss:.3f}", flush=True)
    print(truth(timer.seconds, wall), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
