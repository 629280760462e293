"""The framework-free recorder (stallscope.probe.recorder) on its own: no torch needed or
imported, driven by a tiny fake framework the way a Keras adapter would drive it, and the
standalone session's meta.json."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, env_without_stallscope, make_run

from stallscope.probe import recorder as recorder_mod
from stallscope.probe.recorder import EventLike, Recorder, StepRecord
from stallscope.store import RunStore, StepRow, list_runs, read_meta

pytestmark = pytest.mark.usefixtures("probe_env")  # (conftest.py)


def read_store(run_dir: Path) -> tuple[list[StepRow], list[dict[str, Any]]]:
    store = RunStore(run_dir / "run.db", readonly=True)
    try:
        return store.steps(), store.probes()
    finally:
        store.close()


# --- no framework in the recorder ----------------------------------------------------------------
def test_importing_the_recorder_does_not_import_torch() -> None:
    """Nor TensorFlow or Keras, and neither does the core's step loop (stallscope.probe.watch,
    which imports the package and with it both adapters)."""
    code = (
        "import stallscope.probe.recorder, stallscope.probe.watch, sys; "
        "assert not {'torch', 'tensorflow', 'keras'} & set(sys.modules)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        check=False,
    )
    assert res.returncode == 0, res.stderr


def test_the_recorder_source_never_imports_torch() -> None:
    """Not even lazily, inside a function (which the import test above cannot see)."""
    src = Path(recorder_mod.__file__).read_text()
    assert not re.search(r"^\s*(import\s+torch|from\s+torch[\s.])", src, re.MULTILINE)
    assert "import_module" not in src and "__import__" not in src


CORE = (
    "watch",
    "recorder",
    "buffer",
    "device",
    "writer",
    "loaders",
    "notices",
    "callbacks",
    "standalone",
)
FRAMEWORK_IMPORT = r"^\s*(import\s+(torch|tensorflow|keras)|from\s+(torch|tensorflow|keras)[\s.])"


def imports_adapter(src: str, adapter: str) -> bool:
    """Whether ``src`` has an import statement of the probe adapter ``adapter``."""
    return bool(
        re.search(
            rf"^\s*(from\s+stallscope\.probe\.{adapter}\s+import|import\s+"
            rf"stallscope\.probe\.{adapter}\b|from\s+stallscope\.probe\s+import"
            rf"\s+[^\n]*\b{adapter}\b)",
            src,
            re.MULTILINE,
        )
    )


def test_the_core_never_imports_a_framework_and_the_adapters_are_leaves() -> None:
    """The core's sources name no framework import, not even lazily; each adapter imports the
    core, never the other adapter."""
    probe_dir = Path(recorder_mod.__file__).parent
    for name in CORE:
        src = (probe_dir / f"{name}.py").read_text()
        assert not re.search(FRAMEWORK_IMPORT, src, re.MULTILINE), name
        assert "import_module" not in src and "__import__" not in src, name
        assert not imports_adapter(src, "pytorch") and not imports_adapter(src, "keras"), name
    for adapter, other in (("pytorch", "keras"), ("keras", "pytorch")):
        src = (probe_dir / f"{adapter}.py").read_text()
        assert "from stallscope.probe.watch import" in src
        assert not imports_adapter(src, other), adapter


def test_watch_hands_each_loader_to_the_adapter_that_claims_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stallscope.probe import Probe
    from stallscope.probe.watch import Adapter, adapter_for, register_adapter, watch

    core = sys.modules["stallscope.probe.watch"]
    monkeypatch.setattr(core, "_claiming", list(core._claiming))  # undone after the test
    monkeypatch.setenv("STALLSCOPE_RUN_DIR", str(make_run(tmp_path)))
    assert adapter_for([1, 2]).name == "pytorch"  # the default: any iterable
    assert isinstance(watch([1, 2]).probe, Probe)
    mine = FakeRecorder(rank=5, run_dir=make_run(tmp_path / "fake"), register_atexit=False)
    register_adapter(Adapter("fake", lambda loader: isinstance(loader, tuple), lambda rank: mine))
    assert adapter_for(("a", "b")).name == "fake" and adapter_for(["a"]).name == "pytorch"
    assert [x for x in watch(("a", "b"))] == ["a", "b"]
    mine.close()
    steps, probes = read_store(mine.run_dir)
    assert [s.step for s in steps] == [0, 1] and {s.rank for s in steps} == {5}
    assert probes[0]["config"]["loader"] == {"loader_type": "fake.Pipeline", "shards": 2}


def test_the_raw_tuple_layout_is_the_records() -> None:
    """Hot paths hand over bare tuples in StepRecord's field order; the writer relies on it."""
    assert StepRecord._fields == (
        "step",
        "t_got",
        "wait_s",
        "host_s",
        "samples",
        "epoch",
        "h2d_host_s",
        "gpu",
        "n",
    )
    raw = (3, 1.5, 0.25, 0.5, 8, 1, None, None, 4)
    assert StepRecord._make(raw).host_s == 0.5 and StepRecord._make(raw).n == 4


# --- a framework that is not PyTorch -------------------------------------------------------------
class FakeDevice:
    """An accelerator timeline the test advances; usable once the 'framework' initialized it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.initialized = False


class FakeMarker:
    def __init__(self, dev: FakeDevice) -> None:
        self.dev = dev
        self.t: float | None = None

    def record(self) -> None:
        self.t = self.dev.now

    def query(self) -> bool:
        return self.t is not None

    def elapsed_time(self, end: FakeMarker) -> float:
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1000.0


class FakeTimer:
    """A DeviceTimer that is not CUDA: the recorder must not care."""

    name = "FakeAccel"

    def __init__(self, dev: FakeDevice) -> None:
        self.dev = dev

    def ready(self) -> bool:
        return self.dev.initialized

    def event(self) -> EventLike:
        return FakeMarker(self.dev)


class FakeRecorder(Recorder):
    """What a non-torch adapter adds to the recorder: how it describes its input pipeline."""

    def describe_loader(self, loader: Any) -> dict[str, Any] | None:
        return {"loader_type": "fake.Pipeline", "shards": len(loader)}


class FakeFramework:
    """A training loop that reports each step's data wait and compute time itself (as Keras
    callbacks would), then steps timed with the recorder's own clocks and device timer."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def fit(self, shards: list[str], steps: list[tuple[float, float]], t0: float) -> None:
        self.rec.begin_epoch(shards)
        t = t0
        for wait, compute in steps:
            t += wait  # the batch arrives
            self.rec.record(wait, compute, samples=32, t_got=t)
            t += compute


def test_a_non_torch_adapter_drives_the_recorder(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    dev = FakeDevice()
    rec = FakeRecorder(rank=0, run_dir=run_dir, register_atexit=False, timer=FakeTimer(dev))
    times = [(0.125, 0.5), (0.0, 0.25), (0.375, 0.75)]
    fw = FakeFramework(rec)
    t0 = time.perf_counter()
    fw.fit(["a", "b", "c"], times, t0)
    fw.rec.note_h2d(0.0625)  # a host-timed copy belongs to the next step
    assert rec.record(0.5, 1.0, epoch=4) == 3
    # the device is not ready yet: a hand-timed step has no device timing
    with rec.begin_step(samples=16):
        pass
    dev.initialized = True
    with rec.begin_step(samples=16):
        dev.now += 0.5  # the step's device work
    rec.close()
    assert rec.record(1.0, 1.0) == -1  # closed: nothing recorded, nothing raised
    steps, probes = read_store(run_dir)
    assert [s.step for s in steps] == [0, 1, 2, 3, 4, 5]
    assert [(s.wait_s, s.host_s) for s in steps[:4]] == [*times, (0.5, 1.0)]
    assert [s.samples for s in steps] == [32, 32, 32, None, 16, 16]
    assert [s.epoch for s in steps] == [0, 0, 0, 4, 0, 0]
    assert [s.h2d_s for s in steps[:4]] == [None, None, None, 0.0625]
    assert all(s.gpu_busy_s is None for s in steps[:5])
    assert steps[5].gpu_busy_s == pytest.approx(0.5)
    # wall times follow the adapter's perf_counter readings
    assert steps[1].ts - steps[0].ts == pytest.approx(0.5 + 0.0, abs=1e-6)
    assert steps[2].ts - steps[1].ts == pytest.approx(0.25 + 0.375, abs=1e-6)
    assert abs(steps[0].ts - (time.time() + 0.125)) < 60
    (row,) = probes
    assert row["steps"] == 6 and row["dropped"] == 0
    cfg = row["config"]
    assert cfg["loader"] == {"loader_type": "fake.Pipeline", "shards": 3}
    assert cfg["gpu_timing"] is True and "torch" not in cfg


def test_a_recorder_without_device_timer_or_loader_description(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    rec = Recorder(rank=2, run_dir=run_dir, register_atexit=False)
    rec.begin_epoch(object())
    for i in range(4):
        rec.record(0.01 * i, 0.1)
    rec.close()
    steps, probes = read_store(run_dir)
    assert [s.wait_s for s in steps] == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert {s.rank for s in steps} == {2}
    assert "loader" not in probes[0]["config"] and probes[0]["config"]["gpu_timing"] is False


# --- the standalone session ----------------------------------------------------------------------
PLAIN = """
import stallscope  # no torch: watch() takes any iterable

for epoch in range(2):
    for batch in stallscope.watch([[1] * 8] * 6):
        pass
print("trained", flush=True)
"""


def test_standalone_meta_keeps_loader_config_by_rank(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    env = env_without_stallscope("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    env.update(
        STALLSCOPE_OUT=str(tmp_path / "out"), STALLSCOPE_INTERVAL="0.2", PYTHONPATH=str(ROOT)
    )
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    (run_dir,) = list_runs(tmp_path / "out")
    meta = read_meta(run_dir)
    assert "loader" not in meta
    # the shape `stallscope run` writes: {str(rank): the probe's stored configuration}
    assert set(meta["loader_config"]) == {"0"}
    _steps, (row,) = read_store(run_dir)
    assert meta["loader_config"]["0"] == row["config"]
    assert meta["loader_config"]["0"]["loader"]["loader_type"] == "builtins.list"
    assert meta["loader_config"]["0"]["loader"]["len"] == 6
    assert meta["probe"] == {"steps": 12, "dropped": 0, "lost": 0}
    # the same Session as `stallscope run`: the same meta.json keys
    # (tests/integration/test_session.py)
    from conftest import META_KEYS

    assert META_KEYS <= set(meta), META_KEYS - set(meta)
    assert meta["exit_code"] == 0 and meta["end"] >= meta["start"]
