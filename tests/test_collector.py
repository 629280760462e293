"""Collector: samples sources into the store, survives broken sources and a broken store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stallscope.collector import Collector
from stallscope.sources.base import Source
from stallscope.sources.host import HostSource
from stallscope.store import RunStore


class Broken(Source):
    name = "disk"

    def sample(self, now: float) -> Any:
        raise OSError("device vanished")


def test_broken_source_is_reported_once_then_turned_off(tmp_path: Path) -> None:
    st = RunStore(tmp_path / "run.db")
    host = HostSource()
    host.open()
    c = Collector(st, [host, Broken()], interval=1.0, unavailable={"gpu": "no driver"})
    for _ in range(6):
        c.sample_once()
    events = st.events()
    assert [e["kind"] for e in events if e["source"] == "disk"] == ["error", "disabled"]
    assert any(e["source"] == "gpu" and e["message"] == "no driver" for e in events)
    assert c.samples == 5  # the host kept going (first call primes its counters)
    assert len(st.read("collector.cpu_s")[0].v) == 5


def test_store_failure_never_escapes(tmp_path: Path, capsys: Any) -> None:
    st = RunStore(tmp_path / "run.db")
    host = HostSource()
    host.open()
    c = Collector(st, [host], interval=1.0)
    c.sample_once()
    st.db.close()  # the database goes away under the collector (disk gone, file deleted...)
    c.sample_once()
    c.sample_once()
    c.stop()
    assert c.store_errors >= 2
    err = capsys.readouterr().err
    assert err.count("cannot write to") == 1  # said once


def test_trainer_gpu_memory_marks_the_runs_gpus() -> None:
    from stallscope.collector import _trainer_gpu_points
    from stallscope.store import Point

    payloads = {"gpu": [{"index": 0, "processes": [{"pid": 41, "used_mib": 30000},
                                                   {"pid": 999, "used_mib": 500}]},
                        {"index": 1, "processes": [{"pid": 999, "used_mib": 70000}]}],
                "procs": {"41": {}, "42": {}}}
    assert _trainer_gpu_points(payloads) == [Point("gpu.trainer_mem_mib", "gpu0", 30000.0),
                                             Point("gpu.trainer_mem_mib", "gpu1", 0.0)]
    assert _trainer_gpu_points({"gpu": payloads["gpu"]}) == []  # no trainer tree: unknown
