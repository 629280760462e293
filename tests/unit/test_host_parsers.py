"""Host source: pure parsers on recorded /proc files (tests/fixtures/proc-kernel-6), and the
reader on a fake proc root in tmp_path. The reader on this machine's /proc:
integration/test_host.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES

from stallscope.errors import ParseError, SourceUnavailable
from stallscope.sources.host import (
    CpuTimes,
    HostSource,
    cpu_busy,
    parse_meminfo,
    parse_pressure,
    parse_proc_stat,
    parse_vmstat,
)

K6 = FIXTURES / "proc-kernel-6"


def test_parse_proc_stat_recorded() -> None:
    cpus = parse_proc_stat((K6 / "stat").read_text())
    assert cpus[0].name == "cpu"
    assert [c.name for c in cpus[1:]] == ["cpu0", "cpu1"]
    assert cpus[0].total >= cpus[1].total + cpus[2].total - 10  # aggregate ≈ sum of cores


def test_parse_proc_stat_old_kernel_without_steal() -> None:
    cpus = parse_proc_stat("cpu 10 0 5 100\ncpu0 10 0 5 100\nintr 1 2\n")
    assert cpus[0].iowait == 0 and cpus[0].steal == 0 and cpus[0].total == 115


def test_parse_proc_stat_garbage_quotes_line() -> None:
    with pytest.raises(ParseError, match="cpu x y"):
        parse_proc_stat("cpu x y z w\n")
    with pytest.raises(ParseError, match="aggregate"):
        parse_proc_stat("intr 1 2 3\n")


def test_cpu_busy_matches_top_semantics() -> None:
    a = CpuTimes("cpu", 100, 0, 50, 800, 50, 0, 0, 0)
    b = CpuTimes("cpu", 160, 0, 70, 860, 110, 0, 0, 0)  # +60 user +20 sys +60 idle +60 iowait
    busy, iowait, niced = cpu_busy(a, b)
    assert busy == pytest.approx(40.0)
    assert iowait == pytest.approx(30.0)
    assert niced == 0.0
    assert cpu_busy(b, b) == (0.0, 0.0, 0.0)


def test_cpu_busy_gives_the_niced_user_share_of_the_interval() -> None:
    a = CpuTimes("cpu", 100, 40, 50, 800, 50, 0, 0, 0)
    b = CpuTimes("cpu", 130, 90, 70, 900, 50, 0, 0, 0)  # +30 user +50 nice +20 sys +100 idle
    # the niced time is busy time too
    assert cpu_busy(a, b) == (pytest.approx(50.0), 0.0, pytest.approx(25.0))
    # a counter that went down (a reset) gives no figure rather than a made-up one
    assert cpu_busy(b, b._replace(nice=10)) is None


def test_parse_meminfo_and_vmstat_recorded() -> None:
    mem = parse_meminfo((K6 / "meminfo").read_text())
    assert mem["MemTotal"] > 1_000_000 and "MemAvailable" in mem
    vm = parse_vmstat((K6 / "vmstat").read_text())
    assert "pswpin" in vm and "pswpout" in vm
    with pytest.raises(ParseError):
        parse_meminfo("Foo: 12 kB\n")


def test_parse_pressure_recorded() -> None:
    psi = parse_pressure((K6 / "pressure" / "io").read_text())
    assert set(psi) == {"some", "full"}
    assert 0 <= psi["some"] <= 100
    with pytest.raises(ParseError, match="some total=1"):
        parse_pressure("some total=1\n")


def _proc_copy(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    shutil.copytree(K6, root)
    return root


class _Clock:
    """A monotonic clock the test moves by hand (the rates' time base)."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _with_swap(root: Path, total_kb: int) -> None:
    """Give the copied meminfo a swap area of ``total_kb`` (the recorded machine had none)."""
    mem = (root / "meminfo").read_text().splitlines()
    mem = [f"SwapTotal:    {total_kb} kB" if m.startswith("SwapTotal:") else m for m in mem]
    (root / "meminfo").write_text("\n".join(mem) + "\n")


def _swap_in(root: Path, pages: int) -> None:
    vm = (root / "vmstat").read_text().splitlines()
    vm = [f"pswpin {int(v.split()[1]) + pages}" if v.startswith("pswpin ") else v for v in vm]
    (root / "vmstat").write_text("\n".join(vm) + "\n")


def test_reader_rates_from_two_readings(tmp_path: Path) -> None:
    root = _proc_copy(tmp_path)
    _with_swap(root, 1048576)  # pages are swapped in below: the machine has a swap area
    clock = _Clock(100.0)
    src = HostSource(proc_root=str(root), shm_path=str(tmp_path), clock=clock)
    src.open()
    assert src.sample(100.0) is None  # priming
    # advance the counters: 2 s later, 1000 pages swapped in, cpu0 fully busy, cpu1 idle
    stat = parse_proc_stat((root / "stat").read_text())
    lines = []
    for c in stat:
        add_user = 200 if c.name in ("cpu", "cpu0") else 0
        add_idle = 200 if c.name in ("cpu", "cpu1") else 0
        lines.append(
            f"{c.name} {c.user + add_user} {c.nice} {c.system} {c.idle + add_idle} "
            f"{c.iowait} {c.irq} {c.softirq} {c.steal} 0 0"
        )
    (root / "stat").write_text("\n".join(lines) + "\n")
    _swap_in(root, 1000)
    clock.t = 102.0
    out = src.sample(102.0)
    assert out is not None
    assert out["cpu_pct"] == pytest.approx(50.0)
    assert out["cpu_per_core_pct"] == [pytest.approx(100.0), pytest.approx(0.0)]
    assert out["cpu_max_core_pct"] == pytest.approx(100.0)
    page_kb = os.sysconf("SC_PAGE_SIZE") / 1024
    assert out["swap_in_kb_s"] == pytest.approx(1000 * page_kb / 2)
    assert out["mem_total_mib"] > 0 and out["shm_total_mib"] > 0
    assert "psi_io_some_pct" in out and "psi_io_full_pct" in out


def test_without_a_swap_area_vmstat_is_not_read_and_swapoff_is_counted(tmp_path: Path) -> None:
    """No swap area (meminfo's SwapTotal 0): nothing can be swapped, /proc/vmstat is not read
    (its counters stand). The sample where the area went (swapoff swaps everything in) still
    reads it, so that last swap-in is counted."""
    root = _proc_copy(tmp_path)
    _with_swap(root, 1048576)
    clock = _Clock(100.0)
    src = HostSource(proc_root=str(root), shm_path=str(tmp_path), clock=clock)
    src.open()
    assert src.sample(100.0) is None
    page_kb = os.sysconf("SC_PAGE_SIZE") / 1024
    _with_swap(root, 0)  # swapoff: 500 pages swapped back in on the way
    _swap_in(root, 500)
    clock.t = 101.0
    out = src.sample(101.0)
    assert out is not None and out["swap_in_kb_s"] == pytest.approx(500 * page_kb)
    # no swap area at this read nor the last: vmstat is not read at all
    (root / "vmstat").write_text("this file must not be read\n")
    before = {c[0]: c[2] for c in src.counters() if c[0].startswith("host.swap")}
    clock.t = 102.0
    out = src.sample(102.0)
    assert out is not None
    assert out["swap_in_kb_s"] == 0.0 and out["swap_out_kb_s"] == 0.0
    assert {c[0]: c[2] for c in src.counters() if c[0].startswith("host.swap")} == before
    assert before  # the swap counters are still exported, standing


def test_missing_proc_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="cannot read"):
        HostSource(proc_root=str(tmp_path)).open()


def test_no_psi_is_said_once(tmp_path: Path) -> None:
    root = _proc_copy(tmp_path)
    shutil.rmtree(root / "pressure")
    src = HostSource(proc_root=str(root), shm_path=str(tmp_path / "nope"))
    src.open()
    notes = [m for k, m in src.drain_events() if k == "note"]
    assert any("PSI" in n for n in notes)
    assert any("not mounted" in n for n in notes)
    assert src.drain_events() == []  # handed over once
    src.sample(1.0)
    out = src.sample(2.0)
    assert out is not None and "psi_io_some_pct" not in out and "shm_used_mib" not in out
