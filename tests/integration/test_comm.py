"""Communication wait: the probe's clock (sources/comm.py) and the rules that read it
(straggler by communication, waiting_for_peers, communication_bound) on synthetic steps. The real
DDP runs under torchrun are in test_ddp.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT
from diagnose_inputs import T0, procs, run, ser

from stallscope.analysis.diagnose import diagnose
from stallscope.sources.comm import CommClock, _timed_call, timed_hook
from stallscope.store import RunStore, StepRow


def test_the_clock_adds_blocking_calls_and_the_tail_of_the_last_bucket() -> None:
    c = CommClock()
    assert c.take() is None and not c.used  # no collective in the step
    c.bucket_called(10.0)
    c.bucket_called(10.5)  # the last bucket handed in: the end of the backward's own work
    c.bucket_done(10.2)
    c.bucket_done(10.9)
    c.blocked_s += 0.05
    assert c.used
    assert abs((c.take() or 0) - (0.4 + 0.05)) < 1e-9
    assert c.take() is None  # the next step starts from nothing
    c.bucket_called(3.0)
    c.bucket_done(2.9)  # done before the last handed in (clock noise): no negative wait
    assert c.take() == 0.0


def test_timed_calls_count_blocking_calls_once_and_skip_async_ones() -> None:
    import stallscope.sources.comm as comm

    calls = []

    def collective(*_a: object, async_op: bool = False) -> str:
        calls.append(async_op)
        if not async_op:
            inner()  # a collective calling another is timed once
        return "work"

    inner = _timed_call(lambda: None)
    timed = _timed_call(collective)
    comm.CLOCK.take()  # start from an empty step
    assert timed(async_op=True) == "work" and comm.CLOCK.blocked_s == 0.0
    assert timed() == "work" and comm.CLOCK.blocked_s > 0.0 and comm.CLOCK.depth == 0
    took = comm.CLOCK.take()  # the step is done: its blocking time, then nothing
    assert took is not None and took > 0.0 and comm.CLOCK.blocked_s == 0.0
    assert calls == [True, False]


def test_a_wrapped_hook_keeps_the_inner_hook_s_result() -> None:
    class Fut:
        def __init__(self, v: object) -> None:
            self.v = v

        def value(self) -> object:
            return self.v

        def then(self, cb: object) -> Fut:
            return Fut(cb(self))  # type: ignore[operator]

    hook = timed_hook(lambda state, bucket: Fut(f"reduced {bucket}"))
    assert hook(None, "b0").value() == "reduced b0"


def steps(rank: int, n: int, wait: float, host: float, comm: float | None) -> list[StepRow]:
    return [StepRow(rank, i, T0 + i * (wait + host), wait, host, comm_s=comm) for i in range(n)]


def test_the_rank_its_peers_wait_for_is_the_straggler_by_compute() -> None:
    data = run(
        [], steps(0, 100, 0.002, 0.098, 0.045) + steps(1, 100, 0.002, 0.098, 0.004), config={}
    )
    doc = diagnose(data)
    assert doc["verdict"] == "straggler_rank", [f["kind"] for f in doc["findings"]]
    ev = doc["findings"][0]["evidence"]
    assert ev["rank"] == 1 and ev["cause"] == "compute"
    assert ev["compute_ms_median"] == 94.0 and ev["peers_compute_ms_median"] == 53.0
    assert (
        "rank 0 waits for it in the all-reduce 45% of its step time"
        in doc["findings"][0]["summary"]
    )
    peers = next(f for f in doc["findings"] if f["kind"] == "waiting_for_peers")
    assert peers["evidence"]["waiting_ranks"] == [0]


@pytest.mark.parametrize("runq_1, straggler", [(45.0, True), (12.0, False)])
def test_a_rank_short_of_cpu_is_the_straggler_from_a_smaller_gap(
    runq_1: float, straggler: bool
) -> None:
    """Rank 1 under a CPU quota on a busy host: time it spends frozen inside the all-reduce
    counts as its own collective wait, so its peers wait only 11 points more than it does
    (measured so under torchrun with a CPU hog beside it). With its process waiting for a CPU
    45% of the time against 5% for rank 0 it is the straggler, short of CPU; at 12% it is not
    named (the 15-point gap is the rule without that evidence)."""
    rows = steps(0, 100, 0.002, 0.098, 0.041) + steps(1, 100, 0.002, 0.098, 0.030)
    data = run(
        [
            ser("procs.runq_wait_pct", "10", [5.0] * 20),
            ser("procs.runq_wait_pct", "11", [runq_1] * 20),
        ],
        rows,
        config={},
    )
    data.probes = [
        {"rank": r, "pid": 10 + r, "config": {}, "steps": 100, "dropped": 0, "updated": T0}
        for r in (0, 1)
    ]
    doc = diagnose(data)
    kinds = [f["kind"] for f in doc["findings"]]
    assert ("straggler_rank" in kinds) == straggler, kinds
    if straggler:
        f = doc["findings"][0]
        assert f["kind"] == "straggler_rank" and f["evidence"]["rank"] == 1
        assert f["evidence"]["cause"] == "cpu" and "≥ 5% above rank 1's 30%" in f["rule"]


@pytest.mark.parametrize(
    "runq, host_pct, contention",
    [
        (28.0, 99.5, True),  # measured so: two ranks beside a CPU hog on 2 cores
        (8.0, 99.5, False),  # the same host busy, the ranks rarely waiting: not short of CPU
        (
            28.0,
            60.0,
            False,
        ),  # the ranks wait, but nothing else runs: their own load, not a neighbour
    ],
)
def test_every_rank_waiting_for_a_cpu_on_a_busy_host_is_cpu_contention(
    runq: float, host_pct: float, contention: bool
) -> None:
    """Two ranks beside a CPU hog on a 2-core host (as measured under torchrun: run-queue wait
    27-28% each, the host 99.5% busy, each rank at about 55% CPU): while both wait for a core,
    their all-reduce waits come out alike (25% and 26%) and tell no straggler. The finding says
    the host is short of CPU, with the other processes' cores, and that the collective wait
    cannot tell which rank is slow."""
    rows = steps(0, 100, 0.002, 0.098, 0.025) + steps(1, 100, 0.002, 0.098, 0.026)
    data = run(
        [
            ser("procs.runq_wait_pct", "10", [runq] * 20),
            ser("procs.runq_wait_pct", "11", [runq - 1] * 20),
            ser("procs.cpu_pct", "10", [55.0] * 20),
            ser("procs.cpu_pct", "11", [55.0] * 20),
            ser("host.cpu_pct", "", [host_pct] * 20),
        ],
        rows,
        config={},
        meta={"logical_cores": 2, "host": "node-a"},
    )
    data.probes = [
        {"rank": r, "pid": 10 + r, "config": {}, "steps": 100, "dropped": 0, "updated": T0}
        for r in (0, 1)
    ]
    doc = diagnose(data)
    kinds = [f["kind"] for f in doc["findings"]]
    assert "straggler_rank" not in kinds, kinds
    assert ("cpu_contention" in kinds) == contention, (kinds, doc["signals"]["others_cpu_cores"])
    if not contention:
        return
    f = doc["findings"][0]
    assert f["kind"] == "cpu_contention" and doc["verdict"] == "cpu_contention"
    assert f["evidence"]["runq_wait_pct"] == runq - 1
    assert f["evidence"]["others_cpu_cores"] == 0.89  # 1.99 busy cores less 2 x 0.55
    assert "every rank waited for a CPU (rank 0 28%, rank 1 27% of the time" in f["summary"]
    assert "other processes kept 0.9 of its 2 cores busy" in f["summary"]
    assert "(rank 0 25%, rank 1 26% of the step) cannot show which rank" in f["summary"]
    assert "on node-a" in f["fixes"][0]["action"]
    assert f["est_speedup"] == round(1 / (1 - 0.27), 2)


def test_ranks_in_collectives_on_a_busy_host_are_not_communication_bound() -> None:
    """Measured beside a CPU hog: both ranks 25-26% in the run queue and 46% / 32% of their
    step in the all-reduce. They wait for one another's CPU, not for the network: the
    verdict is cpu_contention and no communication_bound is claimed. The same shares on an
    idle host are communication-bound."""
    rows = steps(0, 100, 0.002, 0.098, 0.046) + steps(1, 100, 0.002, 0.098, 0.032)

    def kinds(host_pct: float) -> list[str]:
        data = run(
            [
                ser("procs.runq_wait_pct", "10", [25.0] * 20),
                ser("procs.runq_wait_pct", "11", [26.0] * 20),
                ser("procs.cpu_pct", "10", [54.0] * 20),
                ser("procs.cpu_pct", "11", [54.0] * 20),
                ser("host.cpu_pct", "", [host_pct] * 20),
            ],
            rows,
            config={},
            meta={"logical_cores": 2},
        )
        data.probes = [
            {"rank": r, "pid": 10 + r, "config": {}, "steps": 100, "dropped": 0, "updated": T0}
            for r in (0, 1)
        ]
        return [f["kind"] for f in diagnose(data)["findings"]]

    busy = kinds(99.5)
    assert busy[0] == "cpu_contention" and "communication_bound" not in busy, busy
    idle = kinds(60.0)
    assert "communication_bound" in idle and "cpu_contention" not in idle, idle


def test_a_single_trainer_on_a_busy_host_is_cpu_contention() -> None:
    """One trainer (no ranks) waiting for a CPU 35% of the time while a neighbour keeps 1.2 of
    4 cores busy; no stall in the steps: the verdict is the busy host, not compute-bound."""
    data = run(
        [
            ser("procs.runq_wait_pct", "1", [35.0] * 20),
            ser("procs.cpu_pct", "1", [180.0] * 20),
            ser("host.cpu_pct", "", [75.0] * 20),
        ],
        steps(0, 100, 0.002, 0.098, None),
        config={},
        meta={"logical_cores": 4},
        entities=procs({"1": "main"}),
    )
    doc = diagnose(data)
    assert doc["verdict"] == "cpu_contention", [f["kind"] for f in doc["findings"]]
    f = doc["findings"][0]
    assert (
        "the trainer waited for a CPU 35% of the time (run-queue wait) while other "
        "processes kept 1.2 of its 4 cores busy." in f["summary"]
    ), f["summary"]
    assert "cannot show which rank" not in f["summary"]
    assert "compute_bound" in [x["kind"] for x in doc["findings"]]


def test_every_rank_in_collectives_and_none_waited_for_is_communication_bound() -> None:
    data = run(
        [], steps(0, 100, 0.002, 0.098, 0.05) + steps(1, 100, 0.002, 0.098, 0.045), config={}
    )
    doc = diagnose(data)
    kinds = [f["kind"] for f in doc["findings"]]
    assert "communication_bound" in kinds and "straggler_rank" not in kinds, kinds
    f = next(f for f in doc["findings"] if f["kind"] == "communication_bound")
    assert f["evidence"]["comm_share"] == {"0": 0.5, "1": 0.45}
    assert "no_sync()" in f["fixes"][0]["action"]
    # below 30% in collectives: not communication-bound
    data = run([], steps(0, 100, 0.002, 0.098, 0.02) + steps(1, 100, 0.002, 0.098, 0.02), config={})
    assert "communication_bound" not in [f["kind"] for f in diagnose(data)["findings"]]


def test_a_run_db_from_before_comm_s_reads_and_migrates(tmp_path: Path) -> None:
    import sqlite3

    db_path = tmp_path / "run.db"
    RunStore(db_path).close()
    db = sqlite3.connect(db_path)  # rebuild steps as an older stallscope wrote it
    db.execute("DROP TABLE steps")
    db.execute(
        "CREATE TABLE steps(rank INTEGER NOT NULL, step INTEGER NOT NULL, ts REAL NOT "
        "NULL, wait_s REAL NOT NULL, host_s REAL NOT NULL, h2d_s REAL, gpu_busy_s REAL, "
        "gpu_idle_s REAL, samples INTEGER, epoch INTEGER, PRIMARY KEY(rank, step)) "
        "WITHOUT ROWID"
    )
    db.execute("INSERT INTO steps VALUES(0, 0, 1.0, 0.1, 0.2, NULL, NULL, NULL, 32, 0)")
    db.commit()
    db.close()
    old = RunStore(db_path, readonly=True)
    assert old.steps() == [StepRow(0, 0, 1.0, 0.1, 0.2, samples=32, epoch=0)]
    old.close()
    store = RunStore(db_path)  # a writer adds the column
    store.add_steps([StepRow(0, 1, 2.0, 0.1, 0.2, comm_s=0.05)])
    assert [s.comm_s for s in store.steps()] == [None, 0.05]
    store.close()


def test_the_stack_window_moves_measured_wait_from_compute_to_comm() -> None:
    """Without the probe the all-reduce wait samples as compute (backward's C++ frames); the
    sampler moves the seconds the clock measured, never more than the window's compute."""
    from stallscope.sources.stacks.aggregate import Tally
    from stallscope.sources.stacks.phases import Frame

    t = Tally(1, 0, "inproc", 40.0)
    backward = [Frame("/venv/torch/_tensor.py", "backward", 600), Frame("train.py", "main", 10)]
    for _ in range(40):
        t.add(backward, 0.025)
    assert t.reassign("compute", "comm", 0.4) == 0.4
    assert abs(t.reassign("compute", "comm", 5.0) - 0.6) < 1e-9  # only what the window holds
    rec = t.record(100.0)
    assert rec is not None and rec["s"] == {"compute": 0.0, "comm": 1.0}, rec["s"]


_SAME_TRAINING = r"""
import hashlib, os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def rank_main(rank, port, timed, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if timed:
        from stallscope.sources import comm
        comm.install()
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10)), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    for _ in range(20):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if rank == 0:
        h = hashlib.sha256()
        for p in model.parameters():
            h.update(p.detach().numpy().tobytes())
        line = h.hexdigest()
        if timed:
            from stallscope.sources.comm import CLOCK
            line += f" used={CLOCK.used}"
        open(out, "w").write(line)
    dist.barrier()
    os._exit(0)  # gloo's teardown may abort when one rank closes first: nothing left to do

if __name__ == "__main__":
    port, timed, out = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
    mp.spawn(rank_main, args=(port, timed, out), nprocs=2)
"""


@pytest.mark.slow
@pytest.mark.torchrun
def test_timing_ddp_s_all_reduce_leaves_the_training_bit_identical(tmp_path: Path) -> None:
    """The probe's communication hook does what DDP does without one: the same 20 steps on two
    ranks give bit-identical parameters with and without it (and the hook did run)."""
    import subprocess
    import sys

    from conftest import ROOT
    from test_agent import free_port

    pytest.importorskip("torch")

    script = tmp_path / "same.py"
    script.write_text(_SAME_TRAINING)
    got = {}
    for timed in ("0", "1"):
        out = tmp_path / f"out{timed}"
        subprocess.run(
            [sys.executable, str(script), str(free_port()), timed, str(out)],
            check=True,
            timeout=120,
            cwd=ROOT,
        )
        got[timed] = out.read_text()
    assert got["1"] == got["0"] + " used=True", got


# --- online: the rank the others wait for (sources/straggler.py) ------------------------------


def _noisy_shares(
    rng: object, n: int, gap: float, base: float = 0.05, noise: float = 0.015
) -> list[dict[int, float]]:
    """n intervals of 4 ranks' communication shares: rank 2 is waited for by ``gap``."""
    import random

    assert isinstance(rng, random.Random)
    out = []
    for _ in range(n):
        s = {r: max(0.0, base + rng.gauss(0, noise)) for r in range(4)}
        for r in (0, 1, 3):
            s[r] += gap
        out.append(s)
    return out


def test_a_rank_turning_ten_percent_slower_is_flagged_within_seconds() -> None:
    """Four ranks keep pace for a minute (1-s intervals, noisy shares), then rank 2 turns
    ~10% slower (its peers wait 9 points more): flagged within 10 intervals, nothing before;
    cleared once it keeps pace again."""
    import random

    from stallscope.sources.straggler import StragglerWatch

    rng = random.Random(7)
    w = StragglerWatch()
    before = [w.update(s) for s in _noisy_shares(rng, 60, 0.0)]
    assert not any(before), [b for b in before if b]
    after = [w.update(s) for s in _noisy_shares(rng, 30, 0.09)]
    first = next(i for i, f in enumerate(after) if f)
    assert first < 10 and set(after[first]) == {2}, (first, after[first])
    assert all(set(f) == {2} for f in after[first:])
    back = [w.update(s) for s in _noisy_shares(rng, 10, 0.0)]
    assert not back[-1]


def test_no_false_alarm_in_a_healthy_simulated_hour() -> None:
    import random

    from stallscope.sources.straggler import StragglerWatch

    rng = random.Random(11)
    w = StragglerWatch()
    flagged = [f for s in _noisy_shares(rng, 3600, 0.0, noise=0.02) if (f := w.update(s))]
    assert flagged == []


def test_a_rank_slow_from_the_start_is_flagged_by_its_level() -> None:
    """No change to see (it was slow from the first interval): a gap of 15 points held for 3
    intervals flags it all the same."""
    import random

    from stallscope.sources.straggler import StragglerWatch

    w = StragglerWatch()
    got = [w.update(s) for s in _noisy_shares(random.Random(3), 6, 0.3)]
    assert not got[1] and set(got[2]) == {2} and got[2][2] > 0.25


def test_the_run_alert_fires_on_the_rank_waited_for(tmp_path: Path) -> None:
    """The collector's probe source reads the steps with their communication time, and the
    default rule rank_waited_for fires on rank 1 when rank 0 starts waiting for it."""
    from stallscope.alerts.engine import AlertEngine
    from stallscope.alerts.rulefile import DEFAULT_RULES
    from stallscope.sources.steps import StepsSource

    store = RunStore(tmp_path / "run.db")
    store.set_probe(0, 1, {}, 0, 0)
    store.set_probe(1, 2, {}, 0, 0)
    src = StepsSource(tmp_path / "run.db")
    src.open()
    engine = AlertEngine(DEFAULT_RULES)
    fired = []
    step = 0
    for t in range(40):
        gap = 0.0 if t < 20 else 0.3  # from t=20 rank 0 waits 30% more of its step
        rows = []
        for _ in range(10):
            step += 1
            rows.append(StepRow(0, step, T0 + t, 0.0, 0.1, comm_s=0.01 + gap * 0.1))
            rows.append(StepRow(1, step, T0 + t, 0.0, 0.1, comm_s=0.01))
        store.add_steps(rows)
        payload = src.sample(T0 + t)
        fired += [
            (t, x.rule.name, x.entity)
            for x in engine.evaluate(T0 + t, src.points(payload))
            if x.state == "firing"
        ]
    store.close()
    src.close()
    assert fired and fired[0][1:] == ("rank_waited_for", "rank1"), fired
    assert 20 <= fired[0][0] <= 24, fired


def test_waiting_for_each_step_s_slowest_rank_is_jitter_not_the_network() -> None:
    """Each step, one rank (a different one each time) takes 60 ms longer: every rank waits
    about 40% of its step, but the least wait in each step (the transfer) is 2 ms of 102."""
    rows = []
    for i in range(100):
        slow = i % 3
        for rank in range(3):
            own = 0.04 + (0.06 if rank == slow else 0.0)
            rows.append(StepRow(rank, i, T0 + i * 0.102, 0.002, 0.1, comm_s=0.102 - own))
    doc = diagnose(run([], rows, config={}))
    kinds = [f["kind"] for f in doc["findings"]]
    assert "rank_jitter" in kinds and "communication_bound" not in kinds, kinds
    assert "straggler_rank" not in kinds, kinds
    f = next(f for f in doc["findings"] if f["kind"] == "rank_jitter")
    assert f["evidence"]["transfer_share"] == pytest.approx(0.02, abs=0.001)
    assert f["evidence"]["jitter_share"] == pytest.approx(0.39, abs=0.01)
    assert "a different one each time" in f["summary"]
    # the same waits, but every rank waits them in every step: the transfer is the cost
    rows = [
        StepRow(r, i, T0 + i * 0.1, 0.002, 0.098, comm_s=0.045)
        for i in range(100)
        for r in range(3)
    ]
    doc = diagnose(run([], rows, config={}))
    f = next(f for f in doc["findings"] if f["kind"] == "communication_bound")
    assert f["evidence"]["transfer_share"] == pytest.approx(0.45, abs=0.001)


def test_cpu_contention_names_the_busiest_other_processes() -> None:
    """Issue 40: cpu_contention told the user to run `ps`; the run recorded who else used the
    cores (meta.json busy_others), and the fix names them."""
    busy = [
        {"pid": 4242, "name": "stress\x1b[31m", "cores": 1.17},
        {"pid": 77, "name": "backup", "cores": 0.31},
    ]
    data = run(
        [
            ser("procs.runq_wait_pct", "1", [35.0] * 20),
            ser("procs.cpu_pct", "1", [180.0] * 20),
            ser("host.cpu_pct", "", [75.0] * 20),
        ],
        steps(0, 100, 0.002, 0.098, None),
        config={},
        meta={"logical_cores": 4, "busy_others": busy},
        entities=procs({"1": "main"}),
    )
    f = diagnose(data)["findings"][0]
    action = f["fixes"][0]["action"]
    assert "pid 4242 (stress\\x1b[31m, 1.2 cores), pid 77 (backup, 0.3 cores)" in action, action
    assert "ps -eo" not in action and f["evidence"]["busiest_others"][0]["pid"] == 4242


def test_busiest_others_from_two_snapshots() -> None:
    from stallscope.sources.others import busiest_others

    t0 = 1000.0
    before = {
        1: (10.0, "trainer", 500.0),
        2: (5.0, "hog", 500.0),
        3: (1.0, "idle", 500.0),
        4: (50.0, "reused", 500.0),
    }
    after = {
        1: (40.0, "trainer", 500.0),
        2: (25.0, "hog", 500.0),
        3: (1.01, "idle", 500.0),
        4: (3.0, "reused", 1005.0),
        5: (4.0, "newcomer", 1010.0),
    }
    got = busiest_others(before, after, 20.0, exclude={1}, started=t0)
    # the hog (1.0 core), the process started during the run (all its CPU), the reused pid
    # as a new process; the trainer's tree and the idle one left out
    assert got == [
        {"pid": 2, "name": "hog", "cores": 1.0},
        {"pid": 5, "name": "newcomer", "cores": 0.2},
        {"pid": 4, "name": "reused", "cores": 0.15},
    ]


def test_busiest_others_are_busiest_first_groups_included() -> None:
    """Three python processes at 0.04 cores each (each under MIN_CORES, together 0.12) outrank
    the one process named alone at 0.06: the list is busiest first as a whole (it was the
    individual ones, then the groups: a CI run beside other work saw 0.05 before 0.1)."""
    from stallscope.sources.others import MIN_CORES, busiest_others

    assert 0.04 < MIN_CORES <= 0.06
    before = {2: (5.0, "a", 500.0), 3: (0.0, "py", 500.0), 4: (0.0, "py", 500.0)}
    before[5] = (0.0, "py", 500.0)
    after = {2: (5.6, "a", 500.0), 3: (0.4, "py", 500.0), 4: (0.4, "py", 500.0)}
    after[5] = (0.4, "py", 500.0)
    got = busiest_others(before, after, 10.0, exclude=set(), started=1000.0)
    assert [(e["name"], e["cores"]) for e in got] == [("py", 0.12), ("a", 0.06)], got


def test_busiest_others_say_which_run_at_a_lower_priority() -> None:
    """A process at nice > 0 carries its nice value; processes of a name are taken together per
    nice value (eight niced python workers are not the trainer's python peers)."""
    from stallscope.sources.others import busiest_others

    before = {2: (0.0, "hog", 500.0, 0.0, 19), 3: (0.0, "py", 500.0, 0.0, 0)}
    before |= {4: (0.0, "py", 500.0, 0.0, 0), 5: (0.0, "py", 500.0, 0.0, 10)}
    after = {2: (9.0, "hog", 500.0, 0.0, 19), 3: (0.5, "py", 500.0, 0.0, 0)}
    after |= {4: (0.4, "py", 500.0, 0.0, 0), 5: (0.4, "py", 500.0, 0.0, 10)}
    got = busiest_others(before, after, 10.0, exclude=set(), started=1000.0, n=1)
    # the niced python (0.04 cores) stays under MIN_CORES on its own, not added to the others
    assert got == [
        {"pid": 2, "name": "hog", "cores": 0.9, "nice": 19},
        {"pid": 3, "name": "py", "cores": 0.09, "processes": 2},
    ], got


def test_a_real_snapshot_reads_each_process_s_nice_value() -> None:
    from stallscope.sources.others import cpu_snapshot

    p = subprocess.Popen(["nice", "-n", "7", sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while True:
            snap = cpu_snapshot()
            if snap.get(p.pid, (0, ""))[1].startswith("python") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert snap[p.pid][4] == 7, snap.get(p.pid)
        assert snap[os.getpid()][4] == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        p.kill()
        p.wait()


def _contended(niced_pct: float, busy: list[dict]) -> dict:
    """A trainer (nice 0) that waited for a CPU 35% of the time on a 4-core host at 75%: its
    1.8 cores and 1.2 cores of others, ``niced_pct`` % of the host's CPU at nice > 0."""
    ents = [{**e, "attrs": {**e["attrs"], "nice": 0}} for e in procs({"1": "main"})]
    data = run(
        [
            ser("procs.runq_wait_pct", "1", [35.0] * 20),
            ser("procs.cpu_pct", "1", [180.0] * 20),
            ser("host.cpu_pct", "", [75.0] * 20),
            ser("host.cpu_nice_pct", "", [niced_pct] * 20),
        ],
        steps(0, 100, 0.002, 0.098, None),
        config={},
        meta={"logical_cores": 4, "busy_others": busy},
        entities=ents,
    )
    return diagnose(data)


def test_processes_at_a_lower_priority_are_not_the_contention() -> None:
    """The other processes' 1.2 cores are a nice-19 job's (25% of 4 cores = 1.0 core niced):
    they yield to the trainer, so its run-queue wait is not theirs and no cpu_contention is
    named; with the same job at nice 0 it is, and a niced one beside it is never told to stop."""
    hog = {"pid": 4242, "name": "batch", "cores": 1.0, "nice": 19}
    doc = _contended(25.0, [hog])
    assert doc["signals"]["niced_others_cpu_cores"] == 1.0
    assert "cpu_contention" not in [f["kind"] for f in doc["findings"]], doc["findings"]
    loud = {"pid": 77, "name": "stress", "cores": 1.0}
    doc = _contended(5.0, [hog | {"cores": 0.2}, loud])
    f = next(f for f in doc["findings"] if f["kind"] == "cpu_contention")
    action = f["fixes"][0]["action"]
    assert "pid 77 (stress, 1.0 cores)" in action and "4242" not in action, action
    assert f["evidence"]["niced_others_cpu_cores"] == 0.2
    assert "0.2 of them at a lower priority, not counted" in f["rule"], f["rule"]


def test_an_import_met_half_way_is_tried_again(tmp_path: Path) -> None:
    """``torch.nn.parallel`` half-imported by the trainer's thread when the sampler's thread
    installs the communication timing (an ImportError there): not installed yet, and the next
    call installs it; after IMPORT_TRIES such failures it is given up, said once."""
    code = textwrap.dedent("""
        import torch.distributed as dist
        from stallscope.sources import comm
        real, fails = comm._patch_ddp, [0]
        def half_way():
            fails[0] += 1
            if fails[0] == 1:
                raise ImportError("cannot import name 'DistributedDataParallel' from partially "
                                  "initialized module 'torch.nn.parallel'")
            real()
        comm._patch_ddp = half_way
        comm.install()
        first = comm._installed
        comm.install()
        from torch.nn.parallel import DistributedDataParallel as DDP
        print(first, comm._installed, getattr(DDP.forward, "__wrapped__", None) is not None,
              getattr(dist.all_reduce, "__stallscope_timed__", False))
        comm._installed, comm._import_failures[0] = False, 0
        def never():
            raise ImportError("always")
        comm._patch_ddp = never
        for _ in range(comm.IMPORT_TRIES + 5):
            comm.install()
        print(comm._installed)
    """)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True", "True", "True", "True"], (r.stdout, r.stderr)
    assert r.stderr.count("communication time not measured: ImportError('always')") == 1, r.stderr


def test_the_named_cores_add_up_to_the_figure() -> None:
    """Issue 49: "other processes kept 1.7 of its 2 cores busy" then "stop pid 19288 (python,
    0.2 cores)" left 1.5 cores unexplained. Processes of one name are taken together, a parent
    counts the short-lived children it reaped, and what no process alive at the end explains
    is said, so the parts add up to the figure."""
    from stallscope.sources.others import busiest_others

    t0 = 1000.0
    before = {
        2: (5.0, "python", 500.0, 0.0),
        3: (5.0, "python", 500.0, 0.0),
        7: (1.0, "bash", 500.0, 10.0),
    }
    after = {
        2: (9.0, "python", 500.0, 0.0),
        3: (8.0, "python", 500.0, 0.0),
        7: (1.2, "bash", 500.0, 24.0),
    }
    # the busiest one by one (n of them: 1 here), the rest together by name
    got = busiest_others(before, after, 10.0, exclude=set(), started=t0, n=1)
    assert got == [
        {"pid": 7, "name": "bash", "cores": 1.42, "children_cores": 1.4},
        {"pid": 2, "name": "python", "cores": 0.7, "processes": 2},
    ]
    # with room for them, each process is its own entry (the tuner names a hog by its pid)
    assert [e["pid"] for e in busiest_others(before, after, 10.0, exclude=set(), started=t0)] == [
        7,
        2,
        3,
    ]
    data = run(
        [
            ser("procs.runq_wait_pct", "1", [35.0] * 20),
            ser("procs.cpu_pct", "1", [100.0] * 20),
            ser("host.cpu_pct", "", [85.0] * 20),
        ],
        steps(0, 100, 0.002, 0.098, None),
        config={},
        meta={"logical_cores": 4, "busy_others": got},
        entities=procs({"1": "main"}),
    )
    f = next(f for f in diagnose(data)["findings"] if f["kind"] == "cpu_contention")
    action = f["fixes"][0]["action"]
    others = f["evidence"]["others_cpu_cores"]
    assert "pid 7 (bash, 1.4 cores with the short-lived processes it started)" in action
    assert "2 processes named python (pid 2 the busiest, 0.7 cores)" in action
    rest = round(others - 1.42 - 0.7, 1)
    assert f"and {rest:.1f} cores more by processes that came and went" in action, action
