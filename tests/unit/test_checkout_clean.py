"""Tests write only to temporary folders (issue 49: `scripts/test.sh --fast` left a run in the
checkout's ./stallscope-runs, and the user's `show latest` showed it). conftest.py's session
check (pytest_sessionfinish) and each test's own (``_nothing_left_in_the_checkout``) rest on
:func:`conftest.leaks`, checked here on folders and an index made for the purpose."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import CHECKOUT_RUNS, ROOT, index_lines, leaks, run_folders


def test_a_new_run_folder_in_the_checkout_is_a_leak() -> None:
    found = leaks({"old-run"}, {"old-run", "20261129-101500-train.py"}, [], [], (ROOT,))
    assert found == [
        f"{CHECKOUT_RUNS / '20261129-101500-train.py'}: a run folder left in the checkout"
    ]
    assert leaks({"old-run"}, {"old-run"}, [], [], (ROOT,)) == []
    # a run the user removed meanwhile is no leak either
    assert leaks({"old-run"}, set(), [], [], (ROOT,)) == []


def test_index_lines_naming_a_tests_run_are_leaks_the_users_own_are_not(tmp_path: Path) -> None:
    """A line added to the real user's index naming a run under the session's temporary folders
    or the checkout is the suite's; one naming another folder (someone's run in /tmp/h50 beside
    the suite) is the user's own."""
    base = tmp_path / "pytest-of-me" / "pytest-7"
    before = ["/home/me/runs/20261128-090000-train"]
    after = [
        *before,
        str(base / "popen-gw1" / "test_x0" / "stallscope-runs" / "r1"),
        "/tmp/h50/out/20261129-035437-train",
        str(ROOT / "stallscope-runs" / "r2"),
        "",
    ]
    found = leaks(set(), set(), before, after, (base, ROOT))
    assert found == [
        f"{after[1]}: added to the user's run index",
        f"{after[3]}: added to the user's run index",
    ]
    assert leaks(set(), set(), after, after, (base, ROOT)) == []


def test_folders_and_indexes_that_cannot_be_read_are_empty(tmp_path: Path) -> None:
    assert run_folders(tmp_path / "none") == set()
    (tmp_path / "runs" / "a").mkdir(parents=True)
    assert run_folders(tmp_path / "runs") == {"a"}
    assert index_lines(tmp_path / "none.txt") == []
    (tmp_path / "runs.txt").write_text("/x/a\n/x/b\n")
    assert index_lines(tmp_path / "runs.txt") == ["/x/a", "/x/b"]


def test_the_session_check_is_installed(pytestconfig: pytest.Config) -> None:
    """The session's first process noted the checkout's runs and the user's index before any
    test ran (an xdist worker's check is its tests' own, per test)."""
    import conftest

    noted = pytestconfig.stash.get(conftest._BEFORE, None)
    if hasattr(pytestconfig, "workerinput"):
        assert noted is None
    else:
        assert noted is not None
        runs, index, _lines = noted
        assert runs == run_folders() and index.name == "runs.txt"
        assert not index.is_relative_to(Path(os.environ["STALLSCOPE_STATE_DIR"]))
