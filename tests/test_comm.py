"""Communication wait: the probe's clock (probe/comm.py) and the rules that read it
(straggler by communication, waiting_for_peers, communication_bound) on synthetic steps. The real
DDP runs under torchrun are in test_ddp.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_diagnose import T0, run

from stallscope.analysis.diagnose import diagnose
from stallscope.probe.comm import CommClock, _timed_call, timed_hook
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
    import stallscope.probe.comm as comm

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
    data = run([], steps(0, 100, 0.002, 0.098, 0.045) + steps(1, 100, 0.002, 0.098, 0.004),
               config={})
    doc = diagnose(data)
    assert doc["verdict"] == "straggler_rank", [f["kind"] for f in doc["findings"]]
    ev = doc["findings"][0]["evidence"]
    assert ev["rank"] == 1 and ev["cause"] == "compute"
    assert ev["compute_ms_median"] == 94.0 and ev["peers_compute_ms_median"] == 53.0
    assert "rank 0 waits for it in the all-reduce 45% of its step time" in \
        doc["findings"][0]["summary"]
    peers = next(f for f in doc["findings"] if f["kind"] == "waiting_for_peers")
    assert peers["evidence"]["waiting_ranks"] == [0]


def test_every_rank_in_collectives_and_none_waited_for_is_communication_bound() -> None:
    data = run([], steps(0, 100, 0.002, 0.098, 0.05) + steps(1, 100, 0.002, 0.098, 0.045),
               config={})
    doc = diagnose(data)
    kinds = [f["kind"] for f in doc["findings"]]
    assert "communication_bound" in kinds and "straggler_rank" not in kinds, kinds
    f = next(f for f in doc["findings"] if f["kind"] == "communication_bound")
    assert f["evidence"]["comm_share"] == {"0": 0.5, "1": 0.45}
    assert "no_sync()" in f["fixes"][0]["action"]
    # below 30% in collectives: not communication-bound
    data = run([], steps(0, 100, 0.002, 0.098, 0.02) + steps(1, 100, 0.002, 0.098, 0.02),
               config={})
    assert "communication_bound" not in [f["kind"] for f in diagnose(data)["findings"]]


def test_a_run_db_from_before_comm_s_reads_and_migrates(tmp_path: Path) -> None:
    import sqlite3

    db_path = tmp_path / "run.db"
    RunStore(db_path).close()
    db = sqlite3.connect(db_path)  # rebuild steps as an older stallscope wrote it
    db.execute("DROP TABLE steps")
    db.execute("CREATE TABLE steps(rank INTEGER NOT NULL, step INTEGER NOT NULL, ts REAL NOT "
               "NULL, wait_s REAL NOT NULL, host_s REAL NOT NULL, h2d_s REAL, gpu_busy_s REAL, "
               "gpu_idle_s REAL, samples INTEGER, epoch INTEGER, PRIMARY KEY(rank, step)) "
               "WITHOUT ROWID")
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
        from stallscope.probe import comm
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
            from stallscope.probe.comm import CLOCK
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
        subprocess.run([sys.executable, str(script), str(free_port()), timed, str(out)],
                       check=True, timeout=120, cwd=ROOT)
        got[timed] = out.read_text()
    assert got["1"] == got["0"] + " used=True", got
