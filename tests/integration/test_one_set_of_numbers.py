"""One run, one set of numbers (issue 49): every surface renders the run's facts, so a figure
that appears in two places is the same figure. Each surface's real output is parsed (the CLI as
a child process: `show`, `show --json`, `diagnose`, `diagnose --json`, `report`, `runs --json`,
`compare --json` and its table) and every shared figure compared: throughput, data-wait share,
the trainer's CPU mean, speed-ups, exit code, duration, verdict.

Inputs: the five recorded H200 runs (tests/fixtures/gpu-h200/SOURCE.md; before this issue
`show --json` gave 314.96 samples/s for prep-probe where `diagnose --json` gave 350.4), and, in
tests/scenarios/test_one_set_of_numbers_live.py, a real training under `stallscope run`, whose
end-of-run summary joins in. A new surface joins :func:`check_one_set`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES
from surfaces import check_one_set

RUNS = FIXTURES / "gpu-h200" / "runs"


@pytest.mark.parametrize("name", sorted(p.name for p in RUNS.iterdir()))
def test_the_recorded_h200_runs_show_one_set_of_numbers(name: str, tmp_path: Path) -> None:
    run = tmp_path / "runs" / name
    shutil.copytree(RUNS / name, run)  # reading a WAL store writes beside it: never in the repo
    doc = check_one_set(run, tmp_path)
    if name == "prep-probe":  # 314.96 in show, 350.4 in diagnose before: now one figure
        assert doc["signals"]["samples_per_s"] == pytest.approx(315.0, abs=0.1)
