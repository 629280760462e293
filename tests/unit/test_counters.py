"""Raw counters beside the rates: the one counter_delta, resets dropping an interval in every
source, pid reuse, rates on the monotonic read time, and ``counters()`` against the metric table.

Sources are fed the recorded files under tests/fixtures/proc-kernel-6 (copied to a temporary
proc root and edited between samples) and a clock the test moves by hand.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES
from hypothesis import given
from hypothesis import strategies as st

from stallscope import metrics
from stallscope.sources import base, disk
from stallscope.sources.base import Counter, Source, counter_delta, counter_deltas
from stallscope.sources.disk import DiskSource, disk_counters, parse_diskstats
from stallscope.sources.host import HostSource, parse_pressure_totals, parse_proc_stat
from stallscope.sources.procs import ProcsSource

K6 = FIXTURES / "proc-kernel-6"
VM_DISKSTATS = FIXTURES / "sys-vm-6.18-loop-overlay" / "proc" / "diskstats"
VM_SYS = FIXTURES / "sys-vm-6.18-loop-overlay" / "sys"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _declared_counters(out: list[Counter]) -> None:
    """Every counter a source returns is declared in stallscope.metrics as a counter."""
    assert out
    for name, entity, value in out:
        m = metrics.lookup(name)
        assert m is not None, name
        assert m.kind == "counter", name
        assert isinstance(entity, str) and isinstance(value, float), (name, entity, value)
        assert value >= 0


# --- the one counter_delta ----------------------------------------------------------------------


def test_counter_delta_normal_wrap_reset() -> None:
    assert counter_delta(10, 25) == 15
    assert counter_delta(7, 7) == 0
    assert counter_delta(2**32 - 6, 4) == 10  # 32-bit wrap unwrapped
    assert counter_delta(1000, 10) is None  # went down, not near the top: a reset
    assert counter_delta(2**40, 2**40 - 8) is None  # beyond 32 bits: cannot be a 32-bit wrap


def test_counter_delta_64_bit_counters() -> None:
    assert counter_delta(2**64 - 6, 4, 64) == 10
    # a 32-bit-looking wrap is a reset for a u64 counter (CPU ticks, /proc/PID/io)
    assert counter_delta(2**32 - 6, 4, 64) is None
    assert counter_delta(500, 499, 64) is None


def test_disk_reexports_the_shared_function() -> None:
    assert disk.counter_delta is base.counter_delta


@given(
    st.lists(st.tuples(st.integers(0, 2**33), st.integers(0, 2**33)), max_size=10),
    st.sampled_from([32, 64]),
)
def test_counter_deltas_is_counter_delta_per_field(pairs: list[tuple[int, int]], bits: int) -> None:
    prev = [p for p, _ in pairs]
    cur = [c for _, c in pairs]
    each = [counter_delta(p, c, bits) for p, c in pairs]
    expected = None if None in each else tuple(each)
    assert counter_deltas(prev, cur, bits) == expected


def test_base_source_has_no_counters() -> None:
    class Bare(Source):
        name = "bare"

        def sample(self, now: float) -> None:
            return None

    assert Bare().counters() == []


# --- the metric table ---------------------------------------------------------------------------


def test_counter_prom_names_end_in_total_and_only_theirs() -> None:
    counters = [m for m in metrics.METRICS if m.kind == "counter"]
    assert counters
    for m in metrics.METRICS:
        if m.kind == "counter":
            assert m.prom.endswith("_total") and m.key.endswith("_total"), m.name
            assert m.prom_scale == 1.0, m.name  # stored in base units already
            assert m.unit in ("s", "B", "J", ""), m.name  # Prometheus' base units
        elif m.prom:
            assert not m.prom.endswith("_total"), m.name
    assert len({m.prom for m in metrics.METRICS if m.prom}) == len(
        [m for m in metrics.METRICS if m.prom]
    )


def test_by_source_lists_payload_metrics_unless_counters_asked() -> None:
    for src in ("disk", "host", "procs"):
        assert all(m.kind != "counter" for m in metrics.by_source(src))
        extra = set(metrics.by_source(src, counters=True)) - set(metrics.by_source(src))
        assert extra and all(m.kind == "counter" for m in extra)


def test_counter_labels() -> None:
    labels = {m.name: m.label for m in metrics.METRICS if m.kind == "counter"}
    assert labels["disk.read_bytes_total"] == "device"
    assert labels["procs.cpu_seconds_total"] == "pid"
    assert labels["host.cpu_seconds_total"] == "mode"
    assert labels["host.swap_in_bytes_total"] == ""


# --- host ---------------------------------------------------------------------------------------


def _host(tmp_path: Path) -> tuple[Path, HostSource, _Clock]:
    """A copy of the recorded /proc, given a swap area (the recorded machine had none, and
    without one the source reads no swap counters: nothing can be swapped)."""
    root = tmp_path / "proc"
    shutil.copytree(K6, root)
    mem = (root / "meminfo").read_text().splitlines()
    mem = [("SwapTotal: 1048576 kB" if m.startswith("SwapTotal:") else m) for m in mem]
    (root / "meminfo").write_text("\n".join(mem) + "\n")
    clock = _Clock()
    src = HostSource(proc_root=str(root), shm_path=str(tmp_path), clock=clock)
    src.open()
    return root, src, clock


def _edit_stat(root: Path, **add: dict[str, int]) -> None:
    """Add ticks per mode to CPU lines: ``cpu0={"user": 5}``; negative values reset."""
    lines = []
    for c in parse_proc_stat((root / "stat").read_text()):
        vals = c._asdict()
        for mode, n in add.get(c.name, {}).items():
            vals[mode] += n
        lines.append(" ".join([c.name, *(str(vals[m]) for m in c._fields[1:])]) + " 0 0")
    (root / "stat").write_text("\n".join(lines) + "\n")


def _edit_vmstat(root: Path, pswpin: int, pswpout: int) -> None:
    vm = []
    for line in (root / "vmstat").read_text().splitlines():
        if line.startswith("pswpin "):
            line = f"pswpin {pswpin}"
        elif line.startswith("pswpout "):
            line = f"pswpout {pswpout}"
        vm.append(line)
    (root / "vmstat").write_text("\n".join(vm) + "\n")


def test_host_rates_use_the_monotonic_read_time_not_now(tmp_path: Path) -> None:
    root, src, clock = _host(tmp_path)
    _edit_vmstat(root, 1000, 0)
    assert src.sample(5.0) is None
    _edit_vmstat(root, 1500, 100)
    clock.t += 4.0
    out = src.sample(5.1)  # the collector's now says 0.1 s: a delayed sample; the read says 4 s
    assert out is not None
    assert out["swap_in_kb_s"] == pytest.approx(500 * PAGE / 1024 / 4)
    assert out["swap_out_kb_s"] == pytest.approx(100 * PAGE / 1024 / 4)


def test_host_cpu_reset_drops_the_interval(tmp_path: Path) -> None:
    root, src, clock = _host(tmp_path)
    assert src.sample(0.0) is None
    # cpu1's iowait went backwards (a reset of that line): the aggregate and cpu1 have no value
    _edit_stat(root, cpu={"user": 100, "iowait": -50}, cpu0={"user": 100}, cpu1={"iowait": -50})
    clock.t += 1.0
    out = src.sample(0.0)
    assert out is not None
    assert out["cpu_pct"] is None and out["iowait_pct"] is None  # not 0
    assert out["cpu_per_core_pct"][0] == pytest.approx(100.0)
    assert out["cpu_per_core_pct"][1] is None
    assert out["cpu_max_core_pct"] == pytest.approx(100.0)
    # the next interval is measured from the reset reading
    _edit_stat(root, cpu={"user": 50, "idle": 50}, cpu0={"user": 50}, cpu1={"idle": 50})
    clock.t += 1.0
    out = src.sample(0.0)
    assert out is not None
    assert out["cpu_pct"] == pytest.approx(50.0)
    assert out["cpu_per_core_pct"] == [pytest.approx(100.0), pytest.approx(0.0)]


def test_host_swap_reset_drops_the_swap_rates(tmp_path: Path) -> None:
    root, src, clock = _host(tmp_path)
    _edit_vmstat(root, 5000, 7000)
    src.sample(0.0)
    _edit_vmstat(root, 10, 7100)  # swap counters cleared: no rate, rather than 0
    clock.t += 1.0
    out = src.sample(0.0)
    assert out is not None and "swap_in_kb_s" not in out and "swap_out_kb_s" not in out
    assert out["cpu_pct"] is not None  # only the affected rates are dropped
    _edit_vmstat(root, 20, 7100)
    clock.t += 1.0
    out = src.sample(0.0)
    assert out is not None and out["swap_in_kb_s"] == pytest.approx(10 * PAGE / 1024)


def test_host_32_bit_swap_wrap_is_unwrapped(tmp_path: Path) -> None:
    root, src, clock = _host(tmp_path)
    _edit_vmstat(root, 2**32 - 10, 0)
    src.sample(0.0)
    _edit_vmstat(root, 10, 0)
    clock.t += 2.0
    out = src.sample(0.0)
    assert out is not None and out["swap_in_kb_s"] == pytest.approx(20 * PAGE / 1024 / 2)


def test_host_counters_declared_and_in_base_units(tmp_path: Path) -> None:
    root, src, _ = _host(tmp_path)
    assert src.counters() == []  # nothing read yet
    _edit_vmstat(root, 3, 4)
    src.sample(0.0)
    got = src.counters()
    _declared_counters(got)
    by = {(n, e): v for n, e, v in got}
    cpu = parse_proc_stat((K6 / "stat").read_text())[0]
    assert by[("host.cpu_seconds_total", "user")] == pytest.approx(cpu.user / CLK_TCK)
    assert by[("host.cpu_seconds_total", "iowait")] == pytest.approx(cpu.iowait / CLK_TCK)
    assert {e for n, e in by if n == "host.cpu_seconds_total"} == {
        "user",
        "nice",
        "system",
        "idle",
        "iowait",
        "irq",
        "softirq",
        "steal",
    }
    assert by[("host.swap_in_bytes_total", "")] == 3 * PAGE
    assert by[("host.swap_out_bytes_total", "")] == 4 * PAGE
    io = parse_pressure_totals((K6 / "pressure" / "io").read_text())
    assert io == {"some": 2652052, "full": 2471438}
    assert by[("host.psi_io_some_seconds_total", "")] == pytest.approx(2.652052)
    assert by[("host.psi_io_full_seconds_total", "")] == pytest.approx(2.471438)
    assert by[("host.psi_cpu_some_seconds_total", "")] == pytest.approx(4.609571)
    assert ("host.psi_mem_full_seconds_total", "") in by
    # every declared host counter is produced on a kernel with PSI
    declared = {m.name for m in metrics.by_source("host", counters=True) if m.kind == "counter"}
    assert {n for n, _ in by} == declared


def test_host_counters_follow_the_latest_read(tmp_path: Path) -> None:
    root, src, clock = _host(tmp_path)
    src.sample(0.0)
    _edit_stat(root, cpu={"user": 2 * CLK_TCK})
    clock.t += 1.0
    src.sample(0.0)
    cpu = parse_proc_stat((K6 / "stat").read_text())[0]
    by = {(n, e): v for n, e, v in src.counters()}
    assert by[("host.cpu_seconds_total", "user")] == pytest.approx(cpu.user / CLK_TCK + 2)


def test_host_without_psi_has_no_psi_counters(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    shutil.copytree(K6, root)
    shutil.rmtree(root / "pressure")
    src = HostSource(proc_root=str(root), shm_path=str(tmp_path), clock=_Clock())
    src.open()
    src.sample(0.0)
    names = {n for n, _, _ in src.counters()}
    assert names and not any("psi" in n for n in names)


# --- procs --------------------------------------------------------------------------------------


STAT_FIXTURE = (K6 / "pid-self" / "stat").read_text()


def _stat_text(
    pid: int, ppid: int, utime: int, stime: int, start: int, blkio: int, state: str
) -> str:
    """The recorded stat line with the fields a test sets (proc(5) numbering: 3 state, 4 ppid,
    14 utime, 15 stime, 22 starttime, 42 delayacct_blkio_ticks)."""
    _, _, tail = STAT_FIXTURE.partition(") ")
    rest = tail.split()
    rest[0], rest[1], rest[11], rest[12], rest[19], rest[39] = (
        state,
        str(ppid),
        str(utime),
        str(stime),
        str(start),
        str(blkio),
    )
    return f"{pid} (python) " + " ".join(rest) + "\n"


def _write_proc(
    root: Path,
    pid: int,
    *,
    utime: int = 100,
    stime: int = 20,
    start: int = 5000,
    blkio: int = 0,
    rchar: int = 10_000,
    read_bytes: int = 4096,
    write_bytes: int = 0,
    run_ns: int | None = None,
    wait_ns: int = 10**6,
    ppid: int = 1,
    state: str = "S",
) -> None:
    """Write (in place: the source keeps descriptors open) one fake /proc/PID. Its time on a
    CPU (schedstat) is its utime + stime unless given: a process whose CPU time moved has run,
    and one whose schedstat stands has not (the source reads no more of it then)."""
    if run_ns is None:
        run_ns = (utime + stime) * 10**9 // CLK_TCK
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    (d / "task" / str(pid) / "children").write_text("")
    (d / "stat").write_text(_stat_text(pid, ppid, utime, stime, start, blkio, state))
    (d / "io").write_text(
        f"rchar: {rchar}\nwchar: 0\nsyscr: 1\nsyscw: 0\n"
        f"read_bytes: {read_bytes}\nwrite_bytes: {write_bytes}\n"
        "cancelled_write_bytes: 0\n"
    )
    (d / "schedstat").write_text(f"{run_ns} {wait_ns} 3\n")
    (d / "cmdline").write_bytes(b"python\0train.py\0")


PID = 4242


def _rec(src: ProcsSource) -> dict[str, Any]:
    """One sample's record of the root process."""
    out = src.sample(0.0)
    assert out is not None
    rec: dict[str, Any] = out[str(PID)]
    return rec


def _procs(tmp_path: Path, **kw: Any) -> tuple[Path, ProcsSource, _Clock]:
    root = tmp_path / "proc"
    _write_proc(root, PID, **kw)
    clock = _Clock()
    src = ProcsSource(PID, proc_root=str(root), clock=clock)
    src.open()
    return root, src, clock


def test_procs_rates_use_the_monotonic_read_time_not_now(tmp_path: Path) -> None:
    root, src, clock = _procs(tmp_path)
    first = src.sample(50.0)
    assert first is not None and "cpu_pct" not in first[str(PID)]  # nothing to diff yet
    _write_proc(
        root,
        PID,
        utime=100 + CLK_TCK,
        stime=20,
        read_bytes=4096 + 2 * 1048576,
        rchar=10_000 + 4 * 1048576,
        write_bytes=1024 * 1024,
        wait_ns=10**6 + 2 * 10**8,
        blkio=CLK_TCK // 2,
    )
    clock.t += 2.0
    out = src.sample(50.01)  # the collector's now moved 10 ms; the reads are 2 s apart
    assert out is not None
    rec = out[str(PID)]
    assert rec["cpu_pct"] == pytest.approx(50.0)
    assert rec["read_kb_s"] == pytest.approx(1024.0)
    assert rec["rchar_kb_s"] == pytest.approx(2048.0)
    assert rec["write_kb_s"] == pytest.approx(512.0)
    assert rec["runq_wait_pct"] == pytest.approx(10.0)
    assert rec["blkio_wait_pct"] == pytest.approx(25.0)


def test_procs_reset_drops_only_the_affected_rates(tmp_path: Path) -> None:
    root, src, clock = _procs(tmp_path, read_bytes=10**6, rchar=10**7, utime=500)
    src.sample(0.0)
    # same process (same start time), but its io counters and utime went down
    _write_proc(
        root, PID, read_bytes=100, rchar=10**7 + 1024, utime=400, stime=20, write_bytes=2048
    )
    clock.t += 1.0
    rec = _rec(src)
    assert "read_kb_s" not in rec and "cpu_pct" not in rec  # dropped, not 0
    assert rec["rchar_kb_s"] == pytest.approx(1.0)
    assert rec["write_kb_s"] == pytest.approx(2.0)
    assert rec["runq_wait_pct"] == 0.0  # unchanged counter: a real zero
    # the next interval is measured from the reset reading
    _write_proc(
        root,
        PID,
        read_bytes=100 + 1024,
        rchar=10**7 + 1024,
        utime=400 + CLK_TCK,
        stime=20,
        write_bytes=2048,
    )
    clock.t += 1.0
    rec = _rec(src)
    assert rec["read_kb_s"] == pytest.approx(1.0) and rec["cpu_pct"] == pytest.approx(100.0)


def test_procs_pid_reuse_is_a_new_process_not_a_reset(tmp_path: Path) -> None:
    root, src, clock = _procs(tmp_path, utime=10, read_bytes=0, start=5000)
    src.sample(0.0)
    # another process got the pid: its counters are higher, but they are not growth
    _write_proc(root, PID, utime=900, read_bytes=10**9, start=9000)
    clock.t += 1.0
    rec = _rec(src)
    assert "cpu_pct" not in rec and "read_kb_s" not in rec
    by = {n: v for n, e, v in src.counters() if e == str(PID)}
    assert by["procs.cpu_seconds_total"] == pytest.approx((900 + 20) / CLK_TCK)
    # rates resume against the new process's first reading
    _write_proc(root, PID, utime=900 + CLK_TCK // 4, read_bytes=10**9 + 1024, start=9000)
    clock.t += 1.0
    rec = _rec(src)
    assert rec["cpu_pct"] == pytest.approx(25.0) and rec["read_kb_s"] == pytest.approx(1.0)


def test_procs_counters_declared_and_in_base_units(tmp_path: Path) -> None:
    root, src, clock = _procs(
        tmp_path, utime=300, stime=100, read_bytes=8192, write_bytes=512, rchar=70_000
    )
    assert src.counters() == []
    _write_proc(root, PID + 1, ppid=PID, utime=7, stime=3)
    src.sample(0.0)
    got = src.counters()
    _declared_counters(got)
    by = {(n, e): v for n, e, v in got}
    e = str(PID)
    assert by[("procs.cpu_seconds_total", e)] == pytest.approx(400 / CLK_TCK)
    assert by[("procs.read_bytes_total", e)] == 8192.0
    assert by[("procs.write_bytes_total", e)] == 512.0
    assert by[("procs.rchar_bytes_total", e)] == 70_000.0
    assert by[("procs.cpu_seconds_total", str(PID + 1))] == pytest.approx(10 / CLK_TCK)
    declared = {m.name for m in metrics.by_source("procs", counters=True) if m.kind == "counter"}
    assert {n for n, _ in by} == declared
    # a process that exits leaves the counters with the next sample
    _write_proc(root, PID + 1, ppid=PID, utime=7, stime=3, state="Z")
    clock.t += 1.0
    src.sample(0.0)
    assert {ent for _, ent, _ in src.counters()} == {e}


# --- disk ---------------------------------------------------------------------------------------


def test_disk_counters_declared_and_in_base_units(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    shutil.copy(VM_DISKSTATS, proc / "diskstats")
    clock = _Clock()
    src = DiskSource(proc_root=str(proc), sys_root=str(VM_SYS), clock=clock)
    assert src.counters() == []
    src.sample(0.0)
    got = src.counters()
    _declared_counters(got)
    assert {e for _, e, _ in got} == {"loop0", "vda"}  # the devices the rates cover
    vda = next(c for c in parse_diskstats(VM_DISKSTATS.read_text()) if c.name == "vda")
    by = {n: v for n, e, v in got if e == "vda"}
    assert by["disk.reads_completed_total"] == vda.rd_ios
    assert by["disk.reads_merged_total"] == vda.rd_merges
    assert by["disk.read_bytes_total"] == vda.rd_sectors * 512
    assert by["disk.read_time_seconds_total"] == pytest.approx(vda.rd_ticks / 1000)
    assert by["disk.writes_completed_total"] == vda.wr_ios
    assert by["disk.written_bytes_total"] == vda.wr_sectors * 512
    assert by["disk.write_time_seconds_total"] == pytest.approx(vda.wr_ticks / 1000)
    assert by["disk.io_time_seconds_total"] == pytest.approx(vda.io_ticks / 1000)
    assert by["disk.io_time_weighted_seconds_total"] == pytest.approx(vda.time_in_queue / 1000)
    declared = {m.name for m in metrics.by_source("disk", counters=True) if m.kind == "counter"}
    assert set(by) == declared


def test_disk_counters_of_old_partition_lines() -> None:
    c = parse_diskstats("   8    1 sda1 10 20 30 40\n")[0]
    got = disk_counters(c)
    _declared_counters(got)
    assert {n: v for n, _, v in got} == {
        "disk.reads_completed_total": 10.0,
        "disk.read_bytes_total": 20 * 512.0,
        "disk.writes_completed_total": 30.0,
        "disk.written_bytes_total": 40 * 512.0,
    }


def test_disk_reset_drops_the_interval_and_counters_show_the_new_values(tmp_path: Path) -> None:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (sys / "block" / "sda").mkdir(parents=True)
    line = "   8       0 sda {r} 0 {s} 5 0 0 0 0 0 7 9 0 0 0 0 0 0\n"
    (proc / "diskstats").write_text(line.format(r=1000, s=8000))
    clock = _Clock()
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), clock=clock)
    src.sample(0.0)
    (proc / "diskstats").write_text(line.format(r=3, s=24))
    clock.t += 1.0
    assert src.sample(0.0) == {}  # no zero-rate row for the reset interval
    by = {n: v for n, _, v in src.counters()}
    assert by["disk.reads_completed_total"] == 3.0 and by["disk.read_bytes_total"] == 24 * 512.0
