"""Host source: CPU (total, per core, iowait, niced), load, memory, swap rates, page cache,
``/dev/shm`` and pressure stall information.

Parsers are pure (text in, records out) and tested on recorded files; :class:`HostSource`
is the thin reader. Equivalents: ``top``/``mpstat`` (CPU), ``free -m`` (memory),
``vmstat`` si/so (swap), ``df /dev/shm``, ``cat /proc/pressure/*``.

Counter growth goes through :func:`~stallscope.sources.base.counter_delta`: a CPU line with a
field that went down (a reset, or a kernel's iowait going backwards) reports ``None`` for that
interval instead of a made-up value, and a reset swap counter leaves the swap rates out. The
swap rates divide by the monotonic time of the ``/proc/vmstat`` reads themselves, not the
collector's ``now``. :meth:`HostSource.counters` gives the raw CPU seconds per mode, swap bytes
and PSI stall totals of the latest read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple, TypedDict, cast

from stallscope.errors import ParseError, SourceUnavailable
from stallscope.metrics import Point
from stallscope.sources.base import (
    Counter,
    ProcFile,
    Source,
    close_all,
    counter_deltas,
    numeric_points,
)

__all__ = [
    "CpuTimes",
    "HostPayload",
    "HostSource",
    "cpu_busy",
    "parse_meminfo",
    "parse_pressure",
    "parse_pressure_totals",
    "parse_proc_stat",
    "parse_vmstat",
    "read_devices",
    "swap_ins",
]


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: the CPU modes of /proc/stat in field order (CpuTimes fields after the name)
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class CpuTimes(NamedTuple):
    """One ``cpu`` line of ``/proc/stat``, in USER_HZ ticks."""

    name: str
    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int

    @property
    def total(self) -> int:
        # guest/guest_nice are already counted in user/nice: not added again (as top does)
        return (
            self.user
            + self.nice
            + self.system
            + self.idle
            + self.iowait
            + self.irq
            + self.softirq
            + self.steal
        )


def parse_proc_stat(text: str) -> list[CpuTimes]:
    """The ``cpu`` (aggregate, first) and ``cpuN`` lines of ``/proc/stat``."""
    out: list[CpuTimes] = []
    # the cpu lines come first: the rest (intr, with a number per interrupt, softirq...) is
    # not split at all
    end = text.find("\nintr")
    for line in (text if end < 0 else text[:end]).splitlines():
        if not line.startswith("cpu"):
            continue
        parts = line.split(None, 9)
        try:
            vals = [*map(int, parts[1:9])]
        except ValueError as exc:
            raise ParseError(f"unexpected /proc/stat line: {line!r}") from exc
        if len(vals) < 4:
            raise ParseError(f"unexpected /proc/stat line: {line!r}")
        if len(vals) < 8:
            vals += [0] * (8 - len(vals))  # kernels before 2.6.11 lack steal etc.
        out.append(_new_tuple(CpuTimes, (parts[0], *vals)))
    if not out or out[0].name != "cpu":
        raise ParseError("no aggregate 'cpu' line in /proc/stat")
    return out


#: a NamedTuple made without its Python-level ``__new__`` (:func:`parse_proc_stat`)
_new_tuple = tuple.__new__


def cpu_busy(prev: CpuTimes, cur: CpuTimes) -> tuple[float, float, float] | None:
    """(busy %, iowait %, niced %) between two readings of one CPU line (``top`` semantics;
    niced: user code of processes at nice > 0, top's ``ni``, part of busy); None when a field
    went down (reset, or iowait going backwards as proc(5) warns it can), so the caller drops
    the interval rather than reporting a busy share computed from a bogus delta."""
    # plain differences first (this runs for every core on every sample); only when one is
    # negative does counter_delta decide between a wrap and a reset
    user, nice, system = cur.user - prev.user, cur.nice - prev.nice, cur.system - prev.system
    idle, iowait, irq = cur.idle - prev.idle, cur.iowait - prev.iowait, cur.irq - prev.irq
    softirq, steal = cur.softirq - prev.softirq, cur.steal - prev.steal
    if min(user, nice, system, idle, iowait, irq, softirq, steal) < 0:
        d = counter_deltas(prev[1:], cur[1:], 64)
        if d is None:
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = d
    dt = user + nice + system + idle + iowait + irq + softirq + steal
    if dt <= 0:
        return 0.0, 0.0, 0.0
    return (
        min(100.0, 100.0 * (dt - idle - iowait) / dt),
        min(100.0, 100.0 * iowait / dt),
        min(100.0, 100.0 * nice / dt),
    )


_MEMINFO_KEYS = (
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "Buffers",
    "Cached",
    "SReclaimable",
    "SwapTotal",
    "SwapFree",
)


def parse_meminfo(text: str, keys: tuple[str, ...] | None = None) -> dict[str, int]:
    """``/proc/meminfo`` as {field: kB}; with ``keys``, only those (found by search)."""
    out: dict[str, int] = {}
    if keys is not None:
        for key in keys:
            i = text.find(f"{key}:")
            while i > 0 and text[i - 1] != "\n":  # "Cached:" also ends "SwapCached:"
                i = text.find(f"{key}:", i + 1)
            if i < 0:
                continue
            j = text.find("\n", i)
            parts = text[i + len(key) + 1 : j if j >= 0 else None].split()
            try:
                out[key] = int(parts[0])
            except (IndexError, ValueError) as exc:
                raise ParseError(f"unexpected /proc/meminfo line: {text[i:j]!r}") from exc
        if "MemTotal" not in out:
            raise ParseError("no MemTotal in /proc/meminfo")
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            out[key.strip()] = int(parts[0])
        except ValueError as exc:
            raise ParseError(f"unexpected /proc/meminfo line: {line!r}") from exc
    if "MemTotal" not in out:
        raise ParseError("no MemTotal in /proc/meminfo")
    return out


def parse_vmstat(text: str, keys: tuple[str, ...] | None = None) -> dict[str, int]:
    """``/proc/vmstat`` as {counter: value}; with ``keys``, only those (found by search, which
    is several times cheaper than splitting the ~180 lines)."""
    out: dict[str, int] = {}
    if keys is not None:
        for key in keys:
            if text.startswith(f"{key} "):
                i = 0
            else:
                i = text.find(f"\n{key} ")
                if i < 0:
                    continue
                i += 1
            j = text.find("\n", i)
            parts = text[i : j if j >= 0 else None].split()
            try:
                out[key] = int(parts[1])
            except (IndexError, ValueError) as exc:
                raise ParseError(f"unexpected /proc/vmstat line: {text[i:j]!r}") from exc
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError as exc:
                raise ParseError(f"unexpected /proc/vmstat line: {line!r}") from exc
    return out


def _parse_psi(text: str) -> tuple[dict[str, float], dict[str, int]]:
    """``/proc/pressure/<res>`` -> ({line: avg10 %}, {line: total µs}), in one pass because the
    sampler wants both from the same read."""
    avg: dict[str, float] = {}
    total: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if (
            len(parts) == 5 and parts[1].startswith("avg10=") and parts[4].startswith("total=")
        ):  # the kernel's layout: skip the dict
            fields = {"avg10": parts[1][6:], "total": parts[4][6:]}
        else:
            fields = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        try:
            avg[parts[0]] = float(fields["avg10"])
            if "total" in fields:
                total[parts[0]] = int(fields["total"])
        except (KeyError, ValueError) as exc:
            raise ParseError(f"unexpected pressure line: {line!r}") from exc
    return avg, total


def parse_pressure(text: str) -> dict[str, float]:
    """``/proc/pressure/<res>`` -> {"some": avg10 %, "full": avg10 %}."""
    return _parse_psi(text)[0]


def parse_pressure_totals(text: str) -> dict[str, int]:
    """``/proc/pressure/<res>`` -> {"some": total µs, "full": total µs}: the cumulative stall
    time, the counter node_exporter exports as ``node_pressure_*_seconds_total``."""
    return _parse_psi(text)[1]


def host_counters(
    cpu: CpuTimes | None, swap: tuple[int, int] | None, psi: dict[str, int]
) -> list[Counter]:
    """The raw host counters in base units (see :meth:`Source.counters`): CPU seconds per
    mode of the aggregate line (entity = mode), swap bytes in/out, PSI stall seconds
    (``psi`` keyed ``"<res>_<some|full>"`` in µs, as the sampler keeps them)."""
    out: list[Counter] = []
    if cpu is not None:
        out.extend(
            ("host.cpu_seconds_total", mode, ticks / _CLK_TCK)
            for mode, ticks in zip(CPU_MODES, cpu[1:])
        )
    if swap is not None:
        out.append(("host.swap_in_bytes_total", "", float(swap[0] * _PAGE)))
        out.append(("host.swap_out_bytes_total", "", float(swap[1] * _PAGE)))
    out.extend((f"host.psi_{key}_seconds_total", "", us / 1e6) for key, us in psi.items())
    return out


class HostPayload(TypedDict, total=False):
    """A host reading, the ``snapshot --json`` shape. Its numbers are the metrics
    ``host.<key>`` of the vocabulary (a test holds the two together); ``cpu_per_core_pct`` is
    the per-core list behind ``host.cpu_core_pct``. None where the machine does not tell."""

    cpu_pct: float | None
    iowait_pct: float | None
    cpu_nice_pct: float | None
    cpu_per_core_pct: list[float | None]
    cpu_max_core_pct: float | None
    load1: float
    mem_total_mib: float
    mem_used_mib: float
    mem_available_mib: float
    page_cache_mib: float
    swap_used_mib: float
    swap_in_kb_s: float
    swap_out_kb_s: float
    shm_total_mib: float
    shm_used_mib: float
    psi_io_some_pct: float | None
    psi_io_full_pct: float | None
    psi_cpu_some_pct: float | None
    psi_mem_some_pct: float | None


#: how often the kernel updates PSI's avg10/avg60/avg300 (PSI_FREQ, 2 s): reading the files
#: more often gives the same averages, so a sample within this of the last read reuses them
PSI_AVG_PERIOD_S = 2.0
#: how often the kernel updates the load averages (LOAD_FREQ, 5 s and a tick): a sample within
#: this of the last read of ``/proc/loadavg`` reuses it
LOAD_PERIOD_S = 5.0


class HostSource(Source):
    """CPU, memory, swap, shm and PSI of the whole machine."""

    name = "host"

    def __init__(
        self,
        proc_root: str = "/proc",
        shm_path: str = "/dev/shm",
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.shm_path = shm_path
        self._statvfs = statvfs
        self._clock = clock  #: read right after /proc/vmstat: the swap rates' time base
        self._prev_cpu: list[CpuTimes] | None = None
        self._prev_vm: tuple[float, int, int] | None = None  #: (read time, pswpin, pswpout)
        self._psi_total: dict[str, int] = {}  #: "io_some" -> µs, latest read
        #: the PSI gauges of the latest read, and its clock time (:meth:`_read_psi`)
        self._psi_gauges: HostPayload = {}
        self._psi_at = -PSI_AVG_PERIOD_S
        self._load1 = 0.0
        self._load_at = -LOAD_PERIOD_S  #: clock time of the last read of loadavg
        self._swap_on = True  #: whether the last sample's meminfo had a swap area
        self._psi_fresh = False  #: whether the latest sample read the PSI files
        self._psi: list[str] = []
        self._shm_ok = True
        self._files: dict[str, ProcFile] = {}

    def _read(self, rel: str) -> str:
        f = self._files.get(rel)
        if f is None:
            f = self._files[rel] = ProcFile(os.path.join(self.proc_root, rel))
        return f.read().decode("ascii", "replace")

    def close(self) -> None:
        close_all(self._files)

    def open(self) -> None:
        try:
            self._read("stat")
            self._read("meminfo")
        except OSError as exc:
            raise SourceUnavailable(
                f"cannot read {self.proc_root}/stat or meminfo: {exc.strerror}"
            ) from exc
        for res in ("io", "cpu", "memory"):
            try:
                self._read(f"pressure/{res}")
                self._psi.append(res)
            except OSError:  # no PSI for this resource: noted below when none at all
                continue
        if not self._psi:
            self.emit(
                "note", "PSI (/proc/pressure) not available: kernel without CONFIG_PSI or psi=0"
            )
        try:
            self._statvfs(self.shm_path)
        except OSError:
            self._shm_ok = False
            self.emit("note", f"{self.shm_path} not mounted: shm usage not reported")

    def points(self, payload: HostPayload) -> list[Point]:
        """Host-wide numbers, plus one ``host.cpu_core_pct`` per core (entity ``cpuN``)."""
        out = numeric_points(self.name, "", payload)
        for i, v in enumerate(payload.get("cpu_per_core_pct") or ()):
            if v is not None:
                out.append(Point("host.cpu_core_pct", f"cpu{i}", float(v)))
        return out

    def sample(self, now: float) -> HostPayload | None:
        cpus = parse_proc_stat(self._read("stat"))
        mem = parse_meminfo(self._read("meminfo"), _MEMINFO_KEYS)
        prev_vm = self._prev_vm
        swap_on = mem.get("SwapTotal", 0) > 0
        if swap_on or self._swap_on or prev_vm is None:
            vm_text = self._read("vmstat")
            t = self._clock()
            vm = parse_vmstat(vm_text, ("pswpin", "pswpout"))
            self._prev_vm = (t, vm.get("pswpin", 0), vm.get("pswpout", 0))
        else:
            # no swap area now nor at the last read (the one where it went was still read):
            # nothing can be swapped in or out, the counters stand (a 4-kB file and its
            # search saved a sample)
            t = self._clock()
            self._prev_vm = (t, prev_vm[1], prev_vm[2])
        self._swap_on = swap_on
        if t - self._load_at >= LOAD_PERIOD_S:
            self._load1 = float(self._read("loadavg").split()[0])
            self._load_at = t
        load1 = self._load1
        prev_cpu, self._prev_cpu = self._prev_cpu, cpus
        if prev_cpu is None or prev_vm is None:
            self._read_psi(None)
            return None

        out: HostPayload = {}
        both = cpu_busy(prev_cpu[0], cpus[0])
        prev_by_name = {c.name: c for c in prev_cpu[1:]}
        per_core: list[float | None] = []
        for c in cpus[1:]:  # a CPU hot-plugged in between (or reset) has no valid interval
            p = prev_by_name.get(c.name)
            core = cpu_busy(p, c) if p else None
            per_core.append(round(core[0], 2) if core else None)
        out["cpu_pct"] = round(both[0], 2) if both else None
        out["iowait_pct"] = round(both[1], 2) if both else None
        out["cpu_nice_pct"] = round(both[2], 2) if both else None
        out["cpu_per_core_pct"] = per_core
        cores = [v for v in per_core if v is not None]
        out["cpu_max_core_pct"] = max(cores) if cores else None
        out["load1"] = load1

        total = mem["MemTotal"]
        avail = mem.get("MemAvailable", mem.get("MemFree", 0))
        cache = mem.get("Cached", 0) + mem.get("Buffers", 0) + mem.get("SReclaimable", 0)
        used = total - mem.get("MemFree", 0) - cache  # free(1)'s "used"
        out["mem_total_mib"] = round(total / 1024, 1)
        out["mem_used_mib"] = round(max(used, 0) / 1024, 1)
        out["mem_available_mib"] = round(avail / 1024, 1)
        out["page_cache_mib"] = round(cache / 1024, 1)
        out["swap_used_mib"] = round((mem.get("SwapTotal", 0) - mem.get("SwapFree", 0)) / 1024, 1)

        dt = t - prev_vm[0]
        swap = counter_deltas(prev_vm[1:], self._prev_vm[1:], 32)
        if dt > 0 and swap is not None:  # a reset counter: no swap rate for this interval
            page_kb = _PAGE / 1024
            out["swap_in_kb_s"] = round(swap[0] * page_kb / dt, 2)
            out["swap_out_kb_s"] = round(swap[1] * page_kb / dt, 2)

        if self._shm_ok:
            try:
                st = self._statvfs(self.shm_path)
                out["shm_total_mib"] = round(st.f_blocks * st.f_frsize / 1048576, 1)
                out["shm_used_mib"] = round((st.f_blocks - st.f_bfree) * st.f_frsize / 1048576, 1)
            except OSError:
                self._shm_ok = False

        if t - self._psi_at >= PSI_AVG_PERIOD_S:
            self._read_psi(out)
            self._psi_at, self._psi_fresh = t, True
        else:  # the kernel has not updated its averages since: the same values
            out.update(self._psi_gauges)
            self._psi_fresh = False
        return out

    def _read_psi(self, out: HostPayload | None) -> None:
        """Read every PSI file once: avg10 gauges into ``out`` (when given), the ``total=``
        counters into ``self._psi_total`` for :meth:`counters`."""
        totals: dict[str, int] = {}
        gauges: dict[str, float | None] = {}
        for res in self._psi:
            try:
                psi, total = _parse_psi(self._read(f"pressure/{res}"))
            except OSError:
                continue
            key = "mem" if res == "memory" else res
            for line, us in total.items():
                if line in ("some", "full"):  # the two lines declared in metrics
                    totals[f"{key}_{line}"] = us
            gauges[f"psi_{key}_some_pct"] = psi.get("some")
            if res == "io":
                gauges["psi_io_full_pct"] = psi.get("full")
        self._psi_total = totals
        self._psi_gauges = cast(HostPayload, gauges)
        if out is not None:
            out.update(self._psi_gauges)

    def counters(self) -> list[Counter]:
        """CPU seconds per mode (aggregate line), swap bytes and PSI stall seconds of the
        latest ``sample()`` (see :func:`host_counters`); [] before the first."""
        if self._prev_cpu is None:
            return []
        if not self._psi_fresh:  # the averages were not read again, but the totals move
            self._read_psi(None)
        vm = self._prev_vm
        return host_counters(
            self._prev_cpu[0], None if vm is None else (vm[1], vm[2]), self._psi_total
        )


def swap_ins() -> int:
    """Bytes swapped in since boot (psutil's ``sin``, the kernel's pswpin pages times the page
    size; 0 where it cannot be read): a rise over a trial or an epoch means the machine swapped
    during it."""
    import psutil

    try:
        return int(psutil.swap_memory().sin)
    except (psutil.Error, OSError, RuntimeError):
        return 0


# --- what this process has read ---------------------------------------------------------------
def read_devices(proc_root: str = "/proc") -> dict[str, int]:
    """Bytes read so far from each block device, ``major:minor`` -> bytes (``/proc/diskstats``);
    {} where it cannot be read."""
    from stallscope.sources.disk import parse_diskstats

    try:
        with open(f"{proc_root}/diskstats") as f:
            rows = parse_diskstats(f.read())
    except (OSError, ParseError):
        return {}
    return {f"{r.major}:{r.minor}": 512 * r.rd_sectors for r in rows}
