"""The agent's step follower on real run directories (meta.json + run.db written by the same
RunStore the probe uses) and real run index files; an end-to-end training through a real agent
and Prometheus is in test_agent_deploy.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from stallscope.agent.config import load_config
from stallscope.agent.exporter import PrometheusSink
from stallscope.agent.steps import StepFollower, runs_of_indexes
from stallscope.store import RunStore, StepRow, base_meta, new_run_dir, write_meta
from stallscope.store.index import index_path, record_run


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_run(out: Path, pid: int | None = None, monitor_pid: int | None = None) -> Path:
    run_dir = new_run_dir(out, "train")
    meta = base_meta(
        ["python", "train.py"],
        start=time.time(),
        interval_s=1.0,
        pid=pid if pid is not None else os.getpid(),
    )
    if monitor_pid is not None:
        meta["monitor_pid"] = monitor_pid
    write_meta(run_dir, meta)
    RunStore(run_dir / "run.db").close()
    return run_dir


def add_steps(
    run_dir: Path, rank: int, first: int, n: int, wait: float, host: float, samples: int | None = 32
) -> None:
    store = RunStore(run_dir / "run.db")
    store.add_steps(
        [StepRow(rank, first + i, time.time(), wait, host, samples=samples) for i in range(n)]
    )
    store.close()


def end_run(run_dir: Path) -> None:
    import json

    meta = json.loads((run_dir / "meta.json").read_text())
    meta["end"], meta["exit_code"] = time.time(), 0
    write_meta(run_dir, meta)


def test_totals_grow_with_each_poll_per_rank(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    record_run(run)
    f = StepFollower(rescan_s=0)
    assert f.poll() == {}  # running, no steps yet: nothing to export
    add_steps(run, 0, 0, 10, wait=0.05, host=0.15)
    add_steps(run, 1, 0, 4, wait=0.0, host=0.2, samples=None)
    got = f.poll()[run.name]
    assert got[0].steps == 10 and abs(got[0].wait_s - 0.5) < 1e-9
    assert abs(got[0].step_s - 2.0) < 1e-9 and got[0].samples == 320
    assert got[1].steps == 4 and not got[1].has_samples
    add_steps(run, 0, 10, 5, wait=0.1, host=0.1)
    got = f.poll()[run.name]
    assert got[0].steps == 15 and abs(got[0].wait_s - 1.0) < 1e-9  # only the new rows added
    assert got[1].steps == 4
    f.close()


def test_rows_packed_before_they_were_read_count_once(tmp_path: Path) -> None:
    """Step rows are packed once 5 minutes old (run.db schema version 4): a follower that
    begins late, or pauses longer, counts the packed rows once, with the rows still rows."""
    run = make_run(tmp_path)
    record_run(run)
    add_steps(run, 0, 0, 10, wait=0.05, host=0.15)
    add_steps(run, 1, 0, 4, wait=0.0, host=0.2, samples=None)
    store = RunStore(run / "run.db")
    assert store.pack_steps(time.time() + 3600) == 14  # every row so far
    store.close()
    add_steps(run, 0, 10, 5, wait=0.1, host=0.1)
    f = StepFollower(rescan_s=0)
    got = f.poll()[run.name]  # begun late: the packs and the rows
    assert got[0].steps == 15 and abs(got[0].wait_s - 1.0) < 1e-9 and got[0].samples == 480
    assert got[1].steps == 4 and abs(got[1].step_s - 0.8) < 1e-9
    add_steps(run, 0, 15, 5, wait=0.1, host=0.1)
    store = RunStore(run / "run.db")
    assert store.pack_steps(time.time() + 3600) == 10  # packed before the next poll
    store.close()
    add_steps(run, 1, 4, 1, wait=0.1, host=0.1)
    got = f.poll()[run.name]
    assert got[0].steps == 20 and abs(got[0].wait_s - 1.5) < 1e-9 and got[0].last_step == 19
    assert got[1].steps == 5
    assert f.poll()[run.name][0].steps == 20  # nothing new: nothing counted twice
    f.close()


def test_a_finished_run_stays_for_the_grace_period_then_goes(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    record_run(run)
    clock = Clock()
    f = StepFollower(clock=clock, grace_s=60, rescan_s=0)
    add_steps(run, 0, 0, 3, 0.1, 0.1)
    assert f.poll()[run.name][0].steps == 3
    add_steps(run, 0, 3, 2, 0.1, 0.1)  # written just before the end
    end_run(run)
    clock.t += 1
    assert f.poll()[run.name][0].steps == 5  # the last rows are read
    clock.t += 59
    assert run.name in f.poll()
    clock.t += 2
    assert f.poll() == {}  # dropped: no stale series
    assert f.poll() == {}  # and not followed again
    f.close()


def test_runs_that_ended_or_died_before_are_not_exported(tmp_path: Path) -> None:
    done = make_run(tmp_path)
    add_steps(done, 0, 0, 3, 0.1, 0.1)
    end_run(done)
    # a standalone probe killed with -9: no end, its trainer's pid is gone
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = make_run(tmp_path, pid=gone.pid)
    add_steps(dead, 0, 0, 3, 0.1, 0.1)
    # under `stallscope run` whose monitor was killed
    orphan = make_run(tmp_path, monitor_pid=gone.pid)
    add_steps(orphan, 0, 0, 3, 0.1, 0.1)
    for r in (done, dead, orphan):
        record_run(r)
    assert StepFollower(rescan_s=0).poll() == {}


def test_a_reused_pid_is_not_the_trainer(tmp_path: Path) -> None:
    """A standalone run killed with -9 whose pid now belongs to a process that started long
    after the run began (this test's own process, an hour "later"): not followed, and
    `runs` calls a run whose monitor pid was reused interrupted."""
    import json

    from stallscope.store.rundir import monitor_alive, run_state, writer_stamp

    run = make_run(tmp_path)
    meta = json.loads((run / "meta.json").read_text())
    meta["start"] = time.time() - 3600 * 24
    write_meta(run, meta)
    add_steps(run, 0, 0, 3, 0.1, 0.1)
    record_run(run)
    assert StepFollower(rescan_s=0).poll() == {}
    assert not monitor_alive(os.getpid(), meta["start"])
    assert monitor_alive(os.getpid(), time.time())
    assert run_state({"start": meta["start"], "monitor_pid": os.getpid()}) == "interrupted"
    assert run_state({"start": time.time(), "monitor_pid": os.getpid()}) == "running"
    # runs record their writer's start ticks and boot id: an exact check that holds whatever
    # the wall clock did since (here a start a day before this process: a clock step)
    stamp = writer_stamp(os.getpid())
    assert isinstance(stamp["start_ticks"], int) and stamp["boot_id"]
    assert (
        run_state({"start": meta["start"], "monitor_pid": os.getpid(), "monitor_stamp": stamp})
        == "running"
    )
    other = dict(stamp, start_ticks=stamp["start_ticks"] + 1)
    assert (
        run_state({"start": time.time(), "monitor_pid": os.getpid(), "monitor_stamp": other})
        == "interrupted"
    )
    assert (
        run_state(
            {
                "start": time.time(),
                "monitor_pid": os.getpid(),
                "monitor_stamp": dict(stamp, boot_id="another-boot"),
            }
        )
        == "interrupted"
    )
    # a Session (`stallscope run`, the standalone probe) writes them
    from stallscope.collect.session import Session

    sess = Session.create(tmp_path / "s", "t", ["x"], interval=1.0, monitor_pid=os.getpid())
    try:
        assert sess.meta["monitor_stamp"] == stamp
    finally:
        sess.finish(0)


def test_unreadable_step_rows_are_skipped(tmp_path: Path) -> None:
    import sqlite3

    run = make_run(tmp_path)
    record_run(run)
    add_steps(run, 0, 0, 2, 0.1, 0.1)
    db = sqlite3.connect(run / "run.db")
    db.execute("INSERT INTO steps(rank, step, ts, wait_s, host_s) VALUES (0, 2, 1.0, -5, 0.1)")
    db.execute("INSERT INTO steps(rank, step, ts, wait_s, host_s) VALUES (0, 3, 1.0, 'x', 0.1)")
    db.commit()
    db.close()
    got = StepFollower(rescan_s=0).poll()[run.name][0]
    assert got.steps == 2 and abs(got.wait_s - 0.2) < 1e-9


def test_other_indexes_from_the_config(tmp_path: Path) -> None:
    # another user's index (a glob in run_indexes), read but never rewritten
    other = tmp_path / "home" / "alice" / "state"
    other.mkdir(parents=True)
    run = make_run(tmp_path / "alice-runs")
    add_steps(run, 0, 0, 7, 0.2, 0.2)
    idx = other / "runs.txt"
    idx.write_text(f"{run}\n" + "/gone\n" * 300)
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'run_indexes = ["{tmp_path}/home/*/state/runs.txt"]\n')
    patterns = load_config(cfg).run_indexes
    assert not index_path().exists()  # this user's own index is empty
    f = StepFollower(runs_of_indexes(patterns), rescan_s=0)
    assert f.poll()[run.name][0].steps == 7
    assert idx.read_text().count("/gone") == 300
    f.close()


def test_exposition_of_the_steps(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    record_run(run)
    add_steps(run, 0, 0, 4, 0.25, 0.25)
    add_steps(run, 1, 0, 2, 0.0, 0.5, samples=None)
    sink = PrometheusSink(["host"], hostname="node-3", steps=StepFollower(rescan_s=0))
    text = generate_latest(sink.registry).decode()
    labels0 = f'Hostname="node-3",rank="0",run="{run.name}",train_job="{run.name}"'
    labels1 = f'Hostname="node-3",rank="1",run="{run.name}",train_job="{run.name}"'
    assert f"stallscope_train_steps_total{{{labels0}}} 4.0" in text
    assert f"stallscope_train_data_wait_seconds_total{{{labels0}}} 1.0" in text
    assert f"stallscope_train_step_seconds_total{{{labels0}}} 2.0" in text
    assert f"stallscope_train_samples_total{{{labels0}}} 128.0" in text
    assert f"stallscope_train_samples_total{{{labels1}}}" not in text  # batch size unknown
    assert f"stallscope_train_steps_total{{{labels1}}} 2.0" in text
    assert f"stallscope_train_first_step_timestamp_seconds{{{labels0}}}" in text
    # nothing training: no train families at all
    empty = PrometheusSink(["host"], hostname="n", steps=StepFollower(lambda: [], rescan_s=0))
    assert "stallscope_train_" not in generate_latest(empty.registry).decode()


# --- the steps rebuilt from Prometheus' counters (diagnose --prometheus) --------------------------


def test_steps_from_counters_baseline_reset_and_shares() -> None:
    from stallscope.analysis.promdata import _rank_rows

    def col(*vs: float) -> tuple[list[float], list[float]]:
        return [100.0 + i for i in range(len(vs))], list(vs)

    # a run going on before the window: the first point is the baseline; the agent restarts
    # after the third point (counters start again from the run's totals read anew: 2 steps)
    cols = {
        "n": col(50, 54, 58, 2, 6),
        "step_s": col(25, 27, 29, 1.0, 3.0),
        "wait_s": col(10, 11, 12, 0.5, 1.5),
        "samples": col(1600, 1728, 1856, 64, 192),
    }
    rows = _rank_rows(3, cols, start=100.0, step=1.0)
    assert len(rows) == 4 + 4 + 2 + 4
    assert {r.rank for r in rows} == {3} and [r.step for r in rows] == list(range(14))
    assert abs(sum(r.wait_s for r in rows) - (1 + 1 + 0.5 + 1)) < 1e-9
    assert abs(sum(r.wait_s + r.host_s for r in rows) - (2 + 2 + 1 + 2)) < 1e-9
    assert {r.samples for r in rows} == {32}
    assert all(100.0 < r.ts <= 104.0 for r in rows)
    # a run that began inside the window: its first point counts from zero
    late = {
        "n": ([110.0, 111.0], [3, 5]),
        "step_s": ([110.0, 111.0], [0.3, 0.5]),
        "wait_s": ([110.0, 111.0], [0.0, 0.1]),
    }
    rows = _rank_rows(0, late, start=100.0, step=1.0)
    assert len(rows) == 5 and all(r.samples is None for r in rows)
    assert abs(sum(r.wait_s for r in rows) - 0.1) < 1e-9
    # without the run's start, its first 3 steps are put in the query step before the first
    # point; with it (the agent's first-step gauge), they spread from the first step on
    assert [round(r.ts, 3) for r in rows[:3]] == [109.333, 109.667, 110.0]
    late["first_ts"] = ([110.0, 111.0], [104.0, 104.0])
    rows = _rank_rows(0, late, start=100.0, step=1.0)
    assert [round(r.ts, 3) for r in rows] == [104.0, 107.0, 110.0, 110.5, 111.0]
    assert abs(sum(r.wait_s for r in rows) - 0.1) < 1e-9
    # a first step before the window: the agent restarted and read the whole run again, so
    # the first point is a baseline, not the window's steps
    late["first_ts"] = ([110.0, 111.0], [90.0, 90.0])
    rows = _rank_rows(0, late, start=100.0, step=1.0)
    assert len(rows) == 2 and [round(r.ts, 3) for r in rows] == [110.5, 111.0]


def test_processes_from_prometheus_labels_one_run_and_its_tree() -> None:
    """What diagnose --prometheus rebuilds from the agent's process labels: the diagnosed
    run's processes only, the roles of a torchrun tree without a probe (ppid labels), the
    rank-less and ranked label sets of one process as one series."""
    from stallscope.analysis.promdata import Series, _one_run_of_procs
    from stallscope.sources.roles import infer_roles

    def ent(
        pid: str, role: str, name: str, ppid: str | None, run: str = "r1", rank: str | None = None
    ) -> dict[str, Any]:
        a = {"role": role, "name": name, "run": run}
        if ppid is not None:
            a["ppid"] = ppid
        if rank is not None:
            a["rank"] = rank
        return a

    entities = {
        ("procs", "10"): ent("10", "launcher", "torchrun", "1"),
        ("procs", "11"): ent("11", "main", "python", "10"),
        ("procs", "12"): ent("12", "main", "python", "10"),
        ("procs", "13"): ent("13", "worker", "pt_data_worker", "11"),
        ("procs", "14"): ent("14", "worker", "pt_data_worker", "12"),
        ("procs", "90"): ent("90", "main", "python", "1", run="r0"),
    }
    series = {
        ("procs.cpu_pct", p): Series("procs.cpu_pct", p, [1.0, 2.0], [50.0, 60.0])
        for _s, p in entities
    }
    _one_run_of_procs(series, entities, None)  # no probe: the run with the most points
    assert {p for _s, p in entities} == {"10", "11", "12", "13", "14"}
    assert ("procs.cpu_pct", "90") not in series
    roles = infer_roles([{"entity": p, "attrs": a} for (_s, p), a in entities.items()])
    assert roles == {"10": "launcher", "11": "main", "12": "main", "13": "worker", "14": "worker"}
    # an agent without the ppid label: workers go under the trainer of their rank
    entities = {
        ("procs", "11"): ent("11", "main", "python", None, rank="0"),
        ("procs", "12"): ent("12", "main", "python", None, rank="1"),
        ("procs", "13"): ent("13", "worker", "pt_data_worker", None, rank="0"),
        ("procs", "14"): ent("14", "worker", "pt_data_worker", None, rank="1"),
    }
    _one_run_of_procs({}, entities, "r1")
    assert {p: a["ppid"] for (_s, p), a in entities.items()} == {
        "11": None,
        "12": None,
        "13": "11",
        "14": "12",
    }


# --- the trainers' processes (run, rank, role labels) ---------------------------------------------

_TREE = r"""
import json, os, sys, time
def rank():
    w = os.fork()
    if w == 0:
        time.sleep(60); os._exit(0)
    return w
kids = {}
for r in (0, 1):
    pid = os.fork()
    if pid == 0:
        w = rank()
        sys.stdout.write(json.dumps({"rank": r, "pid": os.getpid(), "worker": w}) + "\n")
        sys.stdout.flush()
        time.sleep(60); os._exit(0)
time.sleep(60)
"""


def _ranked_run(tmp_path: Path, tree: subprocess.Popen[str]) -> tuple[list[Any], Path]:
    """The two ranks the tree printed, and an indexed run of the tree whose probes say which
    pid is which rank."""
    import json

    assert tree.stdout is not None
    ranks = [json.loads(tree.stdout.readline()) for _ in range(2)]
    run = make_run(tmp_path, pid=tree.pid)
    record_run(run)
    store = RunStore(run / "run.db")
    for r in ranks:
        store.set_probe(r["rank"], r["pid"], {}, 0, 0)
    store.close()
    return ranks, run


def test_trainer_processes_carry_run_rank_and_role(tmp_path: Path) -> None:
    """A real launcher -> two ranks -> one worker each; the ranks' probes in run.db say which
    pid is which rank. The exposition labels every process; when the run ends, they go."""

    from stallscope.agent.trainprocs import TrainerProcs
    from stallscope.collect import Collector

    tree = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        ranks, run = _ranked_run(tmp_path, tree)
        follower = StepFollower(rescan_s=0)
        procs = TrainerProcs(follower)
        sink = PrometheusSink(["procs"], hostname="node-3", steps=follower)
        collector = Collector([procs], [sink], interval=0.2)
        collector.start()
        try:
            time.sleep(1.0)  # a few samples: rates need two
            text = generate_latest(sink.registry).decode()
        finally:
            collector.stop(final_sample=False)
        want = {tree.pid: ("launcher", None)}
        for r in ranks:
            want[r["pid"]] = ("main", r["rank"])
            want[r["worker"]] = ("worker", r["rank"])
        for pid, (role, rank) in want.items():
            line = next(
                (
                    ln
                    for ln in text.splitlines()
                    if ln.startswith("stallscope_proc_cpu_seconds_total{") and f'pid="{pid}"' in ln
                ),
                None,
            )
            assert line is not None, (pid, text)
            assert f'role="{role}"' in line and f'run="{run.name}"' in line, line
            assert 'Hostname="node-3"' in line and 'ppid="' in line, line
            if rank is None:
                assert "rank=" not in line, line
            else:
                assert f'rank="{rank}"' in line, line
        assert "stallscope_proc_resident_memory_bytes{" in text
        # the run ends: its processes leave the exposition at the next sample
        end_run(run)
        procs.sample(time.time())
        assert procs.sample(time.time()) == {}
    finally:
        os.killpg(tree.pid, signal.SIGKILL)  # the ranks and workers too
        tree.wait()


def test_the_trainings_sampled_stacks_reach_metrics(tmp_path: Path) -> None:
    """A followed run's own sampled stacks (``<run>/stacks/``): each trainer process's phase
    shares of the last 10 s, labelled like its process series."""
    from stallscope.agent.trainstacks import TrainerStacks
    from stallscope.sources.stacks.aggregate import append_record

    run = make_run(tmp_path)
    record_run(run)

    def add(pid: int, rank: int, data: float, compute: float) -> None:
        append_record(
            run / "stacks",
            {
                "ts": time.time(),
                "pid": pid,
                "rank": rank,
                "sampler": "inproc",
                "n": 50,
                "rate_hz": 50,
                "s": {"data": data, "compute": compute},
            },
        )

    add(11, 1, 0.9, 0.1)
    add(10, 0, 0.05, 0.95)
    follower = StepFollower(rescan_s=0)
    src = TrainerStacks(follower)
    sink = PrometheusSink(["stacks"], hostname="node-3", steps=follower)
    reading = src.read(time.time())
    assert reading is not None
    from stallscope.collect.collector import Sample

    sink.write(Sample(time.time(), {"stacks": reading}, reading.points))
    text = generate_latest(sink.registry).decode()
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("stallscope_stacks_data_ratio{") and 'pid="11"' in ln
    )
    assert f'run="{run.name}"' in line and 'rank="1"' in line and 'role="main"' in line, line
    assert 'Hostname="node-3"' in line and line.endswith(" 0.9"), line
    # the shares of the last 10 s stay while nothing new came (no gauge that comes and goes)
    assert src.sample(time.time())["11"]["data_pct"] == 90.0
    end_run(run)
    add(11, 1, 1.0, 0.0)
    assert src.sample(time.time()) == {}  # an ended run is not followed


_WORKERS_TREE = r"""
import json, os, sys, time
stop = sys.argv[1]
def busy_until_stop():
    while not os.path.exists(stop):
        sum(range(20000))
    os._exit(0)
for r in (0, 1):
    pid = os.fork()
    if pid == 0:
        workers = []
        for w in range(3):
            k = os.fork()
            if k == 0:
                if w == 0:
                    busy_until_stop()  # works, then exits (an epoch's end)
                time.sleep(60); os._exit(0)
            workers.append(k)
        sys.stdout.write(json.dumps({"rank": r, "pid": os.getpid(), "workers": workers}) + "\n")
        sys.stdout.flush()
        os.waitpid(workers[0], 0)
        time.sleep(60); os._exit(0)
time.sleep(60)
"""


def _series(text: str, name: str) -> dict[str, tuple[str, float]]:
    """pid label -> (the line, its value) of ``name``'s samples."""
    out = {}
    for ln in text.splitlines():
        if ln.startswith(name + "{"):
            pid = ln.split('pid="', 1)[1].split('"', 1)[0]
            out[pid] = (ln, float(ln.rsplit(" ", 1)[1]))
    return out


def test_worker_series_per_rank_sum_the_workers_and_never_go_down(tmp_path: Path) -> None:
    """worker_series = "rank": a real launcher -> 2 ranks -> 3 workers each (one busy, then it
    exits). Each rank's workers are one series (pid "<rank pid>/workers") carrying run, rank,
    role and how many processes it sums; their CPU seconds are the workers' sum and do not go
    down when the busy worker exits; ranks and launcher keep their own series."""

    from stallscope.agent.trainprocs import TrainerProcs

    stop = tmp_path / "stop"
    tree = subprocess.Popen(
        [sys.executable, "-c", _WORKERS_TREE, str(stop)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        ranks, run = _ranked_run(tmp_path, tree)
        follower = StepFollower(rescan_s=0)
        per_proc = TrainerProcs(follower)
        per_rank = TrainerProcs(follower, worker_series="rank")
        sinks = {
            mode: PrometheusSink(["procs"], hostname="node-3", steps=follower)
            for mode in ("process", "rank")
        }

        def scrape(mode: str, src: TrainerProcs) -> str:
            from stallscope.collect import Collector

            collector = Collector([src], [sinks[mode]], interval=60)
            collector.sample_once()
            return generate_latest(sinks[mode].registry).decode()

        for _ in range(2):  # rates need two reads
            texts = {m: scrape(m, s) for m, s in (("process", per_proc), ("rank", per_rank))}
            time.sleep(0.5)
        # On a loaded machine (CI: 2 cores, the suite in parallel) the busy workers get little
        # CPU: wait until each has run 0.4 s by the kernel's own count, whatever the load.
        import psutil

        deadline = time.time() + 60
        while any(sum(psutil.Process(r["workers"][0]).cpu_times()[:2]) < 0.4 for r in ranks):
            assert time.time() < deadline, "the busy workers never ran 0.4 s"
            time.sleep(0.1)
        texts = {m: scrape(m, s) for m, s in (("process", per_proc), ("rank", per_rank))}
        cpu = "stallscope_proc_cpu_seconds_total"
        each = _series(texts["process"], cpu)
        summed = _series(texts["rank"], cpu)
        workers = {str(w) for r in ranks for w in r["workers"]}
        assert workers <= set(each), each.keys()
        assert not workers & set(summed), summed.keys()
        for r in ranks:
            group = f"{r['pid']}/workers"
            line, value = summed[group]
            assert f'rank="{r["rank"]}"' in line and 'role="worker"' in line, line
            assert f'run="{run.name}"' in line and f'ppid="{r["pid"]}"' in line, line
            assert str(r["pid"]) in summed and str(tree.pid) in summed  # trainer, launcher
            mine = sum(each[str(w)][1] for w in r["workers"])
            assert value >= 0.3, line  # the busy worker ran
            assert abs(value - mine) <= 0.2 + 0.5, (value, mine)  # read 0-0.5 s apart
            n = _series(texts["rank"], "stallscope_proc_processes")[group]
            assert n[1] == 3, n
            assert str(r["pid"]) not in _series(texts["rank"], "stallscope_proc_processes")
        # one worker series per rank instead of three, for every worker family
        assert len([ln for ln in texts["rank"].splitlines() if ln.startswith(cpu + "{")]) == 5
        assert len([ln for ln in texts["process"].splitlines() if ln.startswith(cpu + "{")]) == 9
        before = {g: v for g, (_ln, v) in summed.items() if g.endswith("/workers")}
        stop.write_text("")  # the busy workers exit and are reaped by their rank
        deadline = time.time() + 10
        while time.time() < deadline:
            text = scrape("rank", per_rank)
            n = _series(text, "stallscope_proc_processes")
            if all(n.get(f"{r['pid']}/workers", (0, 3))[1] == 2 for r in ranks):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(text)
        after = _series(text, cpu)
        for g, v in before.items():
            assert after[g][1] >= v, (g, v, after[g])  # the exited worker's seconds stay
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()


def test_worker_series_config_key(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('worker_series = "rank"\n')
    assert load_config(cfg).worker_series == "rank"
    cfg.write_text('worker_series = "pod"\n')
    import pytest

    from stallscope.agent.config import ConfigError

    with pytest.raises(ConfigError, match=r"worker_series must be \"process\".*got 'pod'"):
        load_config(cfg)


def test_a_rank_s_summed_workers_come_back_as_that_many_workers() -> None:
    """diagnose --prometheus over an agent with worker_series = "rank": the group series
    (pid "11/workers", 3 processes) becomes 3 workers of trainer 11, each the group's mean, so
    the diagnosis counts 3 workers at their mean CPU."""
    from stallscope.analysis.promdata import Series, _one_run_of_procs, _split_worker_groups
    from stallscope.sources.roles import infer_roles

    entities = {
        ("procs", "11"): {"role": "main", "name": "python", "run": "r1", "rank": "0"},
        ("procs", "11/workers"): {
            "role": "worker",
            "name": "workers",
            "run": "r1",
            "rank": "0",
            "ppid": "11",
        },
    }
    series = {
        ("procs.cpu_pct", "11"): Series("procs.cpu_pct", "11", [1.0, 2.0], [90.0, 95.0]),
        ("procs.cpu_pct", "11/workers"): Series(
            "procs.cpu_pct", "11/workers", [1.0, 2.0], [150.0, 240.0]
        ),
        ("procs.main_thread_active_pct", "11/workers"): Series(
            "procs.main_thread_active_pct", "11/workers", [1.0, 2.0], [40.0, 40.0]
        ),
        ("procs.processes", "11/workers"): Series(
            "procs.processes", "11/workers", [1.0, 2.0], [3.0, 3.0]
        ),
    }
    _one_run_of_procs(series, entities, "r1")
    _split_worker_groups(series, entities)
    workers = sorted(p for (_s, p), a in entities.items() if a["role"] == "worker")
    assert workers == ["11/workers", "11/workers#2", "11/workers#3"]
    for w in workers:
        assert series[("procs.cpu_pct", w)].v == [50.0, 80.0]
        assert series[("procs.main_thread_active_pct", w)].v == [40.0, 40.0]  # a mean already
        assert ("procs.processes", w) not in series
    roles = infer_roles([{"entity": p, "attrs": a} for (_s, p), a in entities.items()])
    assert roles == {
        "11": "main",
        "11/workers": "worker",
        "11/workers#2": "worker",
        "11/workers#3": "worker",
    }
    assert series[("procs.cpu_pct", "11")].v == [90.0, 95.0]  # the trainer is untouched


def test_communication_wait_goes_out_and_comes_back(tmp_path: Path) -> None:
    """Steps with the probe's communication time: the agent sums them per rank (only for the
    ranks that have any), and diagnose --prometheus spreads the counter's growth over the
    steps again."""
    from stallscope.analysis.promdata import _rank_rows

    run = make_run(tmp_path)
    record_run(run)
    store = RunStore(run / "run.db")
    store.add_steps([StepRow(0, i, time.time(), 0.01, 0.09, comm_s=0.04) for i in range(5)])
    store.add_steps([StepRow(1, i, time.time(), 0.01, 0.09) for i in range(5)])
    store.close()
    sink = PrometheusSink(["host"], hostname="node-3", steps=StepFollower(rescan_s=0))
    text = generate_latest(sink.registry).decode()
    labels0 = f'Hostname="node-3",rank="0",run="{run.name}",train_job="{run.name}"'
    labels1 = f'Hostname="node-3",rank="1",run="{run.name}",train_job="{run.name}"'
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith(f"stallscope_train_comm_wait_seconds_total{{{labels0}}}")
    )
    assert abs(float(line.rsplit(" ", 1)[1]) - 0.2) < 1e-9, line
    assert f"stallscope_train_comm_wait_seconds_total{{{labels1}}}" not in text
    cols = {
        "n": ([100.0, 101.0], [0, 4]),
        "step_s": ([100.0, 101.0], [0, 0.4]),
        "wait_s": ([100.0, 101.0], [0, 0.04]),
        "comm_s": ([100.0, 101.0], [0, 0.16]),
    }
    rows = _rank_rows(0, cols, start=100.0, step=1.0)
    assert len(rows) == 4 and all(abs((r.comm_s or 0) - 0.04) < 1e-9 for r in rows)


def test_a_job_on_several_nodes_shares_its_train_job_label(tmp_path: Path) -> None:
    """The probes name their job (torchrun's rendezvous id, the Slurm job, the rendezvous
    endpoint): the step series carry it as train_job, so rules group a job's ranks across
    nodes, whose run ids differ."""
    from stallscope.probe.recorder import job_key

    assert job_key({"TORCHELASTIC_RUN_ID": "j42", "SLURM_JOB_ID": "7"}) == "torchrun:j42"
    assert job_key({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7"}) == "slurm:7"
    assert job_key({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}) == "10.0.0.1:29500"
    assert job_key({}) is None
    run = make_run(tmp_path)
    record_run(run)
    store = RunStore(run / "run.db")
    store.set_probe(1, os.getpid(), {"job": "torchrun:j42"}, 0, 0)
    store.add_steps([StepRow(1, i, time.time(), 0.01, 0.09) for i in range(3)])
    store.close()
    sink = PrometheusSink(["host"], hostname="node-b", steps=StepFollower(rescan_s=0))
    text = generate_latest(sink.registry).decode()
    assert (
        f'stallscope_train_steps_total{{Hostname="node-b",rank="1",run="{run.name}",'
        'train_job="torchrun:j42"} 3.0'
    ) in text, text
