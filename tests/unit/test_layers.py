"""The package's shape, held: no import cycle (module-level or inside functions; imports under
``if TYPE_CHECKING:`` are annotations and do not count), no import from a lower layer to a
higher one (docs/architecture.md "Layers"), no function over 80 lines, no module over 800."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from conftest import ROOT as REPO

ROOT = REPO / "stallscope"

#: top-level part of the package -> layer; a module may import only its own layer or lower ones
LAYER = {
    "errors": 0,
    "version": 0,
    "stats": 0,
    "metrics": 0,
    "labels": 0,
    "textsafe": 0,
    "safefile": 0,
    "tomlfile": 0,
    "py": 0,
    "forksafe": 0,
    "loadermodel": 0,
    "units": 0,
    "envvars": 0,
    "httpsafe": 0,
    "store": 1,
    "sources": 2,
    "collect": 3,
    "analysis": 4,
    "alerts": 5,
    "probe": 6,
    "integrations": 7,
    "report": 7,
    "live": 7,
    "agent": 7,
    "tuner": 7,
    "tools": 7,
    "testing": 7,
    "cli": 8,
    "__main__": 8,
    "inject": 8,
    "": 9,
}
MAX_LINES = 80
#: a module longer than this holds more than one thing: split it by what it holds
MAX_MODULE_LINES = 800


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ["stallscope", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (annotations only, never imported)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)
    return out


def _imports(mod: str, path: Path) -> set[str]:
    """The package's modules that ``mod`` imports anywhere in its text (the longest known
    prefix of each name; a module's own package parents are not counted)."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base) + (f".{node.module}" if node.module else "")
            else:
                target = node.module or ""
            names = [target, *(f"{target}.{a.name}" for a in node.names)]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):
                found.add(name)
    return found


@functools.cache
def graph() -> dict[str, set[str]]:
    """Each module's imports of the package (parsed on first use, by the tests that read it:
    built at import, it cost every pytest process that collects this file ~1 s of CPU, three
    xdist workers of the parallel pass among them)."""
    return {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(mod: str) -> tuple[str, int]:
    part = mod.split(".")[1] if "." in mod else ""
    return part, LAYER[part]


def test_every_part_has_a_layer() -> None:
    assert {_layer(m)[0] for m in MODULES} <= set(LAYER)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle a depth-first walk of ``graph`` meets, each as the modules around it
    (the first repeated at the end)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append([*path[path.index(t) :], t])
            elif t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_the_cycle_finder_finds_cycles() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    cycles = import_cycles(graph())
    assert cycles == [], [" -> ".join(c) for c in cycles]


def test_imports_point_down() -> None:
    up = []
    for m, targets in graph().items():
        part, layer = _layer(m)
        for t in targets:
            t_part, t_layer = _layer(t)
            if t_part != part and t_layer > layer and t != "stallscope":
                up.append(f"{m} ({part}) imports {t} ({t_part})")
    assert not up, up


def test_no_function_over_80_lines() -> None:
    long = [
        f"{p.relative_to(ROOT.parent)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1})"
        for p in MODULES.values()
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (n.end_lineno or n.lineno) - n.lineno + 1 > MAX_LINES
    ]
    assert not long, long


def test_no_module_over_800_lines() -> None:
    long = [
        f"{p.relative_to(ROOT.parent)} ({n})"
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, long
