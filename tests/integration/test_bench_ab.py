"""benchmarks/ab.py: a command run alternately in a worktree of an earlier commit and in the
working tree, each importing its own tree's package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

AB = ROOT / "benchmarks" / "ab.py"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "stallscope").mkdir(parents=True)
    (repo / "stallscope" / "__init__.py").write_text("VALUE = 4\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "a")
    (repo / "stallscope" / "__init__.py").write_text("VALUE = 6\n")  # the working tree: B
    return repo


def test_each_side_runs_its_own_tree_in_alternating_order(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    probe = "import os, stallscope; print('value', stallscope.VALUE, os.getcwd())"
    r = subprocess.run(
        [
            sys.executable,
            str(AB),
            "--repo",
            str(repo),
            "--base",
            "HEAD",
            "--rounds",
            "2",
            "--metric",
            r"value (\d+)",
            "--",
            sys.executable,
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "round 1 (AB): A 4  B 6  B/A 1.500" in lines, r.stdout
    assert "round 2 (BA): A 4  B 6  B/A 1.500" in lines, r.stdout
    assert lines[-1] == "median B/A over 2 rounds: 1.500"
    worktrees = subprocess.run(
        ["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert len(worktrees.splitlines()) == 1  # the temporary worktree is gone


def test_a_command_without_the_figure_or_a_bad_base_fails_with_one_line(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    for base, code in (("HEAD", "print('nothing')"), ("no-such-rev", "print('value 1')")):
        r = subprocess.run(
            [
                sys.executable,
                str(AB),
                "--repo",
                str(repo),
                "--base",
                base,
                "--metric",
                r"value (\d+)",
                "--",
                sys.executable,
                "-c",
                code,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("ab: ")


def test_bad_flags_are_refused_with_one_line(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    for flags in (
        ["--rounds", "0"],
        ["--metric", "(a)(b)"],
        ["--metric", "("],
        ["--base", "--exec=x"],
        ["--timeout", "-1"],
    ):
        args = {"--base": "HEAD", "--metric": r"value (\d+)", "--rounds": "1", "--timeout": "60"}
        args.update(dict(zip(flags[::2], flags[1::2])))
        argv = [x for kv in args.items() for x in kv]
        r = subprocess.run(
            [
                sys.executable,
                str(AB),
                "--repo",
                str(repo),
                *argv,
                "--",
                sys.executable,
                "-c",
                "print('value 1')",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr, (flags, r.stderr)
        assert "error: " in r.stderr.strip().splitlines()[-1], (flags, r.stderr)
