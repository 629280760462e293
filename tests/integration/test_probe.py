"""The in-trainer step probe (stallscope.probe): timings, loader configuration, where records go,
bounded buffer, ranks, the CUDA-event path (with fake events: no GPU here) and failure handling.

Timing checks use lower bounds that sleeps guarantee and loose upper bounds on the median, so a
busy 2-core CI box does not make them flaky while a probe that mis-attributes time still fails.
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, env_without_stallscope, make_run

from stallscope import probe as probe_mod
from stallscope.probe import Probe, StepTimer, Watched, batch_size_of, h2d, loader_config
from stallscope.probe import recorder as recorder_mod
from stallscope.store import RunStore, StepRow, list_runs, read_meta, write_meta

pytest.importorskip("torch")
import itertools

import torch
from torch.utils.data import DataLoader, Dataset

pytestmark = pytest.mark.usefixtures("probe_env")  # (conftest.py)


def read_steps(run_dir: Path, rank: int | None = None) -> list[StepRow]:
    store = RunStore(run_dir / "run.db", readonly=True)
    try:
        return store.steps(rank)
    finally:
        store.close()


def read_probes(run_dir: Path) -> list[dict[str, Any]]:
    store = RunStore(run_dir / "run.db", readonly=True)
    try:
        return store.probes()
    finally:
        store.close()


class SleepyDataset(Dataset[torch.Tensor]):
    """Each sample costs ``delay`` seconds of (sleeping) load time."""

    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.full((3,), float(i))


def new_probe(run_dir: Path, **kw: Any) -> Probe:
    kw.setdefault("register_atexit", False)
    return Probe(run_dir=run_dir, **kw)


# --- timings -------------------------------------------------------------------------------------
def test_wait_and_host_time_match_sleeps(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0)
    per_sample, batch, body = 0.004, 4, 0.012
    loader = DataLoader(SleepyDataset(8 * batch, per_sample), batch_size=batch, num_workers=0)
    for _x in Watched(loader, p):
        time.sleep(body)
    p.close()
    steps = read_steps(run_dir)
    assert [s.step for s in steps] == list(range(8))
    assert all(s.samples == batch and s.epoch == 0 for s in steps)
    waits = [s.wait_s for s in steps]
    hosts = [s.host_s for s in steps]
    # the main process loads the batch itself: wait >= 4 sleeps of 4 ms; host >= the body
    assert min(waits) >= batch * per_sample * 0.95
    assert statistics.median(waits) < batch * per_sample + 0.03
    assert min(hosts) >= body * 0.95
    assert statistics.median(hosts) < body + 0.03
    # wait is not smuggled into host time and vice versa
    assert statistics.median(hosts) < statistics.median(waits) + body
    ts = [s.ts for s in steps]
    assert ts == sorted(ts) and abs(ts[0] - time.time()) < 60


def test_workers_hide_load_time(tmp_path: Path) -> None:
    """With enough workers the same loading no longer shows as wait (steady state)."""
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0)
    loader = DataLoader(SleepyDataset(48, 0.002), batch_size=4, num_workers=2, prefetch_factor=4)
    for _x in Watched(loader, p):
        time.sleep(0.03)  # 30 ms of compute; workers need ~4 ms per batch each
    p.close()
    steps = read_steps(run_dir)
    assert len(steps) == 12
    later = [s.wait_s for s in steps[4:]]
    assert statistics.median(later) < 0.006  # data was ready: no 8 ms load on the wait path
    assert steps[0].wait_s > statistics.median(later)  # first batch: workers start and load


def test_config_and_epochs_of_a_real_dataloader(tmp_path: Path) -> None:
    import psutil

    run_dir = make_run(tmp_path)
    # records of a minute: each epoch's first step alone, its other steps summed in one
    p = new_probe(run_dir, rank=0, group_s=60)
    loader = DataLoader(
        SleepyDataset(12, 0.0),
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        pin_memory=False,
        drop_last=True,
    )
    w = Watched(loader, p)
    assert len(w) == 3 and w.dataset is loader.dataset  # stands in for the loader
    for _ in range(2):
        for _x in w:
            pass
    p.close()
    steps = read_steps(run_dir)
    assert [(s.step, s.n, s.epoch, s.samples) for s in steps] == [
        (0, 1, 0, 4),
        (2, 2, 0, 8),
        (3, 1, 1, 4),
        (5, 2, 1, 8),
    ]
    (row,) = read_probes(run_dir)
    assert row["rank"] == 0 and row["pid"] == os.getpid()
    assert row["steps"] == 6 and row["dropped"] == 0
    cfg = row["config"]
    lc = cfg["loader"]
    assert lc["num_workers"] == 2 and lc["pin_memory"] is False
    assert lc["prefetch_factor"] == 2 and lc["persistent_workers"] is True
    assert lc["batch_size"] == 4 and lc["drop_last"] is True
    assert lc["dataset_type"].endswith("SleepyDataset") and lc["dataset_len"] == 12
    assert lc["start_method"] in ("fork", "spawn", "forkserver")
    assert cfg["physical_cores"] == psutil.cpu_count(logical=False)
    assert cfg["torch"] == torch.__version__ and cfg["cuda_available"] is False
    assert [e["epoch"] for e in cfg["epochs"]] == [0, 1]
    pids = cfg["epochs"][0]["worker_pids"]
    assert len(pids) == 2 and all(isinstance(x, int) and x > 0 for x in pids)
    assert cfg["epochs"][1]["worker_pids"] == pids  # persistent: the same workers
    assert cfg["epochs"][0]["iter_s"] >= 0


def test_start_method_from_the_loaders_context() -> None:
    loader = DataLoader(SleepyDataset(4, 0.0), num_workers=1, multiprocessing_context="spawn")
    assert loader_config(loader)["start_method"] == "spawn"
    gen = loader_config(x for x in range(3))
    assert gen["len"] is None and gen["loader_type"] == "builtins.generator"


def test_batch_size_of_common_batch_shapes() -> None:
    t = torch.zeros(5, 3)
    assert batch_size_of(t) == 5
    assert batch_size_of((t, torch.zeros(5))) == 5
    assert batch_size_of({"input_ids": t, "labels": t}) == 5
    assert batch_size_of([{"x": t}]) == 5
    assert batch_size_of(["a", "b"]) == 2
    assert batch_size_of(7) is None
    assert batch_size_of(torch.tensor(1.0)) is None


def test_break_and_exception_end_the_open_step(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, group_s=60)  # the open step ends a record of several
    for i, _x in enumerate(Watched(list(range(10)), p)):
        if i == 2:
            time.sleep(0.02)
            break
    with pytest.raises(ZeroDivisionError):
        for _x in Watched(list(range(10)), p):
            time.sleep(0.01)
            _ = 1 / 0
    p.close()
    steps = read_steps(run_dir)
    assert [(s.step, s.epoch, s.n) for s in steps] == [(0, 0, 1), (2, 0, 2), (3, 1, 1)]
    assert steps[1].host_s >= 0.019  # the step the loop broke out of still ends, timed
    assert steps[2].host_s >= 0.0095


class FakeClock:
    """``time`` for the watched loop: a ``perf_counter`` the test moves by exact binary
    fractions, so where a record of several steps ends is known to the bit."""

    def __init__(self) -> None:
        self.t = 1024.0

    def perf_counter(self) -> float:
        return self.t


def test_short_steps_are_summed_into_records_that_add_up_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps shorter than GROUP_S are summed, a record per GROUP_S: the epoch's first step
    alone, each record's wait, host time and samples the sums of its steps, the records end to
    end (``ts - wait_s`` one's start, ``ts + host_s`` its end), the epoch's short last batch
    counted as it is."""
    watch_mod = importlib.import_module("stallscope.probe.watch")  # the package exports watch()
    clock = FakeClock()
    monkeypatch.setattr(watch_mod, "time", clock)
    wait, host = 2.0**-13, 2.0**-12  # a 0.37-ms step: three to a 1-ms record
    sizes = [4] * 29 + [2]

    def batches() -> Iterator[torch.Tensor]:
        for k in sizes:
            clock.t += wait
            yield torch.zeros(k, 1)

    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, group_s=0.001)
    for _ in Watched(batches(), p):
        clock.t += host
    p.close()
    rows = read_steps(run_dir)
    assert [r.n for r in rows] == [1] + [3] * 9 + [2]
    assert [r.step for r in rows] == [0] + [3 * i for i in range(1, 10)] + [29]
    assert [r.samples for r in rows] == [4] + [12] * 9 + [6]
    assert sum(r.wait_s for r in rows) == 30 * wait and sum(r.host_s for r in rows) == 30 * host
    assert all(r.wait_s == r.n * wait and r.host_s == r.n * host for r in rows)
    for a, b in itertools.pairwise(rows):  # end to end, nothing lost between records
        assert b.ts - b.wait_s == pytest.approx(a.ts + a.host_s, abs=1e-9)
    (probe_row,) = read_probes(run_dir)
    assert probe_row["steps"] == 30


def _fake_loop(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    waits: list[float],
    host: float,
    *,
    stop_at: int | None = None,
    **kw: Any,
) -> list[StepRow]:
    """A watched loop on the fake clock: step i waits ``waits[i]`` for its batch (of 4 samples,
    the last of 2) and computes ``host``; ``stop_at``: the body breaks out in that step."""
    watch_mod = importlib.import_module("stallscope.probe.watch")
    clock = FakeClock()
    monkeypatch.setattr(watch_mod, "time", clock)

    def batches() -> Iterator[torch.Tensor]:
        for i, w in enumerate(waits):
            clock.t += w
            yield torch.zeros(2 if i == len(waits) - 1 else 4, 1)

    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, group_s=0.001, **kw)
    for i, _ in enumerate(Watched(batches(), p)):
        clock.t += host
        if i == stop_at:
            break
    p.close()
    return read_steps(run_dir)


def test_very_short_steps_are_sampled_and_add_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps under SAMPLED_STEP_S are timed on a sample, one in SAMPLE_EVERY in full, the others
    only counted: records still hold every step, their wall time exactly, a wait share that is
    the steps' own (here every step alike, so exactly it), and every sample, the epoch's last
    record's too (its batches may all go uncounted)."""
    wait, host = 2.0**-16, 2.0**-15  # a 46-us step
    n = 5000
    rows = _fake_loop(monkeypatch, tmp_path, [wait] * n, host)
    assert sum(r.n for r in rows) == n and rows[-1].step == n - 1
    assert rows[0].n == 1 and len(rows) < n // 10
    wall = sum(r.wait_s + r.host_s for r in rows)
    assert wall == pytest.approx(n * (wait + host), rel=1e-12)
    assert sum(r.wait_s for r in rows) / wall == pytest.approx(1 / 3, rel=1e-9)
    assert sum(r.samples or 0 for r in rows) == 4 * (n - 1) + 2  # the short last batch too
    for a, b in itertools.pairwise(rows):  # end to end
        assert b.ts - b.wait_s == pytest.approx(a.ts + a.host_s, abs=1e-9)


def test_a_sampled_wait_share_does_not_line_up_with_a_loaders_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four workers, each slow: every fourth batch waits 120 us, the others nothing. Timing
    every SAMPLE_EVERY-th step (a multiple of 4) would see only waits or none; random gaps see
    the true share."""
    host = 2.0**-15
    waits = [120e-6 if i % 4 == 0 else 0.0 for i in range(40000)]
    rows = _fake_loop(monkeypatch, tmp_path, waits, host)
    truth = sum(waits) / (sum(waits) + host * len(waits))
    wall = sum(r.wait_s + r.host_s for r in rows)
    assert wall == pytest.approx(sum(waits) + host * len(waits), rel=1e-9)
    assert sum(r.wait_s for r in rows) / wall == pytest.approx(truth, abs=0.02)
    assert sum(r.n for r in rows) == 40000 and len(rows) < 4000


def _epoch_ending_in_an_exit(
    monkeypatch: pytest.MonkeyPatch, run_dir: Path, n: int, alert_at: int | None = None
) -> list[StepRow]:
    """One watched epoch of ``n`` 46-us steps on the fake clock whose loader takes 0.5 s to
    exit in its last ``next()`` (a DataLoader shutting its workers down); ``alert_at``: an
    alert for a callback comes at that step, and callbacks take 1 s."""
    watch_mod = importlib.import_module("stallscope.probe.watch")
    clock = FakeClock()
    monkeypatch.setattr(watch_mod, "time", clock)
    p = new_probe(run_dir, rank=0, group_s=0.001)

    def callbacks() -> None:
        clock.t += 1.0
        p.alerts.due.clear()

    monkeypatch.setattr(p, "run_due", callbacks)

    def batches() -> Iterator[torch.Tensor]:
        for i in range(n):
            clock.t += 2.0**-16
            if i == alert_at:
                p.alerts.due.append(None)  # type: ignore[arg-type]
            yield torch.zeros(4, 1)
        clock.t += 0.5  # the loader's exit

    for _ in Watched(batches(), p):
        clock.t += 2.0**-15
    p.close()
    return read_steps(run_dir)


def test_a_sampled_epochs_untimed_last_steps_leave_out_the_loaders_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only one sampled step in about SAMPLE_EVERY reads the clock. When the epoch ends on
    untimed steps, their end is the last reading plus their mean step: the loader's own exit
    is never counted as the trainer's time, whichever step the epoch ends on."""
    for n in range(3000, 3016):  # the last step falls on every place of the gaps
        rows = _epoch_ending_in_an_exit(monkeypatch, make_run(tmp_path / str(n)), n)
        assert sum(r.n for r in rows) == n
        assert sum(r.wait_s + r.host_s for r in rows) == pytest.approx(
            n * (2.0**-16 + 2.0**-15), rel=1e-9
        ), n


def test_alert_callbacks_in_a_sampled_stretch_stay_out_of_its_untimed_last_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alert callbacks (1 s here) run between sampled steps take no step's time, nor the mean
    step that gives untimed last steps their end."""
    for n in range(3000, 3016):
        rows = _epoch_ending_in_an_exit(
            monkeypatch, make_run(tmp_path / str(n)), n, alert_at=n - 200
        )  # a few records before the end
        assert sum(r.n for r in rows) == n
        assert sum(r.wait_s + r.host_s for r in rows) == pytest.approx(
            n * (2.0**-16 + 2.0**-15), rel=1e-9
        ), n


def test_steps_that_slow_down_after_a_sampled_stretch_are_records_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short steps are sampled; once steps last longer than a record's span, each is timed and
    recorded alone again (not left in sampled records of many steps)."""
    wait, host = 2.0**-16, 2.0**-15
    rows = _fake_loop(monkeypatch, tmp_path, [wait] * 3000 + [2.0**-9] * 200, host)
    assert sum(r.n for r in rows) == 3200
    assert [r.n for r in rows[-150:]] == [1] * 150
    assert [r.step for r in rows[-150:]] == list(range(3050, 3200))
    assert sum(r.wait_s + r.host_s for r in rows) == pytest.approx(
        3000 * (wait + host) + 200 * (2.0**-9 + host), rel=1e-9
    )


def test_an_iterator_made_but_not_yet_read_begins_no_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``iter()`` of a watched loader begins its epoch at the first ``next()``: an iterator
    never read begins none, and the time between ``iter()`` and the first ``next()`` (setup in
    the trainer) is not the first step's data wait."""
    watch_mod = importlib.import_module("stallscope.probe.watch")
    clock = FakeClock()
    monkeypatch.setattr(watch_mod, "time", clock)
    wait, host = 2.0**-10, 2.0**-9

    def batches() -> Iterator[torch.Tensor]:
        for _ in range(10):
            clock.t += wait
            yield torch.zeros(4, 1)

    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, group_s=0.001)
    w = Watched(batches(), p)
    iter(w)  # made and dropped
    assert p.state.epoch == -1
    it = iter(w)
    clock.t += 5.0  # the trainer's setup before it asks for the first batch
    for _ in it:
        clock.t += host
    p.close()
    rows = read_steps(run_dir)
    assert {r.epoch for r in rows} == {0} and sum(r.n for r in rows) == 10
    assert sum(r.wait_s for r in rows) == 10 * wait


@pytest.mark.parametrize("fails_at", ["iter", "next"])
def test_a_configuration_the_autotune_takes_back_starts_the_epoch_over_with_its_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_at: str
) -> None:
    """The loader as the autotune set it fails before its first batch, in ``iter()`` (workers
    that cannot start: spawn and a dataset that does not pickle) or in the first ``next()``: the
    autotune takes its configuration back and the same epoch starts over, the restored
    workers' start-up (0.25 s in ``iter()``) counted as the first step's wait."""
    watch_mod = importlib.import_module("stallscope.probe.watch")
    clock = FakeClock()
    monkeypatch.setattr(watch_mod, "time", clock)
    wait, host = 2.0**-8, 2.0**-7

    class Loader:
        broken = True

        def __iter__(self) -> Iterator[int]:
            if self.broken and fails_at == "iter":
                raise RuntimeError("workers cannot start")
            clock.t += 0.25
            return self.batches()

        def batches(self) -> Iterator[int]:
            if self.broken:
                raise RuntimeError("a worker failed")
            for i in range(10):
                clock.t += wait
                yield i

    loader = Loader()

    class Tuner:
        def __init__(self) -> None:
            self.reverted: list[str] = []

        def before_epoch(self) -> None:
            pass

        def revert(self, exc: BaseException) -> bool:
            self.reverted.append(str(exc))
            loader.broken = False
            return True

        def after_epoch(self, *_a: Any) -> None:
            pass

        def summary(self) -> dict[str, Any]:
            return {}

    tuner = Tuner()
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, group_s=0.001)
    seen = []
    for x in Watched(loader, p, tuner=tuner):
        seen.append(x)
        clock.t += host
    p.close()
    assert seen == list(range(10)) and len(tuner.reverted) == 1, tuner.reverted
    rows = read_steps(run_dir)
    assert sum(r.n for r in rows) == 10
    assert sum(r.wait_s for r in rows) == pytest.approx(0.25 + 10 * wait, abs=1e-9)


def test_a_break_in_a_sampled_record_ends_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wait, host = 2.0**-16, 2.0**-15
    rows = _fake_loop(monkeypatch, tmp_path, [wait] * 3000, host, stop_at=2500)
    assert sum(r.n for r in rows) == 2501 and rows[-1].step == 2500
    assert sum(r.wait_s + r.host_s for r in rows) == pytest.approx(2501 * (wait + host), rel=1e-9)


def test_a_record_of_many_steps_counts_one_batch_in_size_every(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting a batch costs ~0.3 us: in a record of many steps one batch in SIZE_EVERY is
    counted and the others taken at their mean; batches of one size come out exact."""
    from stallscope.probe.buffer import SIZE_EVERY

    watch_mod = importlib.import_module("stallscope.probe.watch")
    clock = FakeClock()
    monkeypatch.setattr(watch_mod, "time", clock)
    counted: list[int] = []

    class Batch:
        shape = (16, 3)

        def __getattribute__(self, name: str) -> Any:
            if name == "shape":
                counted.append(1)
            return object.__getattribute__(self, name)

    def batches() -> Iterator[Batch]:
        for _ in range(1 + 10 * SIZE_EVERY):
            clock.t += 2.0**-20
            yield Batch()

    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, group_s=60)
    for _ in Watched(batches(), p):
        clock.t += 2.0**-20
    p.close()
    rows = read_steps(run_dir)
    assert [(r.n, r.samples) for r in rows] == [(1, 16), (10 * SIZE_EVERY, 160 * SIZE_EVERY)]
    assert len(counted) <= 2 + 10 + 1  # the first (twice: deciding how), 1 in 8, the last


def test_step_context_manager(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0)
    for _ in range(5):
        time.sleep(0.01)  # "loading" outside the step
        with StepTimer(p, samples=16).start():
            time.sleep(0.02)
    p.close()
    steps = read_steps(run_dir)
    assert len(steps) == 5 and all(s.samples == 16 for s in steps)
    assert steps[0].wait_s == 0.0  # nothing before the first step to measure from
    assert min(s.wait_s for s in steps[1:]) >= 0.0095
    assert statistics.median(s.wait_s for s in steps[1:]) < 0.04
    assert min(s.host_s for s in steps) >= 0.0195
    assert statistics.median(s.host_s for s in steps) < 0.05


def test_h2d_on_cpu_records_host_copy_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = make_run(tmp_path)
    monkeypatch.setenv("STALLSCOPE_RUN_DIR", str(run_dir))
    monkeypatch.setenv("STALLSCOPE_GROUP_MS", "60000")  # the copies of steps summed add up
    import stallscope

    batches: list[dict[str, Any]] = [
        {"x": torch.ones(4, 2), "meta": [torch.zeros(4), "id"]} for _ in range(3)
    ]
    moved: list[dict[str, Any]] = []
    for b in stallscope.watch(batches):
        moved.append(stallscope.h2d(b, "cpu"))
    with stallscope.step(samples=2):  # a hand-timed step after the loop, same probe
        stallscope.h2d(torch.zeros(2), "cpu")
    p = probe_mod.get_probe()
    assert p is not None
    p.close()
    assert moved[0]["meta"][1] == "id" and torch.equal(moved[0]["x"], batches[0]["x"])
    steps = read_steps(run_dir)
    assert len(steps) == 3 and all(s.h2d_s is not None and s.h2d_s >= 0 for s in steps)
    assert [(s.samples, s.n) for s in steps] == [(4, 1), (8, 2), (2, 1)]
    assert [s.epoch for s in steps] == [0, 0, 0]


# --- where records go ----------------------------------------------------------------------------
SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import stallscope

    delay = float(os.environ.get("TEST_STEP_S", "0.005"))
    loader = DataLoader(TensorDataset(torch.arange(48.0)), batch_size=8, num_workers=1)
    for epoch in range(2):
        for (x,) in stallscope.watch(loader):
            time.sleep(delay)
    print("trained", flush=True)
""")

PLAIN = textwrap.dedent("""
    import stallscope  # no torch: watch() takes any iterable

    for epoch in range(2):
        for batch in stallscope.watch([[1] * 8] * 6):
            pass
    print("trained", flush=True)
""")


def run_script(
    tmp_path: Path, env: dict[str, str], code: str = SCRIPT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(code)
    full = env_without_stallscope("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    full.update(env)
    full["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, str(script), "--flag"],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_standalone_makes_a_run_with_steps_and_machine_samples(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_script(
        tmp_path, {"STALLSCOPE_OUT": str(out), "STALLSCOPE_INTERVAL": "0.2", "TEST_STEP_S": "0.05"}
    )
    assert res.returncode == 0, res.stderr
    assert "trained" in res.stdout
    (run_dir,) = list_runs(out)
    meta = read_meta(run_dir)
    assert meta["command"] == [str(tmp_path / "train.py"), "--flag"]
    assert meta["exit_code"] == 0 and meta["end"] >= meta["start"]
    assert meta["interval_s"] == 0.2 and meta["versions"]["torch"] == torch.__version__
    # the loader configuration per rank, in the shape `stallscope run` writes it
    assert "loader" not in meta and set(meta["loader_config"]) == {"0"}
    assert meta["loader_config"]["0"]["loader"]["num_workers"] == 1
    assert meta["probe"]["steps"] == 12
    steps = read_steps(run_dir)
    assert len(steps) == 12 and all(s.samples == 8 for s in steps)
    assert [s.epoch for s in steps] == [0] * 6 + [1] * 6
    store = RunStore(run_dir / "run.db", readonly=True)
    try:
        cpu = store.read("host.cpu_pct")
        assert cpu and len(cpu[0].v) >= 2  # the probe's own collector sampled the machine
        procs = {e["entity"] for e in store.entities("procs")}
        assert str(meta["pid"]) in procs
    finally:
        store.close()


def test_standalone_exit_code_of_a_crash(tmp_path: Path) -> None:
    code = PLAIN.replace('print("trained", flush=True)', 'raise SystemError("boom")')
    res = run_script(tmp_path, {"STALLSCOPE_OUT": str(tmp_path / "out")}, code=code)
    assert res.returncode == 1 and "boom" in res.stderr
    (run_dir,) = list_runs(tmp_path / "out")
    assert read_meta(run_dir)["exit_code"] == 1
    assert sum(s.n for s in read_steps(run_dir)) == 12


def test_under_stallscope_run_steps_land_in_its_run(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    write_meta(run_dir, {"command": ["x"], "start": 1.0})
    res = run_script(tmp_path, {"STALLSCOPE_RUN_DIR": str(run_dir)})
    assert res.returncode == 0, res.stderr
    assert sum(s.n for s in read_steps(run_dir)) == 12
    assert read_meta(run_dir) == {"command": ["x"], "start": 1.0}  # the parent's file, untouched
    assert not (tmp_path / "stallscope-runs").exists()


def test_two_ranks_report_apart(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    procs = []
    for rank, delay in ((0, "0.002"), (1, "0.02")):
        env = env_without_stallscope()
        env.update(
            STALLSCOPE_RUN_DIR=str(run_dir),
            RANK=str(rank),
            WORLD_SIZE="2",
            TEST_STEP_S=delay,
            PYTHONPATH=str(ROOT),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for pr in procs:
        _out, err = pr.communicate(timeout=120)
        assert pr.returncode == 0, err
    r0, r1 = read_steps(run_dir, 0), read_steps(run_dir, 1)
    assert sum(s.n for s in r0) == 12 and len(r1) == 12  # rank 0's 2-ms steps summed in twos
    assert statistics.median(s.host_s for s in r1) > statistics.median(s.host_s / s.n for s in r0)
    assert [p["rank"] for p in read_probes(run_dir)] == [0, 1]


def test_probe_off_by_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALLSCOPE_PROBE", "0")
    monkeypatch.chdir(tmp_path)
    import stallscope

    data = [1, 2, 3]
    assert list(stallscope.watch(data)) == data
    with stallscope.step():
        pass
    assert not (tmp_path / "stallscope-runs").exists()


def test_import_stays_light() -> None:
    code = (
        "import sys, stallscope; "
        "print(any(m in sys.modules for m in ('torch', 'stallscope.probe', 'sqlite3')))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        check=True,
    )
    assert res.stdout.strip() == "False"


# --- bounded buffer, failures --------------------------------------------------------------------
def test_buffer_overflow_drops_and_counts(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, capacity=5, flush_interval=3600, group_s=0)  # a row a step
    p.writer.ready.wait(10)
    for _x in Watched(list(range(20)), p):
        pass
    p.close()
    assert len(read_steps(run_dir)) == 5
    (row,) = read_probes(run_dir)
    assert row["dropped"] == 15 and row["steps"] == 5
    store = RunStore(run_dir / "run.db", readonly=True)
    events = store.events()
    store.close()
    assert any(e["kind"] == "dropped" and "15 steps dropped" in e["message"] for e in events)


def test_trainer_survives_an_unwritable_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    p = new_probe(blocker / "run", rank=0)
    total = 0
    for x in Watched(list(range(50)), p):
        total += x
    p.close()
    assert total == sum(range(50))
    assert p.stats()["lost"] == 50
    err = capsys.readouterr().err
    assert err.count("cannot write step records") == 1 and "training continues" in err


def test_write_failure_mid_run_is_counted_and_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, flush_interval=3600)
    p.writer.ready.wait(10)

    class Broken:
        def add_step_block(self, *args: Any) -> int:
            raise sqlite3.OperationalError("disk I/O error")

        add_step_values = add_steps = add_step_block

        def close(self) -> None:
            return None

    real = p.writer.store
    p.writer.store = Broken()  # type: ignore[assignment]
    for _ in range(3):
        for _x in Watched(list(range(4)), p):
            pass
        p.flush()
    p.writer.store = real
    p.close()
    assert p.stats()["lost"] == 12
    assert capsys.readouterr().err.count("disk I/O error") == 1


def test_writer_keeps_up_with_a_trainer_that_holds_the_interpreter(tmp_path: Path) -> None:
    """A launch-bound trainer keeps the interpreter lock busy between its short steps. The writer
    wrote a row per SQLite call, and after each it waited up to a switch interval (5 ms) for the
    lock: at 20k steps/s it wrote nothing for 8 s while its queue grew. Blocks of rows per call
    keep it up with the steps."""
    run_dir = make_run(tmp_path)
    # a record a step (GROUP_MS=0), the writer's worst case
    p = new_probe(run_dir, rank=0, capacity=1 << 22, flush_interval=0.2, group_s=0)
    p.writer.ready.wait(10)
    perf = time.perf_counter
    end = perf() + 3.0
    for _ in Watched(range(10**9), p):
        t = perf() + 50e-6
        while perf() < t:  # a step that never lets go of the lock
            pass
        if t > end:
            break
    steps, written = p.state.step + 1, p.writer.written
    p.close()
    assert steps > 5000
    assert written >= steps // 4, (written, steps)
    assert p.stats()["lost"] == 0
    rows = RunStore(run_dir / "run.db").steps(rank=0)
    assert len(rows) == steps and rows[-1].step == steps - 1 and rows[0].samples is None


def test_standalone_in_an_unwritable_place_keeps_training(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = run_script(tmp_path, {"STALLSCOPE_OUT": str(blocker / "out")}, code=PLAIN)
    assert res.returncode == 0 and "trained" in res.stdout
    assert res.stderr.count("stallscope:") == 1, res.stderr


# --- the CUDA path, with fake events (no GPU on this machine) -------------------------------------
class FakeGpu:
    """A GPU timeline: kernels 'run' as the test advances ``now``; events complete up to
    ``done_until``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.done_until = float("inf")
        self.created = 0


class FakeEvent:
    """Obeys the torch.cuda.Event interface the probe may use: record, query, elapsed_time.
    It has no synchronize(): calling one would fail the test."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.t: float | None = None
        gpu.created += 1

    def record(self) -> None:
        self.t = self.gpu.now

    def query(self) -> bool:
        return self.t is not None and self.t <= self.gpu.done_until

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time before both events completed"
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1000.0


def test_fake_cuda_events_give_busy_and_idle(tmp_path: Path) -> None:
    gpu = FakeGpu()
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, flush_interval=3600, events=lambda: FakeEvent(gpu))
    p.writer.ready.wait(10)
    idle = [0.5, 0.01, 0.2, 0.03, 0.0, 0.07]
    busy = [0.1, 0.3, 0.05, 0.2, 0.4, 0.15]
    ends: list[float] = []

    def batches() -> Iterator[int]:
        for i, gap in enumerate(idle):
            gpu.now += gap  # the GPU sits idle while the next batch is prepared
            yield i

    for i in Watched(batches(), p):
        gpu.now += busy[i]  # the step's kernels
        ends.append(gpu.now)
        time.sleep(0.06)  # a 60-ms step: every step is timed (device.timing_every)
        if i == 2:
            gpu.done_until = ends[1]  # the GPU is behind: only steps 0 and 1 have finished
    gpu.done_until = ends[3]
    # the epoch's end woke the writer thread too: its flush or this one writes the steps whose
    # events completed (once, beside a CPU hog, it ran between these lines)
    p.flush()
    # steps 4 and 5 wait for their events; nothing is waited for
    assert [s.step for s in read_steps(run_dir)] == [0, 1, 2, 3]
    gpu.done_until = float("inf")
    p.flush()
    assert [s.step for s in read_steps(run_dir)] == [0, 1, 2, 3, 4, 5]
    p.close()
    steps = read_steps(run_dir)
    assert [s.gpu_busy_s for s in steps] == pytest.approx(busy)
    assert steps[0].gpu_idle_s is None
    assert [s.gpu_idle_s for s in steps[1:]] == pytest.approx(idle[1:])
    assert p.stats()["gpu_unread"] == 0
    assert read_probes(run_dir)[0]["config"]["gpu_timing"] is True
    assert gpu.created < 2 * len(busy) + 2  # events are reused, not made per step


def test_fake_cuda_h2d_is_timed_with_events(tmp_path: Path) -> None:
    gpu = FakeGpu()
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, events=lambda: FakeEvent(gpu))

    class Tensor:
        shape = (4,)

        def to(self, device: str, non_blocking: bool = False) -> str:
            assert device == "cuda:0" and non_blocking
            gpu.now += 0.25  # the copy, on the GPU's timeline; the host returns at once
            return "on-gpu"

    probe_mod._probes[0] = p  # the module front finds this probe
    for b in Watched([[Tensor(), Tensor()]], p):
        assert h2d(b, "cuda:0") == ["on-gpu", "on-gpu"]
        gpu.now += 1.0
    p.close()
    (s,) = read_steps(run_dir)
    assert s.h2d_s == pytest.approx(0.5) and s.gpu_busy_s == pytest.approx(1.5)
    assert s.samples == 4


def test_a_copy_whose_end_event_fails_returns_the_copy_and_turns_timing_off(tmp_path: Path) -> None:
    """``h2d`` with the device refusing the copy's end event (a sticky CUDA error): the copy
    still comes back, the start event goes back to the pool, device timing is off, said once,
    and nothing reaches the trainer."""
    gpu = FakeGpu()
    made: list[int] = []

    class Refused(FakeEvent):
        def record(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def events() -> FakeEvent:
        made.append(1)
        return FakeEvent(gpu) if len(made) % 2 else Refused(gpu)

    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, events=events)

    class Tensor:
        shape = (4,)

        def to(self, device: str, non_blocking: bool = False) -> str:
            return "on-gpu"

    probe_mod._probes[0] = p
    p.gpu_ready()  # (the trainer's CUDA is up)
    assert p.device.timing
    assert h2d(Tensor(), "cuda:0") == "on-gpu"
    assert not p.device.timing and p.device.timer is None and len(p.device._free) == 1
    assert h2d(Tensor(), "cuda:0") == "on-gpu"  # host-timed from now on
    p.close()


def test_fake_cuda_events_that_never_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder_mod, "CLOSE_WAIT_S", 0.1)  # where close() reads it
    gpu = FakeGpu()
    gpu.done_until = -1.0  # a hung GPU
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, events=lambda: FakeEvent(gpu))
    for _x in Watched(list(range(3)), p):
        gpu.now += 1.0
        time.sleep(0.06)  # 60-ms steps: each one timed (device.timing_every)
    t0 = time.monotonic()
    p.close()
    assert time.monotonic() - t0 < 5  # close never blocks on the GPU
    steps = read_steps(run_dir)
    assert len(steps) == 3 and all(s.gpu_busy_s is None for s in steps)
    assert p.stats()["gpu_unread"] == 3


def test_config_is_json(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=3)
    for _x in Watched(DataLoader(SleepyDataset(4, 0.0), batch_size=2), p):
        pass
    p.close()
    (row,) = read_probes(run_dir)
    assert row["rank"] == 3
    json.dumps(row["config"])


def test_failing_cuda_record_turns_gpu_timing_off_not_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    class BadEvent(FakeEvent):
        def record(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access")

    class OddBatch:
        @property
        def shape(self) -> Any:
            raise RuntimeError("no shape today")

    gpu = FakeGpu()
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, events=lambda: BadEvent(gpu))
    seen = sum(1 for _ in Watched([OddBatch() for _ in range(5)], p))
    p.close()
    assert seen == 5
    steps = read_steps(run_dir)
    assert sum(s.n for s in steps) == 5
    assert all(s.gpu_busy_s is None and s.samples is None for s in steps)
    assert capsys.readouterr().err.count("illegal memory access") == 1
    store = RunStore(run_dir / "run.db", readonly=True)
    events = store.events()
    store.close()
    assert any("illegal memory access" in e["message"] for e in events)


def test_short_steps_are_timed_in_pairs_one_in_many(tmp_path: Path) -> None:
    """On an H200 the probe's two event records per step (6-7 us each) took a 50.5-us step to
    97.7 us. Short steps are timed in pairs of consecutive steps, one pair in timing_every(step):
    the second of a pair has the GPU's gap before it; the busy share stays that of every step."""
    from stallscope.probe.device import timing_every

    assert timing_every(0.055) == 1 and timing_every(0.0001) > 20 and timing_every(0.0) == 1
    gpu = FakeGpu()
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, flush_interval=3600, events=lambda: FakeEvent(gpu))
    p.writer.ready.wait(10)
    gpu.done_until = float("inf")

    def batches() -> Iterator[int]:
        for i in range(600):
            gpu.now += 0.001  # the GPU waits 1 ms for each batch
            yield i

    for _ in Watched(batches(), p):
        gpu.now += 0.003  # 3 ms of kernels
        t = time.perf_counter() + 0.0002  # a 0.2-ms step on the host
        while time.perf_counter() < t:
            pass
    p.close()
    steps = read_steps(run_dir)
    assert sum(s.n for s in steps) == 600  # the untimed short steps summed, a record a ms
    assert len(steps) < 600
    timed = [s for s in steps if s.gpu_busy_s is not None]
    assert 4 <= len(timed) <= 120, len(timed)  # pairs, one in many
    assert all(s.n == 1 for s in timed)  # each a record of its own
    gaps = [s for s in timed if s.gpu_idle_s is not None]
    assert gaps and all(s.step - 1 in {t.step for t in timed} for s in gaps)
    busy = sum(s.gpu_busy_s or 0.0 for s in gaps)
    idle = sum(s.gpu_idle_s or 0.0 for s in gaps)
    assert busy / (busy + idle) == pytest.approx(0.75, abs=0.01)


def test_steps_timed_by_hand_are_device_timed_in_pairs_too(tmp_path: Path) -> None:
    """``stallscope.step()`` and the framework callbacks (StepTimer) time the device as a watched
    loop does: pairs one in timing_every(step), not every step (two event records of 6-7 us
    each on every step would double a 50-us step); their untimed copies' events go back."""
    gpu = FakeGpu()
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, flush_interval=3600, events=lambda: FakeEvent(gpu))
    p.writer.ready.wait(10)
    for _ in range(600):
        gpu.now += 0.001  # the GPU waits 1 ms for each batch
        with StepTimer(p, samples=4).start():
            a, b = p.device.event(), p.device.event()  # a device-timed copy in each step
            a.record()
            gpu.now += 0.003  # 3 ms of kernels
            b.record()
            p.note_h2d_events(a, b)
            t = time.perf_counter() + 0.0002  # a 0.2-ms step on the host
            while time.perf_counter() < t:
                pass
    p.close()
    steps = read_steps(run_dir)
    assert sum(s.n for s in steps) == 600
    timed = [s for s in steps if s.gpu_busy_s is not None]
    assert 4 <= len(timed) <= 120, len(timed)  # pairs, one in many
    gaps = [s for s in timed if s.gpu_idle_s is not None]
    assert gaps and all(s.step - 1 in {t.step for t in timed} for s in gaps)
    busy = sum(s.gpu_busy_s or 0.0 for s in gaps)
    idle = sum(s.gpu_idle_s or 0.0 for s in gaps)
    assert busy / (busy + idle) == pytest.approx(0.75, abs=0.01)
    # the untimed steps' copy events were reused: an event is made only when the pool is
    # empty, so the events made are the most ever in use at once: the current step's (at most
    # 4: its start and end, its copy's two) and those of timed steps the writer thread has not
    # read yet (4 each). How far the writer lags depends on the CPU it gets (on a busy host it
    # read late and nearly every timed step made its own: 58 for 14); an untimed step whose
    # copy events were not given back would make 2 more each, 1,000 and more here
    assert gpu.created <= 4 * len(timed) + 4, (gpu.created, len(timed))


def test_a_step_timed_by_hand_is_recorded_once_and_gives_back_a_failed_pairs_event(
    tmp_path: Path,
) -> None:
    """A second ``stop()`` records nothing and moves no clock; when the device refuses a
    step's end event, its start event goes back to the pool (and device timing goes off)."""
    gpu = FakeGpu()
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, flush_interval=3600, events=lambda: FakeEvent(gpu))
    p.writer.ready.wait(10)
    t = StepTimer(p, samples=4).start()
    t.stop()
    end = p.state.last_end
    t.stop()
    assert p.state.last_end == end
    t = StepTimer(p, samples=4).start()
    assert t._ev0 is not None  # the second step of the first pair
    free = len(p.device._free)

    class Refused(FakeEvent):
        def record(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    p.device._free.append(Refused(gpu))
    t.stop()
    assert len(p.device._free) == free + 1 and t._ev0 is None and not p.device.timing
    p.close()
    steps = read_steps(run_dir)
    assert [s.n for s in steps] == [1, 1] and steps[1].gpu_busy_s is None


def test_device_timed_steps_are_handed_over_apart(tmp_path: Path) -> None:
    """The writer hands plain steps to the store in blocks without looking at each; the few
    steps with device marks come in a queue of their own, so a flush of many plain steps never
    sorts through them (it did, row by row, under the trainer's interpreter lock)."""
    gpu = FakeGpu()
    gpu.done_until = float("inf")
    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, flush_interval=3600, events=lambda: FakeEvent(gpu))
    p.writer.ready.wait(10)
    for _ in Watched(list(range(300)), p):
        gpu.now += 0.001
    assert p.buffer.queue and all(r[7] is None for r in p.buffer.queue)
    assert p.buffer.timed and all(r[7] is not None for r in p.buffer.timed)
    assert sum(r[8] for r in p.buffer.queue) + len(p.buffer.timed) == 300
    assert all(r[8] == 1 for r in p.buffer.timed)
    p.close()
    steps = read_steps(run_dir)
    assert sum(s.n for s in steps) == 300 and steps[-1].step == 299
    assert all(a.step + b.n == b.step for a, b in itertools.pairwise(steps))
    assert any(s.gpu_busy_s is not None for s in steps)


def test_a_loader_whose_iter_starts_over_is_read_once_per_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-written loader whose ``__iter__`` resets and returns itself: the probe only ever
    calls ``next()`` on the iterator it got, so sampled stretches never start the epoch over."""
    watch_mod = importlib.import_module("stallscope.probe.watch")
    clock = FakeClock()
    monkeypatch.setattr(watch_mod, "time", clock)

    class Resetting:
        def __iter__(self) -> Resetting:
            self.i = 0
            return self

        def __next__(self) -> int:
            if self.i >= 1000:
                raise StopIteration
            self.i += 1
            clock.t += 2.0**-16
            return self.i

    run_dir = make_run(tmp_path)
    p = new_probe(run_dir, rank=0, group_s=0.001)
    seen = 0
    for _ in Watched(Resetting(), p):
        clock.t += 2.0**-15
        seen += 1
    p.close()
    assert seen == 1000 and sum(r.n for r in read_steps(run_dir)) == 1000
