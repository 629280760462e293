"""The session: one setup for every monitored run, and runs that stand on their own.

A run directory records the facts its diagnosis needs (cores, RAM, the dataset's size, each
disk's sysfs facts, SMART of the dataset's drive), so diagnosing it later, elsewhere, with its
dataset gone, gives the same answer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import META_KEYS, ROOT, stallscope_argv

from stallscope.store import RunStore, read_meta

pytest.importorskip("torch")

TRAIN = str(ROOT / "examples" / "train_cpu.py")



def _diagnose(run_dir: Path, cwd: Path) -> dict[str, Any]:
    r = subprocess.run(stallscope_argv("diagnose", str(run_dir), "--json"), cwd=cwd,
                       capture_output=True, text=True, timeout=120, check=True)
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


@pytest.mark.slow
def test_a_copied_run_with_its_dataset_gone_diagnoses_the_same(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = tmp_path / "runs"
    subprocess.run([sys.executable, TRAIN, "--data-dir", str(data), "--files", "400",
                    "--epochs", "0", "--no-probe"], check=True, capture_output=True, timeout=120)
    r = subprocess.run(stallscope_argv("run", "--interval", "0.5", "--quiet", "--out", str(out),
                                       "--data", str(data), "--", sys.executable, TRAIN,
                                       "--data-dir", str(data), "--files", "400", "--workers",
                                       "1", "--prep-cost", "20", "--max-seconds", "6"),
                       cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    [run_dir] = list(out.iterdir())
    meta = read_meta(run_dir)
    # the facts were recorded at run time
    assert meta["dataset_bytes"] == sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    assert meta["mem_total_mib"] > 0 and meta["logical_cores"] >= 1
    assert meta["disk_health"] and meta["data_devices"]
    st = RunStore(run_dir / "run.db", readonly=True)
    disks = {e["entity"]: e["attrs"] for e in st.entities("disk")}
    st.close()
    assert any(a.get("kind") for a in disks.values()), disks  # sysfs facts kept with the disks

    before = _diagnose(run_dir, tmp_path)
    elsewhere = tmp_path / "elsewhere" / "copied-run"
    shutil.copytree(run_dir, elsewhere)
    shutil.rmtree(data)
    shutil.rmtree(out)
    after = _diagnose(elsewhere, tmp_path / "elsewhere")
    # "run" names the directory diagnosed, which is where it was copied to; all else is equal
    assert before.pop("run") == str(run_dir) and after.pop("run") == str(elsewhere)
    assert after == before


def test_run_meta_keys_are_the_contract(tmp_path: Path) -> None:
    r = subprocess.run(stallscope_argv("run", "--interval", "0.3", "--quiet", "--", "sleep", "1"),
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    [run_dir] = list((tmp_path / "stallscope-runs").iterdir())
    meta = read_meta(run_dir)
    assert META_KEYS <= set(meta), META_KEYS - set(meta)
    assert meta["exit_code"] == 0 and meta["command"] == ["sleep", "1"]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Any:
    """A 2 MiB tmpfs that a test can fill up (root only)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_run_directory_loses_the_record_not_the_exit_code(
        tmp_path: Path, small_tmpfs: Path) -> None:
    """The trainer fills the filesystem holding the run directory, then exits 7: stallscope
    exits 7 too and says exactly what it could not record."""
    filler = small_tmpfs / "filler"
    script = ("import sys, time\n"
              f"f = open({str(filler)!r}, 'wb')\n"
              "try:\n"
              "    while True: f.write(b'x' * 65536); f.flush()\n"
              "except OSError: pass\n"
              "time.sleep(1.5)\n"
              "sys.exit(7)\n")
    r = subprocess.run(stallscope_argv("run", "--interval", "0.2", "--out", str(small_tmpfs),
                                       "--", sys.executable, "-c", script),
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 7, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if "not recorded" in line]
    assert len(said) == 1, r.stderr
    assert "meta.json" in said[0] and "exit code 7" in said[0]
    [run_dir] = [d for d in small_tmpfs.iterdir() if d.is_dir()]
    assert not (run_dir / "meta.json.tmp").exists()  # no half-written file holds space
    assert read_meta(run_dir)["start"]  # what was recorded is still readable
