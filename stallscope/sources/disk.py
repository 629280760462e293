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
``node_disk_*`` set), :class:`DiskSource` (the thin reader), and two
helpers that look at the machine: :func:`devices_for_path` (which disks hold a dataset) and
:func:`device_info` (what kind of disk a device is).
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, ClassVar, NamedTuple

from stallscope.errors import ParseError, SourceUnavailable, StallscopeError, UsageError
from stallscope.metrics import Point
from stallscope.sources.base import (  # counter_delta: shared by every source, re-exported
    Counter,
    Source,
    counter_delta,
    counter_deltas,
    numeric_points,
)

__all__ = [
    "FIELDS",
    "DiskCounters",
    "DiskSource",
    "PathDevices",
    "counter_delta",
    "describe_path",
    "device_info",
    "devices_for_path",
    "disk_counters",
    "iostat_fields",
    "parse_diskstats",
]

#: payload keys, in ``iostat -x`` reading order; the same keys as ``metrics.by_source("disk")``
FIELDS: tuple[str, ...] = (
    "r_s",
    "w_s",
    "rkb_s",
    "wkb_s",
    "rrqm_s",
    "wrqm_s",
    "r_await_ms",
    "w_await_ms",
    "aqu_sz",
    "rareq_kb",
    "wareq_kb",
    "util_pct",
)


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
        out.append(DiskCounters._make([major, minor, fields[2], *v, *_PAD[len(v):], shape]))
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


def iostat_fields(prev: DiskCounters, cur: DiskCounters, dt_s: float) -> dict[str, float] | None:
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
        return [("disk.reads_completed_total", dev, float(c.rd_ios)),
                ("disk.read_bytes_total", dev, c.rd_sectors * 512.0),
                ("disk.writes_completed_total", dev, float(c.wr_ios)),
                ("disk.written_bytes_total", dev, c.wr_sectors * 512.0)]
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


def _sys_name(name: str) -> str:
    """A diskstats name as sysfs spells it (``cciss/c0d0`` -> ``cciss!c0d0``)."""
    return name.replace("/", "!")


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

    # -- reading --------------------------------------------------------------------------------

    def _read(self) -> str:
        assert self._fd is not None
        while True:
            data = os.pread(self._fd, self._bufsize, 0)
            if len(data) < self._bufsize:
                return data.decode("utf-8", "surrogateescape")
            self._bufsize *= 2  # the whole file in one read keeps the snapshot consistent

    def _is_whole_device(self, c: DiskCounters) -> bool:
        key = (c.name, c.major, c.minor)
        whole = self._whole.get(key)
        if whole is None:
            whole = os.path.exists(os.path.join(self.sys_root, "block", _sys_name(c.name)))
            self._whole[key] = whole
        return whole

    def read_counters(self) -> tuple[float, dict[str, DiskCounters]]:
        """One reading of the selected devices: (clock time of the read, counters by name)."""
        if self._fd is None:
            self.open()
        text = self._read()
        t = self._clock()
        rows = parse_diskstats(text)
        if self.devices is not None:
            wanted = set(self.devices)
            return t, {c.name: c for c in rows if c.name in wanted}
        return t, {c.name: c for c in rows if self._is_whole_device(c)}

    def points(self, payload: dict[str, dict[str, float]]) -> list[Point]:
        out: list[Point] = []
        for dev, fields in payload.items():
            out.extend(numeric_points(self.name, dev, fields))
        return out

    def entities(self, payload: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
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

    def sample(self, now: float) -> dict[str, dict[str, float]] | None:
        """``{device: {field: value}}`` over the interval since the previous call."""
        t, cur = self.read_counters()
        self._last = cur
        prev, prev_t = self._prev, self._prev_t
        if prev_t is not None and t <= prev_t:
            return {}  # two reads at the same clock tick: keep the older reading as the base
        self._prev, self._prev_t = cur, t
        if prev_t is None:
            return None
        dt = t - prev_t
        out: dict[str, dict[str, float]] = {}
        for name, c in cur.items():
            p = prev.get(name)
            if p is None:
                continue  # new device: rates from its second reading on
            if self.devices is None and c.total_ios == 0:
                continue  # iostat hides devices that never did any I/O
            fields = iostat_fields(p, c, dt)
            if fields is not None:
                out[name] = fields
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


# ---------------------------------------------------------------------------------------------
# which devices hold a path
# ---------------------------------------------------------------------------------------------

#: filesystems in memory or made up by the kernel: no block device under them
_MEMORY_FS = frozenset({
    "tmpfs", "ramfs", "devtmpfs", "hugetlbfs", "proc", "sysfs", "cgroup", "cgroup2",
    "devpts", "mqueue", "debugfs", "tracefs", "securityfs", "configfs", "pstore", "bpf",
    "efivarfs", "binfmt_misc", "fusectl", "rpc_pipefs", "nsfs", "autofs",
})
#: filesystems whose data comes over the network
_NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p", "virtiofs",
    "afs", "gpfs", "beegfs", "orangefs", "ncpfs", "davfs", "ocfs2", "gfs2", "pvfs2",
})
_MAX_DEPTH = 8


class PathDevices(NamedTuple):
    """What :func:`describe_path` found for a path."""

    devices: list[str]  #: whole block devices holding the path, e.g. ["vda"]; may be empty
    mount_point: str  #: the mount the path lives on ("" if none was found)
    fstype: str  #: that mount's filesystem type
    source: str  #: that mount's source (``/dev/vda1``, ``server:/export``, ``tmpfs``...)
    reason: str  #: why ``devices`` is empty, or "" when it is not


class _Mount(NamedTuple):
    major: int
    minor: int
    mount_point: str
    fstype: str
    source: str
    super_options: str


def _unescape_mount(s: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` is a space)."""
    if "\\" not in s:
        return s
    out: list[str] = []
    i = 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _parse_mountinfo(text: str) -> list[_Mount]:
    """Parse ``/proc/PID/mountinfo`` (see proc(5)); raises ParseError on a malformed line."""
    mounts: list[_Mount] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        try:
            sep = fields.index("-", 6)
            major_s, minor_s = fields[2].split(":")
            mounts.append(
                _Mount(
                    int(major_s),
                    int(minor_s),
                    _unescape_mount(fields[4]),
                    fields[sep + 1],
                    _unescape_mount(fields[sep + 2]) if len(fields) > sep + 2 else "",
                    fields[sep + 3] if len(fields) > sep + 3 else "",
                )
            )
        except (ValueError, IndexError):
            raise ParseError(f"mountinfo: malformed line {line.strip()!r}") from None
    return mounts


def _under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point + "/")


def _overlay_dirs(super_options: str) -> list[str]:
    """upperdir and every lowerdir of an overlay mount's options (``\\:`` escapes a colon)."""
    dirs: list[str] = []
    for opt in _split_unescaped(super_options, ","):
        key, _, value = opt.partition("=")
        if key == "upperdir":
            dirs.append(value.replace("\\:", ":").replace("\\,", ","))
        elif key in ("lowerdir", "lowerdir+"):
            dirs.extend(p.replace("\\:", ":").replace("\\,", ",")
                        for p in _split_unescaped(value, ":") if p)
    return [_unescape_mount(d) for d in dirs]


def _split_unescaped(s: str, sep: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s):
            cur.append(s[i : i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read().strip()
    except OSError:
        return None


def _whole_disk(name: str, sys_root: str) -> str | None:
    """The whole device a block device or partition belongs to (``vda1`` -> ``vda``)."""
    sname = _sys_name(name)
    if os.path.isdir(os.path.join(sys_root, "block", sname)):
        return name
    try:
        target = os.readlink(os.path.join(sys_root, "class", "block", sname))
    except OSError:
        return None
    parts = target.rstrip("/").split("/")
    # .../block/<disk>/<partition>: the partition's directory sits inside its disk's
    if len(parts) >= 3 and parts[-1] == sname and parts[-2] != "block":
        return parts[-2].replace("!", "/")
    return name


def _name_for_devnum(major: int, minor: int, sys_root: str) -> str | None:
    try:
        target = os.readlink(os.path.join(sys_root, "dev", "block", f"{major}:{minor}"))
    except OSError:
        return None
    return target.rstrip("/").rsplit("/", 1)[-1].replace("!", "/")


def _expand_device(
    name: str, sys_root: str, proc_root: str, depth: int, seen: set[str]
) -> tuple[list[str], str]:
    """Whole physical devices under ``name``: loop -> backing file, dm/md -> slaves."""
    disk = _whole_disk(name, sys_root)
    if disk is None:
        return [], f"block device {name} not found under {sys_root}"
    if disk in seen:
        return [], ""
    seen.add(disk)
    base = os.path.join(sys_root, "block", _sys_name(disk))
    backing = _read_text(os.path.join(base, "loop", "backing_file"))
    if backing:
        backing = backing.removesuffix(" (deleted)")
        found = _describe(backing, proc_root, sys_root, depth + 1)
        if found.devices:
            return found.devices, ""
        return [], f"loop device {disk} is backed by {backing}: {found.reason}"
    try:
        slaves = sorted(os.listdir(os.path.join(base, "slaves")))
    except OSError:
        slaves = []
    if not slaves:
        return [disk], ""
    out: list[str] = []
    reasons: list[str] = []
    for slave in slaves:
        devs, why = _expand_device(slave.replace("!", "/"), sys_root, proc_root, depth, seen)
        out.extend(d for d in devs if d not in out)
        if why:
            reasons.append(why)
    return out, "" if out else "; ".join(reasons)


def _describe(path: str, proc_root: str, sys_root: str, depth: int) -> PathDevices:
    if depth > _MAX_DEPTH:
        return PathDevices([], "", "", "", f"gave up following {path}: nested too deeply")
    info = os.path.join(proc_root, "self", "mountinfo")
    try:
        with open(info, encoding="utf-8", errors="surrogateescape") as f:
            mounts = _parse_mountinfo(f.read())
    except OSError as exc:
        raise SourceUnavailable(f"cannot read {info}: {exc.strerror}") from None
    best: _Mount | None = None
    for m in mounts:  # longest mount point wins; among equals, the last mounted (on top)
        if _under(path, m.mount_point) and (
            best is None or len(m.mount_point) >= len(best.mount_point)
        ):
            best = m
    if best is None:
        return PathDevices([], "", "", "", f"no mount in {info} holds {path}")

    def result(devices: list[str], reason: str = "") -> PathDevices:
        return PathDevices(devices, best.mount_point, best.fstype, best.source, reason)

    fstype = best.fstype
    if fstype == "overlay":
        devices: list[str] = []
        reasons: list[str] = []
        for d in _overlay_dirs(best.super_options):
            sub = _describe(d, proc_root, sys_root, depth + 1)
            devices.extend(x for x in sub.devices if x not in devices)
            if sub.reason:
                reasons.append(f"{d}: {sub.reason}")
        if devices:
            return result(devices)
        return result([], "overlay with no block device under its layers"
                      + (f" ({'; '.join(reasons)})" if reasons else ""))
    if fstype in ("tmpfs", "ramfs"):
        return result([], f"{fstype} keeps its files in memory: no block device to watch")
    if fstype in _MEMORY_FS:
        return result([], f"{fstype} is a kernel pseudo-filesystem: no block device to watch")
    if fstype in _NETWORK_FS:
        return result([], f"{fstype} is a network filesystem ({best.source}): no local block "
                      "device to watch; its throughput is the network's")
    if fstype.startswith("fuse"):
        return result([], f"{fstype} is served by a user-space (FUSE) process "
                      f"({best.source}): no block device to watch")
    if fstype == "zfs":
        return result([], f"ZFS dataset {best.source}: its pool's disks are not mapped "
                      "(see `zpool status`)")
    name: str | None = None
    if best.major != 0:
        name = _name_for_devnum(best.major, best.minor, sys_root)
    if name is None and best.source.startswith("/dev/"):
        # btrfs and a few others report an anonymous 0:N device; the source names the disk
        name = best.source.removeprefix("/dev/")
        if name.startswith("mapper/"):
            name = _dm_name_to_kernel(name.removeprefix("mapper/"), sys_root) or name
    if name is None:
        return result([], f"{fstype} on {best.source} (device {best.major}:{best.minor}) has "
                      "no block device in sysfs")
    devs, why = _expand_device(name, sys_root, proc_root, depth, set())
    return result(devs, why)


def _dm_name_to_kernel(dm_name: str, sys_root: str) -> str | None:
    """``/dev/mapper/vg-lv`` -> ``dm-0`` via ``/sys/block/dm-*/dm/name``."""
    block = os.path.join(sys_root, "block")
    try:
        entries = sorted(os.listdir(block))
    except OSError:
        return None
    for e in entries:
        if e.startswith("dm-") and _read_text(os.path.join(block, e, "dm", "name")) == dm_name:
            return e
    return None


def describe_path(path: str, *, proc_root: str = "/proc", sys_root: str = "/sys") -> PathDevices:
    """Which whole block devices hold ``path``, and why none when none do.

    Follows the path's mount (longest mount point in ``/proc/self/mountinfo``) to its
    major:minor, then ``/sys/dev/block/MAJ:MIN`` to the device; a partition becomes its disk,
    a loop device its backing file's disks, a dm/md device its slaves' disks, an overlay
    mount the disks of its upper and lower directories. tmpfs, network and FUSE filesystems
    give no device and a reason. The path is made absolute and symlinks resolved first; a
    block device node (``/dev/sda2``) maps to its disk directly.
    (Classic equivalent: ``df PATH`` then ``lsblk -s``.)
    """
    path = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISBLK(st.st_mode):  # a device node: /dev/nvme0n1p2
        name = _name_for_devnum(os.major(st.st_rdev), os.minor(st.st_rdev), sys_root)
        if name is None:
            return PathDevices([], "", "", path, f"block device {path} is not in {sys_root}")
        devs, why = _expand_device(name, sys_root, proc_root, 0, set())
        return PathDevices(devs, "", "", path, why)
    return _describe(path, proc_root, sys_root, 0)


def devices_for_path(path: str, *, proc_root: str = "/proc", sys_root: str = "/sys") -> list[str]:
    """Whole block device names (``["vda"]``, ``["nvme0n1", "nvme1n1"]``) that hold ``path``.

    Empty when the path lives in memory (tmpfs), on a network or FUSE filesystem, or on a
    device sysfs does not show; :func:`describe_path` says which and why.
    """
    return describe_path(path, proc_root=proc_root, sys_root=sys_root).devices


# ---------------------------------------------------------------------------------------------
# what kind of device
# ---------------------------------------------------------------------------------------------

#: model strings of network-attached or emulated disks that present as SCSI/NVMe hardware
_VIRTUAL_MODELS = (
    "amazon elastic block store", "persistentdisk", "google", "virtual", "qemu", "vmware",
    "vbox",
)


def _kind(name: str, link: str) -> str:
    base = name.rstrip("0123456789")
    for prefix, kind in (("loop", "loop"), ("dm-", "dm"), ("md", "md"), ("zram", "zram"),
                         ("nbd", "nbd"), ("rbd", "rbd"), ("ram", "ram")):
        if base.startswith(prefix) and ("/virtual/" in link or not link):
            return kind
    if "virtio" in link:
        return "virtio"
    if "/vbd-" in link or "xen" in link or name.startswith("xvd"):
        return "xen"
    if "/nvme" in link:
        return "nvme"
    if "/mmc" in link:
        return "mmc"
    if "/host" in link or "/target" in link or "/ata" in link or "/usb" in link:
        return "scsi"
    if "/virtual/" in link:
        return "virtual"
    return "other"


def device_info(name: str, sys_root: str = "/sys") -> dict[str, Any]:
    """What sysfs says about a block device (``"vda"``, ``"/dev/nvme0n1"``, ``"sda1"``).

    Returns a JSON-able dict (classic equivalent: ``lsblk -d -o NAME,ROTA,MODEL,SIZE``):

    * ``name`` -- the device asked about; ``disk`` -- its whole device (same unless a partition)
    * ``kind`` -- ``nvme``, ``scsi`` (SATA/SAS/USB via the SCSI layer), ``mmc``, ``virtio``,
      ``xen``, ``nbd``, ``rbd``, ``loop``, ``dm``, ``md``, ``zram``, ``ram``, ``virtual`` or
      ``other``
    * ``virtual`` -- True when there is no physical drive of its own to ask for SMART data:
      an emulated or network disk (virtio, xen, nbd, rbd, cloud volumes such as EBS or
      Persistent Disk recognised by model) or a software layer (loop, dm, md, zram)
    * ``rotational`` -- bool from ``queue/rotational`` (None if unknown; virtual disks often
      claim 1 whatever backs them)
    * ``model``, ``vendor``, ``serial`` -- strings or None
    * ``size_bytes`` -- int or None; ``removable`` -- bool or None
    * ``scheduler`` -- the active I/O scheduler or None; ``read_ahead_kb`` -- int or None

    Raises :class:`~stallscope.errors.UsageError` when sysfs has no such device.
    """
    name = name.removeprefix("/dev/")
    disk = _whole_disk(name, sys_root)
    if disk is None:
        raise UsageError(f"no block device named {name!r} under {sys_root}/class/block")
    sname, sdisk = _sys_name(name), _sys_name(disk)
    own = os.path.join(sys_root, "class", "block", sname)
    if not os.path.exists(own):
        own = os.path.join(sys_root, "block", sname)
    base = os.path.join(sys_root, "block", sdisk)
    try:
        link = os.readlink(base)
    except OSError:
        link = ""

    def text(*parts: str) -> str | None:
        v = _read_text(os.path.join(base, *parts))
        return v if v else None

    def number(path: str) -> int | None:
        v = _read_text(path)
        return int(v) if v is not None and v.isdigit() else None

    rot = text("queue", "rotational")
    removable = text("removable")
    model = text("device", "model")
    vendor = text("device", "vendor")
    serial = text("serial") or text("device", "serial")
    sched = text("queue", "scheduler")
    if sched is not None and "[" in sched:
        sched = sched[sched.index("[") + 1 : sched.index("]")]
    size = number(os.path.join(own, "size"))
    kind = _kind(disk, link)
    virtual = kind in {"virtio", "xen", "nbd", "rbd", "loop", "dm", "md", "zram", "ram",
                       "virtual"}
    if not virtual and model is not None:
        virtual = any(m in model.lower() for m in _VIRTUAL_MODELS)
    return {
        "name": name,
        "disk": disk,
        "kind": kind,
        "virtual": virtual,
        "rotational": None if rot is None else rot == "1",
        "model": model,
        "vendor": vendor,
        "serial": serial,
        "size_bytes": None if size is None else size * 512,
        "removable": None if removable is None else removable == "1",
        "scheduler": sched,
        "read_ahead_kb": number(os.path.join(base, "queue", "read_ahead_kb")),
    }
