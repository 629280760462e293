"""What a rule reads and compares against, read off its code: the facts it reads
(``fx.<domain>.<fact>``, ``fx.evidence("<fact>", ...)``) and the named thresholds (module
constants in UPPER_CASE that are numbers), through every helper of the rules it calls, however
deep. :class:`~stallscope.analysis.diagnose.rules.RuleSpec` declares its facts (``reads``) and a
test holds the declaration to this reading; docs/diagnosis.md's table of rules, thresholds and
kinds is generated from the specs (:func:`rules_table`) and a test holds the document to it."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from functools import cache
from typing import Any

__all__ = ["facts_read", "series_read", "thresholds_of"]

_PACKAGE = "stallscope.analysis"


@cache
def _tree(fn: Callable[..., Any]) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(fn)))


def _callees(fn: Callable[..., Any]) -> list[Callable[..., Any]]:
    """The functions of the analysis package that ``fn`` calls by name."""
    module = vars(sys.modules[fn.__module__])
    out: list[Callable[..., Any]] = []
    for node in ast.walk(_tree(fn)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            target = module.get(node.func.id)
            if (
                isinstance(target, types.FunctionType)
                and target.__module__.startswith(_PACKAGE)
                and target is not fn
            ):
                out.append(target)
    return out


def _reach(fn: Callable[..., Any]) -> list[Callable[..., Any]]:
    seen: dict[Any, Callable[..., Any]] = {}
    todo = [fn]
    while todo:
        f = todo.pop()
        if f.__code__ in seen:
            continue
        seen[f.__code__] = f
        todo.extend(_callees(f))
    return list(seen.values())


def facts_read(fn: Callable[..., Any]) -> frozenset[str]:
    """The facts a rule reads, its helpers included."""
    from stallscope.analysis.facts import WHERE

    out: set[str] = set()
    for f in _reach(fn):
        for node in ast.walk(_tree(f)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in WHERE
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == WHERE[node.attr]
            ):
                out.add(node.attr)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("evidence", "get")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "fx"
            ):
                out.update(
                    a.value for a in node.args if isinstance(a, ast.Constant) and a.value in WHERE
                )
    return frozenset(out)


def thresholds_of(fn: Callable[..., Any]) -> dict[str, float]:
    """The named numbers a rule compares against, its helpers' included: UPPER_CASE module
    constants each function names, by name (a bool is not a threshold)."""
    out: dict[str, float] = {}
    for f in _reach(fn):
        module = vars(sys.modules[f.__module__])
        for name in f.__code__.co_names + tuple(
            n for c in f.__code__.co_consts if isinstance(c, types.CodeType) for n in c.co_names
        ):
            v = module.get(name)
            if not name.isupper():
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[name] = float(v)
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                # a named set of lines (rules/input.py SCORES): each of its numbers
                for fld in dataclasses.fields(v):
                    x = getattr(v, fld.name)
                    if isinstance(x, (int, float)) and not isinstance(x, bool):
                        out[f"{name}.{fld.name}"] = float(x)
    return dict(sorted(out.items()))


def series_read(fn: Callable[..., Any]) -> frozenset[str]:
    """The run's series a rule reads itself (``data.get("gpu.temp_c", ...)``, ``data.all``,
    ``data.metric``: names given as text), its helpers included."""
    out: set[str] = set()
    for f in _reach(fn):
        for node in ast.walk(_tree(f)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "all", "metric")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("data", "full")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and "." in node.args[0].value
            ):
                out.add(node.args[0].value)
    return frozenset(out)


START, END = "<!-- rules-table:start -->", "<!-- rules-table:end -->"


def rules_table() -> str:
    """docs/diagnosis.md's table of rules, generated from the specs: each rule in the order it
    runs, the kinds it may report, the facts and series it reads and its thresholds."""
    from stallscope.analysis.diagnose.rules import RULES

    def cell(xs: list[str]) -> str:
        return ", ".join(xs) if xs else "-"

    rows = ["| rule | kinds | reads (facts; series) | thresholds |", "| --- | --- | --- | --- |"]
    for spec in RULES:
        reads = cell([f"`{r}`" for r in spec.reads])
        if spec.series:
            reads += "; " + cell([f"`{x}`" for x in spec.series])
        limits = cell([f"`{k}` {v:g}" for k, v in spec.thresholds.items()])
        rows.append(
            f"| `{spec.name}` | {cell([f'`{k.value}`' for k in spec.kinds])} | {reads} | {limits} |"
        )
    return "\n".join(rows) + "\n"


def write_table(path: str) -> bool:
    """Put :func:`rules_table` between the markers of ``path``; True when it changed."""
    from pathlib import Path

    doc = Path(path).read_text()
    head, _, rest = doc.partition(START)
    _, _, tail = rest.partition(END)
    new = f"{head}{START}\n{rules_table()}{END}{tail}"
    if new != doc:
        Path(path).write_text(new)
    return new != doc


if __name__ == "__main__":  # python -m stallscope.analysis.diagnose.rules.declared --write FILE
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        print("updated" if write_table(sys.argv[2]) else "unchanged", sys.argv[2])
    else:
        print(rules_table(), end="")
