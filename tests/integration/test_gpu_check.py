"""benchmarks/gpu_check.py, the one-command GPU check, where there is no GPU (CI): one line and
exit code 2; its table says which runs missed their trainer's truth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check


def test_without_a_gpu_it_says_so_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith("gpu_check: no NVIDIA GPU here") and r.stdout.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_table_marks_a_wrong_verdict_or_share() -> None:
    row = {"kind": "compute", "mode": "pid", "truth_verdict": "compute_bound",
           "truth_share": 0.005, "verdict": "compute_bound", "share": 0.02, "source": "stacks",
           "exit_s": 31.4}
    wrong = dict(row, verdict="input_bound.prep", share=0.549)
    far = dict(row, share=0.2)
    lines = gpu_check.table([row, wrong, far]).splitlines()
    assert lines[2].endswith("yes") and lines[3].endswith("NO") and lines[4].endswith("NO")
