"""Sampled stacks: the frame tables, the tally, py-spy's output, both samplers on real
processes, a refused attach for real (a second user, no CAP_SYS_PTRACE), and the diagnosis
built on them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, stallscope_argv

from stallscope.analysis.stacks import top_stacks, trainer_phases
from stallscope.errors import SourceUnavailable
from stallscope.sources.stacks.aggregate import Tally, append_record, read_records
from stallscope.sources.stacks.phases import Frame, classify, fold, idle_process, starts_training
from stallscope.sources.stacks.pyspy import (
    STOP_GRACE_S,
    PySpySampler,
    parse_raw,
    pyspy_path,
    sample_weight,
)
from stallscope.sources.stacks.source import StacksSource, window_shares

SP = "/usr/lib/python3/site-packages/"
INJECT = ROOT / "stallscope" / "inject"


def F(path: str, func: str, line: int = 1) -> Frame:
    return Frame(path, func, line)


def stack(*frames: Frame) -> list[Frame]:
    """Frames given outermost first (as a traceback reads), returned innermost first."""
    return list(reversed(frames))


LOOP = F("/home/u/train.py", "main", 40)


@pytest.mark.parametrize(
    "inner, phase, framework",
    [
        (
            [
                F(SP + "torch/utils/data/dataloader.py", "__next__"),
                F(SP + "torch/utils/data/dataloader.py", "_next_data"),
                F("/usr/lib/python3.11/queue.py", "get"),
            ],
            "data",
            "pytorch",
        ),
        # num_workers=0: the user's __getitem__ runs inside the loader's fetch: still data
        (
            [
                F(SP + "torch/utils/data/dataloader.py", "__next__"),
                F(SP + "torch/utils/data/_utils/fetch.py", "fetch"),
                F("/home/u/data.py", "__getitem__"),
            ],
            "data",
            "pytorch",
        ),
        (
            [F(SP + "torch/nn/modules/module.py", "_call_impl"), F("/home/u/model.py", "forward")],
            "compute",
            "pytorch",
        ),
        (
            [
                F(SP + "torch/_tensor.py", "backward"),
                F(SP + "torch/autograd/__init__.py", "backward"),
            ],
            "compute",
            "pytorch",
        ),
        ([F(SP + "torch/optim/adam.py", "step")], "compute", "pytorch"),
        (
            [
                F(SP + "torch/distributed/c10d_logger.py", "wrapper"),
                F(SP + "torch/distributed/distributed_c10d.py", "all_reduce"),
            ],
            "comm",
            "pytorch",
        ),
        ([F(SP + "torch/serialization.py", "save")], "ckpt", "pytorch"),
        ([F(SP + "torch/cuda/__init__.py", "synchronize")], "gpu_wait", "pytorch"),
        (
            [
                F(SP + "transformers/trainer.py", "train"),
                F(SP + "transformers/trainer.py", "get_batch_samples"),
                F(SP + "accelerate/data_loader.py", "__iter__"),
            ],
            "data",
            "hf",
        ),
        ([F(SP + "transformers/trainer.py", "_save_checkpoint")], "ckpt", "hf"),
        ([F(SP + "lightning/pytorch/loops/fetchers.py", "__next__")], "data", "lightning"),
        ([F(SP + "tensorflow/python/data/ops/iterator_ops.py", "__next__")], "data", "tensorflow"),
        (
            [
                F(SP + "keras/src/backend/tensorflow/trainer.py", "fit"),
                F(
                    SP + "tensorflow/python/eager/polymorphic_function/polymorphic_function.py",
                    "__call__",
                ),
            ],
            "graph",
            "tensorflow",
        ),
        # the loader being torn down after the loop is not a wait: the process's exit
        (
            [
                F(SP + "torch/utils/data/dataloader.py", "__del__"),
                F(SP + "torch/utils/data/dataloader.py", "_shutdown_workers"),
            ],
            "exit",
            "",
        ),
        ([F("/home/u/train.py", "log_metrics")], "other", ""),
    ],
)
def test_the_innermost_known_frame_decides(inner: list[Frame], phase: str, framework: str) -> None:
    assert classify(stack(LOOP, *inner)) == (phase, framework)


def test_the_trainers_own_line_tells_a_copy_and_a_gpu_wait(tmp_path: Path) -> None:
    """A C call has no frame: the innermost frame's source line says what it is."""
    src = tmp_path / "train.py"
    src.write_text(
        "x = x.to(device, non_blocking=True)\nloss_value = loss.item()\n"
        "y = model(x)  # x.cpu() in a comment is not code\n"
        "x, y = next(it)\nx = next(it).to(device)\nnext_lr = sched.step()\n"
    )
    f = str(src)
    assert classify([F(f, "main", 1)])[0] == "h2d"
    assert classify([F(f, "main", 2)])[0] == "gpu_wait"
    assert classify([F(f, "main", 3)])[0] == "other"
    # binding the batch next() returned (and freeing the last one) is getting the batch
    assert classify([F(f, "main", 4)])[0] == "data"
    assert classify([F(f, "main", 5)])[0] == "h2d"
    assert classify([F(f, "main", 6)])[0] == "other"
    # a library's line is not read: its frames are the tables' business
    assert classify([F(SP + "foo/bar.py", "f", 1)])[0] == "other"


def test_imports_launchers_and_spawned_children() -> None:
    imp = stack(
        LOOP,
        F("<frozen importlib._bootstrap>", "_find_and_load"),
        F(SP + "torch/nn/modules/linear.py", "<module>"),
    )
    assert classify(imp)[0] == "setup"  # module-level code of torch is not training
    join = stack(LOOP, F(SP + "torch/distributed/distributed_c10d.py", "init_process_group"))
    assert classify(join)[0] == "setup"  # joining the group is not a collective
    assert idle_process(stack(F(SP + "torch/distributed/run.py", "main")))
    spawned = F("/usr/lib/python3.11/multiprocessing/spawn.py", "spawn_main")
    # a DataLoader worker started with spawn, mp.spawn's parent: no trainers
    assert idle_process(stack(spawned, F(SP + "torch/utils/data/_utils/worker.py", "_worker_loop")))
    assert idle_process(stack(LOOP, F(SP + "torch/multiprocessing/spawn.py", "join")))
    # the child mp.spawn started to train is one
    assert not idle_process(stack(spawned, F("/home/u/train.py", "train")))
    assert not idle_process(stack(LOOP))
    # importing the modules of a launcher is not being one (transformers imports them all)
    assert not idle_process(
        stack(
            LOOP,
            F("<frozen importlib._bootstrap>", "_find_and_load"),
            F(SP + "torch/distributed/elastic/agent/server/api.py", "<module>"),
        )
    )


def test_fold_is_outermost_first_without_lines() -> None:
    s = stack(F("/home/u/train.py", "<module>", 3), F(SP + "torch/optim/adam.py", "step", 9))
    assert fold(s) == "<module> (u/train.py);step (torch/optim/adam.py)"


DATA = stack(LOOP, F(SP + "torch/utils/data/dataloader.py", "__next__"))
COMPUTE = stack(LOOP, F(SP + "torch/nn/modules/module.py", "_call_impl"))
OTHER = stack(F("/home/u/train.py", "make_dataset"))


def test_a_process_found_to_be_no_trainer_stops_before_training_only() -> None:
    t = Tally(7, None, "inproc", 50.0)
    for _ in range(5):
        t.add(OTHER, 0.1)  # the interpreter starting: nothing known yet
    assert not t.idle
    t.add(stack(LOOP, F(SP + "torch/multiprocessing/spawn.py", "join")), 0.1)
    assert t.idle
    t = Tally(8, None, "inproc", 50.0)
    t.add(DATA, 0.1, key=("k",))
    t.add(stack(LOOP, F(SP + "torch/multiprocessing/spawn.py", "join")), 0.1)
    assert not t.idle  # once training started, it is a trainer
    assert t.add(OTHER, 0.1, key=("k",)) == "data"  # the memo answers for a known key


def test_tally_leaves_out_startup_and_the_tail() -> None:
    t = Tally(7, 1, "inproc", 50.0)
    t.add(OTHER, 0.1)
    assert t.record(99.0) is None  # start-up only: no record (a helper process writes none)
    for _ in range(9):
        t.add(OTHER, 0.1)  # building the dataset: start-up
    t.add(DATA, 0.3)
    t.add(OTHER, 0.2)  # between steps: counted once training goes on
    t.add(COMPUTE, 0.1)
    rec = t.record(100.0)
    assert rec is not None and rec["rank"] == 1 and rec["n"] == 12
    assert rec["s"] == {"startup": 0.9, "data": 0.3, "other": 0.2, "compute": 0.1}
    t.add(OTHER, 0.5)  # clean-up after the loop: pending, then the tail
    last = t.record(101.0, final=True)
    assert last is not None and last["s"] == {"tail": 0.5}
    assert t.add(DATA, 5.0) == "data" and t.seconds["data"] == 1.0  # one sample ≤ 1 s


def test_building_a_dataloader_or_sampler_does_not_start_training() -> None:
    """A sample taken while the DataLoader or DistributedSampler is built, before the loop, is
    start-up: building the model and DDP joining its process group follow it (seconds on a
    busy host, which would count as training's `other`). Iterating the loader starts
    training, a new iterator's workers included."""
    dl = SP + "torch/utils/data/dataloader.py"
    t = Tally(7, 1, "inproc", 50.0)
    t.add(stack(LOOP, F(SP + "torch/utils/data/distributed.py", "__init__")), 0.1)
    t.add(stack(LOOP, F(dl, "__init__"), F(dl, "__setattr__")), 0.1)
    assert not t.started
    t.add(
        stack(
            LOOP,
            F(SP + "torch/nn/parallel/distributed.py", "__init__"),
            F(SP + "torch/distributed/distributed_c10d.py", "broadcast"),
        ),
        0.9,
    )  # DDP joins
    assert not t.started
    # the first epoch's iter(loader) starts the workers (an __init__ under __iter__): a wait
    t.add(stack(LOOP, F(dl, "__iter__"), F(dl, "_get_iterator"), F(dl, "__init__")), 0.3)
    assert t.started
    t.add(COMPUTE, 0.1)
    rec = t.record(100.0)
    assert rec is not None and rec["s"] == pytest.approx(
        {"startup": 1.1, "data": 0.3, "compute": 0.1}
    )
    # once training runs, building another loader (a validation one) is the input's time
    assert t.add(stack(LOOP, F(dl, "__init__")), 0.1) == "data"


def test_pyspy_s_class_qualified_names_match_the_tables() -> None:
    """py-spy names methods with their class. Its `_BaseDataLoaderIter.__next__` starts the
    training and a loader torn down is still `other` (before, an attached trainer's waits
    counted as start-up until its first compute sample: 9 s of a 12-s run once, and its data
    share read 0.806 against the trainer's own 0.953). A loader torn down is the exit."""
    dl = "torch/utils/data/dataloader.py"
    wait = stack(
        F("train.py", "<module>"),
        F(dl, "_BaseDataLoaderIter.__next__"),
        F(dl, "_MultiProcessingDataLoaderIter._next_data"),
        F("multiprocessing/connection.py", "Connection._poll"),
    )
    assert classify(wait) == ("data", "pytorch")
    assert starts_training(wait, "data", "pytorch")
    t = Tally(7, None, "py-spy", 10.0)
    assert t.add(wait, 0.1) == "data" and t.started
    end = stack(
        F("train.py", "<module>"),
        F(dl, "_MultiProcessingDataLoaderIter.__del__"),
        F(dl, "_MultiProcessingDataLoaderIter._shutdown_workers"),
    )
    assert classify(end)[0] == "exit"
    ddp = stack(
        F("train.py", "<module>"),
        F("torch/nn/parallel/distributed.py", "DistributedDataParallel.__init__"),
    )
    assert classify(ddp)[0] == "setup"


def test_folded_stacks_are_bounded_per_record() -> None:
    t = Tally(7, None, "inproc", 50.0)
    t.add(DATA, 0.1)
    for i in range(100):
        t.add(stack(LOOP, F(SP + "torch/nn/modules/module.py", f"f{i}")), 0.01)
    rec = t.record(1.0)
    assert rec is not None and len(rec["stacks"]) == 41  # 40 and "(other stacks)"
    assert abs(sum(rec["stacks"].values()) - 1.1) < 1e-6


RAW = (
    (
        "thread (1282): MainThread;<module> (train.py:10);"
        "__next__ (torch/utils/data/dataloader.py:733);get (queue.py:180) 33\n"
    )
    + """\
thread (1282): MainThread;<module> (train.py:12);_call_impl (torch/nn/modules/module.py:1784) 46
thread (1299): pin_memory;_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:52) 79
garbage line without count
thread (1282): MainThread;<module> (train.py:10) x
"""
)


def test_pyspy_raw_output_keeps_the_main_thread() -> None:
    got = list(parse_raw(RAW, tid=1282))
    assert [(classify(f)[0], n) for f, n in got] == [("data", 33), ("compute", 46)]
    frames = got[0][0]
    assert frames[0] == Frame("queue.py", "get", 180)  # innermost first
    assert len(list(parse_raw(RAW))) == 3


def _round(pid: int) -> str:
    """A py-spy round of ``pid``: 30 samples waiting for data, 10 of compute, and 8 tearing
    down the loader's workers (py-spy's raw output: counts, no order)."""
    main = f"thread ({pid}): MainThread;<module> (train.py:10);"
    return (
        f"{main}__next__ (torch/utils/data/dataloader.py:733);get (queue.py:180) 30\n"
        f"{main}_call_impl (torch/nn/modules/module.py:1784) 10\n"
        f"{main}__del__ (torch/utils/data/dataloader.py:1600);_shutdown_workers "
        "(torch/utils/data/dataloader.py:1580);join (multiprocessing/process.py:149) 8\n"
    )


def test_pyspy_the_round_a_trainer_ended_in_leaves_its_end_out(tmp_path: Path) -> None:
    """Within a round, py-spy keeps no order. In the round a trainer ended in, what was not
    training (its workers torn down: 0.31-0.39 s of a 12-s attached run) is its end: ``tail``,
    in no share; in a round of a trainer still running it is ``other``."""
    alive = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["true"])
    ended.wait()
    try:
        sampler = PySpySampler(tmp_path / "stacks", [alive.pid, ended.pid], rate_hz=10)
        for pid in (alive.pid, ended.pid):
            sampler._tallies[pid].started = True  # training began in an earlier round
            out = tmp_path / f"{pid}.txt"
            out.write_text(_round(pid))
            sampler._finish_round(pid, out, 0, "", wall_s=4.8)
        recs = {r["pid"]: r for r in read_records(tmp_path)}
        assert recs[alive.pid]["s"] == pytest.approx({"data": 3.0, "compute": 1.0, "other": 0.8})
        assert recs[ended.pid]["s"] == pytest.approx(
            {"data": 3.0, "compute": 1.0, "tail": 0.8, "exit": 0.8}
        )  # the tail's exit part
    finally:
        alive.kill()
        alive.wait()


def test_a_pyspy_sample_stands_for_the_time_it_covered() -> None:
    # on time: the aimed interval; behind (168 samples in a 10 s round at 20 Hz, as measured
    # with both cores busy): the round's time over its samples; a stalled round: at most 4x
    assert sample_weight(20, 200, 10.02) == pytest.approx(0.05)
    assert sample_weight(20, 168, 10.0) == pytest.approx(10.0 / 168)
    assert sample_weight(20, 10, 10.0) == pytest.approx(0.2)
    # a round the target left early: fewer samples over a shorter time, not stretched
    assert sample_weight(20, 60, 3.0) == pytest.approx(0.05)
    assert sample_weight(20, 0, 10.0) == sample_weight(20, 5, None) == pytest.approx(0.05)


def _write(
    run: Path,
    pid: int,
    rank: int | None,
    secs: dict[str, float],
    ts: float = 1.0,
    stacks: dict[str, float] | None = None,
) -> None:
    rec = {
        "ts": ts,
        "pid": pid,
        "rank": rank,
        "sampler": "inproc",
        "rate_hz": 50,
        "n": 50,
        "s": secs,
        "stacks": stacks or {},
        "stack_phase": {k: "data" for k in stacks or {}},
    }
    append_record(run / "stacks", rec)


def test_records_read_back_and_garbage_is_skipped(tmp_path: Path) -> None:
    _write(tmp_path, 11, 0, {"data": 3.0, "compute": 1.0}, stacks={"a;b": 3.0})
    with open(tmp_path / "stacks" / "11.jsonl", "a") as fh:
        fh.write(
            '{"pid": "x"}\n[1, 2]\nnot json\n{"ts": 2, "pid": 11, "s": {"data": "lots"}}\n'
            '{"ts": 3, "pid": 11, "s": {"data": 1e300, "other": -1}}\n{"ts": 4, "pi'
        )
    with open(tmp_path / "stacks" / "11.jsonl", "a") as fh:
        fh.write(
            '\n{"ts": NaN, "pid": 11, "s": {"data": 1}}\n{"ts": 1e999, "pid": 11, "s": {}}\n'
            '{"ts": 5, "pid": true, "s": {}}\n'
        )
    recs = read_records(tmp_path)
    assert len(recs) == 3  # the two with odd values are read, their odd values not counted
    [p] = trainer_phases(recs)
    assert p.seconds == {"data": 3.0, "compute": 1.0} and p.share("data") == 0.75
    assert top_stacks(recs, 11) == [("a;b", "data", 3.0)]


def test_trainer_processes_are_ranks_not_workers_or_helpers(tmp_path: Path) -> None:
    _write(tmp_path, 20, None, {"data": 1.0})  # too short to count
    _write(tmp_path, 21, None, {"compute": 9.0})
    _write(tmp_path, 22, None, {"data": 5.0})  # a helper script that trained less
    assert [p.pid for p in trainer_phases(read_records(tmp_path))] == [21]
    _write(tmp_path, 30, 1, {"data": 9.0, "compute": 1.0})
    _write(tmp_path, 31, 0, {"data": 0.5, "comm": 9.5})
    procs = trainer_phases(read_records(tmp_path))
    assert [(p.rank, p.pid) for p in procs] == [(0, 31), (1, 30)]
    # a rank is a trainer even where the process tree, read early, made it look like a
    # launcher (its worker not yet renamed pt_data_worker): RunData.roles says so
    from stallscope.analysis.rundata import RunData

    tree = [
        {"source": "procs", "entity": "31", "attrs": {"name": "python"}},
        {"source": "procs", "entity": "99", "attrs": {"name": "python", "ppid": "31"}},
    ]
    data = RunData(meta={}, series={}, entities=tree, stacks=read_records(tmp_path))
    assert data.roles()["31"] == "main"
    # without a rank, a worker is no trainer
    unranked = tmp_path / "u"
    _write(unranked, 50, None, {"data": 9.0})
    _write(unranked, 51, None, {"compute": 5.0})
    assert [p.pid for p in trainer_phases(read_records(unranked), roles={"50": "worker"})] == [51]


def test_the_collector_reads_new_records_only(tmp_path: Path) -> None:
    src = StacksSource(tmp_path)
    src.open()
    assert src.sample(0.0) == {}
    _write(tmp_path, 5, 3, {"startup": 2.0, "data": 1.5, "compute": 0.5})
    with open(tmp_path / "stacks" / "5.jsonl", "a") as fh:
        fh.write('{"ts": 9, "pid": 5, "s": {"data"')  # half a line: read next time
    got = src.sample(1.0)
    assert got == {"5": window_shares({"data": 1.5, "compute": 0.5})}
    assert got["5"]["data_pct"] == 75.0 and got["5"]["sampled_s"] == 2.0
    assert src.entities(got) == {"5": {"rank": 3}}
    with open(tmp_path / "stacks" / "5.jsonl", "a") as fh:
        fh.write(": 1.0}}\n")
    # the last 10 s of records: the half line completed now (ts 9) counts with the first
    assert src.sample(9.5)["5"] == window_shares({"data": 2.5, "compute": 0.5})
    assert src.sample(15.0)["5"] == window_shares({"data": 1.0})  # ts 1 left the window
    assert src.sample(30.0) == {}  # nothing in the last 10 s
    points = src.points({"5": {"data_pct": 10.0}})
    assert points[0].name == "stacks.data_pct" and points[0].entity == "5"


TRAINER = """\
import os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.03)
        return torch.zeros(4)

model = torch.nn.Linear(4, 4)
it = iter(DataLoader(Slow(), batch_size=1, num_workers=0))
print("ready", flush=True)
t0 = time.monotonic()
wait = 0.0
while time.monotonic() - t0 < float(sys.argv[1]):
    a = time.monotonic()
    x = next(it)
    wait += time.monotonic() - a
    b = time.monotonic()
    while time.monotonic() - b < 0.01:
        model(x).sum().backward()
print(f"data wait: {wait / (time.monotonic() - t0):.3f}", flush=True)
"""


def _share_of(run: Path) -> tuple[float, list]:
    recs = read_records(run)
    [p] = trainer_phases(recs)
    return p.share("data"), recs


@pytest.mark.slow
def test_the_injected_sampler_in_a_real_trainer(tmp_path: Path) -> None:
    """The sitecustomize on PYTHONPATH starts the sampler in a plain script; the data share it
    finds is the script's own within 0.05; the trainer's own sitecustomize still runs."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os\nos.environ['CHAINED'] = '1'\nprint('chained', flush=True)\n"
    )
    env = dict(
        os.environ,
        STALLSCOPE_RUN_DIR=str(tmp_path),
        STALLSCOPE_STACKS_HZ="100",
        PYTHONPATH=f"{INJECT}{os.pathsep}{other}",
    )
    r = subprocess.run(
        [sys.executable, str(script), "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "chained" in r.stdout, r.stderr
    own = float(r.stdout.rsplit("data wait: ", 1)[1])
    share, recs = _share_of(tmp_path)
    print(f"trainer's own data wait {own:.3f}, sampled {share:.3f}")
    assert abs(share - own) <= 0.05
    assert {rec["sampler"] for rec in recs} == {"inproc"}


@pytest.mark.slow
@pytest.mark.exclusive  # beside another test, py-spy read 0.79-0.83 against 0.752 (3 of 6 runs)
def test_pyspy_attached_to_a_running_trainer(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if pyspy_path() is None:
        pytest.fail("py-spy is a dependency of stallscope: pip install py-spy")
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen([sys.executable, str(script), "7"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        sampler = PySpySampler(tmp_path / "stacks", [proc.pid], rate_hz=50, round_s=1.0)
        sampler.start()
        out, _ = proc.communicate(timeout=30)
        sampler.stop()
    finally:
        proc.kill()
    own = float(out.rsplit("data wait: ", 1)[1])
    share, recs = _share_of(tmp_path)
    print(f"trainer's own data wait {own:.3f}, sampled by py-spy {share:.3f}")
    assert abs(share - own) <= 0.07  # py-spy starts a moment after the loop
    assert {rec["sampler"] for rec in recs} == {"py-spy"}


@pytest.mark.slow
def test_stopping_pyspy_keeps_the_round_in_flight(tmp_path: Path) -> None:
    """stop() in the middle of a round (an attached training that ended, Ctrl-C) keeps what
    the round sampled: py-spy ends it on SIGINT and writes it. With SIGTERM it was lost: the
    last round of an attached training, up to 10 s of its stacks (one record of a 14-s run)."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen([sys.executable, str(script), "60"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        sampler = PySpySampler(tmp_path / "stacks", [proc.pid], rate_hz=20, round_s=60.0)
        sampler.start()
        time.sleep(4.0)  # the first round (2 s), then 2 s into a round of 60
        t0 = time.monotonic()
        sampler.stop()
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert took < STOP_GRACE_S, took
    recs = read_records(tmp_path)
    assert len(recs) == 2, recs  # the first round's record and the cut round's
    [p] = trainer_phases(recs)
    assert p.total_s >= 3.0, p.total_s  # ~4 s of training sampled, not the first round's 2


def test_attaching_to_what_is_not_python_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(SourceUnavailable) as err:
            PySpySampler(tmp_path, [proc.pid]).start()
    finally:
        proc.kill()
        proc.wait()
    msg = str(err.value)
    assert msg.startswith(f"cannot sample pid {proc.pid} with py-spy: ") and "\n" not in msg
    assert "CPython" in msg
    with pytest.raises(SourceUnavailable, match="no such process"):
        PySpySampler(tmp_path, [proc.pid]).start()


SLEEPER = "import time\nt = time.time()\nwhile time.time() - t < 6: sum(range(1000))\n"


@pytest.mark.slow
def test_a_refused_attach_is_one_line_and_the_run_goes_on(tmp_path: Path) -> None:
    """For real: the trainer runs as another user (nobody) and stallscope without
    CAP_SYS_PTRACE, so the kernel refuses to let it read the trainer's memory. The run says
    so in one line, and goes on from system metrics."""
    setpriv = shutil.which("setpriv")
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or setpriv is None or system_python is None:
        pytest.skip("needs root (to start a process as another user), setpriv and /usr/bin/python3")
    target = subprocess.Popen(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", system_python, "-c", SLEEPER]
    )
    try:
        time.sleep(0.5)
        drop = [setpriv, "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"]
        r = subprocess.run(
            [
                *drop,
                *stallscope_argv("run", "--pid", str(target.pid), "--out", str(tmp_path / "runs")),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            input="",
            start_new_session=True,
        )
    finally:
        target.kill()
        target.wait()
    assert r.returncode == 0, r.stderr[-2000:]
    first = r.stderr.splitlines()[0]
    assert first.startswith("stallscope: no stack sampling: cannot sample pid "), r.stderr
    assert "ptrace" in first and "Traceback" not in r.stderr
    assert "verdict:" in r.stderr  # the diagnosis goes on from system metrics


def test_stack_rate_is_checked_and_no_stacks_means_none(tmp_path: Path) -> None:
    r = subprocess.run(
        stallscope_argv("run", "--stack-rate", "0", "--", "true"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "--stack-rate" in r.stderr
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--no-stacks",
            "--quiet",
            "--out",
            str(tmp_path),
            "--",
            sys.executable,
            "-c",
            "pass",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [run] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert not (run / "stacks").exists()
    meta = json.loads((run / "meta.json").read_text())
    assert "stacks" not in meta


def _run_with(stacks: list[dict]) -> object:
    from stallscope.analysis.rundata import RunData
    from stallscope.store import Series

    cost = Series("collector.cpu_s", "", [float(t) for t in range(30)], [0.001] * 30)
    return RunData(
        meta={"start": 0.0, "end": 30.0}, series={("collector.cpu_s", ""): cost}, stacks=stacks
    )


def _rec(pid: int, rank: int | None, **secs: float) -> dict:
    return {"ts": 1.0, "pid": pid, "rank": rank, "sampler": "inproc", "n": 500, "s": secs}


def test_the_diagnosis_names_the_starving_rank_from_stacks() -> None:
    """DDP without a probe: rank 1's training thread sits in the loader, rank 0's in the
    all-reduce waiting for it. The straggler rule names rank 1, the evidence says stacks."""
    from stallscope.analysis.diagnose import diagnose

    doc = diagnose(
        _run_with(
            [_rec(10, 0, data=0.4, compute=3.0, comm=6.6), _rec(11, 1, data=9.2, compute=0.8)]
        )
    )
    kinds = [f["kind"] for f in doc["findings"]]
    assert "straggler_rank" in kinds, doc["findings"]
    f = doc["findings"][kinds.index("straggler_rank")]
    assert f["evidence"]["rank"] == 1 and f["evidence"]["best_rank"] == 0
    assert doc["stall_source"] == "stacks" and doc["stall_fraction"] == 0.92
    assert [(r["rank"], r["stall_fraction"], r["comm_share"]) for r in doc["ranks"]] == [
        (0, 0.04, 0.66),
        (1, 0.92, 0.0),
    ]


def test_a_compiled_tensorflow_step_is_no_stall_measurement() -> None:
    """``fit`` attached with py-spy: the training thread sits in the compiled function, which
    holds the tf.data wait too. No stall from stacks then: never compute_bound on that."""
    from stallscope.analysis.diagnose import diagnose

    doc = diagnose(_run_with([_rec(10, None, graph=9.5, other=0.5)]))
    assert doc["stall_source"] is None and doc["stall_fraction"] is None
    assert "compute_bound" not in [f["kind"] for f in doc["findings"]]
    assert doc["signals"]["phase_shares"] == {"graph": 0.95, "other": 0.05}


def test_sampled_stacks_rank_between_probe_and_system_metrics() -> None:
    from stallscope.analysis.diagnose import diagnose

    doc = diagnose(_run_with([_rec(10, None, data=0.2, compute=9.0, other=0.8)]))
    assert doc["verdict"] == "compute_bound" and doc["stall_source"] == "stacks"
    top = doc["findings"][0]
    assert "sampled stacks" in top["summary"] and "sampled data wait 2%" in top["rule"]
    assert top["evidence"]["phase_shares"] == {"data": 0.02, "compute": 0.9, "other": 0.08}
    # the probe, where the trainer has one, speaks first
    from stallscope.store import StepRow

    data = _run_with([_rec(10, None, data=0.2, compute=9.0, other=0.8)])
    data.steps = [StepRow(0, i, float(i), 0.5, 0.5) for i in range(20)]  # type: ignore[attr-defined]
    doc = diagnose(data)  # type: ignore[arg-type]
    assert doc["stall_source"] == "probe" and doc["stall_fraction"] == 0.5


def test_docs_phases_list_every_table_row() -> None:
    """docs/diagnosis.md lists every frame-table row: its phase, file fragment, functions."""
    from stallscope.sources.stacks.phases import TABLES

    doc = (ROOT / "docs" / "diagnosis.md").read_text()
    rows = [ln for ln in doc.splitlines() if ln.startswith("| ") and ln.count("|") == 5]
    for rows_of in TABLES.values():
        for row in rows_of:
            hits = [ln for ln in rows if f"| {row.phase} |" in ln and f"`{row.path}`" in ln]
            assert hits, f"docs/diagnosis.md has no row for {row}"
            assert all(f"`{f}`" in hits[0] for f in row.funcs), (row, hits[0])


STACKS = ROOT / "tests" / "fixtures" / "stacks"


def _phases_of(name: str) -> dict[str, float]:
    counts: dict[str, int] = {}
    for frames, n in parse_raw((STACKS / name).read_text(), tid=1):
        phase = classify(frames)[0]
        counts[phase] = counts.get(phase, 0) + n
    total = sum(counts.values())
    assert total >= 150, name  # 4 s at 50 Hz
    return {k: v / total for k, v in counts.items()}


@pytest.mark.parametrize(
    "name, phase, least",
    [
        ("pytorch-prep.raw", "data", 0.85),  # waits on the worker queue
        ("pytorch-inline.raw", "data", 0.8),  # loads in __getitem__ on the training thread
        ("pytorch-compute.raw", "compute", 0.95),
        ("ddp-starve-rank1.raw", "data", 0.85),  # the starving rank
        ("hf-trainer.raw", "data", 0.85),
        ("lightning.raw", "data", 0.75),
        ("keras-fit.raw", "graph", 0.95),  # fit's compiled step hides the tf.data wait
        ("tf-custom-loop.raw", "data", 0.8),
    ],
)
def test_recorded_trainings_read_right(name: str, phase: str, least: float) -> None:
    """The tables on stacks recorded from real trainings (tests/fixtures/stacks/SOURCE.md)."""
    shares = _phases_of(name)
    assert shares.get(phase, 0.0) >= least, shares


def test_ddp_fast_rank_waits_for_its_peer_inside_backward() -> None:
    """Rank 0 of the starving DDP run: DDP's gradient all-reduce runs in C++ inside backward,
    so its wait for rank 1 shows as compute from Python frames (docs/diagnosis.md); its data
    share is what tells it from rank 1."""
    shares = _phases_of("ddp-starve-rank0.raw")
    assert shares.get("data", 0.0) <= 0.05 and shares.get("compute", 0.0) >= 0.9


def test_building_and_profiler_frames() -> None:
    """Building a model or an optimizer, or moving it to the device, is set-up wherever the
    innermost frame is; the profiler's wrapper decides nothing."""
    build = stack(
        LOOP,
        F(SP + "torch/nn/modules/linear.py", "__init__"),
        F(SP + "torch/nn/modules/module.py", "__setattr__"),
    )
    assert classify(build)[0] == "setup"
    assert classify(stack(LOOP, F(SP + "torch/nn/init.py", "kaiming_uniform_")))[0] == "setup"
    assert (
        classify(
            stack(
                LOOP,
                F(SP + "torch/optim/sgd.py", "__init__"),
                F(SP + "torch/_dynamo/__init__.py", "<module>"),
            )
        )[0]
        == "setup"
    )
    assert (
        classify(
            stack(
                LOOP,
                F(SP + "torch/nn/modules/module.py", "to"),
                F(SP + "torch/nn/modules/module.py", "_apply"),
            )
        )[0]
        == "setup"
    )
    wrapped = stack(
        LOOP,
        F(SP + "torch/utils/data/dataloader.py", "__next__"),
        F(SP + "torch/autograd/profiler.py", "__enter__"),
        F(SP + "torch/_ops.py", "__call__"),
    )
    assert classify(wrapped)[0] == "data"
    # a module's forward is compute, its __init__ is not
    assert classify(stack(LOOP, F(SP + "torch/nn/modules/linear.py", "forward")))[0] == "compute"


EXITING_JOIN = stack(
    F(SP + "torch/utils/data/dataloader.py", "_clean_up_worker"),
    F("/usr/lib/python3.12/multiprocessing/process.py", "join"),
    F("/usr/lib/python3.12/multiprocessing/popen_fork.py", "wait"),
)
SHUTDOWN = stack(
    LOOP,
    F(SP + "torch/utils/data/dataloader.py", "__del__"),
    F(SP + "torch/utils/data/dataloader.py", "_shutdown_workers"),
    F("/usr/lib/python3.12/multiprocessing/process.py", "join"),
)
FINALIZER = stack(
    F("/usr/lib/python3.12/weakref.py", "_exitfunc"),
    F("/usr/lib/python3.12/weakref.py", "__call__"),
    F(SP + "torch/library.py", "_del_library"),
)


def test_a_process_shutting_down_is_exit_never_data() -> None:
    """PyTorch's exit joining pinned persistent workers (30 s with 6 workers on an H200) ran
    in torch/utils/data/dataloader.py and was counted as data; the frames of a shutdown are
    ``exit`` wherever they are on the stack."""
    for frames in (EXITING_JOIN, SHUTDOWN, FINALIZER):
        assert classify(frames)[0] == "exit", frames
    t = Tally(7, None, "inproc", 40.0)
    t.add(DATA, 0.5)
    t.add(COMPUTE, 0.5)
    for _ in range(40):  # 40 s of joins: longer than MAX_PENDING_S, still not the run's
        t.add(EXITING_JOIN, 1.0)
    rec = t.record(100.0, final=True)
    assert rec is not None
    assert rec["s"] == {"data": 0.5, "compute": 0.5, "tail": 40.0, "exit": 40.0}
    # a loader shut down mid-run (workers joined at an epoch's end) is part of the run: other
    t = Tally(7, None, "inproc", 40.0)
    t.add(DATA, 0.5)
    t.add(SHUTDOWN, 0.3)
    t.add(DATA, 0.2)
    assert t.record(100.0)["s"] == {"data": 0.7, "other": 0.3}


def test_a_run_recorded_before_the_exit_phase_reads_with_todays_tables(tmp_path: Path) -> None:
    """Records written when the exit's joins were ``data`` (the H200 runs): the reader moves
    those stacks' seconds to ``exit``, which no share counts."""
    from stallscope.sources.stacks.aggregate import phase_seconds

    folded = fold(EXITING_JOIN)
    rec = {
        "ts": 1.0,
        "pid": 7,
        "s": {"compute": 0.3, "data": 0.7},
        "stacks": {folded: 0.7, fold(COMPUTE): 0.3},
        "stack_phase": {folded: "data", fold(COMPUTE): "compute"},
    }
    assert phase_seconds(rec) == {"compute": 0.3, "data": 0.0, "exit": 0.7}
    (p,) = trainer_phases([{**rec, "s": {"compute": 2.5, "data": 0.7}}])
    assert p.share("data") == 0.0 and p.share("compute") == 1.0


def test_a_hook_that_fails_to_install_never_stops_the_sampler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hook that raises as it installs (here the DataLoader's batch count) is given up, said
    once, and the sampler samples on; the communication timing, not distributed yet, is still
    asked for. (A sampler that died on an error wrote no stacks at all, silently: a DDP rank
    vanished from a diagnosis from stacks.)"""
    from stallscope.sources.stacks import inproc

    tries: list[int] = []

    def broken() -> bool:
        tries.append(1)
        raise RuntimeError("a torch this sampler does not know")

    monkeypatch.setattr(inproc.batches, "install", broken)
    # the batch timing installs at once here, whether or not this process imported torch
    monkeypatch.setattr(inproc.fetches, "install", lambda: True)
    sampler = inproc.InProcSampler(tmp_path, rate_hz=500)
    sampler._thread.start()
    try:
        deadline = time.monotonic() + 10
        while "batches" in sampler._hooks and time.monotonic() < deadline:
            time.sleep(0.01)
        n = sampler.tally.total_n
        time.sleep(0.2)
        assert sampler._thread.is_alive() and sampler.tally.total_n > n  # still sampling
        assert sampler._hooks == ["comm"] and tries == [1]
    finally:
        sampler._stop.set()
        sampler._thread.join(5)
    err = capsys.readouterr().err
    assert err.count("batches hook not installed: RuntimeError: a torch this sampler") == 1, err
    assert "stopped" not in err


def _thread_round(pid: int) -> str:
    """A py-spy round (``--threads``) of a trainer fed by a thread pool: its main thread waits
    in ``queue.get`` 30 samples and computes 10; one pool thread reads a file 25 samples, one
    prepares 15, one only waits for work."""
    main = f"thread ({pid}): MainThread;<module> (train.py:10);"
    pool = "_bootstrap (threading.py:1002);run (concurrent/futures/thread.py:58);"
    return (
        f"{main}get (queue.py:180) 30\n"
        f"{main}_call_impl (torch/nn/modules/module.py:1784) 10\n"
        f"thread ({pid + 1}): pool_0;{pool}load (train.py:20);readinto (_pyio.py:100) 25\n"
        f"thread ({pid + 2}): pool_1;{pool}prep (train.py:30) 15\n"
        f"thread ({pid + 3}): pool_2;_bootstrap (threading.py:1002);"
        "_worker (concurrent/futures/thread.py:80);get (queue.py:171) 40\n"
    )


def test_pyspy_reads_a_thread_loaders_threads_beside_the_training_thread(tmp_path: Path) -> None:
    """Attached (``run --pid``), the trainer's other threads are its loader threads as the
    in-process sampler reads them: the record's ``threads`` part says what they did, and the
    training thread's ``queue.get`` while they worked is a wait for data, not ``other``."""
    alive = subprocess.Popen(["sleep", "60"])
    try:
        sampler = PySpySampler(tmp_path / "stacks", [alive.pid], rate_hz=10)
        sampler._tallies[alive.pid].started = True  # training began in an earlier round
        sampler._finish_round(
            alive.pid, _round_file(tmp_path, _thread_round(alive.pid)), 0, "", 4.0
        )
        # a round with the loader threads gone: the same wait is the training's own "other"
        sampler._finish_round(alive.pid, _round_file(tmp_path, _thread_round(alive.pid), 2), 0, "")
        first, second = read_records(tmp_path)
    finally:
        alive.kill()
        alive.wait()
    assert first["s"] == pytest.approx({"data": 3.0, "compute": 1.0})
    part = first["threads"]
    assert part["n"] == 2  # the thread that only waited for work is no loader
    assert part["s"] == pytest.approx({"fetch": 2.5, "prep": 1.5, "idle": 0.0})
    assert part["wait_s"] == pytest.approx(3.0) and "gil_s" not in part
    assert second["s"] == pytest.approx({"other": 3.0, "compute": 1.0})
    assert "threads" not in second


def _round_file(tmp_path: Path, text: str, lines: int | None = None) -> Path:
    """A round file holding ``text``, or its first ``lines`` lines."""
    out = tmp_path / "round.txt"
    out.write_text("\n".join(text.splitlines()[:lines]) + "\n")
    return out
