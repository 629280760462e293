"""Sizes and rates written for people: one place, one convention.

**Sizes and rates are SI decimal**: 1 kB = 1,000 B, 1 MB = 1,000,000 B (what disk and network
vendors quote). Two sources count in binary and are converted to bytes before they are shown:
the kernel's and ``iostat -x``'s "kB" are KiB (1,024 B), so the metrics named ``*_kb_s`` hold
KiB/s (:func:`kib`); memory from ``/proc/meminfo``, cgroups and NVML comes in MiB (metrics named
``*_mib``, :func:`mib`). Durations: milliseconds under a second, seconds under a minute, then
minutes and hours.
"""

from __future__ import annotations

import math

__all__ = [
    "KIB",
    "MIB",
    "duration",
    "finite_or_none",
    "kib",
    "memory",
    "mib",
    "number",
    "pct",
    "rate",
    "size",
    "speedup",
    "throughput",
]

KIB = 1024  #: bytes in the kernel's and iostat's "kB"
MIB = 1024 * 1024  #: bytes in a MiB (memory figures)

_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def size(n_bytes: float) -> str:
    """Bytes for people, SI: "512 B", "6.2 kB", "36 MB", "1.4 TB" (one decimal under 10)."""
    n = float(n_bytes)
    for unit, div in _UNITS:
        if abs(n) >= div:
            v = n / div
            return f"{v:.1f} {unit}" if abs(v) < 10 else f"{v:,.0f} {unit}"
    return f"{n:.0f} B"


def rate(bytes_per_s: float) -> str:
    """Bytes per second for people, SI: "812 kB/s", "12 MB/s", "1.2 GB/s"."""
    return f"{size(bytes_per_s)}/s"


def kib(n: float) -> float:
    """Bytes in ``n`` KiB: the kernel's and ``iostat``'s "kB" (metrics named ``*_kb_s``)."""
    return n * KIB


def mib(n: float) -> float:
    """Bytes in ``n`` MiB (metrics named ``*_mib``)."""
    return n * MIB


def pct(share: float | None, digits: int = 0) -> str:
    """A share (0.31) as a percentage ("31%"); "?" when unknown. Never "-0%": a share that
    rounds to zero is "0%"."""
    if share is None or share != share:
        return "?"
    v = round(share * 100, digits)
    if v == 0:
        v = 0.0  # -0.0 too
    return f"{v:.{digits}f}%"


def throughput(samples_per_s: float | None) -> str:
    """Samples per second: "61.8 samples/s" (one decimal), "?" when unknown. Every surface
    that shows a run's throughput writes it with this."""
    if samples_per_s is None:
        return "? samples/s"
    return f"{samples_per_s:,.1f} samples/s"


def speedup(x: float) -> str:
    """A speed-up or a ratio of throughputs: "×1.83" (two decimals). The verdict line, the
    report and ``compare`` write every speed-up with this."""
    return f"×{x:.2f}"


def finite_or_none(v: object) -> float | None:
    """``v`` as a float when it is a finite number (never a bool, NaN or ±inf), else None:
    the one check every reader of stored or foreign numbers uses."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def number(v: object) -> str:
    """A number for people: 1,234 · 56.7 · 0.12 · 0.00345; "-" for NaN, ±inf or None; anything
    else as text. Tables (show, the report, snapshot) write their numbers with this."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if not math.isfinite(v):
        return "-"
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.01:
        return f"{v:.2f}"
    return f"{v:.3g}"


def duration(seconds: float) -> str:
    """A duration for people: "250 ms" under a second, "45 s" under 90 s, "12 min" under 90
    minutes, then "1.5 h"."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def memory(used_mib: float, total_mib: float) -> str:
    """Memory used of total, from MiB (the kernel's and NVML's unit), SI like every size:
    "3.2/16 GB", "315 MB/16 GB"."""
    used, total = size(mib(used_mib)), size(mib(total_mib))
    if used.split()[-1] == total.split()[-1]:
        return f"{used.split()[0]}/{total}"
    return f"{used}/{total}"
