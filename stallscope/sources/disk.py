"""The ``disk`` source: ``/proc/diskstats`` turned into sysstat's ``iostat -x`` columns.

Every field means exactly what the ``iostat -x`` column of sysstat 12.6 means, computed the
same way over the interval between two readings (Δ = current minus previous reading of a
cumulative counter, ``dt`` = seconds between the two reads):

==============  ======  =================  ===============================================
key             unit    ``iostat -x``      formula
==============  ======  =================  ===============================================
``r_s``         1/s     ``r/s``            Δ reads completed / dt
``w_s``         1/s     ``w/s``            Δ writes completed / dt
``rkb_s``       kB/s    ``rkB/s``          Δ sectors read / 2 / dt  (a sector is 512 B)
``wkb_s``       kB/s    ``wkB/s``          Δ sectors written / 2 / dt
``rrqm_s``      1/s     ``rrqm/s``         Δ reads merged / dt
``wrqm_s``      1/s     ``wrqm/s``         Δ writes merged / dt
``r_await_ms``  ms      ``r_await``        Δ ms spent reading / Δ reads (0 if no reads)
``w_await_ms``  ms      ``w_await``        Δ ms spent writing / Δ writes (0 if no writes)
``aqu_sz``      -       ``aqu-sz``         Δ weighted ms doing I/O / (dt × 1000)
``rareq_kb``    kB      ``rareq-sz``       Δ sectors read / Δ reads / 2 (0 if no reads)
``wareq_kb``    kB      ``wareq-sz``       Δ sectors written / Δ writes / 2 (0 if none)
``util_pct``    %       ``%util``          Δ ms with I/O in flight / (dt × 1000) × 100
==============  ======  =================  ===============================================

Discards and flushes (kernel 4.18+ / 5.5+) are parsed but, as in ``iostat -x``, not counted
in the write columns. ``util_pct`` is not clamped (iostat does not clamp it either); on
devices that serve requests in parallel (NVMe, RAID, network disks) 100 % does not mean
saturated.

Layout: :func:`parse_diskstats` (pure, text -> :class:`DiskCounters`),
:func:`iostat_fields` (pure, two readings -> the fields, with counter wrap and reset decided
in :func:`_interval_deltas` through the shared :func:`~stallscope.sources.base.counter_delta`),
:func:`disk_counters` (pure, one reading -> the raw counters in base units, node_exporter's
``node_disk_*`` set) and :class:`DiskSource` (the thin reader). Which disks hold a dataset and
what kind of disk a device is: :mod:`stallscope.sources.blockdev`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, ClassVar, NamedTuple, TypedDict, cast

from stallscope.errors import ParseError, SourceUnavailable, StallscopeError
from stallscope.metrics import Point
from stallscope.sources.base import (  # counter_delta: shared by every source, re-exported
    Counter,
    Source,
    counter_delta,
    counter_deltas,
    numeric_points,
)
from stallscope.sources.blockdev import device_info, sys_name

__all__ = [
    "FIELDS",
    "DiskCounters",
    "DiskFields",
    "DiskPayload",
    "DiskSource",
    "counter_delta",
    "disk_counters",
    "iostat_fields",
    "parse_diskstats",
]


class DiskFields(TypedDict):
    """One device of a disk payload over one interval: the twelve ``iostat -x`` fields, in its
    reading order. Each is the metric ``disk.<key>`` of the vocabulary."""

    r_s: float
    w_s: float
    rkb_s: float
    wkb_s: float
    rrqm_s: float
    wrqm_s: float
    r_await_ms: float
    w_await_ms: float
    aqu_sz: float
    rareq_kb: float
    wareq_kb: float
    util_pct: float


#: a disk payload: device name -> its fields
DiskPayload = dict[str, DiskFields]
#: payload keys, in ``iostat -x`` reading order; the same keys as ``metrics.by_source("disk")``
FIELDS: tuple[str, ...] = tuple(DiskFields.__annotations__)


class DiskCounters(NamedTuple):
    """One line of ``/proc/diskstats``: cumulative counters of one block device or partition.

    Names follow the kernel's Documentation/admin-guide/iostats.rst. Times are milliseconds,
    sectors are 512 bytes whatever the device's block size. Fields a line shape does not have
    are 0; ``nfields`` says which shape the line had:

    * 7  -- partitions on kernels 2.6.0-2.6.24: reads, sectors read, writes, sectors written
      (no merges, no times: ``iostat -x`` cannot show these and neither can we);
    * 14 -- kernels 2.6.25-4.17: reads, writes, in-flight, busy time, weighted time;
    * 18 -- kernels 4.18-5.4: plus discards;
    * 20 -- kernels 5.5+: plus flushes (more fields, if a later kernel appends some, are
      ignored; 20 is recorded).
    """

    major: int
    minor: int
    name: str
    rd_ios: int  #: reads completed
    rd_merges: int  #: reads merged with a neighbour before being issued
    rd_sectors: int  #: sectors read
    rd_ticks: int  #: ms spent on reads (sum over requests, queueing included)
    wr_ios: int  #: writes completed
    wr_merges: int
    wr_sectors: int
    wr_ticks: int
    ios_in_progress: int  #: requests in flight now (a gauge, not a counter)
    io_ticks: int  #: ms during which at least one request was in flight (%util)
    time_in_queue: int  #: weighted ms: requests in flight x ms (aqu-sz)
    dc_ios: int = 0  #: discards completed (4.18+)
    dc_merges: int = 0
    dc_sectors: int = 0
    dc_ticks: int = 0
    fl_ios: int = 0  #: flush requests completed (5.5+)
    fl_ticks: int = 0
    nfields: int = 20  #: shape of the line: 7, 14, 18 or 20

    @property
    def extended(self) -> bool:
        """True when the line has merges and times (everything but the old 7-field shape)."""
        return self.nfields != 7

    @property
    def total_ios(self) -> int:
        """All completed requests: reads + writes + discards + flushes."""
        return self.rd_ios + self.wr_ios + self.dc_ios + self.fl_ios


# ---------------------------------------------------------------------------------------------
# pure parser
# ---------------------------------------------------------------------------------------------


_PAD = (0,) * 17


def parse_diskstats(text: str) -> list[DiskCounters]:
    """Parse the text of ``/proc/diskstats`` (any kernel since 2.6) into one record per line.

    Blank lines are skipped. A line of any other shape than 7, 14, 18 or 20+ fields, or with
    a field that is not a non-negative integer where a counter belongs, raises
    :class:`~stallscope.errors.ParseError` quoting the line.
    """
    out: list[DiskCounters] = []
    for line in text.splitlines():
        fields = line.split()
        n = len(fields)
        if n == 0:
            continue
        if n not in (7, 14, 18) and n < 20:
            raise ParseError(
                f"/proc/diskstats: unknown line shape ({n} fields, expected 7, 14, 18 or 20): "
                f"{line.strip()!r}"
            )
        numbers = fields[3:20]
        if not (fields[0].isdigit() and fields[1].isdigit() and "".join(numbers).isdigit()):
            raise ParseError(f"/proc/diskstats: non-numeric counter in line {line.strip()!r}")
        try:
            v = [int(x) for x in numbers]
            major, minor = int(fields[0]), int(fields[1])
        except ValueError:  # digits str.isdigit accepts but int() does not (e.g. superscripts)
            raise ParseError(
                f"/proc/diskstats: non-numeric counter in line {line.strip()!r}"
            ) from None
        if n == 7:
            # reads, sectors read, writes, sectors written: no merges, no times
            v = [v[0], 0, v[1], 0, v[2], 0, v[3], 0, 0, 0, 0]
        shape = n if n < 20 else 20
        out.append(DiskCounters._make([major, minor, fields[2], *v, *_PAD[len(v) :], shape]))
    return out


# ---------------------------------------------------------------------------------------------
# counters -> rates (wrap and reset: base.counter_delta, applied in _interval_deltas)
# ---------------------------------------------------------------------------------------------


class _Deltas(NamedTuple):
    rd_ios: int
    rd_merges: int
    rd_sectors: int
    rd_ticks: int
    wr_ios: int
    wr_merges: int
    wr_sectors: int
    wr_ticks: int
    io_ticks: int
    time_in_queue: int


_DELTA_FIELDS = _Deltas._fields
_delta_fields = attrgetter(*_DELTA_FIELDS)


def _interval_deltas(prev: DiskCounters, cur: DiskCounters) -> _Deltas | None:
    """Counter growth over one interval, or None when the device was reset or replaced.

    The one place where wrap and reset are decided:

    * a different major:minor or line shape under the same name is another device;
    * sysstat's test for "device removed then inserted again": fewer requests in total and
      every sector count lower (or 0 before);
    * otherwise each counter goes through :func:`~stallscope.sources.base.counter_delta`
      (32-bit wrap), and one reset counter invalidates the interval.
    """
    if (prev.major, prev.minor, prev.nfields) != (cur.major, cur.minor, cur.nfields):
        return None
    if (
        cur.total_ios < prev.total_ios
        and (prev.rd_sectors == 0 or cur.rd_sectors < prev.rd_sectors)
        and (prev.wr_sectors == 0 or cur.wr_sectors < prev.wr_sectors)
        and (prev.dc_sectors == 0 or cur.dc_sectors < prev.dc_sectors)
    ):
        return None
    grown = counter_deltas(_delta_fields(prev), _delta_fields(cur), 32)
    return None if grown is None else _Deltas._make(grown)


def iostat_fields(prev: DiskCounters, cur: DiskCounters, dt_s: float) -> DiskFields | None:
    """The twelve ``iostat -x`` fields (see the module docstring) of one device over ``dt_s``.

    ``prev`` and ``cur`` are two readings of the same device ``dt_s`` seconds apart. Returns
    None when there is no valid answer for this interval: the counters were reset (device
    replaced, see :func:`_interval_deltas`), or the line has the old 7-field shape without
    times (``iostat -x`` skips those too).
    """
    if not dt_s > 0:
        raise ValueError(f"interval must be positive, got {dt_s!r} s")
    if not cur.extended:
        return None
    d = _interval_deltas(prev, cur)
    if d is None:
        return None
    return {
        "r_s": d.rd_ios / dt_s,
        "w_s": d.wr_ios / dt_s,
        "rkb_s": d.rd_sectors / 2.0 / dt_s,
        "wkb_s": d.wr_sectors / 2.0 / dt_s,
        "rrqm_s": d.rd_merges / dt_s,
        "wrqm_s": d.wr_merges / dt_s,
        "r_await_ms": d.rd_ticks / d.rd_ios if d.rd_ios else 0.0,
        "w_await_ms": d.wr_ticks / d.wr_ios if d.wr_ios else 0.0,
        "aqu_sz": d.time_in_queue / (dt_s * 1000.0),
        "rareq_kb": d.rd_sectors / d.rd_ios / 2.0 if d.rd_ios else 0.0,
        "wareq_kb": d.wr_sectors / d.wr_ios / 2.0 if d.wr_ios else 0.0,
        "util_pct": d.io_ticks / (dt_s * 1000.0) * 100.0,
    }


def disk_counters(c: DiskCounters) -> list[Counter]:
    """The cumulative counters of one device in base units, as :meth:`Source.counters` gives
    them: node_exporter's ``node_disk_*_total`` set (sectors x 512 -> bytes, ms -> seconds).

    Values are the kernel's raw counters: a 32-bit wrap of a time field shows as a decrease,
    which Prometheus' ``rate()`` treats as a counter reset. The old 7-field partition lines
    have no merges or times, so only their four counters are given.
    """
    dev = c.name
    if not c.extended:
        return [
            ("disk.reads_completed_total", dev, float(c.rd_ios)),
            ("disk.read_bytes_total", dev, c.rd_sectors * 512.0),
            ("disk.writes_completed_total", dev, float(c.wr_ios)),
            ("disk.written_bytes_total", dev, c.wr_sectors * 512.0),
        ]
    return [
        ("disk.reads_completed_total", dev, float(c.rd_ios)),
        ("disk.reads_merged_total", dev, float(c.rd_merges)),
        ("disk.read_bytes_total", dev, c.rd_sectors * 512.0),
        ("disk.read_time_seconds_total", dev, c.rd_ticks / 1000.0),
        ("disk.writes_completed_total", dev, float(c.wr_ios)),
        ("disk.writes_merged_total", dev, float(c.wr_merges)),
        ("disk.written_bytes_total", dev, c.wr_sectors * 512.0),
        ("disk.write_time_seconds_total", dev, c.wr_ticks / 1000.0),
        ("disk.io_time_seconds_total", dev, c.io_ticks / 1000.0),
        ("disk.io_time_weighted_seconds_total", dev, c.time_in_queue / 1000.0),
    ]


# ---------------------------------------------------------------------------------------------
# the thin reader
# ---------------------------------------------------------------------------------------------


class DiskSource(Source):
    """Per-device ``iostat -x`` fields, read from ``/proc/diskstats`` once per sample.

    ``devices``: the device names to report (``"vda"``, ``"nvme0n1"``, a partition such as
    ``"sda1"`` or ``"/dev/sda"``), reported on every interval, like ``iostat -x DEV...``.
    ``None`` gives what ``iostat -x`` shows with no device argument: every whole device
    (an entry of ``/sys/block``: disks, loop, dm, md, zram..., never partitions) that has
    completed at least one request since boot; idle loop devices are hidden that way.

    ``sample(now)`` returns ``{device: {field: value}}`` (keys :data:`FIELDS`), ``None`` on
    the first call. The interval is measured with ``clock`` (seconds, monotonic) right after
    each read, not taken from ``now``, so the collector's scheduling jitter does not skew
    the rates. A device that appears gets rates from its second reading on; one that
    disappears is dropped; one whose counters were reset is left out for that interval.
    ``counters()`` gives the raw counters of the latest reading (see :func:`disk_counters`).
    The file is read with ``pread`` on a descriptor kept open (~8 µs for a small file).
    """

    name: ClassVar[str] = "disk"

    def __init__(
        self,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        devices: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.sys_root = sys_root
        self.devices: tuple[str, ...] | None = (
            None if devices is None else tuple(d.removeprefix("/dev/") for d in devices)
        )
        self._clock = clock
        self._path = os.path.join(proc_root, "diskstats")
        self._fd: int | None = None
        self._bufsize = 16384
        self._prev: dict[str, DiskCounters] = {}
        self._prev_t: float | None = None
        self._last: dict[str, DiskCounters] = {}  #: the latest reading, for counters()
        self._whole: dict[tuple[str, int, int], bool] = {}
        #: the last reading's lines and their records (:meth:`_parse`)
        self._lines: dict[str, DiskCounters] = {}
        #: this sample's unchanged devices (name -> the all-zero fields it was given), and
        #: each one's points, made once (:meth:`points`)
        self._zeroed: dict[str, DiskFields] = {}
        self._zero_points: dict[str, list[Point]] = {}
        #: the last read's text and the devices it selected (:meth:`read_counters`): a file
        #: that reads the same again (no device did any I/O) is not parsed again
        self._text = ""
        self._selected: dict[str, DiskCounters] = {}
        #: the last payload when every device in it was unchanged (all fields 0), handed out
        #: again while the file reads the same (:meth:`sample`)
        self._still: DiskPayload | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> None:
        """Open ``/proc/diskstats``; raise SourceUnavailable saying why if it cannot work."""
        if self._fd is not None:
            return
        if not sys.platform.startswith("linux") and self.proc_root == "/proc":
            raise SourceUnavailable(f"disk: not Linux ({sys.platform}): no /proc/diskstats")
        try:
            fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise SourceUnavailable(f"disk: {self._path} does not exist") from None
        except OSError as exc:
            raise SourceUnavailable(f"disk: cannot open {self._path}: {exc.strerror}") from None
        self._fd = fd
        if self.devices is None and not os.path.isdir(os.path.join(self.sys_root, "block")):
            self.close()
            raise SourceUnavailable(
                f"disk: {self.sys_root}/block not found, so disks cannot be told from "
                "partitions; name the devices to watch"
            )
        if self.devices is not None:
            present = {c.name for c in parse_diskstats(self._read())}
            missing = [d for d in self.devices if d not in present]
            if missing:
                self.close()
                raise SourceUnavailable(
                    f"disk: no block device named {', '.join(missing)} in {self._path}"
                )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._prev = {}
        self._prev_t = None
        self._last = {}
        self._lines = {}
        self._text = ""
        self._selected = {}
        self._still = None

    # -- reading --------------------------------------------------------------------------------

    def _read(self) -> str:
        assert self._fd is not None
        while True:
            data = os.pread(self._fd, self._bufsize, 0)
            if len(data) < self._bufsize:
                return data.decode("utf-8", "surrogateescape")
            self._bufsize *= 2  # the whole file in one read keeps the snapshot consistent

    def _parse(self, text: str) -> list[DiskCounters]:
        """:func:`parse_diskstats`, a line that reads as at the last call given its record
        again (idle devices, most of them: loop devices, partitions)."""
        seen = self._lines
        lines: dict[str, DiskCounters] = {}
        out: list[DiskCounters] = []
        for line in text.splitlines():
            c = seen.get(line)
            if c is None:
                parsed = parse_diskstats(line)
                if not parsed:
                    continue
                c = parsed[0]
            lines[line] = c
            out.append(c)
        self._lines = lines
        return out

    def _is_whole_device(self, c: DiskCounters) -> bool:
        key = (c.name, c.major, c.minor)
        whole = self._whole.get(key)
        if whole is None:
            whole = os.path.exists(os.path.join(self.sys_root, "block", sys_name(c.name)))
            self._whole[key] = whole
        return whole

    def read_counters(self) -> tuple[float, dict[str, DiskCounters]]:
        """One reading of the selected devices: (clock time of the read, counters by name)."""
        if self._fd is None:
            self.open()
        text = self._read()
        t = self._clock()
        if text == self._text:  # nothing moved on any device: the same records, unparsed
            return t, self._selected
        rows = self._parse(text)
        if self.devices is not None:
            wanted = set(self.devices)
            sel = {c.name: c for c in rows if c.name in wanted}
        else:
            sel = {c.name: c for c in rows if self._is_whole_device(c)}
        self._text, self._selected = text, sel
        return t, sel

    def points(self, payload: DiskPayload) -> list[Point]:
        """Each device's fields as points; an unchanged device's (every field 0, served by
        :meth:`sample`) are made once and handed out again: most devices, most samples."""
        zeroed = self._zeroed
        out: list[Point] = []
        for dev, fields in payload.items():
            if zeroed.get(dev) is fields:
                pts = self._zero_points.get(dev)
                if pts is None:
                    pts = self._zero_points[dev] = numeric_points(self.name, dev, fields)
                out += pts
            else:
                out += numeric_points(self.name, dev, fields)
        return out

    def entities(self, payload: DiskPayload) -> dict[str, dict[str, Any]]:
        """Each device with what sysfs says about it (kind, rotational, model, size...), read
        once per device: the diagnosis uses these recorded facts, not the machine it runs on."""
        facts = self.__dict__.setdefault("_facts", {})
        for dev in payload:
            if dev not in facts:
                try:
                    facts[dev] = device_info(dev, self.sys_root)
                except (OSError, ValueError, StallscopeError):
                    facts[dev] = {}
        return {dev: facts[dev] for dev in payload}

    def sample(self, now: float) -> DiskPayload | None:
        """``{device: {field: value}}`` over the interval since the previous call."""
        t, cur = self.read_counters()
        self._last = cur
        prev, prev_t = self._prev, self._prev_t
        if prev_t is not None and t <= prev_t:
            return {}  # two reads at the same clock tick: keep the older reading as the base
        self._prev, self._prev_t = cur, t
        if prev_t is None:
            return None
        if cur is prev and self._still is not None:
            return self._still  # the file read the same and every device was idle already
        dt = t - prev_t
        out: DiskPayload = {}
        zeroed = self._zeroed = {}
        for name, c in cur.items():
            p = prev.get(name)
            if p is None:
                continue  # new device: rates from its second reading on
            if self.devices is None and c.total_ios == 0:
                continue  # iostat hides devices that never did any I/O
            if c is p and c.extended:  # the same line: nothing moved, every field is 0
                out[name] = zeroed[name] = cast(DiskFields, dict.fromkeys(FIELDS, 0.0))
                continue
            fields = iostat_fields(p, c, dt)
            if fields is not None:
                out[name] = fields
        self._still = out if cur is prev and len(zeroed) == len(out) else None
        return out

    def counters(self) -> list[Counter]:
        """Raw counters of the latest ``sample()``'s reading (see :func:`disk_counters`), for
        the same devices the rates cover: with no device list, whole devices that did I/O."""
        out: list[Counter] = []
        for c in self._last.values():
            if self.devices is None and c.total_ios == 0:
                continue
            out.extend(disk_counters(c))
        return out
