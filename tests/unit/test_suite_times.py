"""scripts/suite_times.py: each test file's seconds and CPU seconds from a JUnit XML file, as
scripts/test.sh leaves them in artifacts/ (the CPU from tests/conftest.py's ``cpu_s``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import ROOT

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.unit.test_a" name="test_one" time="1.5">
  <properties><property name="cpu_s" value="1.25"/></properties></testcase>
<testcase classname="tests.unit.test_a" name="test_two" time="0.5">
  <properties><property name="cpu_s" value="0.25"/></properties></testcase>
<testcase classname="tests.scenarios.test_b.TestK" name="test_three" time="9.0">
  <properties><property name="cpu_s" value="not a number"/></properties></testcase>
<testcase classname="tests.integration.test_c" name="test_four" time="3.0"/>
</testsuite></testsuites>
"""


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("suite_times", ROOT / "scripts/suite_times.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_seconds_and_cpu_are_summed_per_file(tmp_path: Path) -> None:
    xml = tmp_path / "p.xml"
    xml.write_text(XML)
    files = _script().per_file(str(xml))
    assert files == {
        "tests/unit/test_a.py": (2.0, 2, 1.5),
        # a value that is not a number is left out; a file without any has no CPU figure
        "tests/scenarios/test_b.py": (9.0, 1, None),
        "tests/integration/test_c.py": (3.0, 1, None),
    }


def test_by_cpu_orders_the_files_by_their_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    xml = tmp_path / "p.xml"
    xml.write_text(XML)
    assert _script().main([str(xml), "--by", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{xml}: 14 s in 4 tests, 2 CPU-s"
    assert "tests/unit/test_a.py" in lines[1] and "1.5 CPU-s" in lines[1]
    assert lines[2].endswith("tests/scenarios/test_b.py") and "CPU-s" not in lines[2]
