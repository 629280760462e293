"""What the cgroups this process lives in allow it: CPUs (the CPU quota) and read bandwidth
per device (the I/O limits), cgroup v1 and v2.

Every reader takes the cgroup mount (``cg_root``) and, where it needs one, ``/proc``
(``proc_root``) as parameters, so tests and the agent can point them at another tree; the
defaults are the machine's. Used by the diagnosis's session (read limits), the offline tuner and
online autotune (usable cores, read caps).
"""

from __future__ import annotations

import os

__all__ = ["CG_ROOT", "cgroup_cpus", "parse_read_caps", "read_caps", "read_limits", "usable_cores"]

#: where the cgroup filesystem is mounted (v2 unified, or v1's controllers under it)
CG_ROOT = "/sys/fs/cgroup"


# --- CPUs ---------------------------------------------------------------------------------------
def usable_cores(
    cg_root: str = CG_ROOT, pid: int | str = "self", *, proc_root: str = "/proc"
) -> int:
    """Physical cores this process may run on: affinity (which a cpuset narrows) and the CPU
    quota of its cgroup and those above it (:func:`cgroup_cpus`) all cap it."""
    import psutil

    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = physical
    quota = cgroup_cpus(cg_root, pid, proc_root=proc_root)
    return max(1, min(physical, allowed, quota or allowed))


def cgroup_cpus(
    cg_root: str = CG_ROOT, pid: int | str = "self", *, proc_root: str = "/proc"
) -> int | None:
    """Whole CPUs the CPU quota allows process ``pid``: v2 ``cpu.max``, or v1's
    ``cpu.cfs_quota_us`` over its period, in the process's own cgroup (``/proc/PID/cgroup``)
    and every cgroup above it up to ``cg_root``; the tightest wins. Without a cgroup namespace
    (Slurm, systemd slices) the quota sits on a cgroup below the mount's root, not at it. None
    without a quota or where none is read."""
    found = [n for n in map(_quota, _cpu_dirs(cg_root, pid, proc_root)) if n]
    return min(found) if found else None


def _cpu_dirs(cg_root: str, pid: int | str, proc_root: str) -> list[tuple[str, bool]]:
    """Each cgroup folder whose CPU quota binds ``pid``, deepest first, with whether it is v2:
    its own cgroup's and every parent's, under v2 and under v1's ``cpu`` controller. The
    mount's root is always among them (a process in a cgroup namespace sees its cgroup there);
    ``..`` never climbs above it."""
    rels: list[tuple[str, list[str], bool]] = []
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            lines = f.read(65536).splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = [p for p in path.split("/") if p and p not in (".", "..")]
        if controllers == "":
            rels.append((cg_root, rel, True))
        elif "cpu" in controllers.split(","):
            for base in dict.fromkeys((f"{cg_root}/{controllers}", f"{cg_root}/cpu")):
                rels.append((base, rel, False))
    dirs: list[tuple[str, bool]] = []
    for base, rel, v2 in rels:
        dirs += [("/".join([base, *rel[:depth]]), v2) for depth in range(len(rel), -1, -1)]
    for root in ((cg_root, True), (f"{cg_root}/cpu", False)):  # the mount's own root
        if root not in dirs:
            dirs.append(root)
    return list(dict.fromkeys(dirs))


def _quota(where: tuple[str, bool]) -> int | None:
    folder, v2 = where
    path = f"{folder}/cpu.max" if v2 else f"{folder}/cpu.cfs_quota_us"
    try:
        with open(path) as f:
            return (_v2_quota if v2 else _v1_quota)(f.read(), path)
    except (OSError, ValueError):
        return None


def _v2_quota(text: str, _path: str) -> int | None:
    quota, period = text.split()[:2]
    if quota == "max":
        return None
    return max(1, int(int(quota) / int(period)))


def _v1_quota(text: str, path: str) -> int | None:
    quota = int(text.strip())
    if quota <= 0:
        return None
    with open(path.replace("cfs_quota_us", "cfs_period_us")) as f:
        period = int(f.read().strip())
    return max(1, int(quota / period))


# --- read bandwidth -----------------------------------------------------------------------------
def parse_read_caps(text: str) -> dict[str, int]:
    """Read limits in bytes/s per device ``major:minor`` from a cgroup v1
    ``blkio.throttle.read_bps_device`` (``8:0 4000000``) or a v2 ``io.max`` (``8:0 rbps=4000000
    wbps=max ...``); devices without a read limit are left out, odd lines skipped."""
    caps: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or ":" not in fields[0]:
            continue
        value = fields[1]
        for f in fields[1:]:
            if f.startswith("rbps="):
                value = f[5:]
                break
        else:
            if "=" in value:  # an io.max line with no rbps key: no read limit
                continue
        try:
            bps = int(value) if value.isascii() and value.isdigit() else 0
        except ValueError:
            bps = 0
        if bps > 0:
            caps[fields[0]] = bps
    return caps


def read_caps(
    pid: int | str = "self", *, proc_root: str = "/proc", cg_root: str = CG_ROOT
) -> dict[str, int]:
    """Bytes per second the process may read from each device (``major:minor``) under the I/O
    limits of its cgroup and every cgroup above it (the smallest wins): cgroup v1's blkio
    throttle or v2's ``io.max`` (``docker run --device-read-bps`` sets either). {} where none
    applies or none can be read."""
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    caps: dict[str, int] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, name = cg_root, "io.max"
        elif "blkio" in controllers.split(","):
            base, name = f"{cg_root}/{controllers}", "blkio.throttle.read_bps_device"
        else:
            continue
        rel = [p for p in path.split("/") if p and p not in (".", "..")]
        for depth in range(len(rel), -1, -1):
            d = "/".join([base, *rel[:depth]])
            try:
                with open(f"{d}/{name}") as f:
                    text = f.read(65536)
            except OSError:
                continue
            for dev, bps in parse_read_caps(text).items():
                caps[dev] = min(bps, caps.get(dev, bps))
    return caps


def read_limits(
    pid: int | str, *, proc_root: str = "/proc", cg_root: str = CG_ROOT, sys_root: str = "/sys"
) -> dict[str, int]:
    """:func:`read_caps` of process ``pid`` keyed by device name (``vda``), as the disk source
    names devices (from ``sys_root``); devices without a name are left out."""
    from stallscope.sources.blockdev import device_name

    out: dict[str, int] = {}
    for devnum, bps in read_caps(pid, proc_root=proc_root, cg_root=cg_root).items():
        name = device_name(devnum, sys_root)
        if name:
            out[name] = bps
    return out
