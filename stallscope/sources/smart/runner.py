"""The one code that runs ``smartctl``: argv, device names, and what to do when it cannot.

:func:`read_smart` runs ``smartctl --json --all DEVICE`` (an argv list, never a shell; device
names validated by :func:`validate_device`) and turns every way that can go wrong (not installed,
no permission, virtual disk, drive asleep) into an ``unknown`` record with the fix
(:func:`_open_fixes`: a sudoers line for exactly smartctl, capabilities, container flags).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from stallscope.errors import UsageError
from stallscope.sources.smart.parse import DriveHealth, unknown_drive
from stallscope.sources.smart.verdict import parse_smartctl_text

__all__ = [
    "RunResult",
    "Runner",
    "read_smart",
    "smartctl_argv",
    "validate_device",
    "validate_device_type",
]

_DEVICE_RE = re.compile(r"^/dev/[A-Za-z0-9][A-Za-z0-9._+:@-]*(?:/[A-Za-z0-9][A-Za-z0-9._+:@-]*)*$")
_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(?:[,+][A-Za-z0-9_/.-]+)*$")


def validate_device(name: str) -> str:
    """``sda`` / ``/dev/sda`` / ``/dev/disk/by-id/...`` -> the ``/dev`` path, or UsageError.

    Only names made of letters, digits and ``._+:@-`` under ``/dev`` pass: nothing that
    smartctl could read as an option, and no ``..``."""
    n = name.strip()
    if n and not n.startswith("/"):
        n = "/dev/" + n
    if not _DEVICE_RE.match(n) or "/../" in n + "/" or "/./" in n + "/":
        raise UsageError(f"not a device name: {name!r} (expected e.g. sda, /dev/nvme0n1)")
    return n


def validate_device_type(dtype: str) -> str:
    """A smartctl ``-d`` value (``sat``, ``nvme``, ``megaraid,3``...), or UsageError."""
    if not _TYPE_RE.match(dtype) or len(dtype) > 40:
        raise UsageError(f"not a smartctl device type: {dtype!r} (e.g. sat, nvme, megaraid,0)")
    return dtype


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: bytes
    stderr: bytes


Runner = Callable[[Sequence[str], float], RunResult]


def _default_runner(argv: Sequence[str], timeout: float) -> RunResult:
    p = subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False)
    return RunResult(p.returncode, p.stdout, p.stderr)


def smartctl_argv(
    device: str, *, device_type: str | None = None, smartctl: Sequence[str] = ("smartctl",)
) -> list[str]:
    """The argv :func:`read_smart` runs (``--nocheck=standby``: a sleeping disk is not woken)."""
    argv = [*smartctl, "--json", "--all", "--nocheck=standby"]
    if device_type:
        argv += ["-d", validate_device_type(device_type)]
    return [*argv, validate_device(device)]


def _open_fixes(smartctl_path: str, euid: int, user: str) -> list[str]:
    """The fixes for a drive SMART cannot open. Each names only what exists, and puts its one
    multi-word command last, in backticks, so that the terminal can print it on a line of its
    own (commands are never wrapped: they must survive copy and paste)."""
    grant = [
        "grant exactly smartctl, nothing else, with this sudoers line, then run stallscope "
        f"disk with --sudo: `echo '{user} ALL=(root) NOPASSWD: {smartctl_path}' | sudo tee "
        "/etc/sudoers.d/stallscope-smartctl`",
        "or, where a systemd service runs stallscope disk, give that service the capabilities "
        "CAP_SYS_RAWIO and CAP_DAC_READ_SEARCH instead (NVMe admin commands also need "
        "CAP_SYS_ADMIN) in its unit: `AmbientCapabilities=CAP_SYS_RAWIO CAP_DAC_READ_SEARCH`",
    ]
    place = [
        "in a container: mount the devices and allow raw commands, or better run stallscope "
        "disk on the host; the container flags: `-v /dev:/dev -v /sys:/sys --cap-add "
        "SYS_RAWIO`",
        "on a virtual disk (virtio, cloud volume) SMART belongs to the host's physical "
        "drives: check them on the host, or the provider's volume health",
    ]
    # root has every right a grant could give: where the device lives is the cause
    return place if euid == 0 else grant + place


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "USER"


def explain_unreadable(
    drive: DriveHealth, dev: str, *, uid: int, smartctl_path: str, source: str = "smartctl"
) -> DriveHealth | None:
    """What smartctl's own words say of a device it could not read (asleep, not allowed, not
    there, type unknown), with the fixes: the same whether smartctl ran now or its ``--json``
    was saved earlier (``disk --smartctl-json``). None when its words say none of these."""
    text = " ".join(drive.reasons)
    low = text.lower()
    if "standby" in low or "sleep" in low:
        return unknown_drive(
            f"{dev} is asleep (standby); not woken up to read SMART",
            device=dev,
            source=source,
            explained=True,
        )
    if "permission denied" in low or "operation not permitted" in low:
        who = (
            "even as root: the kernel or the container runtime forbids raw commands to this device"
            if uid == 0
            else "SMART needs raw device access"
        )
        user = os.environ.get("USER") or os.environ.get("LOGNAME") or _user_name(uid)
        m = re.search(r"failed: ([^;]*)", text)
        msg = m.group(1).strip() if m else text
        return unknown_drive(
            f"cannot open {dev} for SMART ({who}): {msg}",
            device=dev,
            source=source,
            fixes=_open_fixes(smartctl_path, uid, user),
            explained=True,
        )
    if "no such device" in low or "no such file" in low:
        return unknown_drive(f"no such device: {dev}", device=dev, source=source, explained=True)
    if "unable to detect device type" in low:
        return unknown_drive(
            f"smartctl could not tell what kind of device {dev} is",
            device=dev,
            source=source,
            explained=True,
            fixes=(
                "on a virtual disk (virtio, cloud volume), check the "
                "host's drives; else give the type, as stallscope disk "
                f"does by itself: `stallscope disk --device-type sat {dev}`",
            ),
        )
    return None


def read_smart(
    device: str,
    *,
    device_type: str | None = None,
    smartctl: Sequence[str] = ("smartctl",),
    runner: Runner | None = None,
    timeout: float = 30.0,
    euid: int | None = None,
) -> DriveHealth:
    """Run ``smartctl --json --all DEVICE`` and parse it (the thin reader; never raises for a
    problem on the machine — those become an ``unknown`` verdict with the fix).

    Equivalent: ``sudo smartctl -a /dev/sda``. Raises UsageError only for a bad device name.
    """
    dev = validate_device(device)
    run = runner or _default_runner
    uid = os.geteuid() if euid is None else euid
    argv = smartctl_argv(dev, device_type=device_type, smartctl=smartctl)
    exe = next((a for a in smartctl if "smartctl" in a), smartctl[-1])
    path = shutil.which(exe) or exe
    try:
        res = run(argv, timeout)
    except FileNotFoundError:
        return unknown_drive(
            f"{exe} is not installed: cannot read SMART of {dev}",
            device=dev,
            source="smartctl",
            fixes=(
                "install smartmontools ≥ 7 (the package has this name in "
                "apt, dnf, yum and zypper): `apt install smartmontools`",
            ),
        )
    except subprocess.TimeoutExpired:
        return unknown_drive(
            f"smartctl did not answer within {timeout:.0f} s for {dev}",
            device=dev,
            source="smartctl",
        )
    except PermissionError as exc:
        return unknown_drive(f"cannot run {exe}: {exc.strerror}", device=dev, source="smartctl")
    if not res.stdout.strip():
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        fixes: list[str] = []
        if smartctl and smartctl[0] == "sudo":
            fixes = _open_fixes(path, 1, os.environ.get("USER") or _user_name(uid))[:1]
        return unknown_drive(
            f"{exe} printed nothing for {dev} (exit {res.returncode}): "
            f"{err[0] if err else 'no message'}",
            device=dev,
            source="smartctl",
            fixes=fixes,
        )
    drive = parse_smartctl_text(res.stdout, source="smartctl")
    if drive.verdict == "unknown" and not drive.counters and drive.smart_passed is None:
        text = " ".join(drive.reasons)
        if "Unable to detect device type" in text and device_type is None:
            # smartctl guesses the type from the name; /dev/vda, /dev/xvda... it cannot. Ask
            # for SAT, what a user would try after reading "please specify -d".
            return read_smart(
                dev, device_type="sat", smartctl=smartctl, runner=run, timeout=timeout, euid=uid
            )
        told = explain_unreadable(drive, dev, uid=uid, smartctl_path=path)
        if told is not None:
            return told
    if drive.device is None:
        drive = replace(drive, device=dev)
    return drive
