"""Loaders that are not a DataLoader: a ThreadPoolExecutor prefetching batches into a queue
(issue 52, part 3; examples/train_threads.py), run unmodified under `stallscope run`. Its
training thread waits in ``Future.result``, which read as "other" before the sampler sampled
the loader threads: cold files read through a read limit are input_bound.fetch; Python-heavy
prep in 4 threads is input_bound.gil, while prep in NumPy (which releases the GIL) and the same
Python prep in DataLoader worker processes are not. torchdata's nodes on threads (their
``ParallelMapper`` and ``Prefetcher``: frames the phase tables know as a loader's) are read as a
thread loader the same way. Each share within 0.05 of the loop's own timing of its wait for
batches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_own_loop, training_finding

from stallscope.analysis.diagnose.rules.threads import THREADS

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow]

TRAIN = str(ROOT / "examples" / "train_threads.py")
CONSTRAIN = str(ROOT / "examples" / "constrain.py")
#: reads capped at 2 MB/s: a batch of 8 files of 64 KiB is a quarter of a second of reads
#: against a millisecond of compute
READ_BPS = 2_000_000
#: the training's length (s)
SECONDS = "10"
#: the share's tolerance against the loop's own timing
WITHIN = 0.05


def _run(
    tmp_path: Path, data: Path, extra: list[str], wrap: list[str] | None = None
) -> dict[str, Any]:
    trainer = [TRAIN, "--data-dir", str(data), "--max-seconds", SECONDS, *extra]
    doc = run_own_loop(tmp_path, data, trainer, wrap or [])
    sig = doc["signals"]
    print(  # the figures, for a report of the run (pytest -s)
        f"{extra}: {doc['verdict']} stall {doc.get('stall_fraction')} truth "
        f"{doc['trainer_wait']} threads {sig.get('loader_threads')} fetch "
        f"{sig.get('thread_fetch_share')} prep {sig.get('thread_prep_share')} GIL wait "
        f"{sig.get('thread_gil_wait_ms')} ms cpu {sig.get('thread_cpu_cores')}"
    )
    return doc


def _near_truth(doc: dict[str, Any]) -> None:
    assert doc["stall_source"] == "stacks", doc["stall_source"]
    assert abs(doc["stall_fraction"] - doc["trainer_wait"]) <= WITHIN, (
        doc["stall_fraction"],
        doc["trainer_wait"],
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("threads") / "data"
    subprocess.run(
        [sys.executable, TRAIN, "--data-dir", str(data), "--max-seconds", "0"],
        check=True,
        capture_output=True,
    )
    return data


def test_a_thread_pool_reading_through_a_read_limit_is_fetch_bound(
    tmp_path: Path, throttled_group: str, files: Path
) -> None:
    doc = _run(
        tmp_path,
        files,
        ["--cold", "--prep", "none", "--threads", "4"],
        [
            sys.executable,
            CONSTRAIN,
            "--read-bps",
            str(READ_BPS),
            "--data",
            str(files),
            "--cgroup",
            throttled_group,
            "--",
        ],
    )
    f = training_finding(doc)
    assert f["kind"] == "input_bound.fetch", doc["findings"]
    assert "loader thread" in f["summary"] and "reads in flight" in f["fixes"][0]["action"]
    assert doc["signals"]["loader_threads"] == 4
    assert doc["signals"]["thread_fetch_share"] > doc["signals"]["thread_prep_share"]
    _near_truth(doc)


@pytest.mark.exclusive
def test_python_prep_in_four_threads_is_held_by_the_gil(tmp_path: Path, files: Path) -> None:
    """Python prep in 4 threads beside a CPU training step in Python: the step needs the GIL
    too, so on a quiet machine the loader keeps up with a step it slows (the loop's own data
    wait 13-16%, 52 steps in 10 s) and on a busy one the wait grows; either way the verdict is
    input_bound.gil, never compute_bound. (The first version of this scenario, --cost 30,
    read as data-bound only on a host others kept busy: on a fresh clone's quiet CI run the
    loop waited 8-10% and the GIL's evidence stayed under its line.)"""
    doc = _run(tmp_path, files, ["--prep", "python", "--cost", "120", "--threads", "4"])
    s = doc["signals"]
    # the loader threads were busy preparing, several at once, on about one core
    assert s["loader_threads"] == 4 and s["thread_prep_share"] >= THREADS.prep_share, s
    assert s["thread_busy"] >= THREADS.min_busy and s["thread_cpu_cores"] <= 1.1, s
    # the GIL contended: the sampler waited for it (its run-queue wait left out: a busy host
    # makes a CPU wait, not a GIL wait)
    assert s["thread_gil_wait_ms"] >= THREADS.min_gil_wait_ms, s
    f = training_finding(doc)
    assert f["kind"] == "input_bound.gil", doc["findings"]
    assert "compute_bound" not in [x["kind"] for x in doc["findings"]]
    assert "processes" in f["fixes"][0]["action"], f["fixes"]
    # Known gap (issue 52): under a contended GIL the sampler itself waits for the GIL, and
    # its samples land where the training thread waits for it (its step's frames): the
    # sampled data wait reads low (0.075-0.10 against the loop's own 0.13-0.16 on a quiet
    # 2-core machine), never high
    assert doc["stall_source"] == "stacks"
    assert doc["stall_fraction"] <= doc["trainer_wait"] + WITHIN, (
        doc["stall_fraction"],
        doc["trainer_wait"],
    )
    if doc["stall_fraction"] >= 0.15:  # the data-side finding: its gain from the cores
        # processes at a lower priority yield their cores (as the rule counts them)
        taken = (s.get("others_cpu_cores") or 0.0) - (s.get("niced_others_cpu_cores") or 0.0)
        free = s["logical_cores"] - max(0.0, taken)
        if free >= s["main_cpu_pct"] / 100 + THREADS.min_more_cores:
            assert f["est_speedup"] > 1, (f["est_speedup"], free)


@pytest.mark.exclusive
def test_numpy_prep_in_threads_releases_the_gil(tmp_path: Path, files: Path) -> None:
    doc = _run(tmp_path, files, ["--prep", "numpy", "--cost", "2", "--threads", "4"])
    _near_truth(doc)
    kinds = [f["kind"] for f in doc["findings"]]
    assert "input_bound.gil" not in kinds, doc["findings"]
    assert training_finding(doc)["kind"] == "input_bound.prep", doc["findings"]
    assert doc["signals"]["loader_threads"] == 4
    assert doc["signals"]["thread_gil_wait_ms"] < THREADS.min_gil_wait_ms, doc["signals"]


@pytest.mark.exclusive
def test_python_prep_in_dataloader_workers_is_not_the_gil(tmp_path: Path, files: Path) -> None:
    doc = _run(tmp_path, files, ["--prep", "python", "--cost", "30", "--workers", "2"])
    _near_truth(doc)
    kinds = [f["kind"] for f in doc["findings"]]
    assert "input_bound.gil" not in kinds, doc["findings"]
    assert training_finding(doc)["kind"] == "input_bound.prep", doc["findings"]
    assert not doc["signals"].get("loader_threads"), doc["signals"]


@pytest.mark.exclusive
def test_torchdata_nodes_on_threads_are_a_thread_loader(tmp_path: Path, files: Path) -> None:
    """torchdata's ``ParallelMapper`` on 4 threads preparing in Python, each step also waiting
    20 ms as for a GPU's kernels: the training thread waits inside torchdata's frames (known as
    data) in ``queue.get``, on its loader threads: input_bound.gil, as for a pool of the
    loop's own. (Before, a wait inside a known loader's frames was never counted as a wait on
    threads: the run read as a loader without workers, "raise num_workers".)"""
    doc = _run(
        tmp_path,
        files,
        [*("--loader", "torchdata", "--prep", "python", "--cost", "120"), "--step-ms", "20"],
    )
    _near_truth(doc)
    s = doc["signals"]
    # the loader's 4 mapper threads and its own plumbing (the prefetcher's, the mapper's
    # reader and sorter threads) worked; the training thread waited on them
    assert s["loader_threads"] >= 4, s
    assert s["thread_wait_share"] >= 0.5 * doc["stall_fraction"], s
    f = training_finding(doc)
    assert f["kind"] == "input_bound.gil", doc["findings"]
    assert "processes" in f["fixes"][0]["action"], f["fixes"]
