"""Collector: samples sources into sinks, survives broken sources, sinks and stores; knows no
source by name."""

from __future__ import annotations

import ast
import inspect
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import FIXTURES

from stallscope import metrics
from stallscope.collect import Collector, Sample, Sink, StoreSink
from stallscope.collect.derived import trainer_gpu_memory
from stallscope.metrics import Metric, Point
from stallscope.sources.base import Reading, Source
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
    c = Collector([host, Broken()], [StoreSink(st)], interval=1.0, unavailable={"gpu": "no driver"})
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
    sink = StoreSink(st)
    c = Collector([host], [sink], interval=1.0)
    c.sample_once()
    st.db.close()  # the database goes away under the collector (disk gone, file deleted...)
    c.sample_once()
    c.sample_once()
    c.stop()
    assert sink.errors >= 2
    err = capsys.readouterr().err
    assert err.count("cannot write to") == 1  # said once


class Exploding(Sink):
    name = "exploding"

    def __init__(self) -> None:
        self.calls = 0

    def write(self, sample: Sample) -> None:
        self.calls += 1
        raise RuntimeError("registry is gone")


class Keeping(Sink):
    name = "keeping"

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def write(self, sample: Sample) -> None:
        self.samples.append(sample)


def test_a_failing_sink_is_one_event_and_never_stops_the_others(tmp_path: Path) -> None:
    st = RunStore(tmp_path / "run.db")
    host = HostSource()
    host.open()
    bad, good = Exploding(), Keeping()
    c = Collector([host], [bad, StoreSink(st), good], interval=1.0)
    for _ in range(4):
        c.sample_once()
    assert bad.calls == 3 and len(good.samples) == 3  # every sample reached every sink
    sink_events = [e for e in st.events() if e["kind"] == "sink_error"]
    assert len(sink_events) == 1
    assert "exploding sink failed: RuntimeError: registry is gone" in sink_events[0]["message"]
    assert len(st.read("host.cpu_pct")[0].v) == 3  # the store went on


class Thermometer(Source):
    """A source the collector and store have never heard of (defined only in this test)."""

    name = "thermo"
    transient_entities = True
    metric: ClassVar[Metric] = Metric("thermo", "temp_c", "°C", "room temperature (test)")

    def __init__(self) -> None:
        self.n = 0

    def sample(self, now: float) -> Any:
        self.n += 1
        if self.n == 2:
            self.emit("note", "sensor B warming up")
        return {"roomA": {"temp_c": 20.0 + self.n, "label": "lab"}, "roomB": {"temp_c": None}}

    def points(self, payload: Any) -> list[Point]:
        return [
            Point("thermo.temp_c", room, float(f["temp_c"]))
            for room, f in payload.items()
            if f["temp_c"] is not None
        ]

    def entities(self, payload: Any) -> dict[str, dict[str, Any]]:
        return {room: {"label": f.get("label")} for room, f in payload.items()}


def test_a_new_source_needs_no_change_to_collector_or_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the vocabulary is the one place a metric is declared: add it there, as a source would
    monkeypatch.setattr(
        metrics, "_BY_NAME", {**metrics._BY_NAME, Thermometer.metric.name: Thermometer.metric}
    )
    st = RunStore(tmp_path / "run.db")
    keep = Keeping()
    c = Collector([Thermometer()], [StoreSink(st), keep], interval=1.0)
    for _ in range(3):
        c.sample_once()
    [s] = st.read("thermo.temp_c")
    assert s.entity == "roomA" and s.v == [21.0, 22.0, 23.0]
    c.stop(final_sample=False)  # the store sink writes the last-seen times of those present
    ents = {e["entity"]: e for e in st.entities("thermo")}
    assert ents["roomA"]["attrs"] == {"label": "lab"} and ents["roomB"]["attrs"] == {"label": None}
    assert ents["roomA"]["last_ts"] > ents["roomA"]["first_ts"]  # transient: last seen kept
    assert [e["message"] for e in st.events() if e["source"] == "thermo"] == ["sensor B warming up"]
    assert isinstance(keep.samples[0].readings["thermo"], Reading)


def test_collector_and_store_never_branch_on_a_source_name() -> None:
    """No comparison with a source's name literal anywhere in the collector, sinks, store or
    the Prometheus label map (both directions read a metric's ``label``, never its source)."""
    import stallscope.collect.collector as collector_mod
    import stallscope.collect.sinks as sinks_mod
    import stallscope.labels as labels_mod
    import stallscope.store.db as store_mod
    from stallscope.sources import SOURCE_NAMES

    names = {*SOURCE_NAMES, "procs", "smart"}
    for mod in (collector_mod, sinks_mod, store_mod, labels_mod):
        tree = ast.parse(inspect.getsource(mod))
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                consts = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                assert not consts & names, (mod.__name__, ast.unparse(node))


def test_trainer_gpu_memory_marks_the_runs_gpus() -> None:
    gpu = Reading(
        "gpu",
        [
            {
                "index": 0,
                "processes": [{"pid": 41, "used_mib": 30000}, {"pid": 999, "used_mib": 500}],
            },
            {"index": 1, "processes": [{"pid": 999, "used_mib": 70000}]},
        ],
        [],
        {},
    )
    procs = Reading("procs", {"41": {}, "42": {}}, [], {}, True)
    assert trainer_gpu_memory({"gpu": gpu, "procs": procs}) == [
        Point("gpu.trainer_mem_mib", "gpu0", 30000.0),
        Point("gpu.trainer_mem_mib", "gpu1", 0.0),
    ]
    assert trainer_gpu_memory({"gpu": gpu}) == []  # no trainer tree: unknown


def test_events_from_a_source_reach_the_run(tmp_path: Path) -> None:
    """A lost GPU is a run event (not only a log line)."""
    import pynvml

    from stallscope.sources.gpu import GpuSource
    from stallscope.testing.nvml_replay import NvmlReplay

    fixtures = FIXTURES
    replay = NvmlReplay(json.loads(sorted(fixtures.glob("nvml-replay-*.json"))[0].read_text()))

    src = GpuSource(backend=replay)
    src.open()
    st = RunStore(tmp_path / "run.db")
    c = Collector([src], [StoreSink(st)], interval=1.0)
    c.sample_once()
    replay.fail(0, pynvml.NVML_ERROR_GPU_IS_LOST)
    c.sample_once()
    c.sample_once()
    lost = [e for e in st.events() if e["kind"] == "gpu_lost"]
    assert len(lost) == 1 and lost[0]["message"].startswith("GPU 0 ")
    assert lost[0]["source"] == "gpu"


class CounterSink(Keeping):
    name = "counters"
    wants_counters = True


def test_counters_reach_sinks_that_want_them_and_the_store_keeps_rates(tmp_path: Path) -> None:
    st = RunStore(tmp_path / "run.db")
    host = HostSource()
    host.open()
    keep = CounterSink()
    c = Collector([host], [StoreSink(st), keep], interval=1.0)
    c.sample_once()
    c.sample_once()
    names = {p.name for p in keep.samples[-1].points}
    counters = {n for n in names if (m := metrics.lookup(n)) is not None and m.kind == "counter"}
    assert "host.cpu_seconds_total" in counters
    assert "host.cpu_pct" in names  # the rates are there too
    stored = {n for n, _ in st.series_keys()}
    assert "host.cpu_pct" in stored and not stored & counters
    # without a sink that wants them, no counter is even built
    plain = Keeping()
    Collector([host], [plain], interval=1.0).sample_once()
    assert not {p.name for p in plain.samples[-1].points} & counters


class _Keep(Sink):
    name = "keep"

    def __init__(self, counters: bool) -> None:
        self.wants_counters = counters
        self.got: list[Sample] = []

    def write(self, sample: Sample) -> None:
        self.got.append(sample)


def test_the_first_read_hands_raw_counters_only_to_the_sinks_that_export_them() -> None:
    """Rates need two reads, counters one: the host's first read gives its CPU counters to the
    Prometheus-like sink (marked primed, no reading), nothing to the run store's kind, and no
    sample is counted."""
    host = HostSource()
    host.open()
    prom, store = _Keep(True), _Keep(False)
    c = Collector([host], [prom, store], interval=1.0)
    first = c.sample_once()
    assert first.readings == {} and first.primed == {"host"}
    assert [s.ts for s in prom.got] == [first.ts] and store.got == [] and c.samples == 0
    names = {p.name for p in prom.got[0].points}
    assert names and all(
        metrics.lookup(n) is not None and metrics.lookup(n).kind == "counter" for n in names
    ), names
    c.sample_once()
    assert len(store.got) == 1 and len(prom.got) == 2 and c.samples == 1
    assert prom.got[1].readings and not prom.got[1].primed


def test_the_source_registry_knows_every_source(tmp_path: Path) -> None:
    """One name -> factory map: make_source builds every source of stallscope/sources by its
    name (SMART, steps and stacks were wired by hand in three places)."""
    import importlib
    import inspect
    import pkgutil

    import stallscope.sources as pkg
    from stallscope.sources import REGISTRY, Source, make_source

    found: set[str] = set()
    for mod in pkgutil.walk_packages(pkg.__path__, "stallscope.sources."):
        m = importlib.import_module(mod.name)
        for _, cls in inspect.getmembers(m, inspect.isclass):
            if (
                issubclass(cls, Source)
                and cls is not Source
                and cls.__module__ == m.__name__
                and not inspect.isabstract(cls)
            ):
                found.add(cls.name)
    assert found == set(REGISTRY), (found, set(REGISTRY))
    kw = {"root_pid": os.getpid(), "run_dir": tmp_path, "smart_devices": ["sda"]}
    for name in REGISTRY:
        src = make_source(name, **kw)
        assert src.name == name
    with pytest.raises(ValueError, match="unknown source"):
        make_source("nope")
    with pytest.raises(ValueError, match="needs run_dir"):
        make_source("probe")


class _Comings(Thermometer):
    """roomA throughout, roomB in the second and third samples only."""

    def sample(self, now: float) -> Any:
        self.n += 1
        rooms = {"roomA": {"temp_c": 20.0, "label": "lab"}}
        if self.n in (2, 3):
            rooms["roomB"] = {"temp_c": 5.0, "label": "cold"}
        return rooms


def test_last_seen_times_are_written_when_an_entity_goes_at_checkpoints_and_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entity that goes gets the time of the last sample that had it, at once; the ones
    still there get theirs every downsample_every samples and when the collector stops; the
    samples in between write no entity row."""
    monkeypatch.setattr(
        metrics, "_BY_NAME", {**metrics._BY_NAME, Thermometer.metric.name: Thermometer.metric}
    )
    st = RunStore(tmp_path / "run.db")
    clock = iter(float(t) for t in range(100, 200))
    c = Collector(
        [_Comings()], [StoreSink(st, downsample_every=6)], interval=1.0, clock=lambda: next(clock)
    )

    def seen() -> dict[str, tuple[float, float]]:
        return {e["entity"]: (e["first_ts"], e["last_ts"]) for e in st.entities("thermo")}

    ts = [c.sample_once().ts for _ in range(4)]
    assert seen() == {"roomA": (ts[0], ts[0]), "roomB": (ts[1], ts[2])}
    ts += [c.sample_once().ts for _ in range(2)]  # the sixth sample: a checkpoint
    assert seen()["roomA"] == (ts[0], ts[5])
    ts.append(c.sample_once().ts)
    assert seen()["roomA"] == (ts[0], ts[5])
    c.stop(final_sample=False)
    assert seen() == {"roomA": (ts[0], ts[6]), "roomB": (ts[1], ts[2])}


class Constant(Source):
    """A source that costs nothing: one point a sample."""

    name = "thermo"

    def sample(self, now: float) -> Any:
        return {"temp_c": 20.0}

    def points(self, payload: Any) -> list[Point]:
        return [Point("thermo.temp_c", "", payload["temp_c"])]


def _burn(cpu_s: float) -> None:
    """Spend ``cpu_s`` seconds of this thread's CPU (CPU, not wall: a busy machine is fine)."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_the_cost_point_counts_the_collector_threads_cpu_between_its_samples() -> None:
    """``collector.cpu_s`` is what a sample costs the monitor's process: the sample's own work
    plus what the same thread spent since its previous sample (waking up, its loop); CPU that
    another thread spent in between, or that came before the thread's first sample, is not."""
    kept = Keeping()
    c = Collector([Constant()], [kept], interval=1.0)
    _burn(0.05)
    c.sample_once()  # the first: nothing before it is counted
    _burn(0.03)
    c.sample_once()  # 30 ms of this thread's CPU since the last sample: counted
    assert kept.samples[0].cpu_s < 0.02
    assert 0.03 <= kept.samples[1].cpu_s < 0.06
    other = threading.Thread(target=c.sample_once)  # another thread: its own CPU only
    _burn(0.03)
    other.start()
    other.join()
    assert kept.samples[2].cpu_s < 0.02
    c.sample_once()  # back here: the mark is the other thread's, so nothing in between
    assert kept.samples[3].cpu_s < 0.02


class Changing(Source):
    """Points of a declared gauge, a counter and a name the vocabulary lacks; from the third
    sample a second declared gauge too."""

    name = "host"

    def __init__(self) -> None:
        self.n = 0

    def sample(self, now: float) -> Any:
        self.n += 1
        return {"n": self.n}

    def points(self, payload: Any) -> list[Point]:
        n = float(payload["n"])
        out = [
            Point("host.cpu_pct", "", n),
            Point("host.cpu_seconds_total", "user", n),
            Point("host.not_a_metric", "", n),
        ]
        if n >= 3:
            out.append(Point("host.load1", "", n))
        return out


def test_the_store_keeps_declared_non_counter_metrics_even_one_first_met_mid_run(
    tmp_path: Path,
) -> None:
    st = RunStore(tmp_path / "run.db")
    c = Collector([Changing()], [StoreSink(st)], interval=1.0)
    for _ in range(4):
        c.sample_once()
    stored = {n for n, _ in st.series_keys()}
    assert stored == {"host.cpu_pct", "host.load1", "collector.cpu_s", "collector.wall_s"}
    assert st.read("host.cpu_pct")[0].v == [1.0, 2.0, 3.0, 4.0]
    assert st.read("host.load1")[0].v == [3.0, 4.0]


def test_the_cost_line_says_a_stack_sampler_apart() -> None:
    """The end-of-run 'monitoring cost' line is the monitor's own CPU; a stack sampler, in
    the trainer or as py-spy, is said to be apart, never silently left out."""
    import io

    from rich.console import Console

    from stallscope.cli.show import _print_cost

    summary = {"collector_cpu_s_per_sample": 0.0015, "samples": 40, "duration_s": 10.0}
    lines = {}
    for name, stacks in (("none", None), ("inproc", "inproc"), ("py-spy", "py-spy")):
        buf = io.StringIO()
        meta = {"interval_s": 0.25, **({"stacks": {"sampler": stacks}} if stacks else {})}
        _print_cost(summary, meta, Console(file=buf, width=300, color_system=None))
        lines[name] = buf.getvalue()
    assert lines["none"].strip() == (
        "monitoring cost: 1.50 ms CPU per sample (0.600% of one core over the run)"
    )
    assert "the stack sampler runs in the trainer, not counted here" in lines["inproc"]
    assert "the stack sampler (py-spy) is not counted here" in lines["py-spy"]
