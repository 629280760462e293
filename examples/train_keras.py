"""A small CPU Keras training run over a tf.data pipeline, to watch with stallscope.

It writes synthetic images (raw uint8 HWC files, one per sample) into a temporary folder, reads
them back through tf.data (list of files -> read -> decode -> per-sample transform -> batch),
and trains a small convolutional network on them with ``model.fit`` (or a custom loop).

    stallscope run -- python examples/train_keras.py

As it comes, the per-sample transform runs in a ``map`` without ``num_parallel_calls``: one
thread prepares every sample and the model waits for it (input-bound, prep). Knobs reproduce the
classic tf.data bottlenecks and their fixes (see docs/scenarios.md):
  --prep-cost N      CPU work per sample in the map (N blur passes; default 20, 0 for none)
  --parallel         map(..., num_parallel_calls=tf.data.AUTOTUNE) (the prep fix)
  --prefetch         .prefetch(tf.data.AUTOTUNE) at the end of the pipeline
  --cache            .cache() after decoding (a dataset that fits in memory)
  --interleave N     read the files through interleave over N shards of the file list
  --model heavy      a wider network: compute-bound (the healthy case)
  --data-dir DIR     read (and create if missing) the files there, e.g. on a throttled device
  --cold             evict the files from the page cache before each epoch (fetch from storage)
  --loop custom      a custom training loop (GradientTape) instead of model.fit
  --no-probe         no stallscope callback / watch (an unchanged script)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf


def make_files(root: Path, n: int, size: int, classes: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    have = len(list(root.glob("*.bin")))
    if have >= n:
        return
    rng = np.random.default_rng(0)
    for i in range(have, n):
        label = i % classes
        img = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        img[..., label % 3] //= 2  # give each class a learnable tint
        img.tofile(root / f"{i:07d}_{label}.bin")
    os.sync()  # clean before --cold evicts them: not a cost of the first epoch (train_cpu.py)


def evict(root: Path) -> None:
    """Drop the dataset's pages from the page cache so reads hit the device."""
    os.sync()
    for p in root.glob("*.bin"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_dataset(root: Path, args: argparse.Namespace) -> Any:
    files = sorted(str(p) for p in root.glob("*.bin"))[: args.files]
    labels = [int(Path(f).stem.split("_")[1]) for f in files]
    size, cost = args.size, args.prep_cost
    kernel = tf.ones([3, 3, 3, 1], tf.float32) / 9.0
    auto = tf.data.AUTOTUNE

    def load(path: Any, label: Any) -> Any:
        raw = tf.io.decode_raw(tf.io.read_file(path), tf.uint8)
        x = tf.reshape(tf.cast(raw, tf.float32) / 255.0, [size, size, 3])
        return x, label

    def prep(x: Any, label: Any) -> Any:
        x = tf.image.random_flip_left_right(x)
        y = x[None]
        for _ in range(cost):  # stand-in for JPEG decode + augmentation
            y = tf.nn.depthwise_conv2d(y, kernel, [1, 1, 1, 1], "SAME")
        return (y[0] - 0.5) / 0.25, label

    ds = tf.data.Dataset.from_tensor_slices((files, labels)).shuffle(len(files), seed=0)
    if args.interleave:
        n = args.interleave
        ds = tf.data.Dataset.range(n).interleave(
            lambda i: tf.data.Dataset.from_tensor_slices((files, labels)).shard(n, i),
            cycle_length=n,
            num_parallel_calls=auto,
            deterministic=False,
        )
    par = auto if args.parallel else None
    ds = ds.map(load, num_parallel_calls=par)
    if args.cache:
        ds = ds.cache()
    ds = ds.map(prep, num_parallel_calls=par).batch(args.batch_size)
    if args.prefetch:
        ds = ds.prefetch(auto)
    return ds


def make_model(kind: str, size: int, classes: int) -> Any:
    width = {"tiny": 8, "small": 16, "heavy": 96}[kind]
    layers: list[Any] = [
        keras.Input((size, size, 3)),
        keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(width * 2, 3, padding="same", activation="relu"),
    ]
    if kind == "heavy":
        layers += [
            keras.layers.Conv2D(width * 2, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(width * 2, 3, padding="same", activation="relu"),
        ]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(classes)]
    return keras.Sequential(layers)


class _Deadline(keras.callbacks.Callback):  # type: ignore[misc]
    """Stops fit() after a wall-clock budget."""

    def __init__(self, seconds: float, cold: Path | None) -> None:
        super().__init__()
        self.seconds = seconds
        self.cold = cold
        self.start = time.perf_counter()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self.cold is not None:
            evict(self.cold)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.seconds and time.perf_counter() - self.start > self.seconds:
            self.model.stop_training = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=64, help="image side in pixels")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--data-dir", type=Path, help="dataset folder (default: a temp folder)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=0, help="stop after this long")
    ap.add_argument("--prep-cost", type=int, default=20)
    ap.add_argument("--parallel", action="store_true", help="num_parallel_calls=AUTOTUNE")
    ap.add_argument("--prefetch", action="store_true", help="prefetch(AUTOTUNE) at the end")
    ap.add_argument("--cache", action="store_true", help="cache() the decoded samples")
    ap.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="N",
        help="read the files through interleave over N shards",
    )
    ap.add_argument("--model", choices=("tiny", "small", "heavy"), default="small")
    ap.add_argument("--cold", action="store_true", help="evict files before each epoch")
    ap.add_argument("--loop", choices=("fit", "custom"), default="fit")
    ap.add_argument("--steps-per-execution", type=int, default=1)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow intra-op threads (0: TensorFlow's default)",
    )
    ap.add_argument("--no-probe", action="store_true", help="no stallscope callback or watch")
    args = ap.parse_args(argv)

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    keras.utils.set_random_seed(0)
    tmp = None
    root = args.data_dir
    if root is None:
        tmp = tempfile.mkdtemp(prefix="stallscope-keras-demo-")
        root = Path(tmp)
    try:
        t0 = time.perf_counter()
        make_files(root, args.files, args.size, args.classes)
        print(
            f"dataset: {args.files} files in {root} ({time.perf_counter() - t0:.1f} s)", flush=True
        )
        if args.epochs == 0:
            return 0
        ds = make_dataset(root, args)
        model = make_model(args.model, args.size, args.classes)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        start = time.perf_counter()
        if args.loop == "fit":
            model.compile(
                optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                loss=loss_fn,
                steps_per_execution=args.steps_per_execution,
            )
            callbacks: list[Any] = [_Deadline(args.max_seconds, root if args.cold else None)]
            if not args.no_probe:
                from stallscope.integrations.keras import StallscopeCallback

                callbacks.append(StallscopeCallback())
            hist = model.fit(ds, epochs=args.epochs, callbacks=callbacks, verbose=0)
            steps = len(hist.history.get("loss", []))
            print(f"fit: {steps} epoch(s), loss {hist.history['loss'][-1]:.3f}", flush=True)
        else:
            opt = keras.optimizers.SGD(0.05, momentum=0.9)

            @tf.function
            def train_step(x: Any, y: Any) -> Any:
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply(grads, model.trainable_variables)
                return loss

            watch = None
            if not args.no_probe:
                from stallscope import watch
            wait_total = 0.0  # the trainer's own measure of its data wait
            done = False
            for epoch in range(args.epochs):
                if args.cold:
                    evict(root)
                it = iter(watch(ds) if watch is not None else ds)
                seen, t_ep = 0, time.perf_counter()
                while True:
                    t_wait = time.perf_counter()
                    try:
                        x, y = next(it)
                    except StopIteration:
                        break
                    wait_total += time.perf_counter() - t_wait
                    train_step(x, y)
                    seen += int(x.shape[0])
                    if args.max_seconds and time.perf_counter() - start > args.max_seconds:
                        done = True
                        break
                dt = time.perf_counter() - t_ep
                print(f"epoch {epoch}: {seen / dt:.0f} samples/s", flush=True)
                if done:
                    break
            wall = time.perf_counter() - start
            print(
                f"data wait: {100 * wait_total / wall:.1f}% of {wall:.1f} s (measured by the "
                "trainer)",
                flush=True,
            )
        print(f"trained for {time.perf_counter() - start:.1f} s", flush=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
