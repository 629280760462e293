"""Sizes and rates written for people: one place, one convention.

**Sizes and rates are SI decimal**: 1 kB = 1,000 B, 1 MB = 1,000,000 B (what disk and network
vendors quote). Two sources count in binary and are converted to bytes before they are shown:
the kernel's and ``iostat -x``'s "kB" are KiB (1,024 B), so the metrics named ``*_kb_s`` hold
KiB/s (:func:`kib`); memory from ``/proc/meminfo``, cgroups and NVML comes in MiB (metrics named
``*_mib``, :func:`mib`). Durations: milliseconds under a second, seconds under a minute, then
minutes and hours.
"""

from __future__ import annotations

__all__ = ["KIB", "MIB", "kib", "mib", "rate", "size"]

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
