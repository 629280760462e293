"""Host source: pure parsers on recorded /proc files, and the reader on a fake proc root."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT

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
    busy, iowait = cpu_busy(a, b)
    assert busy == pytest.approx(40.0)
    assert iowait == pytest.approx(30.0)
    assert cpu_busy(b, b) == (0.0, 0.0)


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


def test_reader_rates_from_two_readings(tmp_path: Path) -> None:
    root = _proc_copy(tmp_path)
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
        lines.append(f"{c.name} {c.user + add_user} {c.nice} {c.system} {c.idle + add_idle} "
                     f"{c.iowait} {c.irq} {c.softirq} {c.steal} 0 0")
    (root / "stat").write_text("\n".join(lines) + "\n")
    vm = (root / "vmstat").read_text().splitlines()
    vm = [f"pswpin {int(v.split()[1]) + 1000}" if v.startswith("pswpin ") else v for v in vm]
    (root / "vmstat").write_text("\n".join(vm) + "\n")
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


def test_live_host_sample_has_contract_keys() -> None:
    src = HostSource()
    src.open()
    src.sample(0.0)
    out = src.sample(1.0)
    assert out is not None
    for key in ("cpu_pct", "iowait_pct", "cpu_per_core_pct", "load1", "mem_used_mib",
                "mem_total_mib", "swap_in_kb_s", "swap_out_kb_s", "shm_used_mib",
                "shm_total_mib"):
        assert key in out, key
    assert len(out["cpu_per_core_pct"]) == os.cpu_count()


# --- the read limit of this process's cgroup (the tuner's storage bound) --------------------------

def test_parse_read_caps_v1_and_v2() -> None:
    from stallscope.sources.cgroup import parse_read_caps

    assert parse_read_caps("8:0 4000000\n254:0 10485760\n") == {"8:0": 4000000,
                                                               "254:0": 10485760}
    v2 = "8:0 rbps=2097152 wbps=max riops=max wiops=max\n8:16 wbps=1000 riops=50\n"
    assert parse_read_caps(v2) == {"8:0": 2097152}  # 8:16 limits writes and IOPS only
    assert parse_read_caps("garbage\n\n8:0\n8:0 max\n8:0 rbps=max\nx 5\n8:1 -3\n"
                           "8:2 \u00b2\n8:3 rbps=\u0661\n") == {}


def test_read_caps_takes_the_smallest_limit_up_the_cgroup_tree(tmp_path: Path) -> None:
    from stallscope.sources.cgroup import read_caps

    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text("7:blkio:/kubepods/pod1\n4:memory:/x\n0::/slice/job\n")
    (cg / "blkio" / "kubepods" / "pod1").mkdir(parents=True)
    (cg / "blkio" / "kubepods" / "blkio.throttle.read_bps_device").write_text("8:0 3000000\n")
    (cg / "blkio" / "kubepods" / "pod1" / "blkio.throttle.read_bps_device").write_text(
        "8:0 5000000\n8:16 7000000\n")
    (cg / "slice" / "job").mkdir(parents=True)
    (cg / "slice" / "job" / "io.max").write_text("259:0 rbps=9000000 wbps=max\n")
    assert read_caps(42, proc_root=str(proc), cg_root=str(cg)) == {
        "8:0": 3000000, "8:16": 7000000, "259:0": 9000000}
    assert read_caps(43, proc_root=str(proc), cg_root=str(cg)) == {}  # no such process
    (proc / "42" / "cgroup").write_text("7:blkio:/../../etc\n")  # never above the root
    assert read_caps(42, proc_root=str(proc), cg_root=str(cg)) == {}


def test_cgroup_cpu_quota_is_read_under_the_given_root(tmp_path: Path) -> None:
    """The quota reader hard-coded /sys/fs/cgroup; like every other reader it takes its root."""
    from stallscope.sources.cgroup import cgroup_cpus, usable_cores

    v2 = tmp_path / "v2"
    v2.mkdir()
    assert cgroup_cpus(str(v2)) is None  # nothing there
    (v2 / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpus(str(v2)) == 2
    assert usable_cores(str(v2)) <= 2
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(str(v2)) is None
    (v2 / "cpu.max").write_text("garbage\n")
    assert cgroup_cpus(str(v2)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(str(v1)) == 3
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpus(str(v1)) is None
    assert usable_cores(str(tmp_path / "none")) >= 1


def test_read_caps_sees_a_real_blkio_throttle(tmp_path: Path, throttled_group: str) -> None:
    """examples/constrain.py caps reads of tmp_path's disk in a real cgroup; a process in it
    reads that limit back."""
    import json
    import subprocess
    import sys

    root = ROOT
    code = "import json; from stallscope.sources.cgroup import read_caps; " \
        "print(json.dumps(read_caps()))"
    out = subprocess.run([sys.executable, str(root / "examples" / "constrain.py"),
                          "--read-bps", "3000000", "--data", str(tmp_path), "--cgroup",
                          throttled_group, "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60)
    if "is not on a block device" in out.stderr:
        pytest.skip("the temp folder is not on a block device")
    assert out.returncode == 0, out.stderr
    caps = json.loads(out.stdout)
    assert list(caps.values()) == [3000000], caps


def test_a_run_in_a_throttled_cgroup_records_its_read_limit(tmp_path: Path,
                                                           throttled_group: str) -> None:
    """`stallscope run` around a trainer that joins a read-limited cgroup after it started (as
    a container runtime's wrapper does): meta.json names the device and the limit."""
    import json
    import subprocess
    import sys

    from conftest import stallscope_argv

    root = ROOT
    out = tmp_path / "runs"
    r = subprocess.run(stallscope_argv("run", "--quiet", "--interval", "0.5", "--out", str(out),
                                       "--", sys.executable, str(root / "examples" /
                                                                 "constrain.py"),
                                       "--read-bps", "3000000", "--data", str(tmp_path),
                                       "--cgroup", throttled_group, "--", sys.executable, "-c",
                                       "import time; time.sleep(2.5)"),
                       capture_output=True, text=True, timeout=120)
    if "is not on a block device" in r.stderr:
        pytest.skip("the temp folder is not on a block device")
    assert r.returncode == 0, r.stderr
    [run] = list(out.iterdir())
    limits = json.loads((run / "meta.json").read_text())["read_limits"]
    assert list(limits.values()) == [3000000] and all(not k[0].isdigit() for k in limits), limits
