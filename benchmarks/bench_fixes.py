"""Do the fixes deliver what the diagnosis promises? Estimated vs measured speed-up.

    .venv/bin/python benchmarks/bench_fixes.py [--seconds 20] [--repeat 1]

For each CPU scenario with a fix (docs/scenarios.md): run the trainer under `stallscope run`,
read the verdict's est_speedup and first fix, apply the fix, run again, and measure the speed-up
with `stallscope compare` (samples/s from the probe). Prints estimated, measured and their
ratio; the goal (issue 15) is |measured − estimated| ≤ 25% of the estimate; for
`input_bound.epoch_start` the estimate is a lower bound (measured ≥ 75% of it).
Timings move with the machine's load: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "train_cpu.py")

#: (name, before, after given the first fix's text)
SCENARIOS = (
    (
        "prep stall",
        ["--prep-cost", "40", "--workers", "1", "--model", "tiny"],
        lambda fix: [
            "--prep-cost",
            "40",
            "--model",
            "tiny",
            "--workers",
            re.match(r"num_workers 1 → (\d+)", fix).group(1),
        ],
    ),  # type: ignore[union-attr]
    (
        "epoch-boundary stall",
        [
            "--files",
            "400",
            "--workers",
            "2",
            "--prep-cost",
            "0",
            "--worker-init-s",
            "1.5",
            "--no-persistent",
        ],
        lambda _fix: [
            "--files",
            "400",
            "--workers",
            "2",
            "--prep-cost",
            "0",
            "--worker-init-s",
            "1.5",
        ],
    ),
)


def stallscope(*args: str) -> list[str]:
    return [sys.executable, "-m", "stallscope", *args]


def one_run(out: Path, seconds: float, train_args: list[str]) -> Path:
    before = set(out.iterdir()) if out.exists() else set()
    subprocess.run(
        [
            *stallscope(
                "run",
                "--interval",
                "1",
                "--quiet",
                "--out",
                str(out),
                "--",
                sys.executable,
                TRAIN,
                "--max-seconds",
                str(seconds),
                "--epochs",
                "100",
                *train_args,
            )
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    [new] = set(out.iterdir()) - before
    return new


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    print(f"{'scenario':24s} {'first fix':34s} {'estimated':>9s} {'measured':>9s} {'ratio':>6s}")
    ok = True
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        for _ in range(args.repeat):
            for name, before, after in SCENARIOS:
                a = one_run(out, args.seconds, before)
                doc = json.loads(
                    subprocess.run(
                        stallscope("diagnose", str(a), "--json"),
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                )
                top = doc["findings"][0]
                fix = top["fixes"][0]["action"]
                try:
                    b_args = after(fix)
                except AttributeError:
                    print(f"{name:24s} {fix[:34]:34s} (first fix is not more workers: skipped)")
                    continue
                b = one_run(out, args.seconds, b_args)
                cmp = json.loads(
                    subprocess.run(
                        stallscope("compare", str(a), str(b), "--json"),
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                )
                est, got = top["est_speedup"], cmp["speedup"]
                lower = top["kind"] == "input_bound.epoch_start"
                hit = got >= 0.75 * est if lower else abs(got - est) <= 0.25 * est
                ok &= hit
                note = " (estimate is a lower bound)" if lower else ""
                print(
                    f"{name:24s} {fix[:34]:34s} {est:>8.2f}x {got:>8.2f}x {got / est:>6.2f}"
                    f"  {'OK' if hit else 'MISSED'}{note}"
                )
    print("goal: within ±25% of the estimate" + ("" if ok else " — MISSED on this machine"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
