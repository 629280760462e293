"""The disk source: diskstats parsing, iostat -x arithmetic, wrap/reset, the reader, path mapping.

Parsers and path mapping run on files under tests/fixtures: ``diskstats-kernel-6.18-vm.txt`` and
``sys-vm-6.18-loop-overlay/`` were recorded on the development VM; the ``*-typical`` diskstats
files and ``sys-typical-server/`` are hand-made in the exact shapes older kernels and server
layouts produce (see the README in each tree). The live and root-only tests at the end use this
machine; the comparison with the real ``iostat`` is in test_disk_iostat.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import cast

import pytest
from conftest import FIXTURES
from hypothesis import given
from hypothesis import strategies as st

from stallscope.errors import ParseError, SourceUnavailable, UsageError
from stallscope.metrics import by_source
from stallscope.sources.blockdev import describe_path, device_info, devices_for_path
from stallscope.sources.disk import (
    FIELDS,
    DiskCounters,
    DiskPayload,
    DiskSource,
    counter_delta,
    iostat_fields,
    parse_diskstats,
)

VM = FIXTURES / "sys-vm-6.18-loop-overlay"
SERVER = FIXTURES / "sys-typical-server"


def _by_name(text: str) -> dict[str, DiskCounters]:
    return {c.name: c for c in parse_diskstats(text)}


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- parse_diskstats: one test per kernel line shape -------------------------------------------


def test_parse_20_fields_kernel_6_18_recorded() -> None:
    rows = _by_name(_fixture("diskstats-kernel-6.18-vm.txt"))
    assert list(rows) == [
        "loop0",
        "loop0p1",
        "loop1",
        "loop2",
        "loop3",
        "loop4",
        "loop5",
        "loop6",
        "loop7",
        "vda",
        "zram0",
    ]
    vda = rows["vda"]
    # 254 0 vda 65685 13372 4990682 19342 25390 43701 4375184 17577 0 9644 37668
    #           8406 35 302736 560 3937 187
    assert vda == DiskCounters(
        254,
        0,
        "vda",
        65685,
        13372,
        4990682,
        19342,
        25390,
        43701,
        4375184,
        17577,
        0,
        9644,
        37668,
        8406,
        35,
        302736,
        560,
        3937,
        187,
        nfields=20,
    )
    assert vda.extended and vda.total_ios == 65685 + 25390 + 8406 + 3937
    assert rows["loop0p1"].major == 259 and rows["loop0p1"].rd_sectors == 2798


def test_parse_18_fields_kernel_4_19_discards() -> None:
    nvme = _by_name(_fixture("diskstats-kernel-4.19-typical.txt"))["nvme0n1"]
    assert nvme.nfields == 18
    assert (nvme.rd_ios, nvme.wr_ticks, nvme.io_ticks, nvme.time_in_queue) == (
        24051861,
        3123398,
        4311880,
        7632780,
    )
    assert (nvme.dc_ios, nvme.dc_merges, nvme.dc_sectors, nvme.dc_ticks) == (
        153283,
        0,
        2145452800,
        5032,
    )
    assert (nvme.fl_ios, nvme.fl_ticks) == (0, 0)


def test_parse_14_fields_kernel_3_10() -> None:
    sdb = _by_name(_fixture("diskstats-kernel-3.10-typical.txt"))["sdb"]
    assert sdb == DiskCounters(
        8,
        16,
        "sdb",
        81525914,
        3116,
        20866813242,
        1237846035,
        3128361,
        236519,
        1217815720,
        43180163,
        0,
        391938839,
        1281022582,
        nfields=14,
    )
    assert (sdb.dc_ios, sdb.fl_ios) == (0, 0)


def test_parse_7_field_partitions_kernel_2_6_18() -> None:
    rows = _by_name(_fixture("diskstats-kernel-2.6.18-typical.txt"))
    assert rows["sda"].nfields == 14
    sda2 = rows["sda2"]  # "8 2 sda2 410628 9512642 737704 5901600"
    assert sda2.nfields == 7 and not sda2.extended
    assert (sda2.rd_ios, sda2.rd_sectors, sda2.wr_ios, sda2.wr_sectors) == (
        410628,
        9512642,
        737704,
        5901600,
    )
    assert (sda2.rd_merges, sda2.rd_ticks, sda2.io_ticks) == (0, 0, 0)
    # iostat -x skips such lines: no merges, no times -> nothing to report
    assert iostat_fields(sda2, sda2._replace(rd_ios=410700), 1.0) is None


def test_parse_future_kernel_with_more_fields_keeps_the_known_20() -> None:
    line = " 259 0 nvme0n1 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19\n"
    (c,) = parse_diskstats(line)
    assert c.nfields == 20 and c.fl_ticks == 17


@pytest.mark.parametrize(
    "line",
    [
        "8 0 sda 1 2 3 4 5 6 7 8 9 10 11 12",  # 15 fields
        "8 0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",  # 19 fields
        "8 0 sda 1 2",  # 5 fields
        "8 0 sda 1 2 3 4 5 6 7 8 9 x 11",  # not a number
        "8 0 sda 1 2 3 4 5 6 7 8 9 -1 11",  # negative
        "a b sda 1 2 3 4 5 6 7 8 9 10 11",  # bad major/minor
    ],
)
def test_unknown_or_bad_line_raises_parse_error_quoting_it(line: str) -> None:
    text = " 254 0 vda 1 2 3 4 5 6 7 8 9 10 11\n" + line + "\n"
    with pytest.raises(ParseError) as exc:
        parse_diskstats(text)
    assert line in str(exc.value)
    assert "\n" not in str(exc.value)


def test_blank_lines_are_skipped() -> None:
    assert parse_diskstats("") == []
    assert len(parse_diskstats("\n 8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n\n")) == 1


# --- iostat_fields: the arithmetic ---------------------------------------------------------------


_ZERO = parse_diskstats("8 0 sda 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0")[0]


def _c(**kw: int) -> DiskCounters:
    return _ZERO._replace(**kw)  # type: ignore[arg-type]


def test_fields_match_the_metric_vocabulary() -> None:
    assert FIELDS == tuple(m.key for m in by_source("disk"))


def test_iostat_formulas_by_hand() -> None:
    prev = _c(
        rd_ios=1000,
        rd_merges=10,
        rd_sectors=80000,
        rd_ticks=5000,
        wr_ios=400,
        wr_merges=100,
        wr_sectors=16000,
        wr_ticks=9000,
        io_ticks=70000,
        time_in_queue=100000,
        dc_ios=3,
        fl_ios=2,
    )
    # over 2 s: 500 reads (20 merged) of 100 000 sectors in 2 500 ms; 100 writes (50 merged)
    # of 4 000 sectors in 1 000 ms; busy 1 500 ms; weighted 3 000 ms
    cur = prev._replace(
        rd_ios=1500,
        rd_merges=30,
        rd_sectors=180000,
        rd_ticks=7500,
        wr_ios=500,
        wr_merges=150,
        wr_sectors=20000,
        wr_ticks=10000,
        io_ticks=71500,
        time_in_queue=103000,
        dc_ios=9,
        fl_ios=7,
    )
    f = iostat_fields(prev, cur, 2.0)
    assert f is not None and tuple(f) == FIELDS
    assert f == pytest.approx(
        {
            "r_s": 250.0,
            "w_s": 50.0,
            "rkb_s": 25000.0,  # 100 000 sectors x 512 B / 1024 / 2 s
            "wkb_s": 1000.0,
            "rrqm_s": 10.0,
            "wrqm_s": 25.0,
            "r_await_ms": 5.0,  # 2 500 ms / 500 reads
            "w_await_ms": 10.0,
            "aqu_sz": 1.5,  # 3 000 ms / 2 000 ms
            "rareq_kb": 100.0,  # 100 000 sectors / 500 reads / 2
            "wareq_kb": 20.0,
            "util_pct": 75.0,  # 1 500 ms busy of 2 000
        }
    )


def test_idle_interval_gives_zero_awaits_and_sizes() -> None:
    prev = _c(rd_ios=5, rd_ticks=9, wr_ios=5, wr_ticks=9)
    f = iostat_fields(prev, prev, 1.0)
    assert f == dict.fromkeys(FIELDS, 0.0)


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        iostat_fields(_c(), _c(), 0.0)


def test_32_bit_wrap_of_time_fields() -> None:
    # the kernel prints the ms fields as 32-bit unsigned on every kernel
    prev = _c(rd_ios=100, rd_ticks=2**32 - 100, io_ticks=2**32 - 10, time_in_queue=2**32 - 1)
    cur = prev._replace(rd_ios=110, rd_ticks=50, io_ticks=490, time_in_queue=999)
    f = iostat_fields(prev, cur, 1.0)
    assert f is not None
    assert f["r_await_ms"] == pytest.approx(15.0)  # 150 ms / 10 reads
    assert f["util_pct"] == pytest.approx(50.0)
    assert f["aqu_sz"] == pytest.approx(1.0)


def test_32_bit_wrap_of_counts_on_32_bit_kernels() -> None:
    prev = _c(rd_ios=2**32 - 10, rd_sectors=2**32 - 8)
    cur = prev._replace(rd_ios=10, rd_sectors=2**32 - 8 + 160)
    f = iostat_fields(prev, cur, 1.0)
    assert f is not None and f["r_s"] == 20 and f["rareq_kb"] == 4.0


def test_reset_device_is_skipped_for_the_interval() -> None:
    prev = _c(rd_ios=5000, rd_sectors=400000, wr_ios=800, wr_sectors=9000)
    restarted = _c(rd_ios=12, rd_sectors=96, wr_ios=0, wr_sectors=0)
    assert iostat_fields(prev, restarted, 1.0) is None


def test_64_bit_counter_going_down_is_a_reset_not_a_wrap() -> None:
    prev = _c(rd_ios=100, rd_sectors=2**40)
    assert iostat_fields(prev, prev._replace(rd_ios=120, rd_sectors=2**40 - 8), 1.0) is None


def test_small_counter_going_down_is_a_reset_not_a_wrap() -> None:
    # fits in 32 bits, but "wrapping" would mean 4 billion reads in one interval
    prev = _c(rd_ios=1000, wr_ios=50, wr_sectors=800)
    assert iostat_fields(prev, prev._replace(rd_ios=10, wr_ios=60, wr_sectors=900), 1.0) is None


def test_same_name_new_device_number_is_another_device() -> None:
    prev = _c(rd_ios=10)
    assert iostat_fields(prev, prev._replace(minor=16, rd_ios=20), 1.0) is None


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**31 - 1))
def test_counter_delta_undoes_any_32_bit_wrap(prev: int, step: int) -> None:
    assert counter_delta(prev, (prev + step) % 2**32) == step


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_counter_delta_never_negative(prev: int, cur: int) -> None:
    d = counter_delta(prev, cur)
    assert d is None or 0 <= d
    if cur >= prev:
        assert d == cur - prev


# --- DiskSource on files -------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


LINE = "{maj:4d} {min:7d} {name} {r} 0 {rs} {rt} {w} 0 {ws} {wt} 0 {busy} {q} 0 0 0 0 0 0\n"


def _line(
    name: str,
    maj: int = 8,
    mn: int = 0,
    r: int = 0,
    rs: int = 0,
    rt: int = 0,
    w: int = 0,
    ws: int = 0,
    wt: int = 0,
    busy: int = 0,
    q: int = 0,
) -> str:
    return LINE.format(
        maj=maj, min=mn, name=name, r=r, rs=rs, rt=rt, w=w, ws=ws, wt=wt, busy=busy, q=q
    )


@pytest.fixture
def fake_root(tmp_path: Path) -> tuple[Path, Path]:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    for name in ("sda", "sdb", "nvme0n1"):
        (sys / "block" / name).mkdir(parents=True)
    return proc, sys


def test_source_rates_appear_disappear_and_reset(fake_root: tuple[Path, Path]) -> None:
    proc, sys = fake_root
    clock = _Clock()
    stats = proc / "diskstats"
    stats.write_text(_line("sda", r=100, rs=800, rt=50) + _line("sda1", mn=1, r=99))
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), clock=clock)
    src.open()
    assert src.sample(0.0) is None  # first call primes

    clock.t += 2.0
    stats.write_text(
        _line("sda", r=300, rs=2400, rt=250, busy=1000)
        + _line("sda1", mn=1, r=290)
        + _line("sdb", mn=16, r=7)
    )  # sdb appears: no rates yet
    out = src.sample(0.0)
    assert out is not None and list(out) == ["sda"]  # sda1 is a partition: hidden
    assert out["sda"]["r_s"] == 100.0 and out["sda"]["r_await_ms"] == 1.0
    assert out["sda"]["rkb_s"] == 400.0 and out["sda"]["util_pct"] == 50.0

    clock.t += 1.0
    stats.write_text(_line("sdb", mn=16, r=17))  # sda gone (hot-unplugged)
    out = src.sample(0.0)
    assert out is not None and list(out) == ["sdb"] and out["sdb"]["r_s"] == 10.0

    clock.t += 1.0
    stats.write_text(_line("sdb", mn=16, r=2))  # sdb replaced: counters restarted
    assert src.sample(0.0) == {}
    clock.t += 1.0
    stats.write_text(_line("sdb", mn=16, r=5))
    out = src.sample(0.0)
    assert out is not None and out["sdb"]["r_s"] == 3.0
    src.close()


def test_source_hides_whole_devices_that_never_did_io(fake_root: tuple[Path, Path]) -> None:
    proc, sys = fake_root
    clock = _Clock()
    (proc / "diskstats").write_text(_line("sda", r=5) + _line("sdb", mn=16))
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), clock=clock)
    src.sample(0.0)
    clock.t += 1.0
    out = src.sample(0.0)
    assert out is not None and list(out) == ["sda"]
    clock.t += 1.0
    (proc / "diskstats").write_text(_line("sda", r=5) + _line("sdb", mn=16, w=4, ws=32))
    out = src.sample(0.0)  # sdb's first I/O: shown, rated against its idle reading
    assert out is not None and list(out) == ["sda", "sdb"] and out["sdb"]["w_s"] == 4.0


def test_source_named_devices_shown_even_idle_and_partitions_allowed(
    fake_root: tuple[Path, Path],
) -> None:
    proc, sys = fake_root
    clock = _Clock()
    (proc / "diskstats").write_text(_line("sda", r=5) + _line("sda1", mn=1) + _line("sdb", 16))
    src = DiskSource(
        proc_root=str(proc), sys_root=str(sys), devices=["/dev/sda1", "sdb"], clock=clock
    )
    src.sample(0.0)
    clock.t += 1.0
    out = src.sample(0.0)
    assert out is not None and sorted(out) == ["sda1", "sdb"]


def test_an_unchanged_devices_points_are_its_fields_points_every_sample(
    fake_root: tuple[Path, Path],
) -> None:
    """An idle device's points are made once and handed out again: each reading's points are
    still exactly its payload's, through idle, busy and idle again, beside a busy device."""
    from stallscope.sources.base import numeric_points

    proc, sys = fake_root
    clock = _Clock()
    stats = proc / "diskstats"
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), clock=clock)
    sda = [5, 5, 5, 9, 9, 9]  # reads of sda at each sample: idle, busy, idle again
    made = []
    for i, r in enumerate(sda):
        stats.write_text(_line("sda", r=r, rs=8 * r) + _line("sdb", mn=16, r=10 + i))
        reading = src.read(0.0)
        clock.t += 1.0
        if reading is None:
            continue
        want = [p for dev, f in reading.payload.items() for p in numeric_points("disk", dev, f)]
        assert reading.points == want
        made.append(reading.payload["sda"]["r_s"])
    assert made == [0.0, 0.0, 4.0, 0.0, 0.0]
    other = cast(DiskPayload, {"sda": {"r_s": 1.0}})  # not the sample's own: made afresh
    assert src.points(other) == [("disk.r_s", "sda", 1.0)]


def test_a_file_that_reads_the_same_is_not_parsed_again(fake_root: tuple[Path, Path]) -> None:
    """No device did any I/O: the file reads as at the last sample, it is not parsed again,
    and the payload is the last idle sample's (every field 0), handed out again; the next I/O
    gives rates again, over its own interval."""
    proc, sys = fake_root
    clock = _Clock()
    stats = proc / "diskstats"
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), clock=clock)
    parses: list[str] = []
    real = src._parse
    src._parse = lambda text: parses.append(text) or real(text)  # type: ignore[method-assign]
    got, payloads = [], []
    for r in (5, 9, 9, 9, 9, 13):  # sda's reads: busy, idle three times, busy
        stats.write_text(_line("sda", r=r, rs=8 * r, rt=r) + _line("sdb", mn=16, r=3))
        reading = src.read(0.0)
        clock.t += 1.0
        if reading is not None:
            got.append((reading.payload["sda"]["r_s"], reading.payload["sdb"]["r_s"]))
            payloads.append(reading.payload)
            assert all(v == 0.0 for v in reading.payload["sdb"].values())
    assert got == [(4.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (4.0, 0.0)]
    assert len(parses) == 3  # at 5, 9 and 13: never the text read at the last sample again
    # the first idle sample's payload is made, the next two are it again
    assert payloads[2] is payloads[1] and payloads[3] is payloads[1]
    assert payloads[1] is not payloads[0] and payloads[4] is not payloads[1]


def test_source_same_clock_tick_reports_nothing(fake_root: tuple[Path, Path]) -> None:
    proc, sys = fake_root
    clock = _Clock()
    (proc / "diskstats").write_text(_line("sda", r=5))
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), clock=clock)
    src.sample(0.0)
    assert src.sample(0.0) == {}


def test_source_reads_files_larger_than_its_buffer(fake_root: tuple[Path, Path]) -> None:
    proc, sys = fake_root
    clock = _Clock()
    lines = "".join(_line(f"loop{i}", maj=7, mn=i) for i in range(600)) + _line("sda", r=1)
    assert len(lines) > 16384
    (proc / "diskstats").write_text(lines)
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), devices=["sda"], clock=clock)
    _, counters = src.read_counters()
    assert counters["sda"].rd_ios == 1


def test_source_unknown_device_is_unavailable(fake_root: tuple[Path, Path]) -> None:
    proc, sys = fake_root
    (proc / "diskstats").write_text(_line("sda"))
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), devices=["sdq"])
    with pytest.raises(SourceUnavailable, match="sdq"):
        src.open()


def test_source_without_diskstats_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="diskstats"):
        DiskSource(proc_root=str(tmp_path)).open()


def test_source_default_set_on_recorded_vm(tmp_path: Path) -> None:
    # recorded: vda and loop0 did I/O; loop0p1 is a partition; loop1-7 and zram0 never did
    proc = tmp_path / "proc"
    proc.mkdir()
    shutil.copy(VM / "proc" / "diskstats", proc / "diskstats")
    clock = _Clock()
    src = DiskSource(proc_root=str(proc), sys_root=str(VM / "sys"), clock=clock)
    assert src.sample(0.0) is None
    clock.t += 1.0
    out = src.sample(0.0)
    assert out is not None and list(out) == ["loop0", "vda"]
    assert out["vda"] == dict.fromkeys(FIELDS, 0.0)


# --- describe_path / devices_for_path on recorded and typical trees ----------------------------


def _describe(path: str, root: Path) -> tuple[list[str], str]:
    d = describe_path(path, proc_root=str(root / "proc"), sys_root=str(root / "sys"))
    return d.devices, d.reason


def test_path_on_recorded_vm_root_disk() -> None:
    d = describe_path("/work/main/data", proc_root=str(VM / "proc"), sys_root=str(VM / "sys"))
    assert d.devices == ["vda"] and d.mount_point == "/" and d.fstype == "ext4"
    assert d.source == "/dev/vda" and d.reason == ""


def test_path_on_recorded_vm_loop_partition_follows_backing_file() -> None:
    # /tmp/ssfix/loopmnt is loop0p1 (259:0) -> loop0 -> /tmp/ssfix/disk.img -> / -> vda
    assert _describe("/tmp/ssfix/loopmnt/upper/f", VM) == (["vda"], "")


def test_path_on_recorded_vm_overlay_follows_layers() -> None:
    # lower: /dev/shm/ssfix-lower (tmpfs, no device) and /tmp/ssfix/lower2 (vda); upper: loop
    assert _describe("/tmp/ssfix/merged/f", VM) == (["vda"], "")


def test_path_on_recorded_vm_memory_and_pseudo_filesystems() -> None:
    devs, why = _describe("/dev/shm/batch.npy", VM)
    assert devs == [] and "tmpfs" in why and "memory" in why
    devs, why = _describe("/proc/self/io", VM)
    assert devs == [] and "proc" in why


@pytest.mark.parametrize(
    ("path", "devices", "why"),
    [
        ("/home/me/code", ["nvme0n1"], ""),  # / on nvme0n1p1 -> its disk
        ("/datasets/imagenet", ["nvme0n1"], ""),  # "/data" is not a prefix of "/datasets"
        ("/data/imagenet/train", ["nvme0n1", "nvme1n1"], ""),  # LVM over p2 + nvme1n1
        ("/raid/x", ["sda", "sdb"], ""),  # md RAID1 over sda1 + sdb1
        ("/scratch/run1", ["sdc"], ""),  # btrfs: anonymous 0:48, source names the disk
        ("/mnt/usb stick/photos", ["sdd"], ""),  # \040 in mountinfo
        ("/mnt/train-img/shard-0.tar", ["sda", "sdb"], ""),  # loop -> file on md0
        ("/var/lib/docker/overlay2/3f2a/merged/app", ["nvme0n1", "nvme1n1"], ""),
        ("/data/cache/x", [], "tmpfs"),  # longest mount point wins over /data
        ("/mnt/nfs/imagenet", [], "network"),
        ("/mnt/s3/bucket", [], "FUSE"),
        ("/tank/datasets/x", [], "ZFS"),
        ("/mnt/gone/x", [], "sdg1 not found"),
    ],
)
def test_path_on_typical_server(path: str, devices: list[str], why: str) -> None:
    got, reason = _describe(path, SERVER)
    assert got == devices
    assert (why in reason) if why else reason == ""
    assert (
        devices_for_path(path, proc_root=str(SERVER / "proc"), sys_root=str(SERVER / "sys"))
        == devices
    )


def test_path_without_mountinfo_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="mountinfo"):
        devices_for_path("/x", proc_root=str(tmp_path), sys_root=str(tmp_path))


def test_malformed_mountinfo_raises_parse_error(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountinfo").write_text("22 1 259:1 / / rw shared:1 ext4\n")
    with pytest.raises(ParseError, match="259:1"):
        devices_for_path("/x", proc_root=str(tmp_path), sys_root=str(tmp_path))


# --- device_info ----------------------------------------------------------------------------------


def test_device_info_nvme() -> None:
    info = device_info("nvme0n1", sys_root=str(SERVER / "sys"))
    assert info == {
        "name": "nvme0n1",
        "disk": "nvme0n1",
        "kind": "nvme",
        "virtual": False,
        "rotational": False,
        "model": "SAMSUNG MZVL21T0HCLR-00B00",
        "vendor": None,
        "serial": None,
        "size_bytes": 1000215216 * 512,
        "removable": False,
        "scheduler": "none",
        "read_ahead_kb": 128,
    }


@pytest.mark.parametrize(
    ("name", "disk", "kind", "virtual", "rotational"),
    [
        ("/dev/sda", "sda", "scsi", False, True),
        ("sdc", "sdc", "scsi", False, False),
        ("sdd1", "sdd", "scsi", False, True),
        ("md0", "md0", "md", True, True),
        ("dm-0", "dm-0", "dm", True, False),
        ("loop0", "loop0", "loop", True, True),
        ("nvme0n1p2", "nvme0n1", "nvme", False, False),
    ],
)
def test_device_info_kinds(
    name: str, disk: str, kind: str, virtual: bool, rotational: bool
) -> None:
    info = device_info(name, sys_root=str(SERVER / "sys"))
    assert (info["disk"], info["kind"], info["virtual"], info["rotational"]) == (
        disk,
        kind,
        virtual,
        rotational,
    )


def test_device_info_partition_size_and_removable() -> None:
    info = device_info("sdd1", sys_root=str(SERVER / "sys"))
    assert info["size_bytes"] == 60061696 * 512 and info["removable"] is True
    assert info["vendor"] == "SanDisk" and info["scheduler"] == "bfq"


def test_device_info_recorded_virtio_disk() -> None:
    info = device_info("vda", sys_root=str(VM / "sys"))
    assert (info["kind"], info["virtual"], info["rotational"]) == ("virtio", True, True)
    assert info["size_bytes"] == 256 * 2**30 and info["scheduler"] == "mq-deadline"


def test_device_info_unknown_device() -> None:
    with pytest.raises(UsageError, match="sdq"):
        device_info("sdq", sys_root=str(SERVER / "sys"))


# --- this machine ---------------------------------------------------------------------------------

linux_only = pytest.mark.skipif(not os.path.exists("/proc/diskstats"), reason="needs Linux")


@linux_only
def test_live_repository_lives_on_a_block_device() -> None:
    d = describe_path(__file__)
    assert d.devices, f"{__file__} is on no block device: {d.reason}"
    for name in d.devices:
        assert os.path.isdir(f"/sys/block/{name.replace('/', '!')}")
        assert device_info(name)["disk"] == name
        if os.path.exists(f"/dev/{name}"):
            assert devices_for_path(f"/dev/{name}") == [name]


@linux_only
def test_live_proc_is_not_a_device() -> None:
    assert devices_for_path("/proc/self") == []


def test_source_without_sys_block_says_why(fake_root: tuple[Path, Path], tmp_path: Path) -> None:
    proc, _ = fake_root
    (proc / "diskstats").write_text(_line("sda"))
    with pytest.raises(SourceUnavailable, match="name the devices"):
        DiskSource(proc_root=str(proc), sys_root=str(tmp_path / "nosys")).open()
    DiskSource(proc_root=str(proc), sys_root=str(tmp_path / "nosys"), devices=["sda"]).open()


@linux_only
def test_live_sample_is_cheap() -> None:
    src = DiskSource()
    src.open()
    src.sample(time.time())
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        src.sample(time.time())
    per_call = (time.perf_counter() - t0) / n
    src.close()
    assert per_call < 2e-3, f"one sample took {per_call * 1e6:.0f} µs"


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.root
@linux_only
def test_live_loop_device_maps_to_backing_disk_and_shows_io(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: attaches a loop device and mounts it")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    backing = devices_for_path(str(tmp_path))
    if not backing:
        pytest.skip(f"{tmp_path} is not on a block device: nowhere to put a loop image")
    image = tmp_path / "loop.img"
    with open(image, "wb") as f:
        f.truncate(64 * 2**20)
    try:
        dev = _run("losetup", "--find", "--show", str(image))
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot attach a loop device here: {exc.stderr.strip()}")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = False
    try:
        _run("mkfs.ext4", "-q", dev)
        _run("mount", dev, str(mnt))
        mounted = True
        name = dev.removeprefix("/dev/")
        d = describe_path(str(mnt / "data.bin"))
        assert d.fstype == "ext4" and d.source == dev
        assert d.devices == backing
        info = device_info(name)
        assert (info["kind"], info["virtual"]) == ("loop", True)
        if os.path.exists(dev):  # no udev in some containers: no /dev node
            assert devices_for_path(dev) == backing

        payload = os.urandom(4 * 2**20)
        (mnt / "data.bin").write_bytes(payload)
        src = DiskSource()
        src.sample(time.time())
        _run("umount", str(mnt))  # drop the page cache of the loop fs ...
        mounted = False
        _run("mount", dev, str(mnt))
        mounted = True
        assert (mnt / "data.bin").read_bytes() == payload  # ... so this read hits the device
        time.sleep(0.05)
        out = src.sample(time.time())
        assert out is not None and name in out, f"{name} missing from {sorted(out or {})}"
        assert out[name]["rkb_s"] > 0 and out[name]["r_s"] > 0
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", dev], check=False)


def test_an_unchanged_line_gives_what_parsing_it_again_would(fake_root: tuple[Path, Path]) -> None:
    """A line that reads as at the last sample is not parsed again (an idle device): its
    fields are then all zero, as iostat_fields gives for it, and a line that changes is parsed
    anew."""
    proc, sys = fake_root
    clock = _Clock()
    stats = proc / "diskstats"
    busy = _line("sda", r=100, rs=800, rt=50, busy=40, q=60)
    stats.write_text(busy + _line("sdb", mn=16, r=9, rs=72, rt=3))
    src = DiskSource(proc_root=str(proc), sys_root=str(sys), clock=clock)
    assert src.sample(0.0) is None
    first = src._last["sda"]
    moved = _line("sda", r=130, rs=1040, rt=80, busy=70, q=95)
    for later in (moved, moved):  # sda moves, then stays; sdb stays throughout
        clock.t += 0.5
        stats.write_text(later + _line("sdb", mn=16, r=9, rs=72, rt=3))
        prev = src._last
        out = src.sample(0.0)
        assert out is not None
        assert src._last["sdb"] is prev["sdb"]  # the same record, not parsed again
        for dev in ("sda", "sdb"):
            assert out[dev] == iostat_fields(prev[dev], src._last[dev], 0.5), dev
    assert out["sda"] == out["sdb"] == dict.fromkeys(FIELDS, 0.0)
    assert src._last["sda"] is not first
    assert list(iostat_fields(first, first, 1.0) or {}) == list(FIELDS)
    src.close()
