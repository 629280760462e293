"""The TensorFlow/Keras adapter of the probe with real TensorFlow and Keras: the tf.data pipeline
description, model.fit's per-step input wait measured inside the compiled train function (with
and without steps_per_execution), and custom loops through stallscope.watch(dataset).

Input wait is checked against a known cost: a map that sleeps a fixed time per batch with no
prefetch, so each step waits about that long, and a model step much cheaper than that."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

import stallscope
from stallscope.probe.keras import TFProbe, dataset_config
from stallscope.probe.recorder import reset
from stallscope.store import RunStore, StepRow, new_run_dir

pytestmark = pytest.mark.tensorflow

#: TensorFlow and Keras, imported when the first test of this file runs (the autouse fixture
#: below), not when the file is collected: every pytest process of the suite collects it (both
#: workers of the parallel pass, the exclusive pass, the fast tier) and TensorFlow's import is
#: ~5 s of CPU that only the process running these tests needs. A test fails up front when
#: TensorFlow is missing (marker tensorflow, tests/conftest.py COMPONENTS)
tf: Any = None
keras: Any = None


@pytest.fixture(autouse=True)
def _tensorflow() -> None:
    global tf, keras
    if tf is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        tf = pytest.importorskip("tensorflow")
        keras = pytest.importorskip("keras")


SLEEP_S = 0.03
BATCHES = 8


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for k in ("STALLSCOPE_RUN_DIR", "STALLSCOPE_OUT", "STALLSCOPE_PROBE", "RANK"):
        monkeypatch.delenv(k, raising=False)
    d = new_run_dir(tmp_path / "runs", "test")
    RunStore(d / "run.db").close()
    monkeypatch.setenv("STALLSCOPE_RUN_DIR", str(d))
    yield d
    reset()


def read(d: Path) -> tuple[list[StepRow], list[dict[str, Any]]]:
    reset()  # close the recorder: everything written
    store = RunStore(d / "run.db", readonly=True)
    try:
        return store.steps(), store.probes()
    finally:
        store.close()


def slow_dataset(sleep_s: float = SLEEP_S) -> Any:
    """BATCHES batches of 16; each batch costs sleep_s in a map without parallelism (and the
    pipeline's autotuned prefetch turned off, so the step waits for it)."""
    x = tf.random.uniform([16 * BATCHES, 8])
    y = tf.random.uniform([16 * BATCHES, 1])

    def slow(a: Any, b: Any) -> Any:
        out = tf.py_function(lambda t: (time.sleep(sleep_s), t)[1], [a], tf.float32)
        out.set_shape(a.shape)
        return out, b

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).map(slow)
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False
    opts.autotune.enabled = False
    return ds.with_options(opts)


def small_model(spe: int = 1) -> Any:
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    m.compile("sgd", "mse", steps_per_execution=spe)
    return m


# --- the pipeline's shape ------------------------------------------------------------------------
def test_dataset_config_reads_the_pipeline(tmp_path: Path) -> None:
    files = [str(tmp_path / f"{i}.bin") for i in range(5)]
    auto = tf.data.AUTOTUNE
    ds = (
        tf.data.Dataset.from_tensor_slices(files)
        .map(tf.io.read_file)
        .map(tf.strings.length, num_parallel_calls=auto)
        .cache()
        .batch(2)
        .prefetch(auto)
    )
    cfg = dataset_config(ds)
    assert cfg["loader_type"] == "tf.data"
    assert [s["op"] for s in cfg["pipeline"]] == [
        "source",
        "map",
        "map",
        "cache",
        "batch",
        "prefetch",
    ]
    assert cfg["sequential_maps"] == 1 and cfg["parallel_maps"] == 1
    assert cfg["pipeline"][2]["parallel"] == -1  # AUTOTUNE
    assert cfg["prefetch"] and cfg["cache"] and not cfg["interleave"]
    assert cfg["reads_files"] and cfg["source_len"] == 5
    assert cfg["batch_size"] == 2 and cfg["len"] == 3
    bare = dataset_config(tf.data.Dataset.range(10).map(lambda v: v * 2))
    assert not bare["prefetch"] and not bare["reads_files"] and bare["sequential_maps"] == 1
    inter = dataset_config(
        tf.data.Dataset.range(2).interleave(
            lambda i: tf.data.Dataset.range(3), cycle_length=2, num_parallel_calls=2
        )
    )
    assert inter["interleave"] and inter["len"] is None  # unknown cardinality
    # unbatch(): its own internal map is not a user's sequential map, and elements are samples
    unb = dataset_config(tf.data.Dataset.range(10).batch(4).unbatch())
    assert unb["sequential_maps"] == 0 and "batch_size" not in unb
    assert [s["op"] for s in unb["pipeline"]][-1] == "unbatch"
    assert dataset_config(tf.data.Dataset.range(10).batch(4).unbatch().batch(2))["batch_size"] == 2


# --- model.fit -----------------------------------------------------------------------------------
@pytest.mark.parametrize("spe", [1, 3])
def test_fit_splits_input_wait_from_compute(run_dir: Path, spe: int) -> None:
    from stallscope.integrations.keras import StallscopeCallback

    model = small_model(spe)
    model.fit(slow_dataset(), epochs=2, verbose=0, shuffle=False, callbacks=[StallscopeCallback()])
    steps, probes = read(run_dir)
    assert len(steps) == 2 * BATCHES  # one record per step, also when a call runs 3 steps
    assert [s.epoch for s in steps] == [0] * BATCHES + [1] * BATCHES
    assert all(s.samples == 16 for s in steps)
    body = steps[1:]  # the first call also traces the function
    waits = sorted(s.wait_s for s in body)
    assert waits[len(waits) // 2] >= 0.8 * SLEEP_S  # each step waited for its batch
    assert max(s.wait_s for s in body) < SLEEP_S + 0.25
    hosts = sorted(s.host_s for s in body)
    assert hosts[len(hosts) // 2] < 0.5 * SLEEP_S  # the step itself is cheap
    ts = [s.ts for s in steps]
    assert ts == sorted(ts)
    cfg = probes[0]["config"]
    assert cfg["loader"]["loader_type"] == "tf.data"
    assert cfg["loader"]["sequential_maps"] == 1
    assert cfg["framework"] == "tensorflow" and cfg["tensorflow"] == tf.__version__


def test_the_epoch_logs_carry_the_data_wait_share(run_dir: Path, tmp_path: Path) -> None:
    """Each epoch's logs get the probe's figures for the epoch: History, a real CSVLogger and
    Keras' TensorBoard callback after the callback record them (the input wait dominates this
    dataset); TensorBoard's event files are read back with TensorBoard's own reader."""
    import csv

    import keras

    from stallscope.integrations.keras import StallscopeCallback

    model = small_model(1)
    log = tmp_path / "epochs.csv"
    callbacks = [StallscopeCallback(), keras.callbacks.CSVLogger(str(log))]
    has_tb = importlib.util.find_spec("tensorboard") is not None
    if has_tb:
        callbacks.append(keras.callbacks.TensorBoard(str(tmp_path / "tb"), update_freq="epoch"))
    hist = model.fit(slow_dataset(), epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
    shares = hist.history["stallscope_data_wait_share"]
    assert len(shares) == 2 and all(0.5 < s < 1 for s in shares), shares
    rows = list(csv.DictReader(log.open()))
    assert [float(r["stallscope_data_wait_share"]) for r in rows] == pytest.approx(shares)
    assert all(float(r["stallscope_step_ms"]) >= 0.8 * SLEEP_S * 1000 for r in rows), rows
    if not has_tb:
        pytest.skip("tensorboard is not installed: its event files were not checked")
    from logreaders import tb_scalars

    scalars = tb_scalars(tmp_path / "tb")
    assert scalars["epoch_stallscope_data_wait_share"] == pytest.approx(shares), scalars
    assert scalars["epoch_stallscope_step_ms"] == pytest.approx(
        [float(r["stallscope_step_ms"]) for r in rows]
    ), scalars


def test_fit_without_wait_is_compute(run_dir: Path) -> None:
    """A pipeline that keeps up (cached, prefetched): the waits are small next to the step."""
    from stallscope.integrations.keras import StallscopeCallback

    x = tf.random.uniform([64 * BATCHES, 256])
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(64).cache().prefetch(2)
    model = keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(1024),
            keras.layers.Dense(1024),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", "mse")
    model.fit(ds, epochs=3, verbose=0, shuffle=False, callbacks=[StallscopeCallback()])
    steps, _ = read(run_dir)
    body = steps[BATCHES:]  # after the first (caching) epoch
    assert all(s.host_s > 0 for s in body)
    # the typical step's share (a loaded machine may starve the prefetch thread for a step or
    # two, which the total would count; a pipeline that lags shows in every step)
    shares = sorted(s.wait_s / (s.wait_s + s.host_s) for s in body)
    assert shares[len(shares) // 2] < 0.15, shares


def test_a_second_fit_keeps_one_timed_function(run_dir: Path) -> None:
    from stallscope.integrations.keras import StallscopeCallback
    from stallscope.probe.keras import TimedTrainFunction

    model = small_model()
    model.fit(
        slow_dataset(0.0), epochs=1, verbose=0, shuffle=False, callbacks=[StallscopeCallback()]
    )
    first = model.train_function
    model.fit(
        slow_dataset(0.0), epochs=1, verbose=0, shuffle=False, callbacks=[StallscopeCallback()]
    )
    assert isinstance(first, TimedTrainFunction) and model.train_function is first
    steps, _ = read(run_dir)
    assert len(steps) == 2 * BATCHES


# --- custom loops --------------------------------------------------------------------------------
def test_watch_a_dataset_in_a_custom_loop(run_dir: Path) -> None:
    model = small_model()
    opt = keras.optimizers.SGD(0.01)

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    watched = stallscope.watch(slow_dataset())
    assert isinstance(watched.probe, TFProbe)
    for x, y in watched:
        train_step(x, y)
    steps, probes = read(run_dir)
    assert len(steps) == BATCHES and all(s.samples == 16 for s in steps)
    assert sorted(s.wait_s for s in steps)[BATCHES // 2] >= 0.8 * SLEEP_S
    assert probes[0]["config"]["loader"]["loader_type"] == "tf.data"


def test_importing_stallscope_does_not_import_tensorflow() -> None:
    code = (
        "import stallscope, stallscope.probe, stallscope.analysis.diagnose, sys; "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        check=False,
    )
    assert res.returncode == 0, res.stderr


def test_run_eagerly_is_timed_too(run_dir: Path) -> None:
    from stallscope.integrations.keras import StallscopeCallback

    model = small_model()
    model.compile("sgd", "mse", run_eagerly=True)
    model.fit(slow_dataset(), epochs=1, verbose=0, shuffle=False, callbacks=[StallscopeCallback()])
    steps, _ = read(run_dir)
    assert len(steps) == BATCHES
    assert sorted(s.wait_s for s in steps)[BATCHES // 2] >= 0.8 * SLEEP_S


def test_an_unknown_train_function_is_timed_whole_and_said(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A train function that is not Keras 3's (here: a user's wrapper): one warning, each call
    recorded whole, training unchanged."""
    from stallscope.integrations.keras import StallscopeCallback

    model = small_model()
    model.make_train_function()
    keras_fn = model.train_function
    model.train_function = lambda it: keras_fn(it)
    model.fit(slow_dataset(), epochs=1, verbose=0, shuffle=False, callbacks=[StallscopeCallback()])
    assert "timing whole train calls only" in capsys.readouterr().err
    steps, _ = read(run_dir)
    assert len(steps) == BATCHES and all(s.samples == 16 for s in steps)
    # the input wait shows as compute: the limitation the warning names
    assert sorted(s.host_s for s in steps)[BATCHES // 2] >= 0.8 * SLEEP_S


# --- against TensorFlow's own profiler -----------------------------------------------------------
def _profiler_input_time(logdir: Path) -> tuple[float, int]:
    """Seconds the host spent in the iterator's GetNext ops (what TF's input-pipeline analysis
    counts as input time on a CPU host) and how many, from the profiler's XSpace trace."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    [path] = list(logdir.rglob("*.xplane.pb"))
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    total, n = 0, 0
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                name = names.get(ev.metadata_id, "")
                if name.startswith("IteratorGetNext") and name.endswith("Op::DoCompute"):
                    total += ev.duration_ps
                    n += 1
    return total / 1e12, n


@pytest.mark.parametrize("spe", [1, 4])
def test_input_wait_agrees_with_the_tensorflow_profiler(
    run_dir: Path, tmp_path: Path, spe: int
) -> None:
    """The same fit, traced by tf.profiler and timed by the callback: the probe's summed wait is
    the profiler's GetNext time within 10% (+1 ms a step), and both call the run highly
    input-bound (the Profiler's line: ≥ 20% of step time waiting for input)."""
    from stallscope.integrations.keras import StallscopeCallback

    model = small_model(spe)
    cb = StallscopeCallback()
    model.fit(slow_dataset(), epochs=1, verbose=0, shuffle=False, callbacks=[cb])  # traces
    logdir = tmp_path / "prof"
    tf.profiler.experimental.start(str(logdir))
    model.fit(slow_dataset(), epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    tf.profiler.experimental.stop()
    prof_s, ops = _profiler_input_time(logdir)
    steps, _ = read(run_dir)
    mine = [s for s in steps if s.epoch == 0][BATCHES:]  # the profiled fit (its epoch 0 again)
    assert len(mine) == BATCHES and ops >= BATCHES
    wait = sum(s.wait_s for s in mine)
    step = sum(s.wait_s + s.host_s for s in mine)
    print(
        f"spe={spe}: probe wait {wait:.4f} s, profiler GetNext {prof_s:.4f} s ({ops} ops), "
        f"steps {step:.4f} s"
    )
    assert wait == pytest.approx(prof_s, rel=0.1, abs=0.001 * BATCHES), (wait, prof_s)
    assert wait / step >= 0.2 and prof_s / step >= 0.2


_MIRRORED = r"""
import os, sys, time
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from stallscope.integrations.keras import StallscopeCallback
SLEEP_S, BATCHES, SPE = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
x = tf.random.uniform([16 * BATCHES, 8])
y = tf.random.uniform([16 * BATCHES, 1])
def slow(a, b):
    out = tf.py_function(lambda t: (time.sleep(SLEEP_S), t)[1], [a], tf.float32)
    out.set_shape(a.shape)
    return out, b
opts = tf.data.Options()
opts.experimental_optimization.inject_prefetch = False
opts.autotune.enabled = False
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).map(slow).with_options(opts)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
with strategy.scope():
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    m.compile("sgd", "mse", steps_per_execution=SPE)
m.fit(ds, epochs=2, verbose=0, shuffle=False, callbacks=[StallscopeCallback()])
"""


def test_fit_under_a_two_replica_mirrored_strategy(run_dir: Path) -> None:
    """tf.distribute with two replicas (two logical CPU devices, in a process of its own: they
    must be set before TensorFlow starts): one record per global step, each waiting for its
    batch, and the pipeline described as the user wrote it, not as the strategy cloned it.
    (steps_per_execution > 1 under this strategy hangs or fails in Keras 3.15 itself, with or
    without the callback: docs/probe.md.)"""
    sleep_s = 0.1  # the strategy's own prefetch may overlap part of it with the step
    res = subprocess.run(
        [sys.executable, "-c", _MIRRORED, str(sleep_s), str(BATCHES), "1"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            STALLSCOPE_RUN_DIR=str(run_dir),
            TF_CPP_MIN_LOG_LEVEL="2",
        ),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    steps, probes = read(run_dir)
    assert len(steps) == 2 * BATCHES, [s.step for s in steps]
    assert [s.epoch for s in steps] == [0] * BATCHES + [1] * BATCHES
    waits = sorted(s.wait_s for s in steps[1:])
    assert waits[len(waits) // 2] >= 0.5 * sleep_s  # each global step waited for its batch
    hosts = sorted(s.host_s for s in steps[1:])
    assert hosts[len(hosts) // 2] < 0.5 * sleep_s
    loader = probes[0]["config"]["loader"]
    assert loader["batch_size"] == 16 and all(s.samples == 16 for s in steps)
    assert loader["sequential_maps"] == 1 and not loader["prefetch"], loader
