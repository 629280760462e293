"""Sizes and rates written for people: one place, one convention.

**Sizes and rates are SI decimal**: 1 kB = 1,000 B, 1 MB = 1,000,000 B (what disk and network
vendors quote). Two sources count in binary and are converted to bytes before they are shown:
the kernel's and ``iostat -x``'s "kB" are KiB (1,024 B), so the metrics named ``*_kb_s`` hold
KiB/s (:func:`kib`); memory from ``/proc/meminfo``, cgroups and NVML comes in MiB (metrics named
``*_mib``, :func:`mib`). Durations: milliseconds under a second, seconds under a minute, then
minutes and hours.
"""

from __future__ import annotations

__all__ = ["KIB", "MIB", "kib", "mib", "pct", "rate", "size", "speedup", "throughput"]

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
