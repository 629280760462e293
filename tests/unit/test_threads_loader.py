"""Thread loaders (issue 52, part 3): the loader threads' samples classified (fetch, prep,
idle), the training thread's wait on them counted as data, their records read back as facts,
and the diagnosis: input_bound.fetch / prep from the loader threads' samples, input_bound.gil
for Python-bound prep sharing one GIL."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from diagnose_inputs import T0, N, procs, run, ser

from stallscope.analysis.diagnose import diagnose
from stallscope.analysis.diagnose.rules.threads import THREADS, rule_thread_loader
from stallscope.analysis.facts import Facts
from stallscope.sources.stacks.aggregate import Tally, read_records
from stallscope.sources.stacks.phases import Frame
from stallscope.sources.stacks.threads import (
    ThreadTally,
    loader_phase,
    thread_cpu_s,
    thread_runq_s,
    waits_on_thread,
)

_POOL = Frame("/usr/lib/python3.11/concurrent/futures/thread.py", "run", 58)
_BOOT = Frame("/usr/lib/python3.11/threading.py", "_bootstrap_inner", 1045)


def test_a_loader_threads_samples_are_fetch_prep_or_idle(tmp_path: Path) -> None:
    src = tmp_path / "loader.py"
    src.write_text(
        "def load(p):\n    with open(p, 'rb') as fh:\n        return fh.read()\n"
        "def prep(x):\n    return [b * 3 for b in x]\n"
    )
    own = str(src)
    assert loader_phase([Frame(own, "load", 3), _POOL, _BOOT]) == "fetch"
    assert loader_phase([Frame(own, "prep", 5), _POOL, _BOOT]) == "prep"
    # a library that reads, wherever it is on the stack
    sock = Frame("/usr/lib/python3.11/socket.py", "readinto", 707)
    assert loader_phase([sock, Frame(own, "prep", 5), _POOL]) == "fetch"
    # waiting for work: the pool's own frame innermost (SimpleQueue.get is C), a queue's wait
    assert loader_phase([Frame(_POOL.file, "_worker", 81), _BOOT]) == "idle"
    wait = Frame("/usr/lib/python3.11/threading.py", "wait", 320)
    assert loader_phase([wait, Frame("/usr/lib/python3.11/queue.py", "put", 140)]) == "idle"
    # the DataLoader's own thread and stallscope's are no loader threads
    pin = Frame("/x/site-packages/torch/utils/data/_utils/pin_memory.py", "_pin_memory_loop", 9)
    assert loader_phase([wait, pin]) is None
    # a thread iterating a DataLoader (MONAI's ThreadDataLoader's buffer thread) is a loader's
    fetch = Frame("/x/site-packages/torch/utils/data/_utils/fetch.py", "fetch", 52)
    buffer = Frame("/x/site-packages/monai/data/thread_buffer.py", "enqueue_values", 48)
    assert loader_phase([Frame(own, "prep", 5), fetch, buffer]) == "prep"
    # under `run` the DataLoader's __next__ the buffer thread calls is stallscope's hook
    # (sources/stacks/batches.py): see-through, still MONAI's loader thread preparing
    hook = Frame("/x/site-packages/stallscope/sources/stacks/batches.py", "__next__", 90)
    nxt = Frame("/x/site-packages/torch/utils/data/dataloader.py", "__next__", 630)
    assert loader_phase([Frame(own, "prep", 5), fetch, nxt, hook, buffer]) == "prep"
    assert loader_phase([Frame("/x/site-packages/stallscope/probe/writer.py", "_loop", 1)]) is None
    assert loader_phase([Frame("/x/stallscope/probe/writer.py", "_loop", 1)]) is None
    assert loader_phase([]) is None


def test_the_training_thread_waits_on_a_thread_loader() -> None:
    main = Frame("/home/u/train.py", "main", 40)
    result = Frame("/usr/lib/python3.11/concurrent/futures/_base.py", "result", 451)
    get = Frame("/usr/lib/python3.11/queue.py", "get", 180)
    assert waits_on_thread([Frame("/usr/lib/python3.11/threading.py", "wait", 1), result, main])
    assert waits_on_thread([get, main])
    assert not waits_on_thread([Frame("/usr/lib/python3.11/threading.py", "wait", 1), main])
    # counted as data only while loader threads work; never starting the training
    t = Tally(1, None, "inproc", 40)
    frames = [Frame("/usr/lib/python3.11/threading.py", "wait", 1), result, main]
    assert t.add(frames, 0.5, loader_wait=True) == "startup"
    t.started = True
    assert t.add(frames, 0.5) == "other"
    assert not t.loader_wait
    assert t.add(frames, 0.5, loader_wait=True) == "data"
    assert t.loader_wait
    # inside a DataLoader's own frames (num_workers=0 with a decoding pool in the dataset, or
    # the queue its pin-memory thread fills) the wait stays the DataLoader's: not a wait on a
    # thread loader, whatever queue it is in
    dl = Frame("/x/site-packages/torch/utils/data/dataloader.py", "__next__", 630)
    assert not waits_on_thread([*frames[:2], dl, main])
    assert not waits_on_thread([get, dl, main])
    # inside a thread loader the tables know as data (torchdata's nodes: the prefetcher's
    # queue), it is one: data, and a wait on its threads
    prefetch = Frame("/x/site-packages/torchdata/nodes/prefetch.py", "next", 70)
    nodes = [Frame("/usr/lib/python3.11/threading.py", "wait", 1), get, prefetch, main]
    assert waits_on_thread(nodes)
    assert t.add(nodes, 0.5, loader_wait=True) == "data"
    assert t.loader_wait
    assert t.add(nodes, 0.5) == "data"
    assert not t.loader_wait


def test_a_thread_tally_sums_the_working_threads_and_their_cpu() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    th = threading.Thread(target=spin, name="loader-0")
    th.start()
    try:
        tt = ThreadTally()
        assert th.ident is not None and tt.wanted(th.ident)
        tt.add(th.ident, "prep", 0.5, 1.0)
        tt.add(th.ident, "fetch", 0.25, 1.0)
        tt.add(123, "idle", 1.0, 1.0)  # a thread that only waited: no loader
        assert tt.working(2.0, 2.0) and not tt.working(4.0, 2.0)
        tt.wait_s = 0.4
        time.sleep(0.2)
        rec = tt.record()
    finally:
        stop.set()
        th.join()
    assert rec is not None
    assert rec["n"] == 1 and rec["s"] == {"fetch": 0.25, "prep": 0.5, "idle": 0.0}
    assert rec["cpu_s"] > 0 and rec["wait_s"] == 0.4
    assert tt.record() is None  # a fresh window
    me = threading.get_native_id()
    assert (thread_cpu_s(me) or 0) > 0
    hold = threading.Event()
    named = threading.Thread(target=hold.wait, name="stallscope-probe-0")
    named.start()
    try:
        assert named.ident is not None and not ThreadTally().wanted(named.ident)
    finally:
        hold.set()
        named.join()


def _python_prep(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFF
    return acc


def test_the_sampler_records_a_thread_loaders_threads_and_the_wait_on_them(
    tmp_path: Path,
) -> None:
    """A real ThreadPoolExecutor preparing in Python while the main thread waits on its
    futures: the records carry the loader threads' prep and the main thread's data."""
    from stallscope.sources.stacks.inproc import InProcSampler

    sampler = InProcSampler(tmp_path, 100.0, flush_s=0.5)
    sampler.tally.started = True
    sampler.start()
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        while time.monotonic() - t0 < 1.5:
            for f in [pool.submit(_python_prep, 200_000) for _ in range(2)]:
                f.result()
    sampler.stop()
    elapsed = time.monotonic() - t0
    recs = [r for r in read_records(tmp_path) if r.get("threads")]
    assert recs, read_records(tmp_path)
    prep = sum(r["threads"]["s"]["prep"] for r in recs)
    busy = prep + sum(r["threads"]["s"]["fetch"] for r in recs)
    assert prep > 0.5 * busy and max(r["threads"]["n"] for r in recs) == 2
    # each thread's samples stand for the time it was sampled, no more (the first one: a wake)
    total = sum(sum(r["threads"]["s"].values()) for r in recs)
    assert total <= 2 * elapsed + 0.2, (total, elapsed)
    if thread_runq_s(threading.get_native_id()) is not None:  # schedstat: the GIL's figure
        # every record but the first (no run-queue baseline yet) and a last one right after
        # a flush (no wake in it)
        assert any("gil_s" in r["threads"] and r["threads"]["wakes"] > 0 for r in recs), recs
    data = sum(r["s"].get("data", 0.0) for r in recs)
    assert data > 0 and sum(r["threads"]["wait_s"] for r in recs) == pytest.approx(data, 0.01)


def _thread_run(
    *,
    fetch: float,
    prep: float,
    cpu: float,
    main_cpu: float,
    host: float,
    gil_ms: float = 8.0,
    n: int = 4,
    cores: int = 4,
    waits: float = 0.8,
) -> Any:
    """A trainer (pid 100) on ``cores`` cores whose training thread waits on its loader threads 80%
    of each second; the loader threads' thread-seconds ``fetch`` and ``prep`` (idle the rest
    of n), ``cpu`` of their CPU seconds, each second; the sampler waited ``gil_ms`` for the
    GIL at each of its 40 wakes a second."""
    data = run(
        [
            ser("host.cpu_pct", "", [host] * N),
            ser("procs.cpu_pct", "100", [main_cpu] * N),
        ],
        entities=procs({"100": "main"}),
        meta={"logical_cores": cores},
    )
    idle = max(0.0, n - fetch - prep)
    data.stacks = [
        {
            "ts": T0 + i + 1,
            "pid": 100,
            "rank": None,
            "sampler": "inproc",
            "n": 40,
            "s": {"data": waits, "compute": 1.0 - waits},
            "stacks": {},
            "stack_phase": {},
            "threads": {
                "n": n,
                "s": {"fetch": fetch, "prep": prep, "idle": idle},
                "cpu_s": cpu,
                "wait_s": waits,
                "gil_s": gil_ms * 40 / 1000,
                "wakes": 40,
            },
        }
        for i in range(N - 2)
    ]
    return data


def test_python_prep_in_four_threads_on_one_core_is_the_gil() -> None:
    doc = diagnose(_thread_run(fetch=0.3, prep=3.5, cpu=0.9, main_cpu=100, host=30))
    f = doc["findings"][0]
    assert doc["verdict"] == "input_bound.gil", doc["findings"]
    kinds = [x["kind"] for x in doc["findings"]]
    assert "input_bound.prep" not in kinds and "compute_bound" not in kinds
    assert f["evidence"]["thread_busy"] == pytest.approx(3.8)
    assert f["evidence"]["thread_cpu_cores"] == pytest.approx(0.9)
    assert f["evidence"]["thread_gil_wait_ms"] == pytest.approx(8.0)
    assert f["evidence"]["spare_cores"] == pytest.approx(2.8)
    assert "processes" in f["fixes"][0]["action"] and "release the GIL" in f["fixes"][1]["action"]
    assert doc["stall_fraction"] == pytest.approx(0.8)
    assert 1 < f["est_speedup"] <= 1 / (1 - 0.8) + 0.01
    assert "one GIL" in f["summary"] and "0.90 core" in f["summary"]


@pytest.mark.parametrize(
    ("why", "kw", "verdict"),
    [
        # NumPy releasing the GIL: the busy threads get their cores, the GIL is free
        (
            "releases_the_gil",
            {"cpu": 3.3, "main_cpu": 340, "host": 90, "gil_ms": 0.5},
            "input_bound.prep",
        ),
        # a busy host: the threads wait for a CPU, in the run queue, not for the GIL
        ("busy_host", {"host": 100, "gil_ms": 1.5}, "input_bound.prep"),
        # the GIL contended, but the process on more than a core: not one GIL's
        ("several_cores", {"cpu": 1.8, "main_cpu": 190}, "input_bound.prep"),
        # a host of one core: no core more for processes
        ("one_core", {"cores": 1, "host": 100}, "input_bound.prep"),
        # one thread working at a time cannot contend
        ("one_busy", {"prep": 1.0, "fetch": 0.1}, "input_bound.prep"),
        # reading more than preparing, the GIL free
        ("reads", {"fetch": 3.0, "prep": 0.5, "gil_ms": 0.2}, "input_bound.fetch"),
    ],
)
def test_no_gil_where_threads_are_not_held_by_it(
    why: str, kw: dict[str, Any], verdict: str
) -> None:
    args: dict[str, Any] = {"fetch": 0.3, "prep": 3.5, "cpu": 0.9, "main_cpu": 100, "host": 30}
    args.update(kw)
    doc = diagnose(_thread_run(**args))
    assert doc["verdict"] == verdict, (why, doc["findings"])
    f = doc["findings"][0]
    assert "loader thread" in f["summary"], f["summary"]
    if verdict == "input_bound.fetch":
        assert "reads in flight" in f["fixes"][0]["action"]


def test_a_thread_loader_without_its_wait_is_no_finding_of_this_rule() -> None:
    """Loader threads that worked while the training thread did not wait on them (the wait
    was elsewhere), a stall under 15%, a stall not measured: nothing from rule_thread_loader."""
    base = {
        "stall_fraction": 0.8,
        "stall_source": "stacks",
        "loader_threads": 4,
        "thread_wait_share": 0.8,
        "thread_fetch_share": 0.1,
        "thread_prep_share": 0.85,
        "thread_busy": 3.8,
        "thread_cpu_cores": 0.9,
        "main_cpu_pct": 100.0,
    }
    assert rule_thread_loader(None, Facts.of(base))  # type: ignore[arg-type]
    for change in (
        {"thread_wait_share": 0.8 * THREADS.wait_on_threads - 0.01},
        {"stall_fraction": 0.1},
        {"stall_source": "gpu_idle"},
        {"loader_threads": 0},
    ):
        assert not rule_thread_loader(None, Facts.of({**base, **change})), change  # type: ignore[arg-type]


def test_loader_threads_holding_the_gil_the_step_needs_are_no_healthy_run() -> None:
    """A CPU training step in Python beside Python prep in 4 threads: the step waits its turn
    for the GIL, the loader keeps up with the slowed steps, and the data wait stays low (8%;
    examples/train_threads.py --prep python --cost 120 on a quiet 2-core machine: 10% sampled,
    16% by the loop's own clock, 52 steps in 10 s). Not compute_bound: input_bound.gil, gain
    not estimated. With the GIL free (NumPy prep), the same low wait is healthy."""
    doc = diagnose(_thread_run(fetch=0.3, prep=2.8, cpu=1.0, main_cpu=100, host=55, waits=0.08))
    f = doc["findings"][0]
    assert doc["verdict"] == "input_bound.gil", doc["findings"]
    assert "compute_bound" not in [x["kind"] for x in doc["findings"]]
    assert "training thread needs" in f["summary"] and "only 8%" in f["summary"]
    assert f["est_speedup"] == 1.0 and "processes" in f["fixes"][0]["action"]
    assert "< 15%" in f["rule"] and "8.0 ms" in f["rule"]
    free = diagnose(
        _thread_run(fetch=0.3, prep=2.8, cpu=2.9, main_cpu=300, host=75, gil_ms=0.5, waits=0.08)
    )
    assert free["verdict"] == "compute_bound", free["findings"]
