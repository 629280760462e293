"""Nothing that looks like a training gets no verdict (issue 40): a real script that starts 8
sleeping children and sleeps, under `stallscope run`, was called input_bound.prep (critical,
"up to 20x faster"), and `run --pid 1` input_bound.fetch. A training that only reads (its
workers in D state, little CPU) still gets its verdict: the rule asks for no CPU, no reads and
no D state at once (tests/unit/test_diagnose.py has the input-bound cases)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import stallscope_argv

SLEEPERS = (
    "import os, time\n"
    "kids = []\n"
    "for _ in range(8):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        time.sleep(9)\n"
    "        os._exit(0)\n"
    "    kids.append(pid)\n"
    "time.sleep(8)\n"
    "for k in kids:\n"
    "    os.waitpid(k, 0)\n"
)


def test_a_script_of_sleeping_processes_gets_no_verdict(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    r = subprocess.run(
        [
            *stallscope_argv("run", "--interval", "1", "--out", str(out)),
            "--",
            sys.executable,
            "-c",
            SLEEPERS,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    [run_dir] = list(out.iterdir())
    d = subprocess.run(
        stallscope_argv("diagnose", str(run_dir), "--json"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(d.stdout)
    assert doc["verdict"] == "insufficient_data", doc["findings"][0]
    top = doc["findings"][0]
    assert top["summary"].startswith("Nothing here looks like a training"), top["summary"]
    assert top["evidence"]["processes"] == 9 and top["evidence"]["tree_cpu_pct"] < 10
    assert [f["kind"] for f in doc["findings"]] == ["insufficient_data"]
    assert "Nothing here looks like a training" in " ".join(r.stderr.split())
