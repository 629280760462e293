"""Where a suite run's time went, per test file, from the JUnit XML files scripts/test.sh
writes (artifacts/pytest-parallel.xml, artifacts/pytest-exclusive.xml): each file's seconds
(setup, call and teardown of its tests), its CPU seconds and test count, longest first, and each
pass's sums. The CPU is the JUnit property ``cpu_s`` that tests/conftest.py records per test (the
pytest process's own and that of the children it waited for): the parallel pass runs three
workers on two cores and is bound by CPU, so a file's CPU, not its seconds, is what it costs
the pass. ``--by cpu`` orders by it.

    .venv/bin/python scripts/suite_times.py artifacts/pytest-parallel.xml [--top 30]

With ``--dist loadfile`` a worker runs whole files: the parallel pass lasts at least as long as
its longest file, and about half its sum when the two workers finish together."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def per_file(path: str) -> dict[str, tuple[float, int, float | None]]:
    """{test file: (seconds, tests, CPU seconds or None where no test recorded it)} of one
    JUnit XML file."""
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    cpu: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = (case.get("classname") or "").split(".")  # tests.unit.test_x[.TestClass]
        cut = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        name = case.get("file") or "/".join(parts[: cut + 1]) + ".py"
        seconds[name] += float(case.get("time") or 0.0)
        count[name] += 1
        for prop in case.iter("property"):
            if prop.get("name") == "cpu_s":
                try:
                    cpu[name] = cpu.get(name, 0.0) + float(prop.get("value") or "")
                except ValueError:
                    continue
    return {name: (seconds[name], count[name], cpu.get(name)) for name in seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml", nargs="+", help="JUnit XML files (pytest --junitxml)")
    ap.add_argument("--top", type=int, default=30, help="files to list per XML file")
    ap.add_argument("--by", choices=("time", "cpu"), default="time", help="order of the files")
    args = ap.parse_args(argv)
    for path in args.xml:
        files = per_file(path)
        total = sum(s for s, _, _ in files.values())
        cpus = [c for _, _, c in files.values() if c is not None]
        head = f"{path}: {total:.0f} s in {sum(n for _, n, _ in files.values())} tests"
        if cpus:
            head += f", {sum(cpus):.0f} CPU-s"
        print(head)
        col = 2 if args.by == "cpu" else 0
        ranked = sorted(files.items(), key=lambda kv: -(kv[1][col] or 0.0))
        for name, (s, n, c) in ranked[: args.top]:
            used = f"{c:7.1f} CPU-s" if c is not None else " " * 13
            print(f"  {s:7.1f} s  {used}  {n:4d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
