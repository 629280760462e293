"""Run store: writing, reading back, downsampling, concurrent readers, run lookup."""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT

from stallscope.errors import RunNotFound
from stallscope.store import (
    Point,
    RunStore,
    StepRow,
    find_run,
    list_runs,
    new_run_dir,
    read_meta,
    write_meta,
)


def test_points_round_trip(tmp_path: Path) -> None:
    st = RunStore(tmp_path / "run.db")
    for i in range(10):
        st.add_points(
            100.0 + i,
            [Point("gpu.util_pct", "gpu0", i * 10.0), Point("disk.util_pct", "vda", 50.0)],
        )
    [s] = st.read("gpu.util_pct")
    assert s.entity == "gpu0" and s.ts[0] == 100.0 and s.v == [i * 10.0 for i in range(10)]
    assert st.time_range() == (100.0, 109.0)
    assert set(st.read_all()) == {("gpu.util_pct", "gpu0"), ("disk.util_pct", "vda")}
    st.close()


def test_downsample_keeps_the_mean_or_max_and_recent_points(tmp_path: Path) -> None:
    """A bucket keeps its sample count and what readers read: the mean, the max for a metric
    whose mean is not a value it can take (gpu.throttle_mask, a bitmask)."""
    st = RunStore(tmp_path / "run.db")
    for i in range(300):  # 5 minutes at 1 Hz: values 0..299
        st.add_points(
            float(i),
            [Point("host.cpu_pct", "", float(i)), Point("gpu.throttle_mask", "gpu0", float(i))],
        )
    folded = st.downsample(older_than=240.0, bucket_s=60.0)
    assert folded == 480
    mean, mx = (
        st.db.execute(
            "SELECT ts, n, v FROM rollup WHERE series=(SELECT id FROM series WHERE name=?) "
            "ORDER BY ts",
            (name,),
        ).fetchall()
        for name in ("host.cpu_pct", "gpu.throttle_mask")
    )
    assert mean[0] == (0.0, 60, 29.5) and mean[3] == (180.0, 60, 209.5)
    assert mx[0] == (0.0, 60, 59.0) and mx[3] == (180.0, 60, 239.0)
    [s] = st.read("host.cpu_pct")
    assert s.ts[:4] == [0.0, 60.0, 120.0, 180.0] and s.v[4:] == [float(i) for i in range(240, 300)]
    assert s.v[:4] == [29.5, 89.5, 149.5, 209.5]
    # folding again later merges into existing buckets without double counting
    st.add_points(
        299.5, [Point("host.cpu_pct", "", 1000.0), Point("gpu.throttle_mask", "gpu0", 1000.0)]
    )
    st.downsample(older_than=360.0, bucket_s=60.0)
    b = st.db.execute("SELECT n, v FROM rollup WHERE ts=240 ORDER BY series").fetchall()
    assert b == [(61, (sum(range(240, 300)) + 1000.0) / 61), (61, 1000.0)]
    assert st.read_all()[("gpu.throttle_mask", "gpu0")].v[4] == 1000.0
    assert st.integrity_ok()


def test_reader_sees_data_while_writer_is_open(tmp_path: Path) -> None:
    w = RunStore(tmp_path / "run.db")
    w.add_points(1.0, [Point("host.cpu_pct", "", 5.0)])
    r = RunStore(tmp_path / "run.db", readonly=True)
    assert r.read("host.cpu_pct")[0].v == [5.0]
    w.add_points(2.0, [Point("host.cpu_pct", "", 6.0)])
    assert r.read("host.cpu_pct")[0].v == [5.0, 6.0]
    r.close()
    w.close()


def test_steps_probes_events_entities(tmp_path: Path) -> None:
    st = RunStore(tmp_path / "run.db")
    st.add_steps(
        [StepRow(0, 1, 10.0, 0.2, 0.1, samples=32, epoch=0), StepRow(1, 1, 10.0, 0.1, 0.1)]
    )
    st.update_steps_gpu([(0, 1, 0.09, 0.15)])
    s0 = st.steps(rank=0)[0]
    assert s0.gpu_busy_s == 0.09 and s0.gpu_idle_s == 0.15 and s0.samples == 32
    assert len(st.steps()) == 2
    st.set_probe(0, 123, {"num_workers": 2}, steps=1, dropped=0)
    assert st.probes()[0]["config"] == {"num_workers": 2}
    st.add_event(1.0, "gpu", "unavailable", "no driver")
    assert st.events()[0]["message"] == "no driver"
    st.upsert_entity("procs", "7", {"role": "main"}, 1.0)
    st.upsert_entity("procs", "7", {"role": "main", "name": "x"}, 2.0)
    [e] = st.entities("procs")
    assert e["attrs"]["name"] == "x" and e["first_ts"] == 1.0 and e["last_ts"] == 2.0


def test_step_blocks_store_the_same_rows_as_step_rows(tmp_path: Path) -> None:
    """The probe's writer hands its steps over in blocks (bigger than one INSERT binds):
    the rows read back are those written one by one."""
    from stallscope.store.db import BLOCK_ROWS

    n = BLOCK_ROWS + 7
    raw = [
        (
            i,
            0.25 + i * 1e-3,
            1e-4 * (i % 5),
            2e-3,
            32 if i % 3 else None,
            i // 100,
            0.5e-3 if i % 7 == 0 else None,
            None,
            1 + i % 4,
        )
        for i in range(n)
    ]
    a, b = RunStore(tmp_path / "a.db"), RunStore(tmp_path / "b.db")
    assert a.add_step_block(3, 1000.0, raw) == n
    b.add_steps(
        [
            StepRow(3, s, 1000.0 + t, w, h, h2d_s=c, samples=k, epoch=e, n=m)
            for s, t, w, h, k, e, c, _, m in raw
        ]
    )
    assert a.steps(rank=3) == b.steps(rank=3)
    assert len(a.steps(rank=3)) == n and a.steps(rank=3)[9].samples is None
    assert [r.n for r in a.steps(rank=3)[:5]] == [1, 2, 3, 4, 1]


def _to_us(r: StepRow) -> StepRow:
    """A step row as a pack keeps it: its times to the microsecond."""
    from dataclasses import replace

    from stallscope.store.steppack import us

    def q(x: float | None) -> float | None:
        return None if x is None else us(x) / 1e6

    return replace(
        r,
        ts=us(r.ts) / 1e6,
        wait_s=us(r.wait_s) / 1e6,
        host_s=us(r.host_s) / 1e6,
        h2d_s=q(r.h2d_s),
        gpu_busy_s=q(r.gpu_busy_s),
        gpu_idle_s=q(r.gpu_idle_s),
        comm_s=q(r.comm_s),
    )


def test_step_times_are_exact_as_rows_and_to_the_microsecond_packed(tmp_path: Path) -> None:
    """Every way a step is written keeps its times as given while it is a row; packed, they
    are kept to the microsecond (rounded half away from zero, as SQLite's round())."""
    st = RunStore(tmp_path / "run.db")
    x = 0.0123456789
    st.add_steps([StepRow(0, 1, 1.7e9 + x, x, x, x, x, x, 1, 0, x)])
    st.add_step_block(0, 1.7e9, [(2, x, x, x, 1, 0, x, None, 1)])
    st.add_step_values([(0, 3, 1.7e9 + x, x, x, None, None, None, None, None, None, 2)])
    st.update_steps_gpu([(0, 3, x, 2 * x)])
    a, b, c = st.steps()
    assert a == StepRow(0, 1, 1.7e9 + x, *[x] * 5, 1, 0, x)
    assert (b.ts, b.wait_s, b.host_s, b.h2d_s) == (1.7e9 + x, x, x, x)
    assert (c.gpu_busy_s, c.gpu_idle_s, c.n) == (x, 2 * x, 2)
    assert st.pack_steps(2e9) == 3
    a2, b2, c2 = st.steps()
    assert a2 == StepRow(0, 1, 1700000000.012346, *[0.012346] * 5, 1, 0, 0.012346)
    assert (b2.ts, b2.wait_s, b2.host_s, b2.h2d_s) == (1700000000.012346, *[0.012346] * 3)
    assert (c2.gpu_busy_s, c2.gpu_idle_s, c2.n) == (0.012346, 0.024691, 2)
    assert [a2, b2, c2] == [_to_us(r) for r in (a, b, c)]
    st.close()


def test_packed_steps_read_as_the_rows_they_were(tmp_path: Path) -> None:
    """Rows older than the plain window are packed (schema version 4): every reader of
    RunStore.steps() reads the same rows, per rank and all together; the newer rows stay rows
    (what the readers that follow a run as it goes read); unreadable rows stay rows, skipped and
    counted as before; a step written again after it was packed reads as written last."""
    import random

    rng = random.Random(3)
    st = RunStore(tmp_path / "run.db")
    for rank in (0, 1, 4):
        raw = [
            (
                i,
                i * 0.01 + rng.random() * 1e-3,
                rng.random() * 1e-3,
                rng.gauss(0.01, 1e-3),
                64 * (1 + i % 2),
                i // 500,
                rng.random() * 1e-4 if i % 3 else None,
                None,
                1 + i % 2,
            )
            for i in range(2000)
        ]
        st.add_step_block(rank, 1000.0, raw)
        st.add_step_values(
            [
                (
                    rank,
                    5000 + i,
                    1030.0 + i * 0.01,
                    0.001,
                    0.009,
                    None,
                    0.008,
                    0.001,
                    64,
                    9,
                    None,
                    1,
                )
                for i in range(300)
            ]
        )
    with st.db:
        st.db.execute("UPDATE steps SET wait_s='slow' WHERE rank=1 AND step=7")
    before = {r: st.steps(rank=r) for r in (0, 1, 4)}
    every = st.steps()
    assert st.skipped == {"steps": 1}
    assert any(_to_us(r) != r for r in every)  # times finer than the microsecond
    packed_before = {
        r: [_to_us(x) if x.ts < 1015.0 else x for x in rows] for r, rows in before.items()
    }
    packed = st.pack_steps(now=1025.0, keep_s=10.0)  # the rows before 1015.0
    assert 4000 < packed < 6000
    left = st.db.execute(
        "SELECT COUNT(*), MIN(ts) FROM steps WHERE NOT (rank = 1 AND step = 7)"
    ).fetchone()
    assert left[0] == 3 * 2300 - 1 - packed and left[1] >= 1015.0
    assert st.db.execute("SELECT rank FROM steps WHERE step = 7").fetchall() == [(1,)]
    st.skipped.clear()
    assert st.steps() == [x for r in (0, 1, 4) for x in packed_before[r]]
    assert st.skipped == {"steps": 1}
    assert {r: st.steps(rank=r) for r in (0, 1, 4)} == packed_before
    assert st.pack_steps(now=2e9) == 3 * 2300 - 1 - packed  # the rest, but the unreadable row
    every = [x if (x.rank, x.step) == (1, 7) else _to_us(x) for x in every]
    before = {r: [x for x in every if x.rank == r] for r in (0, 1, 4)}
    assert st.steps() == every
    st.add_steps([StepRow(4, 10, 5.0, 0.5, 0.5)])  # a recorder restarted on rank 4
    again = st.steps(rank=4)
    assert len(again) == len(before[4]) and again[10] == StepRow(4, 10, 5.0, 0.5, 0.5)
    assert again[:10] == before[4][:10] and again[11:] == before[4][11:]
    assert st.integrity_ok()
    st.close()
    ro = RunStore(tmp_path / "run.db", readonly=True)
    assert ro.steps(rank=0) == before[0] and len(ro.steps()) == len(every)
    ro.close()


def test_only_readable_step_rows_are_packed(tmp_path: Path) -> None:
    """Every way a row can be unreadable (a text, a blob, NULL, inf, a real where a whole number
    goes, n under 1) or beyond what a pack holds: such a row stays a row, so the readers skip
    and count it as before; every other row is packed."""
    bad = {
        "step": ["1.5"],
        "ts": ["'noon'", "9e999", "1e20"],
        "wait_s": ["X'00'", "-9e999"],
        "host_s": ["'x'"],
        "h2d_s": ["'x'", "9e999"],
        "gpu_busy_s": ["X'01'"],
        "gpu_idle_s": ["1e12"],
        "samples": ["2.5", "'many'", str(1 << 61)],
        "epoch": ["0.5"],
        "n": ["0", "1.5", "'two'"],
        "comm_s": ["9e999", "1e15"],
    }
    st = RunStore(tmp_path / "run.db")
    cases = [(c, v) for c, vs in bad.items() for v in vs]
    st.add_steps(
        [StepRow(0, i, 1.0 + i, 0.01, 0.04, 0.001, 0.03, 0.002, 8, 0, 0.001) for i in range(100)]
    )
    with st.db:
        for i, (col, value) in enumerate(cases):
            st.db.execute(f"UPDATE steps SET {col}={value} WHERE step={10 + 2 * i}")
    before = st.steps()
    skipped = dict(st.skipped)
    assert st.pack_steps(now=1e6) == 100 - len(cases)
    st.skipped.clear()
    assert st.steps() == before and st.skipped == skipped
    assert st.db.execute("SELECT COUNT(*) FROM steps").fetchone() == (len(cases),)
    st.close()


def test_a_mirror_copies_the_rows_packed_before_it_began(tmp_path: Path) -> None:
    """run --pid attached to a trainer whose standalone probe's run packs its steps: the steps
    packed before the mirror began, or while it did not copy, reach the attached run once."""
    from stallscope.store.mirror import StepMirror

    src = RunStore(tmp_path / "probe.db")
    src.add_steps([StepRow(r, i, 100.0 + i, 0.01, 0.04, n=2) for r in (0, 1) for i in range(50)])
    assert src.pack_steps(now=1000.0) == 100
    src.add_steps([StepRow(0, i, 200.0 + i, 0.02, 0.04) for i in range(50, 60)])
    mirror = StepMirror(tmp_path / "probe.db", tmp_path / "run.db")
    assert mirror.copy() == 110
    src.add_steps([StepRow(1, i, 300.0 + i, 0.02, 0.04) for i in range(50, 55)])
    assert src.pack_steps(now=2000.0) == 15  # packed before the next copy
    src.add_steps([StepRow(0, 60, 400.0, 0.02, 0.04)])
    assert mirror.copy() == 6 and mirror.copy() == 0
    mirror.close()
    dest = RunStore(tmp_path / "run.db", readonly=True)
    assert dest.steps() == src.steps() and len(dest.steps()) == 116
    dest.close()
    src.close()


def test_a_damaged_step_pack_is_skipped_and_counted(tmp_path: Path) -> None:
    st = RunStore(tmp_path / "run.db")
    st.add_steps([StepRow(r, i, 1.0 + i, 0.01, 0.04) for r in (0, 1) for i in range(5)])
    huge = [StepRow(2, 0, 1.0, 1e20, 0.04), StepRow(2, 1, 2.0, 0.01, 0.04, samples=1 << 62)]
    st.add_steps(huge)  # readable, but beyond what a pack holds: they stay rows
    assert st.pack_steps(now=1000.0) == 10
    assert st.steps(rank=2) == huge
    with st.db:
        st.db.execute("UPDATE step_packs SET data=X'0102' WHERE rank=1")
    assert [(s.rank, s.step) for s in st.steps()] == [(0, i) for i in range(5)] + [(2, 0), (2, 1)]
    assert st.skipped == {"step_packs": 1}
    st.close()


def _hours_of_points(st: RunStore, hours: float, every: float = 10.0) -> None:
    """Samples every ``every`` seconds from 0 for ``hours``, at times off the bucket grid (as
    sample times are): a noisy series read as its mean, a bitmask read as its max."""
    import random

    rng = random.Random(5)
    for i in range(int(hours * 3600 / every)):
        st.add_points(
            i * every + rng.random(),
            [
                Point("host.cpu_pct", "", rng.random() * 100),
                Point("gpu.throttle_mask", "gpu0", float(rng.randrange(16))),
            ],
        )


def test_buckets_of_whole_hours_are_packed_and_read_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once an hour is wholly downsampled its buckets are packed, a pack a series (schema
    version 6): read, read_all and time_range read them exactly as their rows read (a store
    that keeps them rows is the reference); the newer buckets stay rows; a sample that comes late
    for a packed hour goes into its bucket in the pack (the mean by sample count, the max of a
    bitmask, as a row's bucket); a bucket a pack cannot hold as it is stays a row, read in its
    place."""
    st = RunStore(tmp_path / "run.db")
    ref = RunStore(tmp_path / "ref.db")

    def both(act: Callable[[RunStore], object]) -> None:
        act(st)
        with monkeypatch.context() as m:  # the reference keeps every bucket a row
            m.setattr("stallscope.store.db.pack_buckets", lambda *a: 0)
            act(ref)

    def same() -> None:
        assert st.read_all() == ref.read_all()
        for name in ("host.cpu_pct", "gpu.throttle_mask"):
            assert st.read(name) == ref.read(name)
        assert st.time_range() == ref.time_range()
        assert st.skipped == {} and ref.skipped == {}

    both(lambda s: _hours_of_points(s, 2.5))
    both(lambda s: s.downsample(older_than=3599.0))  # no whole hour yet
    assert st.db.execute("SELECT COUNT(*) FROM rollup_packs").fetchone() == (0,)
    same()
    both(lambda s: s.downsample(older_than=7300.0))  # up to 7260: hours 0 and 1 whole
    packs = st.db.execute("SELECT ts, series FROM rollup_packs ORDER BY ts, series").fetchall()
    assert packs == [(0, 1), (0, 2), (3600, 1), (3600, 2)]
    assert st.db.execute("SELECT MIN(ts), COUNT(*) FROM rollup").fetchone() == (7200.0, 2)
    assert ref.db.execute("SELECT COUNT(*) FROM rollup").fetchone() == (2 * 121,)
    same()
    late = [Point("host.cpu_pct", "", 1000.0), Point("gpu.throttle_mask", "gpu0", 255.0)]
    both(lambda s: s.add_points(30.0, late))  # a sample late for a packed hour
    both(lambda s: s.downsample(older_than=7300.0))
    assert st.db.execute("SELECT COUNT(*) FROM rollup WHERE ts < 7200").fetchone() == (0,)
    assert st.read("gpu.throttle_mask")[0].v[0] == 255.0
    same()
    both(lambda s: s.db.execute("INSERT INTO rollup VALUES(125.5, 1, 1, 42.0)") and s.db.commit())
    both(lambda s: s.downsample(older_than=7300.0))
    assert st.db.execute("SELECT ts FROM rollup WHERE ts < 7200").fetchall() == [(125.5,)]
    same()
    assert st.integrity_ok()
    st.close()
    ro = RunStore(tmp_path / "run.db", readonly=True)
    assert ro.read_all() == ref.read_all() and ro.time_range() == ref.time_range()
    ro.close()
    ref.close()


def test_a_damaged_bucket_pack_is_skipped_and_counted(tmp_path: Path) -> None:
    """A pack that cannot be read (damaged, not a blob) or of no known series is skipped and
    counted by every reader; the other packs and rows are read."""
    st = RunStore(tmp_path / "run.db")
    _hours_of_points(st, 2.5)
    st.downsample(older_than=7300.0)
    whole = st.read_all()
    span = st.time_range()
    assert span is not None and span[0] == 0.0
    with st.db:
        st.db.execute("UPDATE rollup_packs SET data=X'0102' WHERE ts=0 AND series=1")
        st.db.execute("INSERT INTO rollup_packs VALUES(-7200, 1, 'text')")
        st.db.execute(
            "INSERT INTO rollup_packs SELECT -3600, 999, data FROM rollup_packs "
            "WHERE ts=3600 AND series=2"
        )
    got = st.read_all()
    assert st.skipped == {"rollup_packs": 3}
    cpu = whole[("host.cpu_pct", "")]
    assert got[("host.cpu_pct", "")].ts == [t for t in cpu.ts if t >= 3600.0]
    assert got[("gpu.throttle_mask", "gpu0")] == whole[("gpu.throttle_mask", "gpu0")]
    st.skipped.clear()
    [s] = st.read("host.cpu_pct")
    assert s == got[("host.cpu_pct", "")] and st.skipped == {"rollup_packs": 2}
    with st.db:
        st.db.execute("DELETE FROM rollup_packs WHERE series=999")
    assert st.time_range() == span  # the bitmask's pack of hour 0 is still read
    with st.db:
        st.db.execute("UPDATE rollup_packs SET data=X'01' WHERE ts=0")
    assert st.time_range() == (3600.0, span[1])
    st.close()


def test_each_source_turns_its_payload_into_vocabulary_points() -> None:
    from stallscope.sources.gpu import GpuSource
    from stallscope.sources.host import HostSource
    from stallscope.sources.procs import ProcsSource

    gpu = GpuSource(backend=object())
    pts = gpu.points(
        [
            {
                "index": 1,
                "name": "H100",
                "util_pct": 50,
                "throttle": ["sw_power_cap"],
                "ecc_errors": None,
            }
        ]
    )
    assert pts == [Point("gpu.util_pct", "gpu1", 50.0)]
    assert gpu.entities([{"index": 1, "name": "H100", "uuid": "GPU-1"}]) == {
        "gpu1": {"name": "H100", "uuid": "GPU-1"}
    }
    pts = HostSource().points(
        {"cpu_pct": 10.0, "cpu_per_core_pct": [1.0, None], "load1": float("nan")}
    )
    assert Point("host.cpu_pct", "", 10.0) in pts
    assert Point("host.cpu_core_pct", "cpu0", 1.0) in pts
    assert len(pts) == 2
    assert ProcsSource(1).points({"12": {"pid": 12, "cpu_pct": 3.0, "role": "main"}}) == [
        Point("procs.cpu_pct", "12", 3.0)
    ]


def test_run_dirs_and_lookup(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    a = new_run_dir(out, "python train.py", now=0)
    b = new_run_dir(out, "python train.py", now=0)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(0))  # local time, as the names
    assert a.name == f"{stamp}-python-train.py" and b.name == f"{a.name}-1", (a.name, b.name)
    for d in (a, b):
        write_meta(d, {"command": ["x"], "start": 1.0})
    assert list_runs(out) == [a, b]
    assert find_run(str(a)) == a
    assert find_run(b.name, out) == b
    assert find_run("latest", out) == b
    with pytest.raises(RunNotFound, match="ambiguous"):
        find_run(a.name[:8], out)
    with pytest.raises(RunNotFound, match="unknown run 'nope'"):
        find_run("nope", out)
    with pytest.raises(RunNotFound, match="not a stallscope run"):
        find_run(str(tmp_path), out)
    (a / "meta.json").write_text("{broken")
    with pytest.raises(RunNotFound, match="unreadable"):
        read_meta(a)
    assert json.loads((b / "meta.json").read_text())["start"] == 1.0


def test_corrupt_database_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "run.db").write_bytes(b"this is not sqlite" * 100)
    from stallscope.errors import StallscopeError

    with pytest.raises(StallscopeError, match="cannot open run database"):
        RunStore(tmp_path / "run.db", readonly=True).read_all()


def test_bitmask_and_link_metrics_roll_up_to_a_real_value(tmp_path: Path) -> None:
    """The mean of throttle bitmasks 0x40 and 0 is 0x20, a different reason: such metrics read
    back their bucket's max, which is one of the values they really took."""
    st = RunStore(tmp_path / "run.db")
    for i in range(120):
        st.add_points(
            float(i),
            [
                Point("gpu.throttle_mask", "gpu0", 0x40 if i % 2 else 0),
                Point("gpu.util_pct", "gpu0", 50.0 + (i % 2)),
            ],
        )
    st.downsample(older_than=120.0, bucket_s=60.0)
    [mask] = st.read("gpu.throttle_mask")
    assert mask.v == [64.0, 64.0]
    assert st.read_all()[("gpu.throttle_mask", "gpu0")].v == [64.0, 64.0]
    assert st.read("gpu.util_pct")[0].v == [50.5, 50.5]  # ordinary gauges: the mean


def test_meta_with_wrong_types_is_a_clear_error(tmp_path: Path) -> None:
    for bad, key in (
        ({"start": "x"}, "start"),
        ({"command": [1, 2]}, "command"),
        ({"data_devices": 5}, "data_devices"),
        ({"end": 1e30}, "end"),
    ):
        (tmp_path / "meta.json").write_text(json.dumps(bad))
        with pytest.raises(RunNotFound, match=f"'{key}' should be"):
            read_meta(tmp_path)


def test_finished_run_reads_from_a_read_only_directory(tmp_path: Path) -> None:
    """An archived run (read-only directory, so SQLite cannot create its -shm file) opens."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    st = RunStore(tmp_path / "run.db")
    st.add_points(1.0, [Point("host.cpu_pct", "", 5.0)])
    live = RunStore(tmp_path / "run.db", readonly=True)
    assert live.read("host.cpu_pct")[0].v == [5.0]
    live.close()
    st.finish()
    st.close()
    assert not (tmp_path / "run.db-wal").exists()

    as_nobody: list[str] = []
    if os.geteuid() == 0:  # root ignores directory permissions: read as nobody
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root without setpriv: cannot drop privileges to test read-only access")
        as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        pkg = ROOT / "stallscope"
        shutil.copytree(pkg, base / "stallscope")  # importable by nobody, wherever the repo is
        ro = base / "archived"
        ro.mkdir()
        shutil.copy(tmp_path / "run.db", ro / "run.db")
        os.chmod(ro, 0o555)
        code = (
            "from stallscope.store import RunStore; "
            f"print(RunStore({str(ro / 'run.db')!r}, readonly=True)"
            ".read('host.cpu_pct')[0].v)"
        )
        python = (
            "/usr/bin/python3"
            if as_nobody and os.path.exists("/usr/bin/python3")
            else sys.executable
        )
        r = subprocess.run(
            [*as_nobody, python, "-c", code],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(base), "PATH": os.environ.get("PATH", "")},
            cwd="/",
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "[5.0]"
    finally:
        os.chmod(base / "archived", 0o755) if (base / "archived").exists() else None
        shutil.rmtree(base, ignore_errors=True)


def test_non_finite_values_are_never_stored(tmp_path: Path) -> None:
    st = RunStore(tmp_path / "run.db")
    n = st.add_points(
        1.0,
        [
            Point("host.cpu_pct", "", float("inf")),
            Point("host.cpu_pct", "cpu0", float("nan")),
            Point("host.cpu_pct", "cpu1", float("-inf")),
            Point("host.cpu_pct", "cpu2", 7.0),
        ],
    )
    assert n == 1
    from stallscope.store.samples import ids_of, unpack

    [(data,)] = st.db.execute("SELECT data FROM samples").fetchall()
    got = unpack(data)
    assert got is not None and list(got[1]) == [7.0] and len(ids_of(got[0])) == 1
    assert st.db.execute("SELECT COUNT(*) FROM points").fetchone()[0] == 0
    assert st.read_all()[("host.cpu_pct", "cpu2")].v == [7.0]
    st.close()


def test_readers_skip_and_count_unreadable_rows(tmp_path: Path) -> None:
    from stallscope.analysis.rundata import load_run
    from stallscope.store.samples import Packer

    st = RunStore(tmp_path / "run.db")
    for i in range(5):
        st.add_points(float(i), [Point("host.cpu_pct", "", float(i))])
    st.add_steps([StepRow(0, i, float(i), 0.1, 0.2) for i in range(4)])
    st.upsert_entity("procs", "42", {"name": "python", "ppid": 1}, 0.0)
    st.upsert_entity("procs", "43", {"name": ["not", "text"], "ppid": {"x": 1}}, 0.0)
    st.upsert_entity("disk", "vda", {"kind": "virtio"}, 0.0)
    st.add_event(1.0, "gpu", "note", "ok")
    sid = st.db.execute("SELECT id FROM series").fetchone()[0]
    with st.db:
        st.db.executemany(
            "INSERT INTO points VALUES(?, ?, ?)",
            [(10.0, sid, "abc"), (11.0, sid, 9e999), (12.0, 999, 1.0), ("noon", sid, 1.0)],
        )
        st.db.execute("INSERT INTO rollup VALUES(-60, ?, 1, 'x')", (sid,))
        st.db.execute("UPDATE steps SET wait_s='slow' WHERE step=1")
        st.db.execute("UPDATE steps SET h2d_s=X'00' WHERE step=2")
        st.db.execute("UPDATE entities SET attrs='[1]' WHERE source='disk'")
        st.db.execute("INSERT INTO events VALUES(2.0, 'gpu', 'note', X'00')")
        # samples (schema version 7) that cannot be read: truncated, garbage, a count the runs
        # do not add up to, a value that is inf, text, a time that is not a number, runs that
        # name one series twice; and a sound one of an unknown series next to a known one (that
        # point skipped alone)
        good = Packer().pack({sid: 5.5})
        st.db.executemany(
            "INSERT INTO samples VALUES(?, ?)",
            [
                (20.0, good[:-3]),
                (21.0, b"\xff" * 40),
                (22.0, good[:5] + struct.pack("<I", 2) + good[9:] + struct.pack("<d", 1.0)),
                (23.0, Packer().pack({sid: 1.0})[:-8] + struct.pack("<d", math.inf)),
                (24.0, "abc"),
                ("noon", good),
                (25.0, Packer().pack({sid: 6.5, 999: 1.0})),
                (26.0, struct.pack("<BIIIIII2d", 1, 2, 2, sid, 1, sid, 1, 1.0, 2.0)),
            ],
        )
    st.close()
    write_meta(tmp_path, {"command": ["x"], "start": 0.0, "end": 5.0})
    data = load_run(tmp_path)
    assert data.series[("host.cpu_pct", "")].v == [0.0, 1.0, 2.0, 3.0, 4.0, 6.5]
    assert data.series[("host.cpu_pct", "")].ts == [0.0, 1.0, 2.0, 3.0, 4.0, 25.0]
    assert data.span == (0.0, 25.0)
    assert [s.step for s in data.steps] == [0, 3]
    assert [e["entity"] for e in data.entities] == ["42", "43"]
    assert data.entities[1]["attrs"] == {}  # a process's name that is not text is dropped
    assert data.roles() == {"42": "main", "43": "main"}
    assert [e["message"] for e in data.events] == ["ok"]
    assert data.skipped == {
        "points": 4,
        "samples": 8,
        "rollup": 1,
        "steps": 2,
        "entities": 1,
        "events": 1,
    }
    assert data.unreadable == []


def test_missing_optional_tables_read_as_empty(tmp_path: Path) -> None:
    from stallscope.analysis.rundata import load_run

    st = RunStore(tmp_path / "run.db")
    st.add_points(1.0, [Point("host.cpu_pct", "", 1.0)])
    with st.db:
        st.db.execute("DROP TABLE steps")
        st.db.execute("DROP TABLE events")
    st.close()
    write_meta(tmp_path, {"command": ["x"], "start": 0.0})
    data = load_run(tmp_path)
    assert data.steps == [] and data.events == [] and data.series
    assert [u.split(" ")[0] for u in data.unreadable] == ["steps", "events"]


@pytest.mark.parametrize(
    ("meta", "state"),
    [
        ({"end": 5.0, "monitor_pid": 2**40}, "finished"),
        ({"end": None}, "running"),  # no monitor recorded (a standalone probe): taken as running
        ({"end": None, "monitor_pid": "__self__"}, "running"),
        ({"end": None, "monitor_pid": 2**40}, "interrupted"),
        ({"end": None, "monitor_pid": 2**70}, "interrupted"),
        ({"end": None, "monitor_pid": -1}, "interrupted"),
        ({"end": None, "monitor_pid": 0}, "interrupted"),
        ({"end": None, "monitor_pid": "1234"}, "interrupted"),
        ({"end": None, "monitor_pid": 4194304}, "interrupted"),
    ],
)
def test_run_state(meta: dict[str, object], state: str) -> None:
    import os

    from stallscope.store.rundir import run_state

    if meta.get("monitor_pid") == "__self__":
        meta = dict(meta, monitor_pid=os.getpid())
    assert run_state(meta) == state


def test_latest_is_this_folders_newest_run_before_the_index(tmp_path: Path) -> None:
    """On a shared account another program's newer run is in the per-user index: `latest`
    is this folder's newest run; only a folder without runs falls back on the index, and the
    command then says which run it took."""
    import os
    import subprocess

    from conftest import stallscope_argv

    from stallscope.store.index import record_run

    mine = tmp_path / "here" / "stallscope-runs"
    theirs = tmp_path / "elsewhere" / "stallscope-runs"
    own = new_run_dir(mine, "train", now=1_000_000)
    other = new_run_dir(theirs, "other", now=2_000_000)  # newer, and in the index
    for d in (own, other):
        write_meta(d, {"command": ["x"], "start": 1.0, "end": 2.0, "exit_code": 0})
        RunStore(d / "run.db").close()
        record_run(d)
    assert find_run("latest", mine) == own
    empty = tmp_path / "empty" / "stallscope-runs"
    assert find_run("latest", empty) == other
    r = subprocess.run(
        stallscope_argv("show", "latest", "--json"),
        cwd=tmp_path / "here",
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert r.returncode == 0 and own.name in r.stdout and r.stderr == "", r.stderr
    (tmp_path / "empty").mkdir()
    r = subprocess.run(
        stallscope_argv("show", "latest", "--json"),
        cwd=tmp_path / "empty",
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert r.returncode == 0 and other.name in r.stdout
    assert r.stderr.startswith("stallscope: latest run: ") and other.name in r.stderr


def test_reading_new_steps_seeks_the_key_never_scans_the_table(tmp_path: Path) -> None:
    """The agent and the attach mirror read the steps written since their last read at every
    scrape: by the (rank, step) key, whatever the table holds (a long training's run.db keeps
    every step: a scan per scrape grew with the training's age), new ranks included."""
    import sqlite3

    from stallscope.store.db import step_ranks, steps_after

    st = RunStore(tmp_path / "run.db")
    for r in (0, 1, 5):
        st.add_steps([StepRow(r, i, 1.0 + i, 0.01, 0.04) for i in range(50)])
    st.close()
    conn = sqlite3.connect(f"file:{tmp_path / 'run.db'}?mode=ro", uri=True)
    assert step_ranks(conn) == [0, 1, 5]
    where, args = steps_after({0: 47, 1: 49}, step_ranks(conn))
    q = f"SELECT rank, step FROM steps WHERE ({where}) ORDER BY rank, step"
    plan = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + q, args))
    assert "SCAN steps" not in plan and "PRIMARY KEY" in plan, plan
    rows = conn.execute(q, args).fetchall()
    assert rows == [(0, 48), (0, 49)] + [(5, i) for i in range(50)]  # rank 5: never read
    assert steps_after({}, []) == ("", [])
    conn.close()


# --- schema version (PRAGMA user_version) and migration of older stores ------------------------
#: run.db's layout as the first release wrote it (stallscope/store/db.py before DDP
#: communication time): no steps.comm_s, PRAGMA user_version left at 0, info.schema_version 1.
#: The release that timed collectives added comm_s with ALTER TABLE and kept both versions.
FIRST_RELEASE_DDL = """
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series(
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, entity TEXT NOT NULL, UNIQUE(name, entity));
CREATE TABLE IF NOT EXISTS points(
    ts REAL NOT NULL, series INTEGER NOT NULL, v REAL NOT NULL,
    PRIMARY KEY(ts, series)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup(
    ts REAL NOT NULL, series INTEGER NOT NULL, n INTEGER NOT NULL,
    vmin REAL NOT NULL, vmean REAL NOT NULL, vmax REAL NOT NULL,
    PRIMARY KEY(ts, series)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entities(
    source TEXT NOT NULL, entity TEXT NOT NULL, attrs TEXT NOT NULL,
    first_ts REAL NOT NULL, last_ts REAL NOT NULL, PRIMARY KEY(source, entity));
CREATE TABLE IF NOT EXISTS events(
    ts REAL NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps(
    rank INTEGER NOT NULL, step INTEGER NOT NULL, ts REAL NOT NULL,
    wait_s REAL NOT NULL, host_s REAL NOT NULL, h2d_s REAL, gpu_busy_s REAL, gpu_idle_s REAL,
    samples INTEGER, epoch INTEGER,
    PRIMARY KEY(rank, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS probes(
    rank INTEGER PRIMARY KEY, pid INTEGER NOT NULL, config TEXT NOT NULL,
    steps INTEGER NOT NULL DEFAULT 0, dropped INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL);
"""


def _first_release_store(path: Path, *, with_comm: bool, version: int = 0) -> None:
    """A finished run.db of the previous release, with rows in every table (``with_comm``: as the
    release that added ``steps.comm_s`` by ALTER TABLE left it, one step with a comm_s;
    ``version`` 2: as schema version 2 wrote it, comm_s always there, one step a row)."""
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(FIRST_RELEASE_DDL)
    if with_comm:
        db.execute("ALTER TABLE steps ADD COLUMN comm_s REAL")
    if version >= 3:  # rows of several steps
        db.execute("ALTER TABLE steps ADD COLUMN n INTEGER NOT NULL DEFAULT 1")
    with db:
        db.execute("INSERT OR IGNORE INTO info VALUES('schema_version', ?)", (1,))
        db.execute("INSERT INTO series(id, name, entity) VALUES(1, 'gpu.util_pct', 'gpu0')")
        db.executemany(
            "INSERT INTO points VALUES(?, 1, ?)", [(120.0 + i, 40.0 + i) for i in range(3)]
        )
        db.execute("INSERT INTO rollup VALUES(60.0, 1, 60, 10.0, 20.0, 30.0)")
        db.execute(
            "INSERT INTO entities VALUES('gpu', 'gpu0', ?, 60.0, 122.0)",
            (json.dumps({"name": "H100"}),),
        )
        db.execute("INSERT INTO events VALUES(61.0, 'disk', 'unavailable', 'no /proc')")
        db.executemany(
            "INSERT INTO steps(rank, step, ts, wait_s, host_s, h2d_s, gpu_busy_s, gpu_idle_s, "
            "samples, epoch) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(0, i, 100.0 + i, 0.01, 0.04, 0.002, 0.03, 0.001, 32, 0) for i in range(3)],
        )
        if with_comm:
            db.execute("UPDATE steps SET comm_s=0.005 WHERE step=2")
        db.execute(
            "INSERT INTO probes VALUES(0, 4242, ?, 3, 0, 123.0)", (json.dumps({"num_workers": 4}),)
        )
        if version:
            db.execute("UPDATE info SET value=? WHERE key='schema_version'", (str(version),))
    if version:
        db.execute(f"PRAGMA user_version = {int(version)}")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("PRAGMA journal_mode=DELETE")  # finished: one self-contained file
    db.close()


def _pragma(path: Path, name: str) -> object:
    import sqlite3

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        db.close()


def _columns(path: Path, table: str) -> list[str]:
    import sqlite3

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    finally:
        db.close()


def test_new_store_carries_the_schema_version(tmp_path: Path) -> None:
    import sqlite3

    from stallscope.store import SCHEMA_VERSION

    assert SCHEMA_VERSION == 7
    st = RunStore(tmp_path / "run.db")
    st.add_steps([StepRow(0, 1, 1.0, 0.01, 0.04, comm_s=0.002)])
    st.close()
    assert _pragma(tmp_path / "run.db", "user_version") == SCHEMA_VERSION
    assert {"comm_s", "n"} <= set(_columns(tmp_path / "run.db", "steps"))
    db = sqlite3.connect(tmp_path / "run.db")
    assert db.execute("SELECT value FROM info WHERE key='schema_version'").fetchone() == ("7",)
    assert _columns(tmp_path / "run.db", "rollup") == ["ts", "series", "n", "v"]
    assert _columns(tmp_path / "run.db", "rollup_packs") == ["ts", "series", "data"]
    db.close()
    # opened again by a writer (the probe's writer, the attach mirror): nothing to migrate
    st = RunStore(tmp_path / "run.db")
    assert st.steps()[0].comm_s == 0.002
    assert st.db.total_changes == 0
    st.close()


@pytest.mark.parametrize(
    ("with_comm", "version"),
    [(False, 0), (True, 0), (True, 2), (True, 3)],
    ids=["first-release", "with-comm_s", "version-2", "version-3"],
)
def test_previous_release_store_is_migrated_when_opened(
    tmp_path: Path, with_comm: bool, version: int
) -> None:
    """A run.db written by an earlier release (its exact DDL, user_version 0, or 2: comm_s, one
    step a row) reads as it is read-only, without a write (every row one step), and is migrated
    in place by a writer: the missing comm_s and n added, the version set, every old row kept
    (one step each), new steps with comm_s and rows of several steps accepted."""
    import hashlib
    import sqlite3

    from stallscope.store import SCHEMA_VERSION

    path = tmp_path / "run.db"
    _first_release_store(path, with_comm=with_comm, version=version)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert _pragma(path, "user_version") == version

    ro = RunStore(path, readonly=True)
    steps = ro.steps()
    assert [s.step for s in steps] == [0, 1, 2]
    assert [s.n for s in steps] == [1, 1, 1]
    assert [s.comm_s for s in steps] == ([None, None, 0.005] if with_comm else [None] * 3)
    assert ro.read("gpu.util_pct")[0].v == [20.0, 40.0, 41.0, 42.0]
    ro.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # read-only: not written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.db"]
    # a metric whose buckets read as their max (a bitmask), as version 4 and before kept it
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO series(id, name, entity) VALUES(2, 'gpu.throttle_mask', 'gpu0')")
        db.execute("INSERT INTO rollup VALUES(60.0, 2, 60, 1.0, 2.5, 4.0)")
    db.close()
    old = RunStore(path, readonly=True).read_all()

    st = RunStore(path)
    assert _pragma(path, "user_version") == SCHEMA_VERSION
    assert _columns(path, "steps")[-2:] == ["comm_s", "n"]
    assert st.db.execute("SELECT value FROM info WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    # the old rows, every table; a bucket keeps what readers read (version 5)
    assert _columns(path, "rollup") == ["ts", "series", "n", "v"]
    assert st.db.execute("SELECT * FROM rollup ORDER BY series").fetchall() == [
        (60.0, 1, 60, 20.0),
        (60.0, 2, 60, 4.0),
    ]
    assert st.read_all() == old
    assert st.read("gpu.util_pct")[0].v == [20.0, 40.0, 41.0, 42.0]
    assert st.entities() == [
        {
            "source": "gpu",
            "entity": "gpu0",
            "attrs": {"name": "H100"},
            "first_ts": 60.0,
            "last_ts": 122.0,
        }
    ]
    assert [e["message"] for e in st.events()] == ["no /proc"]
    assert [(p["rank"], p["pid"], p["config"]) for p in st.probes()] == [
        (0, 4242, {"num_workers": 4})
    ]
    assert st.steps()[0] == StepRow(0, 0, 100.0, 0.01, 0.04, 0.002, 0.03, 0.001, 32, 0, None, 1)
    # new rows, comm_s and several steps a row included, through both ways the probe writes
    st.add_steps([StepRow(1, 0, 200.0, 0.02, 0.05, comm_s=0.01)])
    st.add_step_block(
        0,
        100.0,
        [(3, 3.0, 0.01, 0.04, 32, 0, None, None, 1), (9, 4.0, 0.06, 0.24, 192, 0, None, None, 6)],
    )
    st.add_points(123.0, [Point("gpu.util_pct", "gpu0", 43.0)])
    assert st.integrity_ok() and st.skipped == {}
    # the old rows and the new packed (schema version 4) read the same
    unpacked = st.steps()
    assert st.pack_steps(1e6) == 6
    assert st.db.execute("SELECT COUNT(*) FROM steps").fetchone() == (0,)
    assert st.steps() == unpacked and st.skipped == {}
    st.close()

    again = RunStore(path, readonly=True)
    assert again.steps() == unpacked
    rows = {(s.rank, s.step): s for s in again.steps()}
    assert sorted(rows) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 9), (1, 0)]
    assert rows[(1, 0)].comm_s == 0.01 and rows[(0, 3)].comm_s is None
    assert rows[(0, 9)].n == 6 and rows[(0, 9)].samples == 192 and rows[(0, 3)].n == 1
    assert rows[(0, 2)].comm_s == (0.005 if with_comm else None)
    assert again.read("gpu.util_pct")[0].v[-1] == 43.0
    again.close()


#: run.db's layout at schema version 5 (stallscope/store/schema.py then): buckets as rollup rows
#: only, step packs of format 1
VERSION_5_DDL = """
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series(
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, entity TEXT NOT NULL, UNIQUE(name, entity));
CREATE TABLE IF NOT EXISTS points(
    ts REAL NOT NULL, series INTEGER NOT NULL, v REAL NOT NULL,
    PRIMARY KEY(ts, series)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup(
    ts REAL NOT NULL, series INTEGER NOT NULL, n INTEGER NOT NULL, v REAL NOT NULL,
    PRIMARY KEY(ts, series)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entities(
    source TEXT NOT NULL, entity TEXT NOT NULL, attrs TEXT NOT NULL,
    first_ts REAL NOT NULL, last_ts REAL NOT NULL, PRIMARY KEY(source, entity));
CREATE TABLE IF NOT EXISTS events(
    ts REAL NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps(
    rank INTEGER NOT NULL, step INTEGER NOT NULL, ts REAL NOT NULL,
    wait_s REAL NOT NULL, host_s REAL NOT NULL, h2d_s REAL, gpu_busy_s REAL, gpu_idle_s REAL,
    samples INTEGER, epoch INTEGER, comm_s REAL, n INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY(rank, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS step_packs(
    rank INTEGER NOT NULL, last INTEGER NOT NULL, first INTEGER NOT NULL, rows INTEGER NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY(rank, last)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS probes(
    rank INTEGER PRIMARY KEY, pid INTEGER NOT NULL, config TEXT NOT NULL,
    steps INTEGER NOT NULL DEFAULT 0, dropped INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL);
"""


#: a step pack of format 1 as version 5 wrote it (tests/unit/test_steppack.py's FORMAT_1), and
#: its rows
FORMAT_1 = bytes.fromhex(
    "01789c63666060600462160685c0437e42af1918b819189814148afcfc12981b181a2c0a2d1899189916322c"
    "e467e0674a6460780594bec8c0c00ed4e6d8e8c8c8c8c8ccc420c8c0a0cec0c8c4c20400dcf00b00"
)
FORMAT_1_ROWS = [
    (0, 100.0, 0.01, 0.04, 0.002, 0.03, 0.001, 32, 0, None, 1),
    (2, 100.06, 0.01, 0.08, None, None, None, 64, 0, 0.005, 2),
    (3, 100.15, 0.012345, 0.04, 0.002, None, None, 32, 1, None, 1),
]


def test_version_5_store_reads_as_it_is_and_is_migrated(tmp_path: Path) -> None:
    """A run.db of schema version 5 (every bucket a rollup row, step packs of format 1) reads as
    it is read-only, without a write, and is migrated in place by a writer: rollup_packs added,
    the version set, every row and pack read as before; its next downsampling packs its whole
    hours, still read the same; its steps packed again (format 2) read the same."""
    import hashlib
    import sqlite3

    from stallscope.store import SCHEMA_VERSION

    path = tmp_path / "run.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(VERSION_5_DDL)
    with db:
        db.execute("INSERT INTO info VALUES('schema_version', '5')")
        db.execute("INSERT INTO series VALUES(1, 'host.cpu_pct', ''), (2, 'gpu.throttle_mask', '')")
        db.executemany(
            "INSERT INTO rollup VALUES(?, ?, 12, ?)",
            [(60.0 * i, s, i * 0.1 + s) for i in range(125) for s in (1, 2)],
        )
        db.executemany("INSERT INTO points VALUES(?, 1, ?)", [(7500.0 + i, 1.5) for i in range(3)])
        db.execute("INSERT INTO step_packs VALUES(0, 3, 0, 3, ?)", (FORMAT_1,))
        db.execute(
            "INSERT INTO steps(rank, step, ts, wait_s, host_s) VALUES(0, 4, 101.0, 0.5, 0.25)"
        )
    db.execute("PRAGMA user_version = 5")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()

    ro = RunStore(path, readonly=True)
    series, steps, span = ro.read_all(), ro.steps(), ro.time_range()
    assert steps == [StepRow(0, *r) for r in FORMAT_1_ROWS] + [StepRow(0, 4, 101.0, 0.5, 0.25)]
    assert len(series[("host.cpu_pct", "")].ts) == 128 and span == (0.0, 7502.0)
    assert ro.skipped == {}
    ro.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # read-only: not written

    st = RunStore(path)
    assert _pragma(path, "user_version") == SCHEMA_VERSION == 7
    assert _columns(path, "rollup_packs") == ["ts", "series", "data"]
    assert st.read_all() == series and st.steps() == steps and st.time_range() == span
    st.downsample(older_than=7300.0)  # nothing left to fold: hours 0 and 1 packed
    assert st.db.execute("SELECT COUNT(*) FROM rollup_packs").fetchone() == (4,)
    assert st.db.execute("SELECT COUNT(*) FROM rollup").fetchone() == (2 * 5,)
    assert st.read_all() == series and st.time_range() == span
    assert st.pack_steps(1e6) == 1
    assert st.steps() == steps and st.skipped == {}
    st.close()


def test_migration_by_writers_opening_at_once(tmp_path: Path) -> None:
    """The collector and an attached probe's mirror may open an old store together: each opens,
    the column is added once."""
    from concurrent.futures import ThreadPoolExecutor

    from stallscope.store import SCHEMA_VERSION

    path = tmp_path / "run.db"
    _first_release_store(path, with_comm=False)
    with ThreadPoolExecutor(8) as pool:
        stores = list(pool.map(lambda _: RunStore(path), range(8)))
    for i, st in enumerate(stores):
        st.add_steps([StepRow(2, i, 300.0 + i, 0.01, 0.02, comm_s=0.001 * i)])
        st.close()
    assert _pragma(path, "user_version") == SCHEMA_VERSION
    assert _columns(path, "steps").count("comm_s") == 1
    ro = RunStore(path, readonly=True)
    assert len(ro.steps(2)) == 8 and len(ro.steps()) == 11
    ro.close()


def test_store_of_a_newer_version_is_one_clear_error(tmp_path: Path) -> None:
    """A run.db written by a later stallscope (user_version above SCHEMA_VERSION) is refused,
    read-only or not, with one error and without a byte written; the CLI says it in one line."""
    import hashlib
    import sqlite3
    import subprocess

    from conftest import stallscope_argv

    from stallscope.errors import StallscopeError
    from stallscope.store import SCHEMA_VERSION

    run = new_run_dir(tmp_path, "newer")
    write_meta(run, {"command": ["x"], "start": 0.0, "end": 2.0})
    st = RunStore(run / "run.db")
    st.add_points(1.0, [Point("host.cpu_pct", "", 5.0)])
    st.finish_and_close()
    db = sqlite3.connect(run / "run.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    before = hashlib.sha256((run / "run.db").read_bytes()).hexdigest()
    for readonly in (True, False):
        with pytest.raises(
            StallscopeError,
            match=(
                rf"written by a newer stallscope \(run.db schema version {SCHEMA_VERSION + 1};"
                rf".* reads versions up to {SCHEMA_VERSION}\)"
            ),
        ):
            RunStore(run / "run.db", readonly=readonly)
    assert hashlib.sha256((run / "run.db").read_bytes()).hexdigest() == before
    assert _pragma(run / "run.db", "journal_mode") == "delete"  # not even turned to WAL
    r = subprocess.run(
        stallscope_argv("show", str(run)), capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "newer stallscope" in r.stderr


def test_version_6_store_reads_as_it_is_and_is_migrated(tmp_path: Path) -> None:
    """A run.db of schema version 6 (a points row a point) reads as it is read-only, without a
    write, and is migrated in place by a writer: samples added, the version set, its points
    left where they are and read with the samples written after; the next downsampling folds
    both into the same buckets (a series' mean over the points of either layout)."""
    import hashlib
    import sqlite3

    from stallscope.store import SCHEMA_VERSION

    path = tmp_path / "run.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(
        VERSION_5_DDL
        + "CREATE TABLE IF NOT EXISTS rollup_packs(ts INTEGER NOT NULL, series INTEGER NOT NULL, "
        "data BLOB NOT NULL, PRIMARY KEY(ts, series)) WITHOUT ROWID;"
    )
    with db:
        db.execute("INSERT INTO info VALUES('schema_version', '6')")
        db.execute("INSERT INTO series VALUES(1, 'host.cpu_pct', ''), (2, 'gpu.throttle_mask', '')")
        db.executemany(
            "INSERT INTO points VALUES(?, ?, ?)",
            [(7200.0 + i, s, 0.1 * i + s) for i in range(30) for s in (1, 2)],
        )
    db.execute("PRAGMA user_version = 6")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()

    ro = RunStore(path, readonly=True)
    series, span = ro.read_all(), ro.time_range()
    assert series[("host.cpu_pct", "")].v == [0.1 * i + 1 for i in range(30)]
    assert ro.read("gpu.throttle_mask")[0].v == [0.1 * i + 2 for i in range(30)]
    assert span == (7200.0, 7229.0) and ro.skipped == {}
    ro.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # read-only: not written

    st = RunStore(path)
    assert _pragma(path, "user_version") == SCHEMA_VERSION == 7
    assert _columns(path, "samples") == ["ts", "data"]
    assert st.read_all() == series and st.time_range() == span
    assert st.db.execute("SELECT COUNT(*) FROM points").fetchone() == (60,)  # left as they are
    for i in range(30, 70):
        st.add_points(7200.0 + i, [Point("host.cpu_pct", "", 0.1 * i + 1)])
    assert st.read("host.cpu_pct")[0].v == [0.1 * i + 1 for i in range(70)]
    assert st.read_all()[("host.cpu_pct", "")].ts == [7200.0 + i for i in range(70)]
    assert st.time_range() == (7200.0, 7269.0)
    assert st.downsample(older_than=7260.0) == 60 + 30  # points of both layouts folded
    assert st.db.execute("SELECT COUNT(*) FROM points").fetchone() == (0,)
    got = st.read_all()
    assert got[("host.cpu_pct", "")].ts == [7200.0] + [7260.0 + i for i in range(10)]
    assert got[("host.cpu_pct", "")].v[0] == pytest.approx(sum(0.1 * i + 1 for i in range(60)) / 60)
    assert got[("gpu.throttle_mask", "")].v == [0.1 * 29 + 2]  # its max
    assert st.skipped == {}
    st.close()


def test_a_held_sample_is_written_with_the_next_and_read_by_its_own_store(
    tmp_path: Path,
) -> None:
    """``hold``: a sample's row waits for the next sample's transaction (two samples, one
    commit). Another connection sees it once that commit lands; the writer's own reads, a
    downsampling and the end of the run see it at once. Never more than one is held."""
    path = tmp_path / "run.db"
    st = RunStore(path)
    other = RunStore(path, readonly=True)
    pts = [Point("host.cpu_pct", "", 1.0)]
    st.add_points(100.0, pts)
    st.add_points(100.25, pts, hold=True)
    assert st.held
    assert other.time_range() == (100.0, 100.0)  # not committed yet
    st.add_points(100.5, pts, hold=True)  # one is held already: both written now
    assert not st.held
    assert other.time_range() == (100.0, 100.5)
    st.add_points(100.75, [Point("host.cpu_pct", "", 7.0)], hold=True)
    [s] = st.read("host.cpu_pct")  # the writer's own read flushes first
    assert s.ts[-1] == 100.75 and s.v[-1] == 7.0 and not st.held
    st.add_points(101.0, pts, hold=True)
    st.add_points(101.25, pts, touch=[("procs", ["1"], 101.0)], hold=True)  # with touch: now
    assert not st.held and other.time_range() == (100.0, 101.25)
    st.add_points(101.5, pts, hold=True)
    st.close()  # closing writes what is held
    assert other.time_range() == (100.0, 101.5)
    other.close()


def test_a_store_sink_holds_samples_under_a_second_apart_and_loses_at_most_one(
    tmp_path: Path,
) -> None:
    """The run's store sink writes two samples to a transaction only when they come less than
    HOLD_BELOW_S apart; a writer that dies without closing loses only the sample it held."""
    from stallscope.collect.collector import Sample
    from stallscope.collect.sinks import HOLD_BELOW_S, StoreSink

    path = tmp_path / "run.db"
    st = RunStore(path)
    sink = StoreSink(st)
    pts = [Point("host.cpu_pct", "", 3.0)]
    t = 1000.0
    for _ in range(3):  # an interval of HOLD_BELOW_S: each sample written at once
        sink.write(Sample(t, points=list(pts)))
        assert not st.held
        t += HOLD_BELOW_S
    for i in range(6):  # a quarter of it (the first still HOLD_BELOW_S after the last):
        sink.write(Sample(t, points=list(pts)))  # every other sample waits for the next
        assert st.held == (i % 2 == 1)
        t += HOLD_BELOW_S / 4
    other = RunStore(path, readonly=True)
    stored = [x for s in other.read("host.cpu_pct") for x in s.ts]
    assert len(stored) == 3 + 5  # the sixth is held: a crash now loses it alone
    st.db.close()  # the writer dies without closing its store
    other.close()
