"""Reading files that may be hostile: only regular files, never more than a bound.

Every file stallscope reads back (``meta.json``, ``run.db``, ``stacks/*.jsonl``, the autotune
state) may have been replaced by something else: a FIFO (an ``open`` that waits forever for a
writer), a link to ``/dev/zero`` (a read that never ends), a file far larger than any stallscope
writes. These helpers open without blocking, check what was opened, and read at most ``limit``
bytes.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotRegular", "is_regular", "read_bounded"]


class NotRegular(OSError):
    """The path is not a regular file (a FIFO, a device, a folder, a socket)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(errno.EINVAL, "not a regular file", os.fspath(path))


def is_regular(path: str | os.PathLike[str]) -> bool:
    """True for a regular file (links followed); False for anything else or nothing."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return False


def read_bounded(path: str | os.PathLike[str], limit: int) -> tuple[bytes, bool]:
    """(at most ``limit`` bytes of the file, whether more was left). Raises :class:`NotRegular`
    for anything but a regular file, without waiting on it, and OSError as ``open`` does."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(path)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    return data[:limit], len(data) > limit
