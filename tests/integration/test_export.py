"""`stallscope export`: readable time, rounded values, process roles; CSV and Parquet alike."""

from __future__ import annotations

import csv
import io
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq  # a test dependency (the dev group): missing, it fails
import pytest
from conftest import stallscope_argv

from stallscope.cli.export import POINT_COLUMNS, STEP_COLUMNS, tidy
from stallscope.metrics import Point
from stallscope.store import RunStore, StepRow, write_meta

START = 1_700_000_000.0


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "20231114-221320-train"
    run.mkdir()
    write_meta(
        run,
        {
            "command": ["python", "train.py"],
            "start": START,
            "end": START + 3,
            "exit_code": 0,
            "interval_s": 1.0,
            "monitor_pid": 1,
        },
    )
    st = RunStore(run / "run.db")
    st.upsert_entity("procs", "4242", {"name": "python", "ppid": 1, "role": "main"}, START)
    st.upsert_entity(
        "procs", "4243", {"name": "pt_data_worker", "ppid": 4242, "role": "worker"}, START
    )
    for k in range(3):
        st.add_points(
            START + 0.25 + k,
            [
                Point("host.cpu_pct", "", 0.1 + 0.2),  # 0.30000000000000004
                Point("disk.rkb_s", "vda", 123456.789),
                Point("disk.r_await_ms", "vda", 0.000123456789),
                Point("procs.cpu_pct", "4242", 99.87654321),
                Point("procs.cpu_pct", "4243", 12.0),
            ],
        )
    st.add_steps(
        [
            StepRow(0, i, START + 1 + i / 3, 0.1 + 0.2, 1 / 3, None, 0.25, None, 32, 0)
            for i in range(3)
        ]
    )
    st.finish()
    st.close()
    return run


def _export(run: Path, *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        stallscope_argv("export", str(run), *args), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and not r.stderr, r.stderr
    return r


def test_tidy_rounds_to_six_significant_digits() -> None:
    assert tidy(0.1 + 0.2) == 0.3
    assert tidy(99.87654321) == 99.8765
    assert tidy(0.000123456789) == 0.000123457
    assert tidy(123456.789) == 123457.0  # whole numbers from 1e5: the units digit stays
    assert tidy(98765432.1) == 98765432.0
    assert tidy(0.0) == 0.0 and tidy(-2.5) == -2.5


def test_csv_has_readable_time_roles_and_rounded_values(tmp_path: Path) -> None:
    run = _run(tmp_path)
    rows = list(csv.DictReader(io.StringIO(_export(run, "--format", "csv").stdout)))
    assert list(rows[0]) == list(POINT_COLUMNS)
    assert len(rows) == 15
    first = rows[0]
    t = datetime.fromisoformat(first["time"])
    assert t.tzinfo is not None and abs(t.timestamp() - (START + 0.25)) < 1e-6
    assert first["time"].split("T")[1][8:12] == ".250"  # milliseconds
    assert {r["t_s"] for r in rows} == {"0.25", "1.25", "2.25"}
    by_metric = {(r["metric"], r["entity"]): r for r in rows if r["t_s"] == "0.25"}
    assert by_metric[("host.cpu_pct", "")]["value"] == "0.3"
    assert by_metric[("disk.rkb_s", "vda")]["value"] == "123457"
    assert by_metric[("disk.r_await_ms", "vda")]["value"] == "0.000123457"
    main, worker = by_metric[("procs.cpu_pct", "4242")], by_metric[("procs.cpu_pct", "4243")]
    assert (main["role"], main["process"], main["value"]) == ("main", "python", "99.8765")
    assert (worker["role"], worker["process"], worker["value"]) == (
        "worker",
        "pt_data_worker",
        "12",
    )
    host = by_metric[("host.cpu_pct", "")]
    assert host["role"] == "" and host["process"] == ""
    # oldest first, then by metric and entity
    assert [r["t_s"] for r in rows] == sorted(r["t_s"] for r in rows)


def test_parquet_has_the_same_columns_and_values(tmp_path: Path) -> None:
    run = _run(tmp_path)
    for what, columns in (("points", POINT_COLUMNS), ("steps", STEP_COLUMNS)):
        rows = list(
            csv.DictReader(io.StringIO(_export(run, "--format", "csv", "--what", what).stdout))
        )
        out = tmp_path / f"{what}.parquet"
        _export(run, "--format", "parquet", "--what", what, "-o", str(out))
        table = pq.read_table(out)
        assert table.column_names == list(columns) == list(rows[0])
        assert table.num_rows == len(rows)
        for col, kind in columns.items():
            got = table.column(col).to_pylist()
            want = [r[col] for r in rows]
            if kind == "str":
                assert [g or "" for g in got] == want, col
            elif kind == "time":  # a UTC timestamp, the CSV's local ISO text's instant
                assert str(table.schema.field(col).type) == "timestamp[ms, tz=UTC]"
                assert [g.isoformat(timespec="milliseconds") for g in got] == [
                    datetime.fromisoformat(w)
                    .astimezone(timezone.utc)
                    .isoformat(timespec="milliseconds")
                    for w in want
                ], col
            else:
                assert [g for g in got] == [None if w == "" else float(w) for w in want], col


def test_steps_have_time_and_rounded_seconds(tmp_path: Path) -> None:
    run = _run(tmp_path)
    rows = list(
        csv.DictReader(io.StringIO(_export(run, "--format", "csv", "--what", "steps").stdout))
    )
    assert list(rows[0]) == list(STEP_COLUMNS)
    assert [r["t_s"] for r in rows] == ["1", "1.333", "1.667"]
    assert rows[0]["wait_s"] == "0.3" and rows[0]["host_s"] == "0.333333"
    assert rows[0]["h2d_s"] == "" and rows[0]["gpu_busy_s"] == "0.25"
    assert datetime.fromisoformat(rows[1]["time"]).timestamp() == pytest.approx(
        START + 1 + 1 / 3, abs=1e-3
    )


def test_steps_of_a_run_without_the_probe_say_why_there_are_none(tmp_path: Path) -> None:
    """A fresh-clone trial: `export --what steps` of a run with no probe wrote the header alone
    and exited 0, which reads as an export that broke."""
    run = _run(tmp_path)
    import sqlite3

    with sqlite3.connect(run / "run.db") as db:
        db.execute("DELETE FROM steps")
    r = subprocess.run(
        stallscope_argv("export", str(run), "--format", "csv", "--what", "steps"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0
    assert r.stdout.strip() == ",".join(STEP_COLUMNS)
    assert r.stderr.count("\n") == 1 and "has no per-step records" in r.stderr
    assert "stallscope.watch(loader)" in r.stderr
