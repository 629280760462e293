"""Fuzzing the SMART parser: mutated real documents and arbitrary input never crash it; what
it cannot read gets a clear ``unknown`` ("unrecognised ...") verdict instead."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, json_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stallscope.sources.smart import (
    DriveHealth,
    HealthState,
    apply_growth,
    compute_growth,
    explain_series,
    parse_smartctl,
    parse_smartctl_text,
)

DOCS = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("smartctl-*.json"))]
VERDICTS = {"ok", "ageing", "failing", "unknown"}
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _mutate(doc: Any, path: tuple[Any, ...], op: str, value: Any) -> None:
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if op == "delete":
        del parent[key]
    elif op == "replace":
        parent[key] = value
    elif op == "wrap":  # right value, wrong container
        parent[key] = [parent[key]]
    elif op == "stringify":
        parent[key] = str(parent[key])


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(draw(st.sampled_from(DOCS)))
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        paths = json_paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["delete", "replace", "replace", "wrap", "stringify"]))
        _mutate(doc, path, op, draw(json_values))
    return doc


def check_drive(d: DriveHealth) -> None:
    assert isinstance(d, DriveHealth)
    assert d.verdict in VERDICTS
    assert d.reasons and all(isinstance(r, str) and r for r in d.reasons)
    if d.verdict == "unknown":
        assert d.counters == {} or d.smart_passed is None
    text = json.dumps(d.to_json(), allow_nan=False)  # valid JSON for scripts
    assert text
    for v in d.counters.values():
        assert isinstance(v, int) and not isinstance(v, bool)


@FUZZ
@given(mutated_documents())
@pytest.mark.slow
def test_mutated_real_documents(doc: Any) -> None:
    d = parse_smartctl(doc)
    check_drive(d)
    # the rest of the pipeline survives whatever the parser let through
    grown = apply_growth(
        d, compute_growth({k: v - 1 for k, v in d.counters.items()}, d.counters, "t0")
    )
    check_drive(grown)
    for drive in explain_series([d, grown, d]):
        check_drive(drive)


@FUZZ
@given(json_values)
def test_arbitrary_json(value: Any) -> None:
    d = parse_smartctl(value)
    check_drive(d)
    if not isinstance(value, dict):
        assert d.verdict == "unknown" and d.reasons[0].startswith("unrecognised")


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    check_drive(parse_smartctl_text(data))


@FUZZ
@given(st.sampled_from(DOCS), st.integers(min_value=1, max_value=400))
def test_truncated_text(doc: Any, cut: int) -> None:
    text = json.dumps(doc)
    d = parse_smartctl_text(text[: len(text) - cut])
    check_drive(d)
    assert d.verdict == "unknown" and "unrecognised" in d.reasons[0]


def test_deep_nesting() -> None:
    deep: Any = {}
    node = deep
    for _ in range(5000):
        node["device"] = {}
        node = node["device"]
    check_drive(parse_smartctl(deep))
    check_drive(parse_smartctl_text("[" * 100_000 + "]" * 100_000))


def test_nan_and_huge_numbers_stay_out_of_counters() -> None:
    doc = copy.deepcopy(DOCS[0])
    doc["nvme_smart_health_information_log"] = {
        "media_errors": math.nan,
        "percentage_used": 10**30,
        "critical_warning": "16",
    }
    d = parse_smartctl(doc)
    check_drive(d)
    assert "media_errors" not in d.counters


@FUZZ
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_state_file_garbage(tmp_path_factory: Any, data: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("state")) / "smart.json"
    path.write_bytes(data)
    st_ = HealthState.load(path)
    assert isinstance(st_.drives, dict)
    st_.observe(parse_smartctl(DOCS[0]), 1.0)
    st_.save()
    assert HealthState.load(path).note is None
