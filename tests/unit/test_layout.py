"""The test folders and the markers say the same thing (tests/README.md): no test file directly
in tests/; none of tests/unit/ carries a heavy marker or starts a process, a server or a tool;
every test in tests/scenarios/ is marked ``slow``, and a file whose every test is ``slow`` is in
tests/scenarios/. The markers are read from the source with ``ast`` (``@pytest.mark.X`` on a
test or its class, a module's or a class's ``pytestmark``), never by running the tests."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from conftest import LONG, TESTS_DIR

TIERS = ("unit", "integration", "scenarios")
#: markers of tests that start a heavy real component, run long, need the machine alone, root
#: or a GPU: none of them in tests/unit/ (``scripts/test.sh --fast`` leaves them all out)
HEAVY = frozenset({*LONG, "exclusive", "root", "gpu"})
#: what a unit test never does (it runs in the test's own process): modules that start
#: processes or servers, the os calls that do, and conftest's helpers for children and tools
NO_PROCESS_MODULES = frozenset(
    {"subprocess", "multiprocessing", "socket", "socketserver", "http.server", "pty"}
)
NO_PROCESS_CALLS = frozenset(
    {
        "fork",
        "forkpty",
        "system",
        "popen",
        "posix_spawn",
        "posix_spawnp",
        "spawnl",
        "spawnv",
        "spawnve",
        "execv",
        "execve",
    }
)
NO_PROCESS_HELPERS = frozenset({"stallscope_argv", "terminate", "tool_missing"})


def mark_name(node: ast.expr) -> str | None:
    """X of ``pytest.mark.X`` or ``pytest.mark.X(...)``, else None."""
    if isinstance(node, ast.Call):
        node = node.func
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "pytest"
    ):
        return node.attr
    return None


def marks_of(nodes: Iterable[ast.expr]) -> set[str]:
    """The markers a list of decorators or a ``pytestmark`` value applies (a list or one)."""
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.List | ast.Tuple):
            out |= marks_of(node.elts)
        elif (name := mark_name(node)) is not None:
            out.add(name)
    return out


def pytestmark_of(body: list[ast.stmt]) -> set[str]:
    """The markers of a module's or a class's ``pytestmark = ...``."""
    return {
        m
        for stmt in body
        if isinstance(stmt, ast.Assign | ast.AnnAssign)
        for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
        if isinstance(target, ast.Name) and target.id == "pytestmark" and stmt.value
        for m in marks_of([stmt.value])
    }


def marks_per_test(tree: ast.Module) -> dict[str, set[str]]:
    """Each test function (``test*``, at module level or in a ``Test*`` class) with the markers
    it carries: its own, its class's and its module's."""
    module = pytestmark_of(tree.body)
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            out[node.name] = module | marks_of(node.decorator_list)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            cls = module | marks_of(node.decorator_list) | pytestmark_of(node.body)
            for item in node.body:
                if isinstance(
                    item, ast.FunctionDef | ast.AsyncFunctionDef
                ) and item.name.startswith("test"):
                    out[f"{node.name}.{item.name}"] = cls | marks_of(item.decorator_list)
    return out


def process_starts(tree: ast.Module) -> set[str]:
    """What in a file starts a process, a server or a tool (NO_PROCESS_*), by name."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in NO_PROCESS_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in NO_PROCESS_MODULES:
                found.add(node.module)
            elif node.module == "os":
                found |= {f"os.{a.name}" for a in node.names if a.name in NO_PROCESS_CALLS}
            elif node.module == "conftest":
                found |= {a.name for a in node.names if a.name in NO_PROCESS_HELPERS}
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in NO_PROCESS_CALLS
        ):
            found.add(f"os.{node.attr}")
    return found


def layout_problems(tests_dir: Path) -> list[str]:
    """Every way the test files under ``tests_dir`` break the rules of tests/README.md."""
    problems = [
        f"{p.relative_to(tests_dir)}: a test file directly in tests/; move it to one "
        f"of {', '.join(TIERS)}"
        for p in sorted(tests_dir.glob("test_*.py"))
    ]
    for path in sorted(tests_dir.rglob("test_*.py")):
        rel = path.relative_to(tests_dir)
        if len(rel.parts) == 1:
            continue
        tier = rel.parts[0]
        if tier not in TIERS or len(rel.parts) != 2:
            problems.append(f"{rel}: test files go in tests/{{{','.join(TIERS)}}}/, one level")
            continue
        tree = ast.parse(path.read_text(), str(path))
        tests = marks_per_test(tree)
        all_slow = bool(tests) and all("slow" in m for m in tests.values())
        if tier == "unit":
            # anywhere in the file: a test's decorator, a pytest.param's marks, an alias
            heavy = sorted(
                {
                    name
                    for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and (name := mark_name(node)) in HEAVY
                }
            )
            if heavy:
                problems.append(
                    f"{rel}: marked {', '.join(heavy)}: not a unit test (see "
                    "tests/README.md: integration or scenarios)"
                )
            if starts := process_starts(tree):
                problems.append(
                    f"{rel}: uses {', '.join(sorted(starts))}: a unit test runs in "
                    "the test's process; this one belongs in tests/integration/"
                )
        elif tier == "scenarios":
            if not tests:
                problems.append(f"{rel}: no tests")
            for name, marks in tests.items():
                if "slow" not in marks:
                    problems.append(f"{rel}::{name}: not marked slow, in tests/scenarios/")
        elif all_slow:
            problems.append(f"{rel}: every test is marked slow: it belongs in tests/scenarios/")
    return problems


def test_the_folders_and_the_markers_agree() -> None:
    assert layout_problems(TESTS_DIR) == []
    for tier in TIERS:
        assert list((TESTS_DIR / tier).glob("test_*.py")), f"tests/{tier}/ has no test file"


def test_the_layout_check_finds_each_misplaced_file(tmp_path: Path) -> None:
    """The check above can fail: a tree that breaks each rule once gets one problem each."""
    files = {
        "test_back_in_tests.py": "def test_a():\n    pass\n",
        "unit/test_ok.py": "import os\n\ndef test_a():\n    assert os.sep\n",
        "unit/test_heavy.py": "import pytest\n\n@pytest.mark.prometheus\ndef test_a():\n    pass\n",
        "unit/test_param.py": "import pytest\n\n@pytest.mark.parametrize('x', [1, pytest.param("
        "2, marks=pytest.mark.slow)])\ndef test_a(x):\n    pass\n",
        "unit/test_child.py": "import subprocess\n\ndef test_a():\n    subprocess.run(['true'])\n",
        "unit/test_fork.py": "import os\n\ndef test_a():\n    os.fork()\n",
        "unit/test_cli.py": "from conftest import stallscope_argv\n\ndef test_a():\n    pass\n",
        "integration/test_ok.py": "import pytest\n\n@pytest.mark.slow\ndef test_a():\n    pass\n\n"
        "def test_b():\n    pass\n",
        "integration/test_all_slow.py": "import pytest\n\npytestmark = [pytest.mark.slow]\n\n"
        "def test_a():\n    pass\n",
        "scenarios/test_ok.py": "import pytest\n\npytestmark = pytest.mark.slow\n\n"
        "class TestA:\n    def test_a(self):\n        pass\n",
        "scenarios/test_class.py": "import pytest\n\n@pytest.mark.slow\nclass TestA:\n"
        "    def test_a(self):\n        pass\n",
        "scenarios/test_quick.py": "import pytest\n\n@pytest.mark.slow\ndef test_a():\n    pass\n\n"
        "def test_b():\n    pass\n",
        "elsewhere/test_x.py": "def test_a():\n    pass\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = layout_problems(tmp_path)
    assert [p.split(":")[0] for p in found] == [
        "test_back_in_tests.py",
        "elsewhere/test_x.py",
        "integration/test_all_slow.py",
        "scenarios/test_quick.py",
        "unit/test_child.py",
        "unit/test_cli.py",
        "unit/test_fork.py",
        "unit/test_heavy.py",
        "unit/test_param.py",
    ], found
    assert "scenarios/test_quick.py::test_b: not marked slow" in " ".join(found)
