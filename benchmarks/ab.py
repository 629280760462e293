"""A benchmark, alternated between an earlier commit and the working tree, in one run.

    .venv/bin/python benchmarks/ab.py --base HEAD~1 --metric 'ratio x([0-9.]+)' \
        -- .venv/bin/python benchmarks/bench_run_cost.py --seconds 20 --pairs 1

The base commit is checked out in a temporary git worktree. Each round runs the command once in
each tree, in the order A B, then B A, then A B... (a machine that drifts during the run weighs
on both sides alike). The command runs with the tree as its working directory and first on
``PYTHONPATH``, so ``benchmarks/...`` and ``import stallscope`` are that tree's, and so is the
``stallscope`` a benchmark starts (its entry point imports the package from there).

``--metric`` is a regular expression with one group: the number it captures in the command's
output (the last match) is the round's figure. Prints each round's two figures and their ratio
(B / A), and the median ratio. Exit 1 when a command fails or prints no figure; the worktree is
removed in any case.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figure(cmd: list[str], tree: Path, metric: re.Pattern[str], timeout: float) -> float:
    """Run ``cmd`` in ``tree``; the last number ``metric`` captures in its output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode} in {tree}: {out.strip()[-600:]}")
    found = metric.findall(out)
    if not found:
        raise RuntimeError(
            f"no figure matching {metric.pattern!r} in the output in {tree}: {out.strip()[-600:]}"
        )
    return float(found[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the earlier commit (A)")
    ap.add_argument("--metric", required=True, help="regular expression, one group: the figure")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repo", type=Path, default=ROOT, help="the repository (default: this one)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per command")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the benchmark command")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("give the benchmark command after --")
    try:
        metric = re.compile(args.metric)
    except re.error as exc:
        ap.error(f"--metric: {exc}")
    if metric.groups != 1:
        ap.error("--metric needs exactly one group, the figure")
    if args.rounds < 1 or not args.timeout > 0:
        ap.error("--rounds must be at least 1 and --timeout above 0")
    if args.base.startswith("-"):
        ap.error(f"--base: {args.base!r} is not a revision")
    repo = args.repo.resolve()
    with tempfile.TemporaryDirectory(prefix="stallscope-ab-") as tmp:
        base = Path(tmp) / "base"
        add = subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", str(base), args.base],
            capture_output=True,
            text=True,
        )
        if add.returncode != 0:
            print(f"ab: cannot check out {args.base}: {add.stderr.strip()}", file=sys.stderr)
            return 1
        try:
            return _rounds(cmd, base, repo, metric, args.rounds, args.timeout, args.base)
        finally:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(base)],
                capture_output=True,
            )


def _rounds(
    cmd: list[str],
    base: Path,
    head: Path,
    metric: re.Pattern[str],
    rounds: int,
    timeout: float,
    base_name: str,
) -> int:
    ratios = []
    print(f"A = {base_name}, B = the working tree; command: {' '.join(cmd)}", flush=True)
    for i in range(rounds):
        order = [("A", base), ("B", head)] if i % 2 == 0 else [("B", head), ("A", base)]
        got: dict[str, float] = {}
        for name, tree in order:
            try:
                got[name] = figure(cmd, tree, metric, timeout)
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
                print(f"ab: round {i + 1}, {name}: {exc}", file=sys.stderr)
                return 1
        ratio = got["B"] / got["A"] if got["A"] else float("nan")
        ratios.append(ratio)
        print(
            f"round {i + 1} ({''.join(n for n, _ in order)}): A {got['A']:g}  B {got['B']:g}  "
            f"B/A {ratio:.3f}",
            flush=True,
        )
    print(f"median B/A over {rounds} rounds: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
