"""The shipped default alert rules: each one made to fire and to clear on constructed inputs,
the sources that feed the new ones (the probe's steps per rank, SMART checks), conditions across
two metrics (``also``) and trend rules (``trend_s``), and data-wait alerts end to end under
``stallscope run``."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from conftest import FIXTURES, env_without_stallscope, stallscope_argv

from stallscope.alerts import DEFAULT_RULES, AlertEngine, parse_rules
from stallscope.metrics import Point, lookup
from stallscope.sources.smart import SmartSource, drive_points, explain_series, parse_smartctl
from stallscope.sources.steps import StepsSource, window_points
from stallscope.store import RunStore, StepRow

T0 = 1_763_712_000.0


def _engine() -> AlertEngine:
    return AlertEngine(parse_rules({}, "defaults").rules)


def _drive(
    series: list[list[tuple[str, str, float]]], dt: float = 1.0, engine: AlertEngine | None = None
) -> list[tuple[float, str, str, str]]:
    """Feed one sample per entry (a list of (metric, entity, value)); transitions as
    (t, alert, entity, state)."""
    eng = engine or _engine()
    out = []
    for i, pts in enumerate(series):
        for t in eng.evaluate(T0 + i * dt, [Point(*p) for p in pts]):
            out.append((i * dt, t.rule.name, t.entity, t.state))
    return out


def test_every_default_reads_a_metric_of_the_vocabulary() -> None:
    names = {r.name for r in DEFAULT_RULES}
    assert {
        "gpu_hot",
        "gpu_throttled",
        "shm_nearly_full",
        "host_swapping",
        "disk_saturated",
        "smart_failing",
        "smart_defects_growing",
        "smart_threshold_soon",
        "data_wait_high",
        "gpu_memory_growing",
        "rank_slow",
    } <= names
    for r in DEFAULT_RULES:
        assert lookup(r.metric) is not None, r.metric
        assert all(lookup(a.metric) is not None for a in r.also)


def test_smart_failing_fires_and_clears() -> None:
    seq = [[("smart.failing", "sda", v)] for v in (0, 0, 1, 1, 0)]
    assert _drive(seq) == [
        (2.0, "smart_failing", "sda", "firing"),
        (4.0, "smart_failing", "sda", "cleared"),
    ]


def test_smart_defect_growth_fires_and_clears() -> None:
    seq = [[("smart.medium_growth", "sda", v)] for v in (0, 303, 303, 0)]
    assert _drive(seq) == [
        (1.0, "smart_defects_growing", "sda", "firing"),
        (3.0, "smart_defects_growing", "sda", "cleared"),
    ]


def test_smart_threshold_soon_fires_and_clears() -> None:
    seq = [[("smart.days_left", "nvme0n1", v)] for v in (90, 45, 29.5, 27, 60)]
    assert _drive(seq) == [
        (2.0, "smart_threshold_soon", "nvme0n1", "firing"),
        (4.0, "smart_threshold_soon", "nvme0n1", "cleared"),
    ]


def test_data_wait_share_needs_two_minutes_and_clears_below_20() -> None:
    seq = (
        [[("probe.wait_pct", "rank0", 10.0)]] * 10
        + [[("probe.wait_pct", "rank0", 45.0)]] * 130
        + [[("probe.wait_pct", "rank0", 25.0)]] * 10
        + [[("probe.wait_pct", "rank0", 5.0)]]
    )
    assert _drive(seq) == [
        (130.0, "data_wait_high", "rank0", "firing"),
        (150.0, "data_wait_high", "rank0", "cleared"),
    ]
    # a minute and a half of waiting is not enough
    short = [[("probe.wait_pct", "rank0", 45.0)]] * 90 + [[("probe.wait_pct", "rank0", 5.0)]]
    assert _drive(short) == []


def test_disk_saturated_needs_high_util_and_slow_reads_together() -> None:
    def s(util: float, r_await: float) -> list[tuple[str, str, float]]:
        return [
            ("disk.util_pct", "sdb", util),
            ("disk.r_await_ms", "sdb", r_await),
            ("disk.r_await_ms", "sda", 500.0),
        ]  # another disk's latency must not count

    busy_but_fast = [s(99, 2)] * 120  # NVMe at 100% util serving quickly: fine
    assert _drive(busy_but_fast) == []
    eng = _engine()
    fired = _drive([s(95, 80)] * 70 + [s(95, 10)], engine=eng)
    assert fired == [
        (60.0, "disk_saturated", "sdb", "firing"),
        (70.0, "disk_saturated", "sdb", "cleared"),
    ]
    eng = _engine()
    for i in range(61):
        got = eng.evaluate(
            T0 + i, [Point("disk.util_pct", "sdb", 95), Point("disk.r_await_ms", "sdb", 80)]
        )
    [t] = got
    assert "disk.r_await_ms = 80" in t.summary() and "and disk.r_await_ms > 50" in t.summary()


def test_gpu_memory_growing_is_a_steady_trend_not_a_level() -> None:
    rng = random.Random(1)
    # 20 min at 10 s: flat at a high level with noise, then +120 MiB/min, then flat again
    flat = [[("gpu.mem_used_mib", "gpu0", 70000 + rng.gauss(0, 200))] for _ in range(60)]
    grow = [[("gpu.mem_used_mib", "gpu0", 70000 + 20 * i + rng.gauss(0, 5))] for i in range(60)]
    top = grow[-1][0][2]
    after = [[("gpu.mem_used_mib", "gpu0", top + rng.gauss(0, 5))] for _ in range(90)]
    got = _drive(flat + grow + after, dt=10.0)
    assert [(a, s) for _t, a, _e, s in got] == [
        ("gpu_memory_growing", "firing"),
        ("gpu_memory_growing", "cleared"),
    ]
    fire_t, clear_t = got[0][0], got[1][0]
    # growth starts at 600 s; the fit over 10 min sees it steadily after a few minutes, and
    # the alert waits 2 more (for_s)
    assert 600 + 120 < fire_t < 600 + 600, fire_t
    assert clear_t > 1200
    assert _drive(flat * 3, dt=10.0) == []  # noise around a high level: no trend


def test_rank_slow_fires_and_clears() -> None:
    seq = (
        [[("probe.rank_slowdown", "rank3", 1.0)]] * 5
        + [[("probe.rank_slowdown", "rank3", 2.1)]] * 70
        + [[("probe.rank_slowdown", "rank3", 1.1)]]
    )
    assert _drive(seq) == [
        (65.0, "rank_slow", "rank3", "firing"),
        (75.0, "rank_slow", "rank3", "cleared"),
    ]


# --- what feeds them --------------------------------------------------------------------------
def test_window_points_per_rank() -> None:
    fast = [(T0 + i, 0.01, 0.09, 1) for i in range(10)]  # waits 10%, 100 ms steps
    slow = [(T0 + i, 0.15, 0.15, 1) for i in range(10)]  # waits 50%, 300 ms steps
    # rank 4: 0.5-ms steps, 50 to a row (the probe sums steps under a millisecond)
    summed = [(T0 + i, 0.005, 0.02, 50) for i in range(3)]
    got = window_points({0: fast, 1: fast, 2: slow, 3: fast[:3]})
    assert set(got) == {"rank0", "rank1", "rank2"}  # rank 3: too few steps to say
    assert got["rank2"] == {"wait_pct": 50.0, "step_ms": 300.0, "rank_slowdown": 3.0}
    assert got["rank0"]["wait_pct"] == 10.0 and got["rank0"]["rank_slowdown"] == 0.5
    # three rows, 150 steps: enough to say, each step its row's mean
    assert window_points({4: summed}) == {"rank4": {"wait_pct": 20.0, "step_ms": 0.5}}
    assert "rank_slowdown" not in window_points({0: fast})["rank0"]


def test_steps_source_reads_the_run_incrementally(tmp_path: Path) -> None:
    st = RunStore(tmp_path / "run.db")
    src = StepsSource(tmp_path / "run.db", window_s=30)
    src.open()
    assert src.sample(T0) == {}
    st.add_steps([StepRow(0, i, T0 + i, 0.6, 0.4) for i in range(20)])
    st.set_probe(0, 1, {}, 20, 0)
    got = src.sample(T0 + 20)
    assert got == {"rank0": {"wait_pct": 60.0, "step_ms": 1000.0}}
    st.add_steps([StepRow(0, i, T0 + i, 0.0, 1.0) for i in range(20, 60)])
    assert src.sample(T0 + 60)["rank0"]["wait_pct"] == 0.0  # older steps left the window
    assert [p.name for p in src.read(T0 + 60).points] == ["probe.wait_pct", "probe.step_ms"]
    src.close()
    st.close()


def _fixture(name: str) -> object:
    return json.loads((FIXTURES / name).read_text())


def test_smart_points_from_real_smartctl_outputs() -> None:
    before = parse_smartctl(_fixture("smartctl-ST3500418AS_11.json"))
    [grown] = explain_series([before, parse_smartctl(_fixture("smartctl-ST3500418AS_12.json"))])
    assert drive_points(before) == {
        "failing": 0.0,
        "medium_growth": 0.0,
        "reallocated": 1.0,
        "pending": 0.0,
    }
    assert drive_points(grown)["failing"] == 1.0 and drive_points(grown)["medium_growth"] == 303
    nvme = parse_smartctl(_fixture("smartctl-nvme-null-Samsung_SSD_970_EVO_Plus_250GB-nvme0.json"))
    assert drive_points(nvme)["nvme_spare_pct"] == 100.0
    assert drive_points(parse_smartctl(_fixture("smartctl-7.3-virtio-vda-sat-eperm.json"))) == {}


def test_smart_source_reports_its_latest_check() -> None:
    grown = explain_series(
        [parse_smartctl(_fixture(f"smartctl-ST3500418AS_{n}.json")) for n in (11, 12)]
    )
    src = SmartSource(["/dev/sda"], check=lambda _d: (grown, ["a note"]))
    src.check_now()  # what the background thread does every 10 min
    pts = {(p.name, p.entity): p.value for p in src.read(T0).points}
    assert pts[("smart.failing", "sda")] == 1.0 and pts[("smart.reallocated", "sda")] == 304
    assert src.drain_events() == [("note", "a note")]
    eng = _engine()
    fired = {t.rule.name for t in eng.evaluate(T0, src.read(T0).points)}
    assert fired == {"smart_failing", "smart_defects_growing"}


def test_check_rejects_bad_also_and_trend(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text(
        '[[alerts]]\nname = "x"\nmetric = "disk.util_pct"\nabove = 90\n'
        'also = [{metric = "nope", above = 1}, {metric = "disk.r_await_ms"}]\n'
        "trend_s = -5\n"
    )
    r = subprocess.run(
        stallscope_argv("alerts", "check", str(f)), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "also[0].metric: 'nope'" in r.stderr
    assert "also[1]: give exactly one of 'above' or 'below'" in r.stderr
    assert "trend_s: a positive number of seconds" in r.stderr


TRAINER = """
import sys, time
import stallscope

def slow_loader():
    for i in range(60):
        time.sleep(0.05)  # the input pipeline cannot keep up
        yield i

for x in stallscope.watch(slow_loader()):
    time.sleep(0.01)
"""


def test_data_wait_alert_fires_under_run(tmp_path: Path) -> None:
    """The probe writes steps in the trainer; the monitor reads them per rank and the rule on
    probe.wait_pct fires (for_s shortened to 1 s by the rules file)."""
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[alerts]]\nname = "data_wait_high"\nmetric = "probe.wait_pct"\nabove = 30\nfor_s = 1\n'
    )
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--interval",
            "0.3",
            "--alerts",
            str(rules),
            "--out",
            str(tmp_path / "runs"),
            "--quiet",
            "--",
            sys.executable,
            str(script),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env_without_stallscope(),
    )
    assert r.returncode == 0, r.stderr
    [run_dir] = list((tmp_path / "runs").iterdir())
    st = RunStore(run_dir / "run.db", readonly=True)
    fired = [e["message"] for e in st.events() if e["kind"] == "alert_firing"]
    st.close()
    assert any("data_wait_high on rank0 firing: probe.wait_pct = " in m for m in fired), fired
