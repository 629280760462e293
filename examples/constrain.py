"""Run a command under a real resource limit, to reproduce a bottleneck on purpose (root only).

    # reads of the device holding DIR capped at 2 MB/s (cgroup v1 blkio throttle)
    python examples/constrain.py --read-bps 2000000 --data DIR -- CMD ...

    # a 64 MiB /dev/shm (Docker's default) in a private mount namespace
    python examples/constrain.py --shm-size 64m -- CMD ...

The limit applies to CMD and everything it starts (DataLoader workers included); the command is
exec'd from an argv list, never through a shell. The throttle cgroup is left in place for the
caller to remove (`--cleanup NAME` removes it), because exec() leaves no process behind to do it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")


def device_of(path: str) -> str:
    """major:minor of the whole disk holding path (the throttle applies to whole devices)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from stallscope.sources.blockdev import devices_for_path

    devs = devices_for_path(path)
    if not devs:
        raise SystemExit(f"constrain: {path} is not on a block device")
    return (Path("/sys/block") / devs[0] / "dev").read_text().strip()


def throttle(name: str, dev: str, bps: int) -> None:
    group = BLKIO / name
    if not BLKIO.is_dir():
        raise SystemExit("constrain: no cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio")
    group.mkdir(exist_ok=True)
    (group / "blkio.throttle.read_bps_device").write_text(f"{dev} {bps}\n")
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")


def cleanup(name: str) -> None:
    group = BLKIO / name
    if group.is_dir():
        for pid in (group / "cgroup.procs").read_text().split():
            try:  # move stragglers back to the root group so the directory can go
                (BLKIO / "cgroup.procs").write_text(f"{pid}\n")
            except OSError:
                continue
        group.rmdir()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--read-bps", type=int, help="cap reads of --data's device (bytes/s)")
    ap.add_argument("--data", help="path on the device to throttle")
    ap.add_argument("--cgroup", default="stallscope-demo", help="blkio cgroup name")
    ap.add_argument("--shm-size", help="mount a tmpfs of this size on /dev/shm (e.g. 64m)")
    ap.add_argument("--cleanup", metavar="NAME", help="remove the blkio cgroup NAME and exit")
    ap.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("constrain: needs root (cgroups and mounts)")
    if args.cleanup:
        cleanup(args.cleanup)
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise SystemExit("constrain: no command given")
    if args.shm_size and not args.in_namespace:
        unshare = shutil.which("unshare")
        if unshare is None:
            raise SystemExit("constrain: unshare (util-linux) not found")
        argv = [
            unshare,
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            os.path.abspath(__file__),
            "--in-namespace",
            *sys.argv[1:],
        ]
        os.execv(unshare, argv)
    if args.shm_size:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={args.shm_size},mode=1777", "tmpfs", "/dev/shm"],
            check=True,
        )
    if args.read_bps:
        if not args.data:
            raise SystemExit("constrain: --read-bps needs --data PATH")
        throttle(args.cgroup, device_of(args.data), args.read_bps)
    os.execvp(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
