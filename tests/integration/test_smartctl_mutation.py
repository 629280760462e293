"""Mutation fuzz of `disk --smartctl-json` over the recorded smartctl documents.

Every recorded ``tests/fixtures/smartctl-*.json`` is mutated deterministically (seed below) in
eleven ways — keys deleted; values replaced by a string, an int, a list, a dict, null, a huge
int, a NaN-ish string or number, a deeply nested value; the text truncated; bytes flipped — and
each mutated document goes the whole way the CLI takes it: written to a file, read and parsed by
``_from_files`` (what ``disk --smartctl-json`` calls), then rendered as the terminal text and as
the ``--json`` document, and given an exit status. No exception may escape, the verdict must be
one of ok/ageing/failing/unknown, the JSON must be strict JSON, and the exit status 0, 1 or 3.
A handful of them also go through the real CLI in a subprocess.
"""

from __future__ import annotations

import copy
import io
import json
import random
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, json_paths, print_drives, stallscope_argv
from rich.console import Console

from stallscope.cli import disk

SEED = 20261123
PER_CATEGORY = 200
VERDICTS = {"ok", "ageing", "failing", "unknown"}
TEXTS = {p.name: p.read_bytes() for p in sorted(FIXTURES.glob("smartctl-*.json"))}
DOCS = {name: json.loads(text) for name, text in TEXTS.items()}


PATHS = {name: json_paths(doc) for name, doc in DOCS.items()}


DEEP = "__stallscope_deep__"


def _nested_text(depth: int, leaf: str) -> str:
    """JSON text of a value nested ``depth`` deep (built as text: the encoder would recurse)."""
    opens = "".join("[" if i % 2 else '{"table":' for i in range(depth))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(depth)))
    return opens + leaf + closes


NAN_ISH = [
    "NaN",
    "nan",
    "-inf",
    "Infinity",
    "1e999",
    "-1e999",
    "0x10",
    "١٢٣",
    " 42 ",
    "4_2",
    "",
    "null",
    "None",
    "true",
    "−5",
    "1e-400",
    "9" * 5000,
]

#: category -> value to put at a random path (None: a structural mutation handled below)
REPLACE: dict[str, Callable[[random.Random], Any]] = {
    "to_str": lambda r: r.choice(
        ["", "x", "0", "-1", "[bold]red[/bold]", "\x1b[2J\x07", "A" * r.randint(1, 5000)]
    ),
    "to_int": lambda r: r.choice([0, -1, 1, 255, -(2**31), 2**31, 7]),
    "to_list": lambda r: r.choice([[], [None], [1, "a", {}], [[[]]]]),
    "to_dict": lambda r: r.choice([{}, {"value": "x"}, {"raw": {"value": -1}}, {"": None}]),
    "to_null": lambda r: None,
    "huge_int": lambda r: r.choice([2**64, -(2**63) - 1, 10**300, -(10**300), 2**1000]),
    "nan_ish": lambda r: r.choice([*NAN_ISH, float("nan"), float("inf"), float("-inf"), -0.0]),
    "deep_nesting": lambda r: DEEP,  # replaced in the text by _nested_text
}
CATEGORIES = ["delete_key", *REPLACE, "truncate_text", "flip_bytes"]


def mutations(
    seed: int = SEED, per_category: int = PER_CATEGORY
) -> Iterator[tuple[str, str, bytes]]:
    """(category, description, document bytes), deterministic for a seed."""
    rng = random.Random(seed)
    names = sorted(DOCS)
    for cat in CATEGORIES:
        for i in range(per_category):
            name = names[i % len(names)]
            if cat == "truncate_text":
                text = TEXTS[name]
                cut = rng.randrange(len(text))
                yield cat, f"{name}[:{cut}]", text[:cut]
                continue
            if cat == "flip_bytes":
                data = bytearray(TEXTS[name])
                flips = []
                for _ in range(rng.randint(1, 8)):
                    at = rng.randrange(len(data))
                    data[at] ^= 1 << rng.randrange(8)
                    flips.append(at)
                yield cat, f"{name} flipped at {flips}", bytes(data)
                continue
            doc = copy.deepcopy(DOCS[name])
            done = []
            for _ in range(rng.randint(1, 3)):  # one to three mutations of this kind
                paths = json_paths(doc) if done else PATHS[name]
                if not paths:
                    break
                path = rng.choice(paths)
                parent = doc
                for k in path[:-1]:
                    parent = parent[k]
                if cat == "delete_key":
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = REPLACE[cat](rng)
                done.append("/".join(map(str, path)))
            text = json.dumps(doc)
            if cat == "deep_nesting":
                depth = rng.choice([50, 200, 600, 900, 5000, 100_000])
                text = text.replace(f'"{DEEP}"', _nested_text(depth, rng.choice(["1", '"x"'])))
                done.append(f"depth {depth}")
            yield cat, f"{name} {cat} at {done}", text.encode()


def check_one(path: Path) -> str | None:
    """Run one saved document the way `disk --smartctl-json FILE [--json]` does; None when all
    is well, else what went wrong."""
    drives = disk._from_files([str(path)])
    if not drives or any(d.verdict not in VERDICTS for d in drives):
        return f"verdict {[d.verdict for d in drives]}"
    doc = {"drives": [d.to_json() for d in drives]}
    json.loads(json.dumps(doc, indent=2, allow_nan=False))  # strict JSON, as --json prints
    print_drives(Console(file=io.StringIO(), width=100, color_system=None), drives)
    code = disk._exit_status(drives, saved=True)
    if code not in (0, 1, 3):
        return f"exit status {code}"
    return None


def run_all(
    tmp: Path, seed: int = SEED, per_category: int = PER_CATEGORY
) -> tuple[Counter[str], dict[str, list[str]]]:
    tried: Counter[str] = Counter()
    failed: dict[str, list[str]] = {}
    for n, (cat, what, data) in enumerate(mutations(seed, per_category)):
        tried[cat] += 1
        path = tmp / f"m{n}.json"
        path.write_bytes(data)
        try:
            problem = check_one(path)
        except Exception as exc:  # counted and reported below
            problem = f"{type(exc).__name__}: {str(exc)[:200]}"
        if problem is not None:
            failed.setdefault(cat, []).append(f"{what}: {problem}")
        path.unlink()
    return tried, failed


def test_mutation_count_is_deterministic() -> None:
    a = [(c, w) for c, w, _ in mutations(SEED, 5)]
    b = [(c, w) for c, w, _ in mutations(SEED, 5)]
    assert a == b and len(a) == 5 * len(CATEGORIES)


@pytest.mark.slow
def test_mutated_documents_never_crash(tmp_path: Path) -> None:
    t0 = time.monotonic()
    tried, failed = run_all(tmp_path)
    took = time.monotonic() - t0
    assert sum(tried.values()) >= 2000 and set(tried) == set(CATEGORIES)
    assert not failed, {k: (len(v), v[:3]) for k, v in failed.items()}
    assert took < 60, f"{took:.1f} s for {sum(tried.values())} documents"


def _cli_cases() -> list[tuple[str, str, bytes]]:
    picked: dict[str, tuple[str, str, bytes]] = {}
    for cat, what, data in mutations(SEED + 1, 3):
        picked.setdefault(cat, (cat, what, data))
    return list(picked.values())


@pytest.mark.parametrize("case", _cli_cases(), ids=lambda c: c[0])
def test_mutated_documents_through_the_cli(tmp_path: Path, case: tuple[str, str, bytes]) -> None:
    _cat, what, data = case
    path = tmp_path / "doc.json"
    path.write_bytes(data)
    for extra in ([], ["--json"]):
        proc = subprocess.run(
            stallscope_argv("disk", "--smartctl-json", str(path), *extra),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "Traceback" not in proc.stderr, (what, proc.stderr[-2000:])
        assert proc.returncode in (0, 1, 3), (what, proc.returncode, proc.stderr)
        if extra:
            doc = json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(c))
            assert {d["verdict"] for d in doc["drives"]} <= VERDICTS
