"""Procs source: parsers on recorded /proc/PID files, and the reader on a real process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import FIXTURES

from stallscope.errors import ParseError, SourceUnavailable
from stallscope.sources import procs as procs_source
from stallscope.sources.procs import (
    RELIST_EVERY,
    ProcCounters,
    ProcIo,
    ProcsSource,
    ThreadStates,
    parse_pid_io,
    parse_pid_stat,
    parse_schedstat,
    proc_rates,
    thread_states,
)

PID = FIXTURES / "proc-kernel-6" / "pid-self"


def test_parse_pid_stat_recorded() -> None:
    st = parse_pid_stat((PID / "stat").read_text())
    assert st.comm == "cat" and st.state == "R" and st.threads == 1
    assert st.blkio_ticks == 0  # field 42 present on this kernel


def test_parse_pid_stat_comm_with_spaces_and_parens() -> None:
    line = "42 (a (b) c) S 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 4 0 99 0 12 " + "0 " * 20
    st = parse_pid_stat(line)
    assert st.comm == "a (b) c" and st.ppid == 1 and st.utime == 7 and st.stime == 3
    assert st.threads == 4 and st.rss_pages == 12 and st.nice == 0
    niced = line.replace(" 20 0 4 ", " 39 19 4 ", 1)  # priority 39, nice 19
    assert parse_pid_stat(niced).nice == 19 and parse_pid_stat(niced).threads == 4


def test_parse_pid_stat_old_kernel_without_field_42() -> None:
    line = "42 (x) S 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 4 0 99 0 12"
    assert parse_pid_stat(line).blkio_ticks is None


def test_the_full_scans_parent_reader_agrees_with_parse_pid_stat(tmp_path) -> None:
    """The full /proc scan reads each process's parent from the stat bytes (_ppid_of): the
    same parent as parse_pid_stat on recorded, tricky and live files, and None wherever
    parse_pid_stat refuses the text (the scan skips those processes, as it did)."""
    from stallscope.sources.procs import _ppid_of

    texts = {
        "recorded": (PID / "stat").read_text(),
        "parens": "42 (a (b) c) S 7 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 4 0 99 0 12 " + "0 " * 20,
        "old": "42 (x) S 3 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 4 0 99 0 12",
        "garbage": "garbage",
        "short": "42 (x) S 3 42 42",
        "bad pid": "x42 (x) S 3 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 4 0 99 0 12",
        "bad ppid": "42 (x) S q 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 4 0 99 0 12",
    }
    for name, text in texts.items():
        path = tmp_path / name.replace(" ", "_")
        path.write_text(text)
        try:
            want: int | None = parse_pid_stat(text).ppid
        except ParseError:
            want = None
        assert _ppid_of(str(path)) == want, name
    assert _ppid_of(str(tmp_path / "parens")) == 7
    assert _ppid_of(str(tmp_path / "missing")) is None
    live = [d for d in os.listdir("/proc") if d.isdigit()][:50]
    assert live
    for d in live:
        try:
            want = parse_pid_stat(open(f"/proc/{d}/stat").read()).ppid
        except OSError:
            continue  # exited meanwhile
        got = _ppid_of(f"/proc/{d}/stat")
        assert got in (want, None), d  # None only for one that exited in between


def test_parse_errors_quote_input() -> None:
    with pytest.raises(ParseError, match="garbage"):
        parse_pid_stat("garbage")
    with pytest.raises(ParseError, match="read_bytes"):
        parse_pid_io("rchar: 1\n")
    with pytest.raises(ParseError):
        parse_schedstat("x")


def test_parse_io_and_schedstat_recorded() -> None:
    io = parse_pid_io((PID / "io").read_text())
    assert io.rchar == 6976 and io.read_bytes == 0
    assert parse_schedstat((PID / "schedstat").read_text()) == (197486, 82838)


CLK_TCK = os.sysconf("SC_CLK_TCK")
BASE = ProcCounters(
    starttime=5000,
    cpu_ticks=100,
    main_ns=10**9,
    io=ProcIo(10_000, 4096, 0),
    sched_wait_ns=10**6,
    blkio_ticks=0,
)


def test_proc_rates_over_an_interval() -> None:
    cur = ProcCounters(
        starttime=5000,
        cpu_ticks=100 + CLK_TCK,
        main_ns=10**9 + 5 * 10**8,
        io=ProcIo(10_000 + 4 * 1048576, 4096 + 2 * 1048576, 1048576),
        sched_wait_ns=10**6 + 2 * 10**8,
        blkio_ticks=CLK_TCK // 2,
    )
    assert proc_rates(BASE, cur, 2.0) == {
        "cpu_pct": pytest.approx(50.0),
        "main_thread_active_pct": pytest.approx(25.0),
        "read_kb_s": pytest.approx(1024.0),
        "write_kb_s": pytest.approx(512.0),
        "rchar_kb_s": pytest.approx(2048.0),
        "runq_wait_pct": pytest.approx(10.0),
        "blkio_wait_pct": pytest.approx(25.0),
    }
    # an unchanged counter is a real zero
    assert proc_rates(BASE, BASE, 1.0) == {
        "cpu_pct": 0.0,
        "main_thread_active_pct": 0.0,
        "read_kb_s": 0.0,
        "write_kb_s": 0.0,
        "rchar_kb_s": 0.0,
        "runq_wait_pct": 0.0,
        "blkio_wait_pct": 0.0,
    }


def test_proc_rates_counter_reset_drops_only_that_rate() -> None:
    cur = BASE._replace(cpu_ticks=50, io=ProcIo(10_000 + 1024, 100, 2048))
    rates = proc_rates(BASE, cur, 1.0)
    assert "cpu_pct" not in rates and "read_kb_s" not in rates  # went down: left out, not 0
    assert rates["rchar_kb_s"] == pytest.approx(1.0)
    assert rates["write_kb_s"] == pytest.approx(2.0)
    assert rates["runq_wait_pct"] == 0.0


def test_proc_rates_pid_reuse_new_process_and_no_time() -> None:
    grown = BASE._replace(cpu_ticks=900, io=ProcIo(10**9, 10**9, 10**9))
    # another start time: another process got the pid, its higher counters are not growth
    assert proc_rates(BASE, grown._replace(starttime=9000), 1.0) == {}
    assert proc_rates(None, grown, 1.0) == {}  # first read of a process: a baseline
    assert proc_rates(BASE, grown, 0.0) == {}  # dt 0 (or a clock that went back): no rates
    assert proc_rates(BASE, grown, -1.0) == {}


def test_proc_rates_leave_out_what_either_read_lacks() -> None:
    lacking = BASE._replace(main_ns=None, io=None, sched_wait_ns=None, blkio_ticks=None)
    assert proc_rates(BASE, lacking, 1.0) == {"cpu_pct": 0.0}
    assert proc_rates(lacking, BASE, 1.0) == {"cpu_pct": 0.0}
    # percentages of a wait are capped at 100 (a sample late by scheduling)
    late = BASE._replace(
        sched_wait_ns=10**6 + 3 * 10**9, main_ns=10**9 + 3 * 10**9, blkio_ticks=3 * CLK_TCK
    )
    rates = proc_rates(BASE, late, 1.0)
    assert rates["runq_wait_pct"] == rates["main_thread_active_pct"] == 100.0
    assert rates["blkio_wait_pct"] == 100.0


TREE = textwrap.dedent("""
    import os, sys, time
    def burn():
        end = time.time() + 30
        while time.time() < end:
            pass
    def sleeper():
        time.sleep(30)
    kids = []
    for fn in (burn, sleeper):
        pid = os.fork()
        if pid == 0:
            fn(); os._exit(0)
        kids.append(pid)
    print(" ".join(map(str, kids)), flush=True)
    time.sleep(30)
""")


def _end_tree(p: subprocess.Popen[str], kids: list[int]) -> None:
    """Kill TREE and its forked children (they outlive their parent)."""
    for pid in kids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.kill()
    p.wait()


def test_real_tree_roles_and_cpu() -> None:
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    kids: list[int] = []
    try:
        assert p.stdout is not None
        burn, sleeper = map(int, p.stdout.readline().split())
        kids = [burn, sleeper]
        src = ProcsSource(p.pid)
        src.open()
        truth = psutil.Process(burn)
        c0 = sum(truth.cpu_times()[:2])
        t0 = time.time()
        src.sample(t0)
        time.sleep(1.0)
        c1 = sum(truth.cpu_times()[:2])
        t1 = time.time()
        out = src.sample(t1)
        assert out is not None
        assert set(out) == {str(p.pid), str(burn), str(sleeper)}
        assert out[str(p.pid)]["role"] == "main"
        assert out[str(burn)]["role"] == "worker"
        # psutil as ground truth over the same interval (a loaded CI box gives the loop less
        # than a core, so compare with what it really got, within clock-tick granularity)
        expected = 100 * (c1 - c0) / (t1 - t0)
        assert expected > 5
        assert out[str(burn)]["cpu_pct"] == pytest.approx(expected, abs=6)
        assert out[str(sleeper)]["cpu_pct"] < 2
        assert out[str(sleeper)]["state"] == "S"
        assert "read_kb_s" in out[str(burn)] and "runq_wait_pct" in out[str(burn)]
        # a worker that exits disappears from the next sample
        os.kill(sleeper, 9)
        time.sleep(0.2)
        out = src.sample(time.time())
        assert out is not None and str(sleeper) not in out
    finally:
        _end_tree(p, kids)


def test_a_child_forked_after_the_tree_settled_is_seen_at_the_next_sample(
    tmp_path: Path,
) -> None:
    """A torchrun rank forks its DataLoader workers after a long set-up, when the tree has been
    the same for many samples: the rank has run since the last sample, so its children are read
    and its worker is in the very next sample, not RELIST_EVERY samples later (a 6-s DDP run at
    --interval 1 once read as ranks with no workers)."""
    go = tmp_path / "go"
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"  # the rank: no children until told, and busy waiting
        f"    while not os.path.exists({str(go)!r}):\n"
        "        time.sleep(0.02)\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(30); os._exit(0)\n"
        "    time.sleep(30); os._exit(0)\n"
        "time.sleep(30)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        src = ProcsSource(p.pid)
        src.open()
        deadline = time.monotonic() + 10
        while len(src.sample(time.time()) or {}) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(procs_source._SETTLE + 2):  # the tree settles: no new process for a while
            out = src.sample(time.time())
            time.sleep(0.05)
        assert out is not None and len(out) == 2
        [rank] = [int(pid) for pid in out if int(pid) != p.pid]
        go.touch()
        while not psutil.Process(rank).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        [worker] = psutil.Process(rank).children()
        assert not src._settling  # the tree has settled: only some children files are read
        src._n = RELIST_EVERY + 1  # and this sample is not one of the periodic full listings
        out = src.sample(time.time())
        assert out is not None and str(worker.pid) in out, (worker.pid, list(out))
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_a_process_s_nice_value_is_known_and_follows_a_renice() -> None:
    """The entity carries the process's nice value (the diagnosis tells a niced trainer from
    niced processes beside it); a process reniced later (a worker_init_fn calling os.nice) is
    known by its new one."""
    p = subprocess.Popen(["nice", "-n", "5", sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        src = ProcsSource(p.pid)
        src.open()
        deadline = time.monotonic() + 10
        while True:  # `nice` execs the interpreter: until then the pid is `nice` itself
            out = src.sample(time.time())
            assert out is not None
            ent = src.entities(out)[str(p.pid)]
            if ent["name"].startswith("python") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert ent["nice"] == 5, ent
        os.setpriority(os.PRIO_PROCESS, p.pid, 12)  # lowering a priority needs no privilege
        # a sleeping process's stat is read again at the latest on the next full read
        seen = []
        for _ in range(RELIST_EVERY + 1):
            out = src.sample(time.time())
            assert out is not None
            seen.append(src.entities(out)[str(p.pid)]["nice"])
        assert seen[-1] == 12, seen
    finally:
        p.kill()
        p.wait()


def test_a_process_that_renames_itself_is_known_by_its_new_name() -> None:
    """A DataLoader worker names itself pt_data_worker after its fork; first seen before that
    (a trainer under a CPU quota is slow to get there) it kept the name it was seen with, and
    its trainer read as no trainer. Its entity follows the rename."""
    code = (
        "import ctypes, sys, time\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "ctypes.CDLL(None).prctl(15, b'pt_data_worker', 0, 0, 0)\n"
        "print('renamed', flush=True)\n"
        "time.sleep(30)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        # seen before its exec is through, a process reads an empty cmdline (CI once sampled
        # it there); the child says when it runs
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        src = ProcsSource(p.pid)
        src.open()
        out = src.sample(time.time())
        assert out is not None
        before = src.entities(out)[str(p.pid)]
        assert before["cmdline"], before
        assert before["name"] != "pt_data_worker"
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "renamed"
        out = src.sample(time.time())
        assert out is not None
        after = src.entities(out)[str(p.pid)]
        assert after["name"] == "pt_data_worker" and after["cmdline"] == before["cmdline"]
    finally:
        p.kill()
        p.wait()


def test_an_idle_process_gives_its_last_record_with_zero_rates_and_its_io_unread() -> None:
    """A sleeping single-threaded worker reads the same stat and schedstat at each sample: its
    record is what a full read gives (all rates 0) without reading its io file; a busy one is
    read in full every time."""
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    kids: list[int] = []
    try:
        assert p.stdout is not None
        kids = list(map(int, p.stdout.readline().split()))
        burn, sleeper = kids
        fast, full = ProcsSource(p.pid), ProcsSource(p.pid)
        fast.open()
        full.open()
        reads: list[tuple[int, str]] = []
        pread = fast._pread

        def counted(pid: int, name: str) -> str:
            reads.append((pid, name))
            return pread(pid, name)

        fast._pread = counted  # type: ignore[method-assign]
        for _ in range(4):
            full._idle.clear()  # the reference: every process read in full
            a, b = fast.sample(time.time()), full.sample(time.time())
            time.sleep(0.15)
        assert a is not None and b is not None
        assert a[str(sleeper)] == b[str(sleeper)]
        assert a[str(sleeper)]["cpu_pct"] == a[str(sleeper)]["runq_wait_pct"] == 0.0
        assert set(a[str(sleeper)]) == set(b[str(sleeper)]) >= {"read_kb_s", "rchar_kb_s"}
        io = [pid for pid, name in reads if name == "io"]
        assert io.count(burn) == 4 and io.count(sleeper) <= 2, io
        assert a[str(burn)]["cpu_pct"] > 0 and set(a[str(burn)]) == set(b[str(burn)])
        # its unchanged schedstat is enough: its stat is not read either, but every
        # RELIST_EVERY samples (memory reclaimed from a process that does not run)
        stat = [pid for pid, name in reads if name == "stat"]
        assert stat.count(burn) == 4 and stat.count(sleeper) <= 2, stat
        reads.clear()
        fast._n = RELIST_EVERY - 1
        a = fast.sample(time.time())
        assert a is not None and a[str(sleeper)]["cpu_pct"] == 0.0
        assert (sleeper, "stat") in reads, reads
    finally:
        _end_tree(p, kids)


def test_unreadable_root_pid() -> None:
    with pytest.raises(SourceUnavailable, match="not readable"):
        ProcsSource(2**22 + 7).open()


def _ent(pid: int, ppid: int, name: str, role: str = "worker") -> dict:
    return {"entity": str(pid), "attrs": {"name": name, "ppid": ppid, "role": role}}


def test_infer_roles_through_a_shell_launcher() -> None:
    from stallscope.sources.roles import infer_roles

    tree = [
        _ent(10, 1, "sh", "main"),
        _ent(11, 10, "python"),
        _ent(12, 11, "pt_data_worker"),
        _ent(13, 11, "pt_data_worker"),
    ]
    assert infer_roles(tree) == {"10": "launcher", "11": "main", "12": "worker", "13": "worker"}


def test_infer_roles_torchrun_ranks_and_probe_pids() -> None:
    from stallscope.sources.roles import infer_roles

    tree = [
        _ent(10, 1, "torchrun", "main"),
        _ent(11, 10, "python"),
        _ent(12, 10, "python"),
        _ent(13, 11, "python"),
        _ent(14, 12, "python"),
    ]
    # no DataLoader worker names: the launcher's children are the trainers
    assert infer_roles(tree) == {
        "10": "launcher",
        "11": "main",
        "12": "main",
        "13": "worker",
        "14": "worker",
    }
    # the probe's pids are the strongest evidence
    assert infer_roles(tree, {"11"})["12"] == "launcher"
    # a plain `python train.py` root with workers stays main
    plain = [_ent(20, 1, "python", "main"), _ent(21, 20, "python")]
    assert infer_roles(plain) == {"20": "main", "21": "worker"}


def test_infer_roles_a_rank_whose_workers_were_not_seen_by_name() -> None:
    """Rank 1 under a CPU quota renamed its DataLoader worker (pt_data_worker) after the sampler
    first saw it: only rank 0's worker is known by name. Rank 1 shares rank 0's launcher and
    command line: a trainer too (it read as a launcher, and a DDP run diagnosed from its stacks
    alone lost its straggler: a fresh-clone CI run); a helper the launcher started with another
    command line is not."""
    from stallscope.sources.roles import infer_roles

    cmd = "python examples/train_ddp.py --max-seconds 6"
    tree = [
        _ent(10, 1, "torchrun", "main"),
        _ent(11, 10, "python"),
        _ent(12, 10, "python"),
        _ent(13, 11, "pt_data_worker"),
        _ent(14, 12, "python"),
        _ent(15, 10, "python"),
    ]
    for e in tree[1:5]:
        e["attrs"]["cmdline"] = cmd
    tree[5]["attrs"]["cmdline"] = "python -m tensorboard.main --logdir runs"
    assert infer_roles(tree) == {
        "10": "launcher",
        "11": "main",
        "12": "main",
        "13": "worker",
        "14": "worker",
        "15": "launcher",
    }
    # the probe of rank 0 alone: rank 1 is still its sibling rank
    assert infer_roles(tree, {"11"})["12"] == "main"


def test_thread_states_counts_d_and_tensorflow_threads() -> None:
    stats = [
        "100 (python) S 1 100",
        "101 (tf_Compute) R 1 100",
        "102 (tf_data (x)) D 1 100",
        "103 (python) D 1 100",
        "garbage",
    ]
    assert thread_states(stats) == ThreadStates(d=2, tf=2)
    assert thread_states([]) == ThreadStates(0, 0)


THREADED = textwrap.dedent("""
    import sys, threading, time
    ready = threading.Event()
    def named():
        # what TensorFlow does for its pools: the OS-level thread name
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write("tf_Compute")
        ready.set()
        time.sleep(60)
    threading.Thread(target=named, daemon=True).start()
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    ready.wait()
    print("ok", flush=True)
    time.sleep(60)
""")


def test_real_threads_of_the_trainer() -> None:
    """The trainer's threads are read from /proc/PID/task: a thread named like TensorFlow's
    pools is counted; none of three sleeping threads is in D."""
    p = subprocess.Popen([sys.executable, "-c", THREADED], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ok"
        src = ProcsSource(p.pid)
        src.open()
        out = src.sample(time.time())
        assert out is not None
        rec = out[str(p.pid)]
        assert rec["threads"] == 3
        assert rec["tf_threads"] == 1 and rec["d_threads"] == 0
    finally:
        p.kill()
        p.wait()


def _comm(tid: str) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:  # a thread that just ended
        return ""


def _tf_thread(stop: threading.Event, name: str = "tf_Compute") -> threading.Thread:
    ready = threading.Event()

    def run() -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name)
        ready.set()
        stop.wait()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait()
    return t


def _gone(t: threading.Thread) -> None:
    """Join ``t`` and wait for its kernel task to leave /proc/self/task: ``join()`` returns
    when the Python thread is done, and on a busy machine its task was still listed (read as
    a live tf_ thread)."""
    t.join()
    deadline = time.monotonic() + 10.0
    while os.path.exists(f"/proc/self/task/{t.native_id}") and time.monotonic() < deadline:
        time.sleep(0.01)


def test_threads_that_come_and_go_are_counted_and_their_descriptors_closed() -> None:
    """The trainer's threads are listed again when their count changes or one's file fails;
    between listings each stat is re-read through a kept descriptor, one a live thread."""
    from stallscope.sources import procs

    me = str(os.getpid())
    # threads other tests of this process left behind (TensorFlow's pools are named tf_*)
    tf0 = sum(1 for t in os.listdir("/proc/self/task") if _comm(t).startswith("tf_"))
    stops = [threading.Event() for _ in range(4)]
    threads = [_tf_thread(s) for s in stops[:3]]
    src = ProcsSource(os.getpid())
    src.open()

    def sample() -> dict:
        out = src.sample(time.time())
        assert out is not None
        return out[me]

    def kept() -> int:
        return sum(
            1
            for pid, name in src._files
            if str(pid) == me and name.startswith("task/") and name.endswith("/stat")
        )

    try:
        base = len(os.listdir("/proc/self/task"))
        rec = sample()
        assert rec["tf_threads"] == tf0 + 3 and kept() == base
        for _ in range(3):  # the same threads: read through the kept descriptors
            assert sample()["tf_threads"] == tf0 + 3
        threads.append(_tf_thread(stops[3]))  # one more: the count changed, listed again
        assert sample()["tf_threads"] == tf0 + 4 and kept() == base + 1
        stops[0].set()
        _gone(threads[0])
        # one gone and one other started: the count is the same, the dead one's read fails...
        extra = threading.Event()
        other = _tf_thread(extra, "tf_data")
        sample()
        rec = sample()  # ...so they are listed again: both seen, the dead one's fd closed
        assert rec["tf_threads"] == tf0 + 4, rec
        assert kept() == len(os.listdir("/proc/self/task"))
        extra.set()
        _gone(other)
        # one that exits: the count changed, listed again; and a listing every RELIST_EVERY
        # samples whatever happened keeps the same picture
        for _ in range(procs.RELIST_EVERY + 1):
            rec = sample()
            assert rec["tf_threads"] == tf0 + 3 and kept() == len(os.listdir("/proc/self/task"))
    finally:
        for s in stops:
            s.set()
        src.close()
