"""The CLI end to end: real child processes under `stallscope run`, stored runs, bad input."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq  # a test dependency (the dev group): missing, it fails
from conftest import stallscope_argv

from stallscope.store import RunStore, read_meta

TRAINER = textwrap.dedent("""
    import os, sys, time
    pid = os.fork()
    if pid == 0:
        end = time.time() + 1.5
        while time.time() < end:
            pass
        t = os.times()
        print(f"worker cpu {t.user + t.system:.3f}", flush=True)
        os._exit(0)
    time.sleep(1.6)
    os.waitpid(pid, 0)
    print("child done", flush=True)
    sys.exit(3)
""")


def _run(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        stallscope_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_run_records_tree_and_exits_with_child_code(tmp_path: Path) -> None:
    r = _run(["run", "--interval", "0.2", "--", sys.executable, "-c", TRAINER], tmp_path)
    assert r.returncode == 3, r.stderr
    assert "child done" in r.stdout
    assert "run directory:" in r.stderr
    assert "Traceback" not in r.stderr
    [run_dir] = list((tmp_path / "stallscope-runs").iterdir())
    meta = read_meta(run_dir)
    assert meta["exit_code"] == 3 and meta["end"] >= meta["start"]
    assert meta["interval_s"] == 0.2 and meta["samples"] >= 5
    st = RunStore(run_dir / "run.db", readonly=True)
    roles = {e["attrs"]["role"] for e in st.entities("procs")}
    assert roles == {"main", "worker"}
    worker = next(e["entity"] for e in st.entities("procs") if e["attrs"]["role"] == "worker")
    [busy] = st.read("procs.cpu_pct", worker)
    # the CPU time stored for the worker adds up to what it says it used (it misses at most the
    # part before its first sample, one interval)
    used = float(r.stdout.split("worker cpu ")[1].split()[0])
    dts = [0.2] + [b - a for a, b in zip(busy.ts, busy.ts[1:])]
    stored = sum(v / 100 * dt for v, dt in zip(busy.v, dts))
    assert used - 0.2 - 0.15 <= stored <= used + 0.15, (used, stored)
    assert st.read("host.cpu_pct")[0].v
    assert st.read("collector.cpu_s")[0].v
    st.close()
    # the stored run is usable by the other commands
    r = _run(["runs", "--json"], tmp_path)
    assert json.loads(r.stdout)[0]["exit_code"] == 3
    r = _run(["show", "latest", "--json"], tmp_path)
    doc = json.loads(r.stdout)
    metrics = {row["metric"] for row in doc["summary"]["rows"]}
    assert {"host.cpu_pct", "procs.cpu_pct[main]", "procs.cpu_pct[worker]"} <= metrics
    r = _run(["show", run_dir.name], tmp_path)
    assert r.returncode == 0 and "median" in r.stdout
    r = _run(["export", str(run_dir), "--format", "csv"], tmp_path)
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert rows and list(rows[0]) == ["time", "t_s", "metric", "entity", "role", "process", "value"]
    assert any(row["metric"] == "procs.cpu_pct" for row in rows)
    assert {row["role"] for row in rows if row["metric"] == "procs.cpu_pct"} == {"main", "worker"}
    r = _run(
        ["export", str(run_dir), "--format", "parquet", "-o", str(tmp_path / "p.parquet")], tmp_path
    )
    assert r.returncode == 0, r.stderr
    table = pq.read_table(tmp_path / "p.parquet")
    assert table.column_names == list(rows[0])
    assert table.num_rows == len(rows)


def test_sigterm_is_forwarded_and_code_returned(tmp_path: Path) -> None:
    child = textwrap.dedent("""
        import signal, sys, time
        def bye(signum, frame):
            print("got", signum, flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen(
        stallscope_argv("run", "--interval", "0.5", "--", sys.executable, "-c", child),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 7, err
    assert f"got {int(signal.SIGTERM)}" in out
    [run_dir] = list((tmp_path / "stallscope-runs").iterdir())
    assert read_meta(run_dir)["signals_forwarded"] == ["SIGTERM"]


def test_child_killed_by_signal_gives_128_plus_n(tmp_path: Path) -> None:
    r = _run(
        [
            "run",
            "--interval",
            "0.5",
            "--",
            sys.executable,
            "-c",
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        ],
        tmp_path,
    )
    assert r.returncode == 128 + 9


def test_kill_9_of_collector_leaves_a_sound_database(tmp_path: Path) -> None:
    p = subprocess.Popen(
        stallscope_argv("run", "--interval", "0.2", "--", "sleep", "30"),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3.0)
        killed_at = time.time()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    finally:
        [run_dir] = list((tmp_path / "stallscope-runs").iterdir())
        child = read_meta(run_dir).get("pid")
        if child:  # the orphaned `sleep` (only ours, by the pid the run recorded)
            os.kill(child, signal.SIGKILL)
    db = sqlite3.connect(run_dir / "run.db")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    last = db.execute("SELECT MAX(ts) FROM samples").fetchone()[0]
    # at most one interval (plus scheduling slack on a busy 2-core box) lost
    assert killed_at - last < 0.2 + 1.0
    n = db.execute("SELECT COUNT(DISTINCT ts) FROM samples").fetchone()[0]
    assert n >= 3
    assert read_meta(run_dir)["end"] is None  # it never finished...
    [row] = json.loads(_run(["runs", "--json"], tmp_path).stdout)
    assert row["state"] == "interrupted"  # ...and its monitor is gone: not "running" forever


def test_snapshot_json_contract(tmp_path: Path) -> None:
    r = _run(["snapshot", "--interval", "0.3", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["interval_s"] == 0.3 and doc["ts"] > 1.7e9
    assert "cpu_pct" in doc["host"] and "shm_total_mib" in doc["host"]
    assert "gpu" in doc or "gpu" in doc["unavailable"]
    assert "disk" in doc or "disk" in doc["unavailable"]
    for name, reason in doc["unavailable"].items():
        assert isinstance(reason, str) and reason and "\n" not in reason, name


def _one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert needle in lines[0], lines[0]


def test_bad_input_gives_one_line(tmp_path: Path) -> None:
    _one_line_error(
        _run(["run", "--", "no-such-command-xyz"], tmp_path),
        "command not found: no-such-command-xyz",
    )
    _one_line_error(_run(["run", "--interval", "0", "--", "true"], tmp_path), "--interval")
    _one_line_error(_run(["run", "--interval", "abc", "--", "true"], tmp_path), "--interval")
    _one_line_error(_run(["run"], tmp_path), "no command given")
    _one_line_error(_run(["show", "nope"], tmp_path), "unknown run 'nope'")
    _one_line_error(_run(["export", "nope", "--format", "csv"], tmp_path), "unknown run")
    _one_line_error(
        _run(["run", "--data", "/no/such/path", "--", "true"], tmp_path), "--data /no/such/path"
    )
    _one_line_error(_run(["snapshot", "--bogus"], tmp_path), "unrecognized arguments")
    # the help it points to is the command's (a fresh-clone trial: `diagnose latest --jsn`
    # pointed to `stallscope --help`)
    _one_line_error(_run(["snapshot", "--bogus"], tmp_path), "(see `stallscope snapshot --help`)")
    _one_line_error(_run(["--bogus"], tmp_path), "(see `stallscope --help`)")
    assert not (tmp_path / "stallscope-runs").exists() or not any(
        (tmp_path / "stallscope-runs").iterdir()
    )


def test_runs_with_no_runs(tmp_path: Path) -> None:
    r = _run(["runs"], tmp_path)
    assert r.returncode == 0 and "no runs" in r.stdout


def test_runs_piped_prints_whole_fields(tmp_path: Path) -> None:
    """Piped, `runs` cut the verdict to "input_boun" and dropped the command and the folder at
    80 columns. A pipe or a file gets one tab-separated line a run, nothing cut."""
    from stallscope.store import new_run_dir, write_meta

    out = tmp_path / "stallscope-runs"
    cmd = ["python", "train_with_a_rather_long_name.py", "--epochs", "90", "--lr", "0.001"]
    run_dir = new_run_dir(out, "train_with_a_rather_long_name")
    write_meta(
        run_dir,
        {
            "command": cmd,
            "start": 1.7e9,
            "end": 1.7e9 + 26,
            "exit_code": 0,
            "verdict": "input_bound.epoch_start",
        },
    )
    r = subprocess.run(
        stallscope_argv("runs", "--out", str(out)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert r.returncode == 0, r.stderr
    head, line = r.stdout.splitlines()
    assert head.split("\t") == [
        "run",
        "started",
        "duration",
        "exit",
        "verdict",
        "owner",
        "command",
        "in",
    ]
    fields = line.split("\t")
    assert fields[0] == run_dir.name and fields[2] == "26 s" and fields[3] == "0"
    assert fields[4] == "input_bound.epoch_start" and fields[6] == " ".join(cmd)
    assert fields[7] == "."


def test_show_header_is_never_folded_when_piped(tmp_path: Path) -> None:
    """Piped at 80 columns, the header folded and left "samples" alone on a line."""
    r = _run(["run", "--quiet", "--", "sleep", "1"], tmp_path)
    assert r.returncode == 0, r.stderr
    [run_dir] = list((tmp_path / "stallscope-runs").iterdir())
    show = subprocess.run(
        stallscope_argv("show", str(run_dir)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    head = show.stdout.splitlines()[1]
    assert "every 1 s for the first 2 min, then every 5 s" in head and head.rstrip().endswith(
        "samples"
    ), show.stdout[:400]


def test_module_entry_point_version() -> None:
    r = subprocess.run(
        stallscope_argv("--version"), capture_output=True, text=True, env=dict(os.environ)
    )
    assert r.returncode == 0 and r.stdout.startswith("stallscope ")


def test_run_with_data_maps_device_and_checks_its_health(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    r = _run(
        [
            "run",
            "--interval",
            "0.3",
            "--quiet",
            "--data",
            str(tmp_path / "data"),
            "--",
            "sleep",
            "1",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    [run_dir] = list((tmp_path / "stallscope-runs").iterdir())
    meta = read_meta(run_dir)
    devs = meta["data_devices"]
    assert devs, meta.get("unavailable")  # the test folder sits on a block device
    # SMART of the dataset's drive was read with the real smartctl (a virtual disk gives
    # "unknown" with the reason and the fix; a real one a verdict)
    assert [d["device"] for d in meta["disk_health"]] == [f"/dev/{d}" for d in devs]
    for d in meta["disk_health"]:
        assert d["verdict"] in ("ok", "ageing", "failing", "unknown")
        assert d["reasons"] or d["verdict"] == "ok"
    st = RunStore(run_dir / "run.db", readonly=True)
    assert st.read("disk.util_pct", devs[0])  # the dataset's device is sampled
    st.close()


def test_damaged_runs_give_one_line(tmp_path: Path) -> None:
    out = tmp_path / "stallscope-runs"
    r = _run(["run", "--interval", "0.3", "--quiet", "--", "true"], tmp_path)
    assert r.returncode == 0
    [run_dir] = list(out.iterdir())
    # a run.db of a foreign schema
    db = sqlite3.connect(run_dir / "run.db")
    db.execute("DROP TABLE series")
    db.execute("CREATE TABLE series(x TEXT)")
    db.commit()
    db.close()
    for cmd in (
        ["show", str(run_dir)],
        ["diagnose", str(run_dir)],
        ["export", str(run_dir), "--format", "csv"],
    ):
        _one_line_error(_run(cmd, tmp_path), "run database unreadable")
    # a meta.json with a wrong type: `runs` still lists the others
    (run_dir / "meta.json").write_text(json.dumps({"start": "yesterday"}))
    r = _run(["runs", "--json"], tmp_path)
    assert r.returncode == 0 and "'start' should be a number" in r.stdout
    _one_line_error(_run(["show", str(run_dir)], tmp_path), "'start' should be a number")
    _one_line_error(
        _run(["export", "nope-run", "-o", "/nonexistent/x.csv"], tmp_path), "unknown run"
    )
    _one_line_error(_run(["run", "--keep-full", "nan", "--", "true"], tmp_path), "--keep-full")


def test_export_to_unwritable_path(tmp_path: Path) -> None:
    r = _run(["run", "--interval", "0.3", "--quiet", "--", "true"], tmp_path)
    assert r.returncode == 0
    _one_line_error(
        _run(["export", "latest", "-o", "/nonexistent/dir/x.csv"], tmp_path),
        "cannot write /nonexistent/dir/x.csv",
    )


def test_machine_text_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """argv with rich markup and an escape sequence prints literally, never as styling."""
    r = _run(["run", "--interval", "0.3", "--", "echo", "[bold red]x[/]", "\x1b[31mRED"], tmp_path)
    assert r.returncode == 0, r.stderr
    r = _run(["show", "latest"], tmp_path)
    assert "[bold red]x[/]" in r.stdout
    assert "\x1b[31m" not in r.stdout and "\\x1b[31mRED" in r.stdout


def test_early_sigterm_reaches_the_child(tmp_path: Path) -> None:
    """A signal that arrives while the child is starting is forwarded, not fatal to us."""
    r = _run(
        ["run", "--quiet", "--", "sh", "-c", "kill -TERM $PPID; sleep 5; echo survived"], tmp_path
    )
    assert r.returncode == 128 + 15
    assert "survived" not in r.stdout
    [run_dir] = list((tmp_path / "stallscope-runs").iterdir())
    meta = read_meta(run_dir)
    assert meta["exit_code"] == -15 and meta["signals_forwarded"] == ["SIGTERM"]
