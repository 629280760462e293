"""One run, one set of numbers (issue 49), on a real training: the README's demo trainer (one
slow DataLoader worker, the probe on) under `stallscope run`, then every surface of the run it
made, `run`'s own end-of-run summary among them, held together by
tests/integration/test_one_set_of_numbers.py's check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, stallscope_argv
from surfaces import check_one_set

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow]


def test_a_real_training_shows_one_set_of_numbers(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "runs"
    argv = [
        *stallscope_argv("run", "--interval", "1", "--out", str(out)),
        "--",
        sys.executable,
        str(ROOT / "examples" / "train_cpu.py"),
        "--max-seconds",
        "10",
        "--epochs",
        "100",
        "--workers",
        "1",
    ]
    r = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    [run] = list(out.iterdir())
    doc = check_one_set(run, tmp_path, run_stderr=r.stderr)
    assert doc["signals"]["samples_per_s"] > 0 and doc["signals"]["exit_code"] == 0
