"""The session: one setup for every monitored run, and runs that stand on their own.

A run directory records the facts its diagnosis needs (cores, RAM, the dataset's size, each
disk's sysfs facts, SMART of the dataset's drive), so diagnosing it later, elsewhere, with its
dataset gone, gives the same answer."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import META_KEYS, ROOT, make_demo_files, stallscope_argv

from stallscope.store import RunStore, read_meta

pytest.importorskip("torch")

TRAIN = str(ROOT / "examples" / "train_cpu.py")


def _diagnose(run_dir: Path, cwd: Path) -> dict[str, Any]:
    r = subprocess.run(
        stallscope_argv("diagnose", str(run_dir), "--json"),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


@pytest.mark.slow
def test_a_copied_run_with_its_dataset_gone_diagnoses_the_same(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = tmp_path / "runs"
    # the trainer's own 400 files (its make_files, in this process: a trainer started with
    # --epochs 0 for them cost ~5 s of CPU, torch's import and an optimizer's)
    make_demo_files(data, 400)
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--interval",
            "0.5",
            "--quiet",
            "--out",
            str(out),
            "--data",
            str(data),
            "--",
            sys.executable,
            TRAIN,
            "--data-dir",
            str(data),
            "--files",
            "400",
            "--workers",
            "1",
            "--prep-cost",
            "20",
            "--max-seconds",
            "6",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
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
    r = subprocess.run(
        stallscope_argv("run", "--interval", "0.3", "--quiet", "--", "sleep", "1"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
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
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_run_directory_loses_the_record_not_the_exit_code(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    """The trainer fills the filesystem holding the run directory, then exits 7: stallscope
    exits 7 too and says exactly what it could not record."""
    filler = small_tmpfs / "filler"
    script = (
        "import sys, time\n"
        f"f = open({str(filler)!r}, 'wb')\n"
        "try:\n"
        "    while True: f.write(b'x' * 65536); f.flush()\n"
        "except OSError: pass\n"
        "time.sleep(1.5)\n"
        "sys.exit(7)\n"
    )
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--interval",
            "0.2",
            "--out",
            str(small_tmpfs),
            "--",
            sys.executable,
            "-c",
            script,
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 7, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if "not recorded" in line]
    assert len(said) == 1, r.stderr
    assert "meta.json" in said[0] and "exit code 7" in said[0]
    [run_dir] = [d for d in small_tmpfs.iterdir() if d.is_dir()]
    assert not (run_dir / "meta.json.tmp").exists()  # no half-written file holds space
    assert read_meta(run_dir)["start"]  # what was recorded is still readable


def test_runs_are_found_from_any_folder(tmp_path: Path) -> None:
    """A run started in one folder is listed, shown and diagnosed from another (the per-user
    index), while --out still names where new runs go."""
    work, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    r = subprocess.run(
        stallscope_argv("run", "--interval", "0.3", "--quiet", "--", "sleep", "1"),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    [run_dir] = list((work / "stallscope-runs").iterdir())
    rows = json.loads(
        subprocess.run(
            stallscope_argv("runs", "--json"),
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert [Path(x["path"]).resolve() for x in rows] == [run_dir.resolve()]
    for ref in ("latest", run_dir.name, run_dir.name[:12]):
        s = subprocess.run(
            stallscope_argv("show", ref, "--json"),
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert s.returncode == 0, (ref, s.stderr)
        assert Path(json.loads(s.stdout)["run"]).resolve() == run_dir.resolve()
    # $STALLSCOPE_OUT says where new runs go
    import os

    env = dict(os.environ, STALLSCOPE_OUT=str(tmp_path / "central"))
    r = subprocess.run(
        stallscope_argv("run", "--interval", "0.3", "--quiet", "--", "true"),
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0 and len(list((tmp_path / "central").iterdir())) == 1
    assert not (elsewhere / "stallscope-runs").exists()


def test_attach_to_a_running_tree_and_detach_without_signalling_it(tmp_path: Path) -> None:
    """run --pid: the tree (a worker forked after the attach included) is recorded; Ctrl-C
    ends the monitoring, never the trainer."""
    import os
    import signal
    import time

    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\ntime.sleep(1.5)\n"
            "if os.fork() == 0:\n    time.sleep(60); os._exit(0)\n"
            "time.sleep(60)\n",
        ]
    )
    try:
        mon = subprocess.Popen(
            stallscope_argv(
                "run",
                "--pid",
                str(trainer.pid),
                "--interval",
                "0.3",
                "--out",
                str(tmp_path / "runs"),
            ),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(4.0)
        mon.send_signal(signal.SIGINT)
        _out, err = mon.communicate(timeout=60)
        assert mon.returncode == 0, err[-2000:]
        assert trainer.poll() is None  # still running: Ctrl-C reached only stallscope
        [run_dir] = list((tmp_path / "runs").iterdir())
        meta = read_meta(run_dir)
        assert meta["attached"] is True and meta["ended"] == "detached"
        assert meta["pid"] == trainer.pid and meta["exit_code"] is None
        st = RunStore(run_dir / "run.db", readonly=True)
        pids = {e["entity"] for e in st.entities("procs")}
        st.close()
        assert str(trainer.pid) in pids and len(pids) == 2  # the worker forked after attach
        assert "verdict:" in err
    finally:
        trainer.kill()
        trainer.wait()
        os.system(f"pkill -KILL -P {trainer.pid} 2>/dev/null")


def test_attach_follows_the_process_to_its_end_and_bad_pids_are_one_line(tmp_path: Path) -> None:
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--pid",
            str(trainer.pid),
            "--interval",
            "0.3",
            "--quiet",
            "--out",
            str(tmp_path / "runs"),
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    trainer.wait()
    assert r.returncode == 0, r.stderr
    [run_dir] = list((tmp_path / "runs").iterdir())
    assert read_meta(run_dir)["ended"] == "exited"
    bad = subprocess.run(
        stallscope_argv("run", "--pid", "999999999"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr


def test_a_bug_while_finishing_the_record_loses_it_not_the_exit_code(tmp_path: Path) -> None:
    """Whatever breaks while the run's record is closed (here a bug planted in the roles pass;
    a NameError there once crashed `run` with a traceback), the trainer's exit code passes
    through and the user reads one line."""
    code = (
        "import sys\n"
        "import stallscope.collect.session as s\n"
        "s.Session._record_roles = lambda self: 1 / 0\n"
        "from stallscope.cli import main\n"
        f"sys.exit(main(['run', '--quiet', '--out', {str(tmp_path)!r}, '--', sys.executable,"
        " '-c', 'import sys; sys.exit(7)']))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert r.returncode == 7, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "the run's record could not be finished: ZeroDivisionError" in r.stderr


def test_runs_are_named_after_the_script_not_the_interpreter() -> None:
    """Issue 40: every run was named `<time>-python`; the probe's own runs already take the
    script's name."""
    from stallscope.cli.run import run_label

    cases = {
        ("/usr/bin/python3", "-u", "train_cpu.py", "--epochs", "3"): "train_cpu",
        ("torchrun", "--standalone", "--nproc-per-node", "2", "train.py"): "train",
        ("torchrun", "--nproc-per-node=2", "ddp.py"): "ddp",
        ("accelerate", "launch", "--num_processes", "2", "fit.py"): "fit",
        ("uv", "run", "python", "train.py"): "train",
        ("python", "-m", "pkg.train_lm"): "train_lm",
        ("python3", "-c", "print(1)"): "python3",
        ("./train.sh", "--fast"): "train.sh",
        ("sleep", "5"): "sleep",
    }
    for cmd, name in cases.items():
        assert run_label(list(cmd)) == name, cmd


def test_a_run_directory_takes_the_scripts_name(tmp_path: Path) -> None:
    script = tmp_path / "train_cpu.py"
    script.write_text("print('data wait: 0.0% of 0.1 s')\n")
    out = tmp_path / "runs"
    r = subprocess.run(
        [*stallscope_argv("run", "--quiet", "--out", str(out)), "--", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-1500:]
    [run_dir] = list(out.iterdir())
    assert run_dir.name.endswith("-train_cpu"), run_dir.name


def test_attach_to_a_shell_wrapper_samples_the_python_trainer_under_it(tmp_path: Path) -> None:
    """Issue 40: `run --pid` of a shell wrapper pointed py-spy at the shell ("is it a CPython
    process?") although the Python trainer was in the tree: the trainer's stacks are sampled."""
    import signal
    import time

    train = ROOT / "tests" / "trainings" / "torch_launch_bound.py"
    wrapper = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} {train} --seconds 60; echo done"], stdout=subprocess.DEVNULL
    )
    try:
        time.sleep(1.0)  # the wrapper has started its trainer
        mon = subprocess.Popen(
            stallscope_argv(
                "run",
                "--pid",
                str(wrapper.pid),
                "--interval",
                "0.5",
                "--out",
                str(tmp_path / "runs"),
            ),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # until the sampler wrote its first record (torch's import and py-spy's first round
        # take longer on a busy machine), at most 40 s
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if any(f.stat().st_size for f in (tmp_path / "runs").glob("*/stacks/*.jsonl")):
                break
        mon.send_signal(signal.SIGINT)
        _out, err = mon.communicate(timeout=60)
        assert mon.returncode == 0, err[-2000:]
        flat = " ".join(err.split())
        assert (
            f"pid {wrapper.pid} (sh) is not Python: sampling the stacks of the Python "
            "trainer it runs" in flat
        ), flat[-1500:]
        [run_dir] = list((tmp_path / "runs").iterdir())
        files = sorted(p.name for p in (run_dir / "stacks").glob("*.jsonl"))
        assert files and f"{wrapper.pid}.jsonl" not in files, files
        records = [
            json.loads(line)
            for f in (run_dir / "stacks").glob("*.jsonl")
            for line in f.read_text().splitlines()
            if line.strip()
        ]
        assert any("torch_launch_bound.py" in "".join(r.get("stacks", {})) for r in records), (
            records[:2]
        )
    finally:
        wrapper.kill()
        subprocess.run(["pkill", "-KILL", "-f", "torch_launch_bound.py --seconds 60"], check=False)
        wrapper.wait()


def test_runs_shows_each_runs_verdict_and_lists_one_folder_alone(tmp_path: Path) -> None:
    """Issue 40: `runs` had no verdict column and no way to list only this folder's runs."""
    out = tmp_path / "runs"
    r = subprocess.run(
        [
            *stallscope_argv("run", "--interval", "0.3", "--out", str(out)),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(1.5)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-1500:]
    [run_dir] = list(out.iterdir())
    verdict = read_meta(run_dir)["verdict"]
    assert verdict in r.stderr  # what the end of the run printed
    elsewhere = tmp_path / "other"
    subprocess.run(
        [
            *stallscope_argv("run", "--quiet", "--interval", "0.3", "--out", str(elsewhere)),
            "--",
            "sleep",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    listed = subprocess.run(
        stallscope_argv("runs", "--out", str(out), "--here", "--json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = json.loads(listed.stdout)
    assert [row["run"] for row in rows] == [run_dir.name]
    assert rows[0]["verdict"] == verdict
    table = subprocess.run(
        stallscope_argv("runs", "--out", str(out), "--here"),
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "COLUMNS": "160"},
    )
    assert "verdict" in table.stdout and verdict[:15] in table.stdout, table.stdout


def _cpu_at(seen: list[tuple[float, float]], at: float) -> float:
    """CPU seconds at wall time ``at``, between the two readings around it (linear)."""
    for (t0, c0), (t1, c1) in itertools.pairwise(seen):
        if t0 <= at <= t1:
            return c0 + (c1 - c0) * (at - t0) / (t1 - t0) if t1 > t0 else c0
    raise AssertionError(f"no reading around {at}")


def test_a_run_records_the_busiest_processes_beside_it(tmp_path: Path) -> None:
    """meta.json busy_others: a CPU hog outside the training's tree is named, with its share of
    a core; the training's own processes are not."""
    import threading
    import time

    import psutil

    from stallscope.sources.others import MIN_CORES

    # a name of its own (prctl PR_SET_NAME): processes of one name are listed together, and on
    # a shared machine other python processes may be busier than the hog
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ctypes\n"
            "ctypes.CDLL(None).prctl(15, b'stallscope-hog', 0, 0, 0)\n"
            "while True: pass",
        ]
    )
    # the hog's CPU seconds as the host gave them, every 50 ms (wall time, CPU seconds): on a
    # busy 2-core machine it gets a quarter of a core, on an idle one nearly a whole one
    seen: list[tuple[float, float]] = []
    done = threading.Event()

    def watch() -> None:
        proc = psutil.Process(hog.pid)
        while not done.is_set():
            t = proc.cpu_times()
            seen.append((time.time(), t.user + t.system))
            done.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out = tmp_path / "runs"
        r = subprocess.run(
            [
                *stallscope_argv("run", "--quiet", "--interval", "0.5", "--out", str(out)),
                "--",
                sys.executable,
                "-c",
                "import time\nt = time.time()\nwhile time.time() - t < 2: pass",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr[-1500:]
    finally:
        done.set()
        watcher.join(5)
        hog.kill()
        hog.wait()
    [run_dir] = list(out.iterdir())
    meta = read_meta(run_dir)
    busy = meta["busy_others"]
    # the hog is named with its share of a core over the run (start to end): the CPU seconds
    # it got then, within 0.1 of a core (other work on the machine may be busier)
    assert seen[0][0] < meta["start"] and seen[-1][0] > meta["end"], (seen[0], seen[-1], meta)
    got = (_cpu_at(seen, meta["end"]) - _cpu_at(seen, meta["start"])) / (
        meta["end"] - meta["start"]
    )
    hogs = [b for b in busy if b["pid"] == hog.pid]
    assert hogs and hogs[0]["name"] == "stallscope-hog", (got, busy)
    assert hogs[0]["cores"] == pytest.approx(got, abs=0.1), (got, busy)
    assert hogs[0]["cores"] >= MIN_CORES
    assert [b["cores"] for b in busy] == sorted((b["cores"] for b in busy), reverse=True)
    assert meta["pid"] not in {b["pid"] for b in busy}
