"""Where a suite run's time went, per test file, from the JUnit XML files scripts/test.sh
writes (artifacts/pytest-parallel.xml, artifacts/pytest-exclusive.xml): each file's seconds
(setup, call and teardown of its tests) and test count, longest first, and each pass's sum.

    .venv/bin/python scripts/suite_times.py artifacts/pytest-parallel.xml [--top 30]

With ``--dist loadfile`` a worker runs whole files: the parallel pass lasts at least as long as
its longest file, and about half its sum when the two workers finish together."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def per_file(path: str) -> dict[str, tuple[float, int]]:
    """{test file: (seconds, tests)} of one JUnit XML file."""
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = (case.get("classname") or "").split(".")  # tests.unit.test_x[.TestClass]
        cut = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        name = case.get("file") or "/".join(parts[: cut + 1]) + ".py"
        seconds[name] += float(case.get("time") or 0.0)
        count[name] += 1
    return {name: (seconds[name], count[name]) for name in seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml", nargs="+", help="JUnit XML files (pytest --junitxml)")
    ap.add_argument("--top", type=int, default=30, help="files to list per XML file")
    args = ap.parse_args(argv)
    for path in args.xml:
        files = per_file(path)
        total = sum(s for s, _ in files.values())
        print(f"{path}: {total:.0f} s in {sum(n for _, n in files.values())} tests")
        for name, (s, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"  {s:7.1f} s  {n:4d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
