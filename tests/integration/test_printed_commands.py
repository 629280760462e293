"""Every command stallscope prints for the user to run (a finding's fix, `run`'s `next:` lines)
runs exactly as printed (issue 49): `slow_exit`'s fix said a bare "`stallscope report` lists
the exit's stacks" (exit 2, "RUN required"), fetch's fixes `stallscope pack SRC DST`, the wait
finding `py-spy dump --pid PID`. No placeholder is left to fill in, and each stallscope command
printed is run here and must not be refused as a usage error."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, stallscope_argv
from diagnose_inputs import N, procs, run, ser, steps

from stallscope.analysis.diagnose import diagnose, diagnose_run
from stallscope.textsafe import split_commands

#: words that stand for something the user would have to fill in
PLACEHOLDER = re.compile(r"\b(PID|SRC|DST|FILE|RUN|CMD|PATH|DIR|train\.py)\b")


def printed_commands(doc: dict[str, Any]) -> list[str]:
    """The commands a diagnosis prints on lines of their own (split_commands), all findings."""
    out = []
    for f in doc["findings"]:
        for fix in f["fixes"]:
            out += split_commands(str(fix["action"]))[1]
    return out


def runs_as_printed(command: str, cwd: Path) -> None:
    assert not PLACEHOLDER.search(command), command
    argv = shlex.split(command)
    if argv[0] != "stallscope":
        return  # py-spy, ps, nvidia-smi: their own tools, checked for placeholders only
    r = subprocess.run(
        stallscope_argv(*argv[1:]), capture_output=True, text=True, timeout=180, cwd=cwd
    )
    assert r.returncode != 2, (command, r.stderr[-1000:])  # 2: a usage error


def test_the_recorded_runs_print_commands_that_run(tmp_path: Path) -> None:
    printed: list[str] = []
    for name in sorted(p.name for p in (FIXTURES / "gpu-h200" / "runs").iterdir()):
        run_dir = tmp_path / name
        shutil.copytree(FIXTURES / "gpu-h200" / "runs" / name, run_dir)
        for command in printed_commands(diagnose_run(run_dir)):
            runs_as_printed(command, tmp_path)
            printed.append(command)
    assert printed, "the recorded runs print no command: nothing was checked"
    assert not [c for c in printed if PLACEHOLDER.search(c)], printed


def test_a_slow_exits_report_command_names_the_run(tmp_path: Path) -> None:
    """The exit's stacks are in the run's report: the command names the run."""
    run_dir = tmp_path / "prep-probe"
    shutil.copytree(FIXTURES / "gpu-h200" / "runs" / "prep-probe", run_dir)
    from stallscope.analysis.rundata import load_run

    data = load_run(run_dir)
    data.meta["pin_memory"] = None
    doc = diagnose_run(run_dir, data)
    slow = [f for f in doc["findings"] if f["kind"] == "slow_exit"]
    assert slow
    commands = printed_commands(doc)
    for command in commands:
        runs_as_printed(command, tmp_path)


def test_fetch_fixes_pack_the_runs_own_dataset(tmp_path: Path) -> None:
    """`stallscope pack SRC DST` became the run's dataset and a folder beside it: run as
    printed, it packs."""
    src = tmp_path / "small files"
    src.mkdir()
    for i in range(20):  # an image folder: <class>/<file>
        (src / f"c{i % 3}").mkdir(exist_ok=True)
        (src / f"c{i % 3}" / f"{i:03d}.jpg").write_bytes(bytes([i]) * 3000)
    rkb = [2000] * N
    data = run(
        [
            ser("host.cpu_pct", "", [20] * N),
            ser("disk.util_pct", "vda", [95] * N),
            ser("disk.rkb_s", "vda", rkb),
            ser("disk.r_s", "vda", [400] * N),
            ser("disk.rareq_kb", "vda", [5] * N),
            ser("disk.r_await_ms", "vda", [30] * N),
            ser("procs.cpu_pct", "100", [25] * N),
            ser("procs.d_state", "100", [1] * N),
        ],
        steps=steps(100, wait=0.08, host=0.02),
        entities=procs({"100": "main"}),
        config={"num_workers": 0},
        meta={"data_devices": ["vda"], "data": str(src)},
    )
    doc = diagnose(data)
    commands = [c for c in printed_commands(doc) if c.startswith("stallscope pack")]
    assert commands, json.dumps(doc["findings"], indent=1)[:3000]
    for command in commands:
        runs_as_printed(command, tmp_path)
    assert list((tmp_path / "small files-shards").glob("*.tar")), commands


def test_runs_next_lines_run_as_printed(tmp_path: Path) -> None:
    """`run`'s closing `next:` lines, on a real (short) run."""
    out = tmp_path / "runs"
    r = subprocess.run(
        [
            *stallscope_argv("run", "--out", str(out), "--interval", "0.5"),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(2)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    nexts = [
        ln.split("next:", 1)[-1].strip() if "next:" in ln else ln.strip()
        for ln in r.stderr.splitlines()
        if "next:" in ln or (ln.startswith("      ") and " diagnose " in ln)
    ]
    assert len(nexts) == 2, r.stderr[-2000:]
    for line in nexts:  # as a shell would run them: the printed words, nothing added
        assert not PLACEHOLDER.search(line), line
        done = subprocess.run(
            shlex.split(line), capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert done.returncode == 0, (line, done.stderr[-1000:])


@pytest.mark.parametrize("kind", ["input_bound.wait"])
def test_the_wait_findings_py_spy_names_a_pid(kind: str) -> None:
    data = run(
        [
            ser("host.cpu_pct", "", [30] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("procs.cpu_pct", "100", [10] * N),
            ser("procs.cpu_pct", "101", [8] * N),
            ser("procs.d_state", "101", [0] * N),
        ],
        steps=steps(200, wait=0.06, host=0.01),
        entities=procs({"100": "main", "101": "worker"}),
        config={"num_workers": 1, "physical_cores": 2},
    )
    doc = diagnose(data)
    f = next(f for f in doc["findings"] if f["kind"] == kind)
    commands = printed_commands({"findings": [f]})
    assert "py-spy dump --pid 101" in commands, commands
    assert all(not PLACEHOLDER.search(c) for c in commands), commands
