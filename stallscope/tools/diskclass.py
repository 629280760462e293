"""Device classes for the disk benchmark: what a healthy device of each class delivers at queue
depth 1 (:data:`HEALTHY`), the class of a filesystem's devices (:func:`classify`), the figures
of a :class:`~stallscope.tools.diskbench.BenchResult` far below its class (:func:`judge`), and
two engines' results side by side (:func:`compare`). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stallscope.sources.blockdev import NETWORK_FS

if TYPE_CHECKING:
    from stallscope.tools.diskbench import BenchResult

__all__ = ["HEALTHY", "Expectation", "classify", "compare", "judge"]


@dataclass(frozen=True)
class Expectation:
    """What a healthy device of one class delivers at queue depth 1 (low, high)."""

    label: str
    seq_cold_mb_s: tuple[float, float]
    rand_iops: tuple[float, float]
    small_files_per_s: tuple[float, float]
    note: str = ""


#: healthy QD1 figures per class (docs/disk-health.md explains where they come from)
HEALTHY: dict[str, Expectation] = {
    "hdd": Expectation(
        "rotational HDD",
        (100, 280),
        (60, 200),
        (50, 400),
        "a 7200 rpm disk seeks in ~8 ms: random reads cap near 120/s",
    ),
    "sata_ssd": Expectation(
        "SATA SSD",
        (350, 560),
        (3000, 12000),
        (1000, 6000),
        "SATA 6 Gb/s caps sequential reads near 560 MB/s",
    ),
    "nvme": Expectation(
        "NVMe SSD",
        (1500, 7000),
        (8000, 20000),
        (3000, 20000),
        "PCIe 3/4 x4: 3.5–7 GB/s sequential at depth; ~80 µs per 4 KiB read",
    ),
    "network_virtual": Expectation(
        "network or virtual disk",
        (100, 2000),
        (1000, 20000),
        (300, 10000),
        "cloud volumes deliver what is provisioned (e.g. gp3 baseline 125 MB/s, 3000 IOPS)",
    ),
    "memory": Expectation(
        "RAM-backed filesystem",
        (2000, 30000),
        (50000, 2_000_000),
        (10000, 300000),
        "tmpfs reads are memory copies",
    ),
}
#: page-cache reads slower than this mean the CPU or memory is the limit, not the disk
CACHED_FLOOR_MB_S = 1000.0
#: a figure below this share of its class's low end is flagged
FAR_BELOW = 0.5
_CLASS_ORDER = ("hdd", "network_virtual", "sata_ssd", "nvme", "memory")


_MEMORY_FS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


def classify(fstype: str, infos: Sequence[Mapping[str, Any]]) -> str:
    """Device class of a filesystem: ``hdd``, ``sata_ssd``, ``nvme``, ``network_virtual``,
    ``memory`` or ``unknown`` (pure; ``infos`` are ``sources.blockdev.device_info`` dicts).

    Several devices (RAID, LVM) give the slowest class among them."""
    if fstype in _MEMORY_FS:
        return "memory"
    if fstype in NETWORK_FS or fstype.startswith("fuse"):
        return "network_virtual"
    classes = []
    for info in infos:
        if info.get("virtual"):
            classes.append("network_virtual")
        elif info.get("kind") == "nvme":
            classes.append("nvme")
        elif info.get("rotational"):
            classes.append("hdd")
        elif info.get("rotational") is False and info.get("kind") in ("scsi", "other"):
            classes.append("sata_ssd")
    if not classes:
        return "unknown"
    return min(classes, key=_CLASS_ORDER.index)


def judge(result: BenchResult, cls: str) -> list[str]:
    """Flags for figures far below a healthy device of class ``cls`` (pure)."""
    flags = []
    if 0 < result.seq_cached_mb_s < CACHED_FLOOR_MB_S:
        flags.append(
            f"page-cache reads only {result.seq_cached_mb_s:.0f} MB/s (healthy: "
            f"> {CACHED_FLOOR_MB_S:.0f}): the CPU or memory is the limit — check "
            "CPU load and memory pressure"
        )
    exp = HEALTHY.get(cls)
    if exp is None:
        return flags
    checks = (
        ("cold sequential reads", result.seq_cold_mb_s, exp.seq_cold_mb_s, "MB/s"),
        ("4 KiB random reads", result.rand_iops, exp.rand_iops, "IOPS"),
        ("small-file reads", result.small_files_per_s, exp.small_files_per_s, "files/s"),
    )
    for what, got, (lo, hi), unit in checks:
        if got < lo * FAR_BELOW:
            flags.append(
                f"{what} {got:,.0f} {unit} are far below a healthy {exp.label} "
                f"({lo:,.0f}–{hi:,.0f} {unit})"
            )
    return flags


def compare(a: BenchResult, b: BenchResult) -> dict[str, dict[str, float | None]]:
    """Side by side: per figure ``{a.engine: x, b.engine: y, "diff_pct": 100*(x-y)/y}``
    (``diff_pct`` None when y is 0)."""
    out: dict[str, dict[str, float | None]] = {}
    keys = [
        ("seq_cached_mb_s", a.seq_cached_mb_s, b.seq_cached_mb_s),
        ("seq_cold_mb_s", a.seq_cold_mb_s, b.seq_cold_mb_s),
        ("rand_iops", a.rand_iops, b.rand_iops),
        ("small_files_per_s", a.small_files_per_s, b.small_files_per_s),
    ]
    for p in ("p50", "p99"):
        if p in a.rand_lat_us and p in b.rand_lat_us:
            keys.append((f"rand_lat_{p}_us", a.rand_lat_us[p], b.rand_lat_us[p]))
    for k, x, y in keys:
        out[k] = {a.engine: x, b.engine: y, "diff_pct": 100.0 * (x - y) / y if y else None}
    return out
