"""The DataLoader batches `stallscope run` counts inside a PyTorch trainer
(stallscope/sources/stacks/batches.py), and the throughput `compare` and `show` read from them
when a run has no probe (issue 40: "compare without the probe has no samples/s row")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import stallscope_argv

from stallscope.analysis.stacks import batch_throughput, trainer_phases
from stallscope.sources.stacks import batches
from stallscope.sources.stacks.aggregate import Tally
from stallscope.sources.stacks.phases import Frame

torch = pytest.importorskip("torch")


@pytest.fixture
def counting() -> Iterator[None]:
    """The counter installed on this process's DataLoaders, removed after the test."""
    import torch.utils.data  # noqa: F401  (the module the counter waits for)

    assert batches.install()
    try:
        yield
    finally:
        batches.uninstall()


def test_a_batch_is_as_long_as_its_first_tensor() -> None:
    import numpy as np

    t = torch.zeros(8, 3)
    assert batches.batch_len(t) == 8
    assert batches.batch_len((t, torch.zeros(8))) == 8
    assert batches.batch_len(["names", np.zeros((5, 2))]) == 5
    assert batches.batch_len({"text": ["a"], "ids": torch.zeros(4, 16)}) == 4
    assert batches.batch_len(torch.tensor(3.0)) == 0  # a scalar says nothing
    assert batches.batch_len(["a", "b"]) == 0 and batches.batch_len(None) == 0


@pytest.mark.parametrize("workers", [0, 1])
def test_every_batch_of_an_epoch_is_counted_and_the_training_sees_the_same(
    counting: None, workers: int
) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(100.0).reshape(-1, 1))
    before = list(batches.COUNTS)
    got = list(DataLoader(data, batch_size=16, num_workers=workers))  # 6 of 16, one of 4
    assert [len(b[0]) for b in got] == [16] * 6 + [4]
    assert torch.equal(torch.cat([b[0] for b in got]), data.tensors[0])  # same samples, order
    assert batches.COUNTS[0] - before[0] == 7  # StopIteration counts nothing
    assert batches.COUNTS[1] - before[1] == 100


def test_each_batch_s_wait_and_step_are_timed_but_an_iterator_s_first(counting: None) -> None:
    """A loader whose every 5th sample takes 40 ms, a step of 5 ms between batches: the waits
    come into WAITS and the handover-to-handover times into STEPS, each iterator's first batch
    left out (the workers' start); they go into the window's record as ``wait_b``, ``step_b``,
    and read back into the trainer's histograms."""
    import time

    from torch.utils.data import DataLoader, Dataset

    from stallscope.sources.stacks.fetches import bucket_mid_s, cost_summary

    class Slow(Dataset):
        def __len__(self) -> int:
            return 20

        def __getitem__(self, i: int) -> int:
            time.sleep(0.04 if i % 5 == 0 else 0.001)
            return i

    batches.WAITS.clear()
    batches.STEPS.clear()
    for _epoch in range(2):
        for _batch in DataLoader(Slow(), batch_size=1, num_workers=0):
            time.sleep(0.005)
    assert sum(batches.WAITS.values()) == sum(batches.STEPS.values()) == 2 * 19
    waits = cost_summary([batches.WAITS], tail=0.1)
    assert waits is not None and waits["p99_ms"] >= 36  # the 40-ms samples, within a bucket
    assert max(bucket_mid_s(k) for k in batches.STEPS) >= 0.04 + 0.005 * 0.9
    tally = Tally(1, None, "inproc", 50.0)
    tally.add([Frame("/x/torch/utils/data/dataloader.py", "__next__", 1)], 0.02)
    tally.time_batches(dict(batches.WAITS), dict(batches.STEPS))
    rec = tally.record(1.0)
    assert rec is not None and sum(rec["wait_b"].values()) == 38
    rec["s"] = {"data": 1.0, "compute": 1.0}
    [p] = trainer_phases([rec])
    assert p.wait_b == batches.WAITS and p.step_b == batches.STEPS


def test_uninstall_gives_torch_its_own_next_back(counting: None) -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    assert _BaseDataLoaderIter.__next__.__module__ == batches.__name__
    batches.uninstall()
    assert _BaseDataLoaderIter.__next__.__module__ == "torch.utils.data.dataloader"
    assert batches.install()  # the fixture's uninstall finds it installed


def test_counts_go_into_the_window_record_and_none_are_lost_before_training() -> None:
    tally = Tally(1, None, "inproc", 50.0)
    loader = [
        Frame("/x/torch/utils/data/dataloader.py", "__next__", 1),
        Frame("train.py", "<module>", 1),
    ]
    tally.count(2, 64)  # batches taken before the first training sample was seen
    assert tally.record(1.0) is None  # nothing sampled yet: no record, the counts kept
    tally.add(loader, 0.02)
    tally.count(1, 32)
    rec = tally.record(2.0)
    assert rec is not None and rec["batches"] == 3 and rec["samples"] == 96
    tally.add(loader, 0.02)
    rec = tally.record(3.0)
    assert rec is not None and "batches" not in rec  # none in this window


def test_throughput_from_counted_batches_skips_what_is_not_a_count() -> None:
    recs: list[dict[str, Any]] = [
        {"ts": 1.0, "pid": 7, "s": {"data": 1.0, "compute": 1.0}, "batches": 10, "samples": 320},
        {"ts": 2.0, "pid": 7, "s": {"data": 1.0, "compute": 1.0}, "batches": "10", "samples": 320},
        {"ts": 3.0, "pid": 7, "s": {"data": 1.0, "compute": 1.0}, "batches": 5, "samples": -1},
        {"ts": 4.0, "pid": 7, "s": {"data": 1.0, "compute": 1.0}, "batches": 10, "samples": 320},
    ]
    [p] = trainer_phases(recs)
    assert (p.batches, p.batch_samples) == (20, 640)
    assert batch_throughput([p], 8.0) == 80.0
    assert batch_throughput([p], 0.0) is None


# --- end to end: two runs of a training with no stallscope code, and `compare` ------------------

TRAINING = """
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.full((8,), float(i))


workers, seconds = int(sys.argv[1]), float(sys.argv[2])
loader = DataLoader(Slow(), batch_size=8, num_workers=workers)
model = torch.nn.Linear(8, 1)
samples, t0 = 0, time.perf_counter()
for x in loader:
    model(x).sum().backward()
    samples += len(x)
    if time.perf_counter() - t0 >= seconds:
        break
print(f"own rate: {samples / (time.perf_counter() - t0):.2f} samples/s")
"""


def _run(tmp_path: Path, name: str, workers: int) -> tuple[Path, float]:
    script = tmp_path / "slow_training.py"
    script.write_text(TRAINING)
    out = tmp_path / name
    r = subprocess.run(
        [
            *stallscope_argv("run", "--quiet", "--interval", "0.5", "--out", str(out), "--"),
            sys.executable,
            str(script),
            str(workers),
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"own rate: ([0-9.]+) samples/s", r.stdout)
    assert m, r.stdout[-2000:]
    [run] = list(out.iterdir())
    return run, float(m.group(1))


@pytest.mark.slow
def test_compare_without_the_probe_reads_samples_per_s_from_the_counted_batches(
    tmp_path: Path,
) -> None:
    """Two runs of an unmodified training (A: no workers, B: two), no probe: `compare` gives
    both samples/s, each within 10% of the training's own rate, says where they came from, and
    the speed-up is their ratio."""
    a, own_a = _run(tmp_path, "a", 0)
    b, own_b = _run(tmp_path, "b", 2)
    c = subprocess.run(
        stallscope_argv("compare", str(a), str(b), "--json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert c.returncode == 0, c.stderr
    out = json.loads(c.stdout)
    assert out["throughput_source"] == {"a": "counted_batches", "b": "counted_batches"}, out
    [row] = [r for r in out["rows"] if r["key"] == "samples_per_s"]
    assert row["a"] == pytest.approx(own_a, rel=0.1), (row, own_a)
    assert row["b"] == pytest.approx(own_b, rel=0.1), (row, own_b)
    assert out["speedup"] == pytest.approx(row["b"] / row["a"], rel=0.01)
    assert "no_throughput" not in out
    text = subprocess.run(
        stallscope_argv("compare", str(a), str(b)),
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert (
        "samples/s of both runs from the DataLoader batches counted inside the trainer"
        in text.stdout
    ), text.stdout
    assert "B is ×" in text.stdout, text.stdout
    # the loading sleeps: the diagnosis says it waits on something else, and asks for workers
    # past the cores (it was "CPU preprocessing cannot keep up": a fresh-clone trial)
    for run, nw in ((a, 0), (b, 2)):
        doc = json.loads(
            subprocess.run(
                stallscope_argv("diagnose", str(run), "--json"),
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )
        top = doc["findings"][0]
        assert top["kind"] == "input_bound.wait", doc["findings"]
        assert top["fixes"][0]["action"].startswith(f"num_workers {nw} → "), top["fixes"]
        assert top["fixes"][0]["change"]["num_workers"] > max(nw, 2), top["fixes"]
    # show gives the same figure, from the same evidence
    shown = json.loads(
        subprocess.run(
            stallscope_argv("show", str(b), "--json"),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )["summary"]
    assert (shown["samples_per_s"], shown["throughput_source"]) == (row["b"], "counted_batches")


BUFFERED = """
import os, queue, sys, threading, time
import numpy as np
import torch
import torch.utils.data as tud
from stallscope.sources.stacks import batches, inproc

class Sorted(tud.Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        a = np.random.default_rng(i).random(100_000)
        return np.sort(a)[:8]

assert batches.install()
sampler = inproc.start(sys.argv[1])
q = queue.Queue(maxsize=2)

def buffer():  # MONAI's ThreadDataLoader's buffer thread: iterate a DataLoader into a queue
    for batch in tud.DataLoader(Sorted(), batch_size=8, num_workers=0):
        q.put(batch)

threading.Thread(target=buffer, daemon=True).start()
torch.set_num_threads(1)
model, w = torch.nn.Linear(512, 512), torch.randn(64, 512)
t0 = time.monotonic()
while time.monotonic() - t0 < 4:
    x = q.get()
    for _ in range(3):  # a step of a few ms beside ~60 ms of loading a batch
        model(w).sum().backward()
sampler.stop()
os._exit(0)  # the buffer thread is still inside torch: no interpreter teardown under it
"""


@pytest.mark.slow
def test_a_thread_iterating_a_dataloader_under_the_hook_is_a_loader_thread(
    tmp_path: Path,
) -> None:
    """MONAI's ThreadDataLoader: a buffer thread iterates a DataLoader (num_workers=0) into a
    queue. Under `run` that DataLoader's __next__ is stallscope's counting hook; its frame
    made the thread read as stallscope's own, no loader's, and a 93%-data-bound MONAI training
    read as data_wait_unknown. The thread is a loader thread preparing, and the training
    thread's wait on it is data."""
    import subprocess
    import sys

    from stallscope.sources.stacks.aggregate import read_records

    script = tmp_path / "buffered.py"
    script.write_text(BUFFERED)
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    recs = read_records(tmp_path)
    parts = [rec["threads"] for rec in recs if "threads" in rec]
    assert parts, recs
    assert sum(p["s"]["prep"] for p in parts) > 1.0, parts
    [p] = trainer_phases(recs)
    assert p.share("data") >= 0.5, p.seconds
