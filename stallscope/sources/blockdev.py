"""Block devices under a path, and what sysfs says about a device.

:func:`describe_path` / :func:`devices_for_path`: which whole block devices hold a dataset (the
path's mount in ``/proc/self/mountinfo`` followed through sysfs: partitions to their disk,
loop devices to their backing file, dm/md to their slaves, overlays to their layers), and why
none when none do (tmpfs, network, FUSE, ZFS). :func:`device_info`: what kind of disk a device
is (``lsblk -d -o NAME,ROTA,MODEL,SIZE``), whether it is virtual (no SMART of its own), its
model, size, scheduler. Readers take ``proc_root`` / ``sys_root`` so that the tests run them on
recorded trees (``tests/fixtures/sys-*``).
"""

from __future__ import annotations

import os
import stat
from typing import Any, NamedTuple

from stallscope.errors import ParseError, SourceUnavailable, UsageError

__all__ = [
    "NETWORK_FS",
    "PathDevices",
    "describe_path",
    "device_info",
    "devices_for_path",
    "sys_name",
]


def sys_name(name: str) -> str:
    """A diskstats name as sysfs spells it (``cciss/c0d0`` -> ``cciss!c0d0``)."""
    return name.replace("/", "!")


# ---------------------------------------------------------------------------------------------
# which devices hold a path
# ---------------------------------------------------------------------------------------------

#: filesystems in memory or made up by the kernel: no block device under them
_MEMORY_FS = frozenset(
    {
        "tmpfs",
        "ramfs",
        "devtmpfs",
        "hugetlbfs",
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "devpts",
        "mqueue",
        "debugfs",
        "tracefs",
        "securityfs",
        "configfs",
        "pstore",
        "bpf",
        "efivarfs",
        "binfmt_misc",
        "fusectl",
        "rpc_pipefs",
        "nsfs",
        "autofs",
    }
)
#: filesystems whose data comes over the network (the one list: tools/diskclass.py reads it)
NETWORK_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "9p",
        "virtiofs",
        "afs",
        "gpfs",
        "beegfs",
        "orangefs",
        "ncpfs",
        "davfs",
        "ocfs2",
        "gfs2",
        "pvfs2",
    }
)
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
            dirs.extend(
                p.replace("\\:", ":").replace("\\,", ",") for p in _split_unescaped(value, ":") if p
            )
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
    sname = sys_name(name)
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


def device_name(devnum: str, sys_root: str = "/sys") -> str | None:
    """The kernel's name of block device ``major:minor`` (``254:0`` -> ``vda``), None when
    there is none."""
    major, _, minor = devnum.partition(":")
    if not (major.isdigit() and minor.isdigit()):
        return None
    return _name_for_devnum(int(major), int(minor), sys_root)


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
    base = os.path.join(sys_root, "block", sys_name(disk))
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
        return result(
            [],
            "overlay with no block device under its layers"
            + (f" ({'; '.join(reasons)})" if reasons else ""),
        )
    if fstype in ("tmpfs", "ramfs"):
        return result([], f"{fstype} keeps its files in memory: no block device to watch")
    if fstype in _MEMORY_FS:
        return result([], f"{fstype} is a kernel pseudo-filesystem: no block device to watch")
    if fstype in NETWORK_FS:
        return result(
            [],
            f"{fstype} is a network filesystem ({best.source}): no local block "
            "device to watch; its throughput is the network's",
        )
    if fstype.startswith("fuse"):
        return result(
            [],
            f"{fstype} is served by a user-space (FUSE) process "
            f"({best.source}): no block device to watch",
        )
    if fstype == "zfs":
        return result(
            [], f"ZFS dataset {best.source}: its pool's disks are not mapped (see `zpool status`)"
        )
    name: str | None = None
    if best.major != 0:
        name = _name_for_devnum(best.major, best.minor, sys_root)
    if name is None and best.source.startswith("/dev/"):
        # btrfs and a few others report an anonymous 0:N device; the source names the disk
        name = best.source.removeprefix("/dev/")
        if name.startswith("mapper/"):
            name = _dm_name_to_kernel(name.removeprefix("mapper/"), sys_root) or name
    if name is None:
        return result(
            [],
            f"{fstype} on {best.source} (device {best.major}:{best.minor}) has "
            "no block device in sysfs",
        )
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
    "amazon elastic block store",
    "persistentdisk",
    "google",
    "virtual",
    "qemu",
    "vmware",
    "vbox",
)


def _kind(name: str, link: str) -> str:
    base = name.rstrip("0123456789")
    for prefix, kind in (
        ("loop", "loop"),
        ("dm-", "dm"),
        ("md", "md"),
        ("zram", "zram"),
        ("nbd", "nbd"),
        ("rbd", "rbd"),
        ("ram", "ram"),
    ):
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
    sname, sdisk = sys_name(name), sys_name(disk)
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
    virtual = kind in {"virtio", "xen", "nbd", "rbd", "loop", "dm", "md", "zram", "ram", "virtual"}
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
