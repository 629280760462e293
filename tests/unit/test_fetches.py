"""The workers' batch costs (sources/stacks/fetches.py) and what the loader model makes of them
(loadermodel.in_order_speedup): histograms written and read back, summaries, hostile files."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from stallscope.loadermodel import in_order_speedup, loader_time
from stallscope.sources.stacks import fetches
from stallscope.sources.stacks.fetches import (
    BASE,
    bucket,
    bucket_mid_s,
    cost_summary,
    draw_costs,
    read_histograms,
)


@pytest.mark.parametrize("cost", [2e-5, 0.003, 0.048, 0.43, 7.0])
def test_a_bucket_stands_for_its_costs_within_ten_percent(cost: float) -> None:
    mid = bucket_mid_s(bucket(cost))
    assert abs(mid / cost - 1) <= (BASE**0.5 - 1) + 1e-9


@pytest.mark.parametrize("cost", [0.0, -1.0, float("nan"), 1e-9])
def test_costs_below_the_floor_or_not_numbers_land_in_bucket_zero(cost: float) -> None:
    assert bucket(cost) == 0


def _hist(costs: list[float]) -> dict[int, int]:
    out: dict[int, int] = {}
    for c in costs:
        out[bucket(c)] = out.get(bucket(c), 0) + 1
    return out


def test_a_heavy_tail_shows_in_the_summary_and_costs_alike_do_not() -> None:
    # 2% of 4-sample batches hold a sample 41x slower: ~8% of the batches 11x the median
    tail = _hist([0.048] * 920 + [0.53] * 80)
    flat = _hist([0.09] * 1000)
    t, f = cost_summary([tail]), cost_summary([flat])
    assert t is not None and f is not None
    assert t["batches"] == 1000 and t["p99_ms"] / t["p50_ms"] > 9
    assert t["tail_share"] > 0.25  # the slowest 5% took 6x their share of the loading time
    assert f["p99_ms"] == f["p50_ms"] and f["tail_share"] == pytest.approx(0.05, abs=0.001)
    assert cost_summary([]) is None and cost_summary([{}]) is None


def test_histograms_are_merged_per_pid_and_garbage_lines_are_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "fetches"
    folder.mkdir()
    good = {"ts": 1.0, "pid": 11, "n": 3, "sum_s": 0.1, "b": {"40": 2, "41": 1}}
    lines = [
        json.dumps(good),
        json.dumps({**good, "b": {"40": 5}}),
        "not json",
        json.dumps({**good, "pid": True}),
        json.dumps({**good, "b": {"40": -1}}),
        json.dumps({**good, "b": {"x": 1}}),
        json.dumps({**good, "b": {"99999": 1}}),
        json.dumps([1, 2]),
    ]
    (folder / "11.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "12.jsonl").write_text(json.dumps({**good, "pid": 12}) + "\n")
    os.symlink(folder / "12.jsonl", folder / "13.jsonl")  # a link is not read
    os.mkfifo(folder / "14.jsonl")  # nor a FIFO (it would block)
    assert read_histograms(tmp_path) == {11: {40: 7, 41: 1}, 12: {40: 2, 41: 1}}
    assert read_histograms(tmp_path / "absent") == {}


def test_the_timed_fetch_returns_the_batch_and_appends_its_histogram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Fetcher:
        def fetch(self, index: list[int]) -> list[int]:
            if index == [-1]:
                raise IndexError("no such sample")
            return [i * 2 for i in index]

    mod = types.ModuleType(fetches._MODULE)
    mod._MapDatasetFetcher = Fetcher  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fetches._MODULE, mod)
    monkeypatch.setenv("STALLSCOPE_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(fetches, "RECORDER", fetches._Recorder())
    # hooks an in-process sampler installed on the real DataLoader earlier in this process
    # stay as they are: this test times its own fetcher only
    monkeypatch.setattr(fetches, "_original", [])
    original = Fetcher.fetch
    try:
        assert fetches.install() and fetches.installed()
        assert Fetcher().fetch([1, 2]) == [2, 4]
        with pytest.raises(IndexError):  # passes through, untimed
            Fetcher().fetch([-1])
        fetches.RECORDER.flush()
    finally:
        fetches.uninstall()
    assert Fetcher.fetch is original and not fetches.installed()
    rec = json.loads((tmp_path / "fetches" / f"{os.getpid()}.jsonl").read_text())
    assert rec["pid"] == os.getpid() and rec["n"] == 1 and sum(rec["b"].values()) == 1
    assert read_histograms(tmp_path) == {os.getpid(): {int(k): v for k, v in rec["b"].items()}}


def test_nothing_to_time_without_the_dataloader_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, fetches._MODULE, raising=False)
    monkeypatch.setattr(fetches, "_original", [])
    assert fetches.install() is False and not fetches.installed()


def test_draws_keep_the_distribution_and_are_the_same_every_time() -> None:
    hist = _hist([0.048] * 920 + [0.53] * 80)
    a, b = draw_costs([hist], 3000), draw_costs([hist], 3000)
    assert a == b and len(a) == 3000
    slow = sum(1 for c in a if c > 0.2)
    assert slow == 240  # 8% of the draws, as in the histogram
    assert draw_costs([], 10) == [] and draw_costs([hist], 0) == []


def test_the_loader_model_in_order_matches_its_plain_bounds() -> None:
    # costs alike: W workers deliver W / cost batches a second, the step takes compute each
    assert loader_time([0.1] * 400, 4, 0.0, in_order=True) == pytest.approx(10.0, rel=0.01)
    assert loader_time([0.1] * 400, 4, 0.05, in_order=True) == pytest.approx(20.1, rel=0.01)
    assert in_order_speedup([0.1] * 400, 4, 0.01) == 1.0


def test_slow_samples_in_order_cost_what_any_order_wins_back() -> None:
    costs = draw_costs([_hist([0.048] * 920 + [0.53] * 80)], 3000)
    got = in_order_speedup(costs, 2, 0.016)
    assert got is not None and 1.15 <= got <= 1.6, got
    # more batches prefetched per worker absorb part of a slow batch: less to win
    more = in_order_speedup(costs, 2, 0.016, prefetch_factor=8)
    assert more is not None and more < got
    assert in_order_speedup(costs, 1, 0.016) is None and in_order_speedup([], 2, 0.0) is None
