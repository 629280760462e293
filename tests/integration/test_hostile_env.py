"""Hostile environment variables (issue 50): numbers that are no numbers, infinite or out of range,
values with escape sequences or 100 kB long, a runs folder whose name is not UTF-8 or too long.
Each is said in one clean line (or refused, for a command, in one line with exit 2), and what
reads it goes on: a real trainer with the standalone probe, the CLI, the stack sampler that
``stallscope run`` injects, as child processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, env_without_stallscope, stallscope_argv

from stallscope.store import RunStore, list_runs, read_meta

#: a trainer with the standalone probe and no torch: watch() takes any iterable
PLAIN = """
import stallscope

for epoch in range(2):
    for batch in stallscope.watch([[1] * 8] * 6):
        pass
print("trained", flush=True)
"""
NINES = "9" * 100_000
#: an escape sequence that retitles a terminal (OSC 0), and one that colours it
ESCAPES = "\x1b]0;owned\x07\x1b[31m"


def _train(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    full = env_without_stallscope("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    full.update(STALLSCOPE_OUT=str(tmp_path / "out"), PYTHONPATH=str(ROOT))
    full.update(env)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _clean_lines(stderr: str) -> list[str]:
    """stderr's lines, checked: no traceback, no control character, none longer than 600."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()
    assert not [ln for ln in lines if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in ln)], stderr[
        :2000
    ]
    assert all(len(ln) < 600 for ln in lines), [len(ln) for ln in lines]
    return lines


@pytest.mark.parametrize("value", ["inf", "1e309", NINES, "nan", "-1", "0"])
def test_an_interval_that_is_no_finite_number_in_range_is_said_and_the_default_used(
    tmp_path: Path, value: str
) -> None:
    """``STALLSCOPE_INTERVAL=inf`` (or 1e309, or 100 kB of nines) killed the standalone
    collector's thread with an OverflowError traceback, and the run got no machine samples. It is
    now checked as ``--interval`` is (finite, 0.1 to 3600): one line, the default 5 s used, and
    the machine sampled."""
    res = _train(tmp_path, STALLSCOPE_INTERVAL=value)
    assert res.returncode == 0 and "trained" in res.stdout, res.stderr[-3000:]
    lines = _clean_lines(res.stderr)
    said = [ln for ln in lines if "STALLSCOPE_INTERVAL" in ln]
    assert len(said) == 1 and "between 0.1 and 3600" in said[0] and "using 5" in said[0], lines
    (run_dir,) = list_runs(tmp_path / "out")
    assert read_meta(run_dir)["interval_s"] == 5.0
    store = RunStore(run_dir / "run.db", readonly=True)
    try:
        assert store.read("host.cpu_pct") or store.entities("procs"), "no machine sample"
    finally:
        store.close()


@pytest.mark.parametrize("name", ["STALLSCOPE_GROUP_MS", "STALLSCOPE_ALERTS", "STALLSCOPE_RUN_DIR"])
def test_a_printed_environment_value_is_made_safe_and_clipped(tmp_path: Path, name: str) -> None:
    """A value with escape sequences and 100 kB long reached the terminal raw and whole (a
    warning of 100-200 kB). It is now shown through the sanitiser, clipped; the training goes
    on."""
    res = _train(tmp_path, **{name: f"/nonexistent/{ESCAPES}{NINES}"})
    assert res.returncode == 0 and "trained" in res.stdout, res.stderr[-3000:]
    lines = _clean_lines(res.stderr)
    assert any(name in ln or "/nonexistent/" in ln for ln in lines), lines
    assert "\\x1b" in res.stderr  # shown, not sent


def test_the_added_by_of_a_run_is_stored_safe(tmp_path: Path) -> None:
    """``STALLSCOPE_PROBE_ADDED`` (what added the probe: shown in the findings) is stored with its
    control characters shown and clipped, never raw."""
    res = _train(tmp_path, STALLSCOPE_PROBE_ADDED=f"x{ESCAPES}{NINES}")
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = list_runs(tmp_path / "out")
    config = read_meta(run_dir)["loader_config"]["0"]
    added = config["added_by"]
    assert "\x1b" not in added and "\x07" not in added and "\\x1b" in added
    assert len(added) < 200, len(added)


@pytest.mark.parametrize("value", ["inf", "0", "abc", NINES])
def test_a_bad_stack_rate_from_the_environment_is_said_and_the_default_used(
    tmp_path: Path, value: str
) -> None:
    """The stack sampler ``stallscope run`` injects reads ``STALLSCOPE_STACKS_HZ``: ``inf`` made
    its thread spin, ``0`` divided by zero, ``abc`` printed the value raw in its error. Checked
    as ``--stack-rate`` is (1 to 1000): one line, the default rate."""
    run_dir = tmp_path / "run"
    (run_dir / "stacks").mkdir(parents=True)
    env = env_without_stallscope()
    env.update(
        PYTHONPATH=f"{ROOT / 'stallscope' / 'inject'}:{ROOT}",
        STALLSCOPE_RUN_DIR=str(run_dir),
        STALLSCOPE_STACKS_HZ=value,
    )
    code = (
        "import time\nt = time.time()\nwhile time.time() - t < 1.0:\n    sum(range(1000))\n"
        "print('done')"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0 and "done" in res.stdout, res.stderr[-3000:]
    lines = _clean_lines(res.stderr)
    said = [ln for ln in lines if "STALLSCOPE_STACKS_HZ" in ln]
    assert len(said) == 1 and "between 1 and 1000" in said[0] and "using 40" in said[0], lines
    assert not [ln for ln in lines if ln not in said], lines


@pytest.mark.parametrize(
    "rank,world,expect",
    [("abc", "2", (0, 2)), ("0", NINES, (0, 1)), ("1", "inf", (0, 1)), ("1", "2", (1, 2))],
)
def test_the_shard_reader_takes_rank_and_world_size_checked(
    rank: str, world: str, expect: tuple[int, int]
) -> None:
    """The WebDataset reader's RANK / WORLD_SIZE (no torch.distributed group) raised ValueError
    on anything but an integer; a bad one is now said in one line and taken as one process."""
    env = env_without_stallscope()
    env.update(PYTHONPATH=str(ROOT), RANK=rank, WORLD_SIZE=world)
    code = "from stallscope.tools.data import _dist_info\nprint(list(_dist_info()))"
    res = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert tuple(json.loads(res.stdout)) == expect
    lines = _clean_lines(res.stderr)
    assert len(lines) == (0 if expect == (1, 2) else 1), lines


@pytest.mark.parametrize("command", [["run", "--", "true"], ["runs"], ["show", "latest"]])
@pytest.mark.parametrize(
    "out",
    [
        "/tmp/stallscope-\udcff\udcfe-runs",  # not UTF-8
        "/tmp/" + "a" * 300,  # ENAMETOOLONG
        "/tmp/" + "b/" * 2100,
    ],
)  # past PATH_MAX
def test_a_runs_folder_that_cannot_be_one_is_refused_in_one_line(
    tmp_path: Path, command: list[str], out: str
) -> None:
    """A ``STALLSCOPE_OUT`` that is not UTF-8 crashed ``run`` (UnicodeEncodeError writing the
    run index); one too long crashed ``runs`` (ENAMETOOLONG from ``stat``). Both are refused in
    one line, exit 2, before anything is made."""
    env = env_without_stallscope()
    env.update(
        PYTHONPATH=str(ROOT), STALLSCOPE_OUT=out, STALLSCOPE_STATE_DIR=str(tmp_path / "state")
    )
    res = subprocess.run(
        stallscope_argv(*command),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = _clean_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr[-2000:])
    assert lines[0].startswith("stallscope: error: $STALLSCOPE_OUT "), lines
    assert not (tmp_path / "state" / "runs.txt").exists()
