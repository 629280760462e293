"""Host source on this machine: the reader on the real /proc, and the read limit of a real
throttled cgroup. The parsers and the reader on recorded files: unit/test_host_parsers.py; the
cgroup readers on fake trees: unit/test_cgroup.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from stallscope.sources.host import HostSource


def test_live_host_sample_has_contract_keys() -> None:
    src = HostSource()
    src.open()
    src.sample(0.0)
    out = src.sample(1.0)
    assert out is not None
    for key in (
        "cpu_pct",
        "iowait_pct",
        "cpu_per_core_pct",
        "load1",
        "mem_used_mib",
        "mem_total_mib",
        "swap_in_kb_s",
        "swap_out_kb_s",
        "shm_used_mib",
        "shm_total_mib",
    ):
        assert key in out, key
    assert len(out["cpu_per_core_pct"]) == os.cpu_count()
    assert 0.0 <= out["cpu_nice_pct"] <= out["cpu_pct"]


def test_a_niced_busy_loop_shows_as_niced_cpu() -> None:
    """A real `nice -n 19` busy loop: the kernel counts its user time in /proc/stat's nice
    column, so the host's cpu_nice_pct holds at least what the loop ran by the kernel's own
    count of it (a busy machine gives a nice-19 loop little: CI's parallel pass, 0.06 of a
    core)."""
    import psutil

    loop = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
    try:
        src = HostSource()
        src.open()
        time.sleep(0.5)  # past the interpreter's start-up
        proc = psutil.Process(loop.pid)
        t0, ran0 = time.monotonic(), proc.cpu_times().user
        src.sample(0.0)
        # 2 s, or until the loop has run 0.1 CPU-s (a busy host gives it little), at most 60 s
        time.sleep(2.0)
        while proc.cpu_times().user - ran0 < 0.1 and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        out = src.sample(time.monotonic() - t0)
        t1, ran1 = time.monotonic(), proc.cpu_times().user
        assert out is not None
        assert out["cpu_nice_pct"] <= out["cpu_pct"], out
        niced_s = out["cpu_nice_pct"] / 100.0 * (os.cpu_count() or 1) * (t1 - t0)
        ran = ran1 - ran0
        assert ran >= 0.1, f"the loop ran {ran:.2f} CPU-s in {t1 - t0:.0f} s"
        # the two readings of each count sit a few ms apart: 20% and two clock ticks of slack
        assert niced_s >= 0.8 * ran - 0.02, (niced_s, ran, out)
    finally:
        loop.kill()
        loop.wait()


# --- the read limit of this process's cgroup (the tuner's storage bound) --------------------------


def test_read_caps_sees_a_real_blkio_throttle(tmp_path: Path, throttled_group: str) -> None:
    """examples/constrain.py caps reads of tmp_path's disk in a real cgroup; a process in it
    reads that limit back."""
    import json
    import subprocess
    import sys

    root = ROOT
    code = (
        "import json; from stallscope.sources.cgroup import read_caps; "
        "print(json.dumps(read_caps()))"
    )
    out = subprocess.run(
        [
            sys.executable,
            str(root / "examples" / "constrain.py"),
            "--read-bps",
            "3000000",
            "--data",
            str(tmp_path),
            "--cgroup",
            throttled_group,
            "--",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "is not on a block device" in out.stderr:
        pytest.skip("the temp folder is not on a block device")
    assert out.returncode == 0, out.stderr
    caps = json.loads(out.stdout)
    assert list(caps.values()) == [3000000], caps


def test_a_run_in_a_throttled_cgroup_records_its_read_limit(
    tmp_path: Path, throttled_group: str
) -> None:
    """`stallscope run` around a trainer that joins a read-limited cgroup after it started (as
    a container runtime's wrapper does): meta.json names the device and the limit."""
    import json
    import subprocess
    import sys

    from conftest import stallscope_argv

    root = ROOT
    out = tmp_path / "runs"
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--quiet",
            "--interval",
            "0.5",
            "--out",
            str(out),
            "--",
            sys.executable,
            str(root / "examples" / "constrain.py"),
            "--read-bps",
            "3000000",
            "--data",
            str(tmp_path),
            "--cgroup",
            throttled_group,
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(2.5)",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "is not on a block device" in r.stderr:
        pytest.skip("the temp folder is not on a block device")
    assert r.returncode == 0, r.stderr
    [run] = list(out.iterdir())
    limits = json.loads((run / "meta.json").read_text())["read_limits"]
    assert list(limits.values()) == [3000000] and all(not k[0].isdigit() for k in limits), limits
