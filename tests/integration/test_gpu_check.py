"""benchmarks/gpu_check.py, the one-command GPU check, where there is no GPU (CI): one line and
exit code 2; its table says which runs missed their trainer's truth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check


def test_without_a_gpu_it_says_so_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    # on stderr (issue 50: it was on stdout), nothing on stdout
    assert (
        r.stderr.startswith("gpu_check: error: no NVIDIA GPU here")
        and r.stderr.count("\n") == 1
        and not r.stdout
    ), (r.stdout, r.stderr)
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_table_marks_a_wrong_verdict_or_share() -> None:
    row = {
        "kind": "compute",
        "mode": "pid",
        "truth_verdict": "compute_bound",
        "truth_share": 0.005,
        "verdict": "compute_bound",
        "share": 0.02,
        "source": "stacks",
        "exit_s": 31.4,
    }
    wrong = dict(row, verdict="input_bound.prep", share=0.549)
    far = dict(row, share=0.2)
    lines = gpu_check.table([row, wrong, far]).splitlines()
    assert lines[2].endswith("yes") and lines[3].endswith("NO") and lines[4].endswith("NO")


# --- bad arguments: one line on stderr, exit 2, as the CLI does (issue 50) ----------------------
def _script(name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def _one_line(r: subprocess.CompletedProcess[str], prefix: str) -> str:
    """The one stderr line of a refusal (exit 2, ``prefix`` first), checked."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.startswith(prefix), r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and not r.stdout, (r.stdout, r.stderr)
    return r.stderr.strip()


@pytest.mark.parametrize(
    "args",
    [
        ["--steps-us", "0"],
        ["--steps-us", "abc"],
        ["--steps-us", "nan"],
        ["--steps-us", "50,inf"],
        ["--seconds", "inf"],
        ["--seconds", "nan"],
        ["--seconds", "0"],
        ["--reps", "0"],
    ],
)
def test_bench_probe_cuda_checks_its_arguments_with_only_too(args: list[str]) -> None:
    """``--only`` (what each round's process runs) skipped the checks: ``--steps-us 0`` divided by
    zero, ``abc`` raised, ``nan`` and ``--seconds inf`` never ended."""
    line = _one_line(
        _script("bench_probe_cuda.py", "--only", "pairs", *args), "bench_probe_cuda.py: error: "
    )
    assert args[0] in line, line  # the line names the option it refused


@pytest.mark.parametrize("out", ["a-file", "/dev/null/x"])
def test_gpu_check_dry_run_with_an_out_that_cannot_be_a_folder(tmp_path: Path, out: str) -> None:
    """``--dry-run-cpu --out`` a file, or a path under /dev/null, raised from mkdir."""
    (tmp_path / "a-file").write_text("x")
    target = str(tmp_path / out) if out == "a-file" else out
    r = _script("gpu_check.py", "--dry-run-cpu", "--out", target)
    _one_line(r, "gpu_check: error: --out ")
    assert (tmp_path / "a-file").read_text() == "x"


def test_gpu_trainer_without_a_gpu_is_one_line() -> None:
    """``gpu_trainer.py host`` (``--device cuda`` by default) on a machine without a GPU raised
    AssertionError ("Torch not compiled with CUDA enabled") or RuntimeError."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check is for machines without one")
    line = _one_line(
        _script("gpu_trainer.py", "host", "--seconds", "1", timeout=120), "gpu_trainer: error: "
    )
    assert "no CUDA GPU here" in line, line


@pytest.mark.parametrize("device", ["bogus", "meta", "cuda:99"])
def test_gpu_trainer_with_a_bad_device_is_one_line(device: str) -> None:
    """A ``--device`` torch does not know raised RuntimeError from ``torch.device``."""
    line = _one_line(
        _script("gpu_trainer.py", "host", "--seconds", "1", "--device", device, timeout=120),
        "gpu_trainer: error: ",
    )
    # the device it could not use, named; a CUDA index on a machine with no GPU at all says that
    assert device in line or (device.startswith("cuda") and "no CUDA GPU here" in line), line


def test_gpu_trainer_on_the_cpu_still_trains() -> None:
    """The dry run the arguments' checks must not stop: ``--device cpu`` trains and says how much
    of its time was data wait."""
    r = _script("gpu_trainer.py", "host", "--seconds", "1", "--device", "cpu", timeout=120)
    assert r.returncode == 0 and "data wait:" in r.stdout, r.stderr[-2000:]
