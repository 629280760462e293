"""`stallscope disk` end to end, as a child process: saved smartctl files, the real smartctl on
this machine's disk, the bench with both engines, bad input, and Ctrl-C/SIGTERM cleanup."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, stallscope_argv, tool_missing

BENCH = ["--size", "8M", "--seconds", "0.2", "--files", "30"]


def _run(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STALLSCOPE_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run(
        stallscope_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )


def _fx(name: str) -> str:
    return str(FIXTURES / f"smartctl-{name}.json")


def check_one_line_error(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode == 2, p
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stallscope: error:"), p.stderr


def test_saved_files_growth_json(tmp_path: Path) -> None:
    p = _run(
        [
            "disk",
            "--smartctl-json",
            _fx("ST3500418AS_11"),
            _fx("ST3500418AS_12"),
            _fx("nvme-null-SAMSUNG_MZWLL3T2HAJQ-00005-nvme0"),
            "--json",
        ],
        tmp_path,
    )
    assert p.returncode == 1, p.stderr  # a failing drive: `stallscope disk || alert` works
    doc = json.loads(p.stdout)
    assert set(doc) == {"drives"}  # no bench without --bench
    st3500, nvme = doc["drives"]
    assert st3500["verdict"] == "failing" and st3500["protocol"] == "ATA"
    assert st3500["growth"]["Reallocated_Sector_Ct"]["from"] == 1
    assert st3500["growth"]["Reallocated_Sector_Ct"]["to"] == 304
    assert nvme["verdict"] == "failing" and nvme["attributes"]["critical_warning"] == 16
    assert not (tmp_path / "state").exists()  # saved files never touch the state file


def test_saved_files_human(tmp_path: Path) -> None:
    p = _run(["disk", "--smartctl-json", _fx("ST3500418AS_11"), _fx("ST3500418AS_12")], tmp_path)
    assert p.returncode == 1, p.stderr
    assert "failing" in p.stdout and "1 → 304" in p.stdout
    healthy = _run(["disk", "--smartctl-json", _fx("ST3500418AS_11")], tmp_path)
    assert healthy.returncode == 0, healthy.stdout


def test_saved_garbage_is_unrecognised(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": "world"}')
    p = _run(["disk", "--smartctl-json", str(bad), "--json"], tmp_path)
    assert p.returncode == 3, p.stderr  # not a smartctl document: scripts can tell
    [d] = json.loads(p.stdout)["drives"]
    assert d["verdict"] == "unknown" and "unrecognised" in d["reasons"][0]


@pytest.mark.parametrize(
    "args",
    [
        ["disk", "--smartctl-json", "/nonexistent/x.json"],
        ["disk", "/nonexistent/path"],
        ["disk", "--smartctl-json", "x.json", "--bench"],
        ["disk", ".", "--bench", "--size", "lots"],
        ["disk", ".", "--bench", "--seconds", "0"],
        ["disk", "--device-type", "sat;id"],
    ],
)
def test_bad_input_one_line(tmp_path: Path, args: list[str]) -> None:
    check_one_line_error(_run(args, tmp_path))


def _vda_or_skip() -> None:
    if shutil.which("smartctl") is None:
        tool_missing("smartctl")
    if not os.path.exists("/dev/vda"):
        pytest.skip("this machine has no /dev/vda (the virtio disk this test is about)")


def test_real_disk_cannot_open(tmp_path: Path) -> None:
    _vda_or_skip()
    p = _run(["disk", "/dev/vda", "--json"], tmp_path)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    [d] = json.loads(p.stdout)["drives"]
    assert d["device"] == "/dev/vda" and d["verdict"] == "unknown"
    assert "cannot open /dev/vda" in d["reasons"][0]
    fixes = " ".join(d["fixes"])
    assert "/dev:/dev" in fixes
    # a grant (sudoers, capabilities) only for a user who lacks root's rights
    assert ("sudoers" in fixes and "CAP_SYS_RAWIO" in fixes) == (os.geteuid() != 0), fixes
    human = _run(["disk", "vda"], tmp_path)
    assert human.returncode == 0 and "cannot open /dev/vda" in human.stdout.replace("\n", " ")


def test_bench_refuses_a_raw_device(tmp_path: Path) -> None:
    _vda_or_skip()
    p = _run(["disk", "/dev/vda", "--bench"], tmp_path)
    check_one_line_error(p)
    assert "raw device" in p.stderr


def test_bench_builtin_json(tmp_path: Path) -> None:
    target = tmp_path / "data"
    target.mkdir()
    p = _run(["disk", str(target), "--bench", "--json", *BENCH], tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    b = doc["bench"]
    assert b["path"] == str(target) and b["fstype"]
    assert "fio" not in b and "compare" not in b
    r = b["builtin"]
    for k in ("seq_cached_mb_s", "seq_cold_mb_s", "rand_iops", "small_files_per_s"):
        assert r[k] > 0, k
    assert {"p50", "p99"} <= set(r["rand_lat_us"])
    if b["class"] != "unknown":
        assert b["healthy"]["label"]
    assert os.listdir(target) == []


@pytest.mark.exclusive
@pytest.mark.fio
def test_bench_fio_side_by_side(tmp_path: Path) -> None:
    if shutil.which("fio") is None:
        tool_missing("fio")
    p = _run(["disk", str(tmp_path), "--bench", "--engine", "fio", "--json", *BENCH], tmp_path)
    assert p.returncode == 0, p.stderr
    b = json.loads(p.stdout)["bench"]
    assert b["fio"]["engine"] == "fio" and b["builtin"]["engine"] == "builtin"
    assert set(b["compare"]["rand_iops"]) == {"builtin", "fio", "diff_pct"}
    human = _run(["disk", str(tmp_path), "--bench", "--engine", "fio", *BENCH], tmp_path)
    assert human.returncode == 0, human.stderr
    assert "builtin" in human.stdout and "fio" in human.stdout and "diff" in human.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_bench_interrupted_cleans_up(tmp_path: Path, sig: int) -> None:
    target = tmp_path / "data"
    target.mkdir()
    env = {**os.environ, "STALLSCOPE_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        stallscope_argv(
            "disk", str(target), "--bench", "--size", "64M", "--seconds", "20", "--files", "30"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 30
    while not any(n.startswith(".stallscope-bench-") for n in os.listdir(target)):
        assert time.monotonic() < deadline and proc.poll() is None, "bench did not start"
        time.sleep(0.05)
    time.sleep(1.0)  # well inside a 20 s phase
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "interrupted" in err
    assert os.listdir(target) == []


@pytest.mark.parametrize(
    "name, said",
    [
        ("smartctl-7.3-virtio-vda-sat-eperm.json", "cannot open /dev/vda for SMART (even as root"),
        (
            "smartctl-7.3-virtio-vda-unable-to-detect.json",
            "smartctl could not tell what kind of device /dev/vda is",
        ),
    ],
)
def test_a_saved_unreadable_device_is_explained_as_the_live_path_does(
    tmp_path: Path, name: str, said: str
) -> None:
    """Issue 40: real `smartctl --json -a /dev/vda` outputs exited 3 ("smartctl could not read
    the device"); the device's state is explained, with its fix, and the check exits 0."""
    p = _run(["disk", "--smartctl-json", str(FIXTURES / name), "--json"], tmp_path)
    assert p.returncode == 0, p.stderr
    [d] = json.loads(p.stdout)["drives"]
    assert d["verdict"] == "unknown" and d["reasons"][0].startswith(said), d
    assert d["fixes"], d
