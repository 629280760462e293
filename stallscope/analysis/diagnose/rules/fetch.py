"""The fetch side of an input stall (input_bound.fetch): what the storage under the dataset
shows (a cgroup read limit, a cap before the device, a slow device, small random reads) and the
fixes for each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stallscope import units
from stallscope.analysis.diagnose.model import Fix, RunData
from stallscope.analysis.diagnose.rules.common import _workers_now, pack_command
from stallscope.analysis.diagnose.rules.scores import SCORES
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import limited

#: a throughput-capped device (a cloud disk): quick reads (r_await ms), a device mostly idle
#: (%util), yet the readers blocked (D state ≥ SCORES.d_state_strong)
CAPPED_AWAIT_MS = 10.0
CAPPED_UTIL_PCT = 50.0
#: small random reads: requests under this size (KiB) at more than SMALL_READS_S reads/s
SMALL_READ_KB = 64.0
SMALL_READS_S = 50.0


def _fetch_fixes(data: RunData, fx: Facts, *, tf: bool = False) -> list[Fix]:
    """Fixes for a fetch stall. ``tf``: only the storage-level ones (the tf.data pipeline's
    own come from :func:`~stallscope.analysis.diagnose.tfdata.tf_fetch_fixes`)."""
    fixes: list[Fix] = []
    info = data.device_info().get(fx.disk.device or "", {})
    device = _device_fix(data, fx, info, tf=tf)
    if device is not None:
        fixes.append(device)
    if tf:
        return fixes
    rq = fx.disk.disk_rareq_kb_median
    if rq is not None and rq < SMALL_READ_KB and (fx.disk.disk_r_s_median or 0) > SMALL_READS_S:
        fixes.append(
            Fix(
                f"pack the small files into WebDataset shards ({_pack_text(data)})",
                f"reads average {rq:.0f} kB at {fx.disk.disk_r_s_median:.0f} r/s: "
                "many small random reads, each paying a seek/metadata lookup",
            )
        )
    size = data.dataset_bytes
    avail = fx.host.mem_available_min_mib
    if size and avail and size / 1048576 < 0.7 * avail:
        fixes.append(
            Fix(
                f"dataset {units.size(size)} < available RAM "
                f"{units.size(units.mib(avail))}: cache it in memory (or copy it to "
                "/dev/shm or local disk first)",
                "after one pass every read is served from RAM",
            )
        )
    nw = _workers_now(fx)
    if (
        nw is not None
        and fx.host.physical_cores
        and nw < min(4, fx.host.physical_cores)
        and not (info.get("rotational") and not info.get("virtual"))
    ):
        fixes.append(
            Fix(
                f"num_workers {nw} → {min(4, fx.host.physical_cores)} to keep more reads in flight",
                "SSD/NVMe serve parallel reads faster than one at a time; "
                "on a spinning disk this adds seeks instead",
            )
        )
    return fixes


def _device_fix(data: RunData, fx: Facts, info: Mapping[str, Any], *, tf: bool) -> Fix | None:
    """The storage-level fix for the dataset's device: reads held at the cgroup's read limit,
    capped before the device, or a device too slow; None without a device."""
    dev = fx.disk.device
    if not dev:
        return None
    if limited(fx):
        return _limit_fix(fx, dev)
    if _capped(fx):
        return _capped_fix(fx, dev)
    return _slow_device_fix(data, fx, dev, info, tf=tf)


def _capped(fx: Facts) -> bool:
    """A throughput-capped device: quick reads, a device mostly idle, yet the readers blocked."""
    aw = fx.disk.disk_r_await_median_ms
    return (
        aw is not None
        and aw < CAPPED_AWAIT_MS
        and (fx.disk.disk_util_median_pct or 0) < CAPPED_UTIL_PCT
        and (fx.loader.worker_d_share or fx.procs.main_d_share or 0) >= SCORES.d_state_strong
    )


def _limit_fix(fx: Facts, dev: str) -> Fix:
    limit = units.kib(fx.disk.read_limit_kb_s or 0.0)
    p95 = units.rate(units.kib(fx.disk.disk_rkb_s_p95 or 0))
    return Fix(
        f"reads of /dev/{dev} are held at the trainer's cgroup read limit "
        f"({units.rate(limit)}): raise or lift the I/O limit (cgroup io.max / "
        "blkio throttle, `docker run --device-read-bps`, the pod's I/O limits), "
        "or copy the dataset to storage the limit does not cover",
        f"the device's read rate reached {p95} (p95) against a limit of {units.rate(limit)}",
    )


def _capped_fix(fx: Facts, dev: str) -> Fix:
    # what the trainer itself gets; the device total also counts other processes
    rate = fx.loader.worker_read_kb_s or fx.procs.main_read_kb_s or fx.disk.disk_rkb_s_median or 0.0
    util = fx.disk.disk_util_median_pct or 0.0
    aw = fx.disk.disk_r_await_median_ms or 0.0
    who = "workers" if fx.loader.workers else "the trainer's threads"
    return Fix(
        f"reads of /dev/{dev} look capped before the device (trainer reads "
        f"~{units.rate(units.kib(rate))}, device not busy, {who} waiting): "
        "raise "
        "the volume's provisioned throughput/IOPS or lift the I/O limit "
        "(cgroup io.max / blkio throttle), or copy the dataset to local NVMe",
        f"{who} wait on I/O while the device shows {util:.0f}% util and "
        f"{aw:.0f} ms await: the limit is above the device",
    )


def _slow_device_fix(
    data: RunData, fx: Facts, dev: str, info: Mapping[str, Any], *, tf: bool
) -> Fix:
    aw = fx.disk.disk_r_await_median_ms
    kind = (
        "virtual/network disk"
        if info.get("virtual")
        else "rotational"
        if info.get("rotational")
        else info.get("kind") or ""
    )
    detail = ", ".join(
        x
        for x in (
            kind,
            f"await {aw:.0f} ms" if aw is not None else "",
            f"{fx.disk.disk_util_median_pct:.0f}% util"
            if fx.disk.disk_util_median_pct is not None
            else "",
        )
        if x
    )
    return Fix(
        f"dataset on /dev/{dev} ({detail}): move it to local NVMe"
        + ("" if tf else f", or pack it ({_pack_text(data)}) to read sequentially"),
        "the device serves reads too slowly for the trainer",
    )


def _pack_text(data: RunData) -> str:
    """The pack command for this run's dataset, or how to get one (no placeholder to fill)."""
    cmd = pack_command(data)
    return f"`{cmd}`" if cmd else "stallscope pack, from the dataset's folder to a new one"
