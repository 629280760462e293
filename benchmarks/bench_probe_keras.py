"""What the Keras/TensorFlow probe costs the trainer (goal: <= 1 % of step time on a cheap step).

    .venv/bin/python benchmarks/bench_probe_keras.py            # ~70 s on 2 cores
    .venv/bin/python benchmarks/bench_probe_keras.py --width 64 --steps 200   # ~1 ms steps

A/B in one process, in many short interleaved rounds (the order drawn at random each round, so
that slow swings of other load on the machine hit both sides alike), a cheap CPU step (a
dense model on cached, prefetched data: ~5 ms by default, the cheap step of
benchmarks/bench_probe.py; ``--width 64`` gives ~1 ms):

- ``fit``: ``model.fit`` without and with ``StallscopeCallback`` (two models of the same shape,
  both traced before timing); per-step time = one epoch's wall time / steps.
- ``fit spe=4``: the same with ``steps_per_execution=4``.
- ``custom``: a ``tf.function`` step over the dataset iterated bare and through
  ``stallscope.watch(dataset)``.
- ``train fn``: the training thread's cost alone: ``model.train_function(iterator)`` called
  directly, Keras' own vs the instrumented one (fit's callbacks and epoch set-up left out).

Then the same four on a null step (a width-1 model, five times the steps), where the probe's
added CPU per step (median per-round difference, µs) stands out of the step's own swings, put
against the cheap step's time; and the in-graph part alone (a ``get_next()`` loop over a trivial
dataset, bare and through the stamping iterator).

Last, in a fresh process that runs nothing else (``--parts``), the probe's parts each timed
alone: the in-graph stamps, the instrumented train function's Python around a call (its ring
reads twice a second included) and the writer thread's cost per stored step. Their sum, put
against the cheapest step above, is the last line (the goal: <= 1 %): on a shared 2-core VM
the whole-training A/B swings by more than 1 % between identical runs, the parts do not.

Each round runs both sides once; its ratio is probed / bare, and the printed ratio is the median
over rounds, for wall time and for the process's CPU time (``time.process_time``: all its threads;
on a shared machine wall time swings with other load, CPU time much less). The probe reports into
a run directory as under ``stallscope run``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

from stallscope.store import RunStore, new_run_dir

#: hidden width of the model: 1024 gives a ~5 ms CPU step here (the cheap step of
#: benchmarks/bench_probe.py); ``--width 64`` a ~1 ms one
WIDTH = 1024


def dataset(steps: int) -> Any:
    x = tf.random.uniform([32 * steps, 32])
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32).cache().prefetch(4)


def model(spe: int, width: int) -> Any:
    m = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    m.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=spe)
    return m


#: (wall s, CPU s) per step of one side of a round
Timing = tuple[float, float]


Pair = tuple[float, float, float, float, float, float]


def ab(bare: Callable[[], Timing], probed: Callable[[], Timing], rounds: int) -> Pair:
    """Interleaved rounds (order drawn at random each round); returns median bare ms/step,
    median probed ms/step, median per-round wall ratio, median per-round CPU ratio, and the
    median per-round CPU difference and wall difference (µs/step)."""
    a: list[Timing] = []
    b: list[Timing] = []
    rng = random.Random(0)
    for _ in range(rounds):
        if rng.random() < 0.5:
            b.append(probed())
            a.append(bare())
        else:
            a.append(bare())
            b.append(probed())
    return (
        statistics.median(x[0] for x in a) * 1e3,
        statistics.median(x[0] for x in b) * 1e3,
        statistics.median(y[0] / x[0] for x, y in zip(a, b)),
        statistics.median(y[1] / x[1] for x, y in zip(a, b)),
        statistics.median((y[1] - x[1]) * 1e6 for x, y in zip(a, b)),
        statistics.median((y[0] - x[0]) * 1e6 for x, y in zip(a, b)),
    )


def fit_pair(steps: int, rounds: int, spe: int) -> Pair:
    from stallscope.integrations.keras import StallscopeCallback

    ds = dataset(steps)
    bare, probed = model(spe, WIDTH), model(spe, WIDTH)
    cb = StallscopeCallback()

    def run(m: Any, cbs: list[Any]) -> Timing:
        t0, c0 = time.perf_counter(), time.process_time()
        m.fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=cbs)
        return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps

    run(bare, []), run(probed, [cb])  # trace both
    return ab(lambda: run(bare, []), lambda: run(probed, [cb]), rounds)


def train_fn_pair(steps: int, rounds: int) -> Pair:
    from stallscope.probe.keras import get_tf_probe, instrument

    ds = dataset(steps).repeat()
    bare, probed = model(1, WIDTH), model(1, WIDTH)
    for m in (bare, probed):
        m.fit(ds, epochs=1, steps_per_epoch=2, verbose=0)  # builds and traces
    probe = get_tf_probe()
    assert probe is not None and instrument(probed, probe)
    it = iter(ds)
    fa, fb = bare.train_function, probed.train_function
    fa(it), fb(it)

    def run(f: Any) -> Timing:
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            f(it)
        return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps

    return ab(lambda: run(fa), lambda: run(fb), rounds)


def custom_pair(steps: int, rounds: int) -> Pair:
    import stallscope

    ds = dataset(steps)
    m = model(1, WIDTH)
    opt = keras.optimizers.SGD(0.01)

    @tf.function
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((m(x) - y) ** 2)
        opt.apply(tape.gradient(loss, m.trainable_variables), m.trainable_variables)
        return loss

    def run(it: Any) -> Timing:
        t0, c0 = time.perf_counter(), time.process_time()
        for x, y in it:
            step(x, y)
        return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps

    run(ds)
    return ab(lambda: run(ds), lambda: run(stallscope.watch(ds)), rounds)


def stamps_pair(steps: int, rounds: int) -> Pair:
    """The in-graph part alone: a ``tf.function`` looping ``get_next()`` over the cheapest
    dataset (``range``: ~50 µs a step here, so the few µs the stamps add stand out of its
    swings), bare and through the probe's stamping iterator (two timestamps and a ring write a
    step)."""
    from stallscope.probe.keras import _StampedIterator

    ds = tf.data.Dataset.range(2**62)
    ring = tf.Variable(tf.zeros([1033, 2], tf.float64), trainable=False)

    def body(it: Any) -> Any:
        s = tf.constant(0, tf.int64)
        for _ in tf.range(steps):
            s += it.get_next()
        return s

    bare = tf.function(body)
    stamped = tf.function(lambda it: body(_StampedIterator(it, ring, tf)))
    it = iter(ds)
    bare(it), stamped(it)

    def run(f: Any) -> Timing:
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(4):
            f(it)
        return (time.perf_counter() - t0) / steps / 4, (time.process_time() - c0) / steps / 4

    return ab(lambda: run(bare), lambda: run(stamped), rounds)


def parts(calls: int, rounds: int) -> dict[str, float]:
    """The probe's own work per step, each part timed alone (µs, median of ``rounds``), in a process
    that runs nothing else: ``stamps``, the in-graph ops (a ``get_next()`` loop, bare vs stamped,
    wall time per step); ``host``, the instrumented train function's Python around a call, its ring
    read twice a second included (the compiled step replaced by a stub that returns at once, vs the
    stub alone); ``writer``, the probe's writer thread storing one step row (rows pushed as a
    training would, written by one flush, thread CPU time)."""
    from stallscope.probe.keras import TimedTrainFunction, get_tf_probe

    out: dict[str, float] = {}
    # the step's time (wall): the process's CPU time also counts TensorFlow's idle pool threads
    # spinning, which swings by more than the few µs measured here
    *_, wall_added = stamps_pair(512, rounds)
    out["stamps"] = wall_added

    class Opt:
        def has_value(self) -> bool:
            return True

        def get_value(self) -> int:
            return 0

    opt = Opt()

    def stub(_it: Any) -> Any:
        return opt

    probe = get_tf_probe()
    assert probe is not None
    timed = TimedTrainFunction(model(1, 1), stub, None, probe, tf, None)
    timed._fn = stub  # the compiled step, stubbed: what is left is the wrapper's own work
    it = iter(dataset(4).repeat())
    diffs = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(calls):
            opt.has_value() and opt.get_value()
            stub(it)
        t1 = time.thread_time()
        for _ in range(calls):
            timed(it)
        t2 = time.thread_time()
        diffs.append(((t2 - t1) - (t1 - t0)) / calls * 1e6)
    out["host"] = statistics.median(diffs)
    per_row = []
    for r in range(rounds):
        probe.flush()
        now = time.time()
        for i in range(2000):
            probe.buffer.push((10**6 * (r + 1) + i, now, 0.001, 0.004, 32, 0, None, None, 1))
        t0 = time.thread_time()
        probe.flush()
        per_row.append((time.thread_time() - t0) / 2000 * 1e6)
    out["writer"] = statistics.median(per_row)
    return out


def main() -> int:
    global WIDTH
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="steps per timed epoch")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--width", type=int, default=1024, help="hidden width (step cost)")
    ap.add_argument(
        "--parts",
        action="store_true",
        help="only time the probe's parts alone "
        "and print them as JSON (what the full run starts in a process of its own)",
    )
    args = ap.parse_args()
    if args.parts:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = new_run_dir(Path(tmp), "bench")
            RunStore(run_dir / "run.db").close()
            os.environ["STALLSCOPE_RUN_DIR"] = str(run_dir)
            print(json.dumps(parts(2000, args.rounds)))
            from stallscope.probe.recorder import reset

            reset()
        return 0
    WIDTH = args.width
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = new_run_dir(Path(tmp), "bench")
        RunStore(run_dir / "run.db").close()
        os.environ["STALLSCOPE_RUN_DIR"] = str(run_dir)
        print(
            f"tensorflow {tf.__version__}, keras {keras.__version__}, {os.cpu_count()} CPUs; "
            f"{args.steps} steps x {args.rounds} rounds per side"
        )
        pairs: dict[str, Callable[[int, int], Pair]] = {
            "fit": lambda st, r: fit_pair(st, r, 1),
            "fit spe=4": lambda st, r: fit_pair(st, r, 4),
            "custom": custom_pair,
            "train fn": train_fn_pair,
        }
        cheap: dict[str, Pair] = {}
        for name, pair in pairs.items():
            a, b, wall, cpu, _d, _dw = cheap[name] = pair(args.steps, args.rounds)
            print(
                f"{name:10s} bare {a:6.3f} ms/step  probed {b:6.3f} ms/step  "
                f"wall ratio {wall:.4f}  CPU ratio {cpu:.4f} ({(cpu - 1) * 100:+.2f} %)"
            )
        # the same pairs on a null step (a width-1 model: the framework's own cost per step),
        # five times the steps: the probe's added CPU per step in µs, measured where the step's
        # own swings are small, then put against the cheap step above
        WIDTH = 1
        print(f"null step (width 1), {args.steps * 5} steps x {args.rounds} rounds per side:")
        worst = 0.0
        for name, pair in pairs.items():
            a, b, _wall, _cpu, added, _dw = pair(args.steps * 5, args.rounds)
            share = added / (cheap[name][0] * 1e3)
            worst = max(worst, share)
            print(
                f"{name:10s} bare {a:6.3f} ms/step  probed {b:6.3f} ms/step  "
                f"probe CPU {added:+5.0f} µs/step = {share * 100:+.2f} % of the cheap "
                f"step ({cheap[name][0]:.3f} ms)"
            )
        from stallscope.probe.recorder import reset

        reset()
        print(f"worst null-step difference {worst * 100:.2f} % of the cheap step")
    # the parts alone, in a fresh process (this one's TensorFlow threads and writer would
    # blur them): what the probe adds to every step, whatever else the machine does
    r = subprocess.run(
        [sys.executable, __file__, "--parts", "--rounds", str(args.rounds)],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(r.stdout.strip().splitlines()[-1])
    total = got["stamps"] + got["host"] + got["writer"]
    step_us = min(c[0] for c in cheap.values()) * 1e3
    print(
        f"the probe's parts alone, per step: in-graph stamps {got['stamps']:+.1f} µs, "
        f"host wrapper and ring reads {got['host']:+.1f} µs (per call; less per step with "
        f"steps_per_execution > 1), writer thread {got['writer']:+.1f} µs"
    )
    print(
        f"probe cost {total:.1f} µs per step = {total / step_us * 100:.2f} % of the cheapest "
        f"step above ({step_us / 1e3:.3f} ms; goal <= 1 %)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
