"""Reading files that may be hostile: only regular files, never more than a bound.

Every file stallscope reads back (``meta.json``, ``run.db``, ``stacks/*.jsonl``, the autotune
state) may have been replaced by something else: a FIFO (an ``open`` that waits forever for a
writer), a link to ``/dev/zero`` (a read that never ends), a file far larger than any stallscope
writes. These helpers open without blocking, check what was opened, and read at most ``limit``
bytes.

What a root agent reads on a user's behalf (docs/agent.md, "What the agent reads, and as
whom") is held to one more rule, ``owner``: the file is opened without following a link
(``O_NOFOLLOW``) and read only when the user who listed it owns it (:class:`NotOwned` else), so
a user cannot make the agent read a file that user could not read (a link to ``/etc/shadow``,
another user's run).
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = [
    "NotOwned",
    "NotRegular",
    "is_regular",
    "owned_dir",
    "owned_file",
    "read_bounded",
    "read_unfollowed",
]


class NotRegular(OSError):
    """The path is not a regular file (a FIFO, a device, a folder, a socket)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(errno.EINVAL, "not a regular file", os.fspath(path))


class NotOwned(OSError):
    """The path is a link, or belongs to another user than the one it was read for."""

    def __init__(self, path: str | os.PathLike[str], owner: int) -> None:
        super().__init__(errno.EACCES, f"a link, or not owned by uid {owner}", os.fspath(path))


def owned_dir(path: str | os.PathLike[str], owner: int) -> bool:
    """True for a folder (not a link to one) that ``owner`` owns."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == owner


def owned_file(path: str | os.PathLike[str], owner: int) -> bool:
    """True for a regular file (not a link to one) that ``owner`` owns."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == owner


def is_regular(path: str | os.PathLike[str]) -> bool:
    """True for a regular file (links followed); False for anything else or nothing."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return False


def read_bounded(
    path: str | os.PathLike[str], limit: int, *, owner: int | None = None, offset: int = 0
) -> tuple[bytes, bool]:
    """(at most ``limit`` bytes of the file from ``offset``, whether more was left). Raises
    :class:`NotRegular` for anything but a regular file, without waiting on it, and OSError as
    ``open`` does. ``owner``: read only a file, not a link, that this uid owns
    (:class:`NotOwned` else)."""
    data, more, _uid = _read(path, limit, owner=owner, offset=offset, nofollow=owner is not None)
    return data, more


def read_unfollowed(path: str | os.PathLike[str], limit: int) -> tuple[bytes, bool, int]:
    """:func:`read_bounded` of a file that is not a link (:class:`NotOwned` for a link), with
    the uid that owns it: whom what it lists belongs to (another user's run index)."""
    return _read(path, limit, owner=None, offset=0, nofollow=True)


def _read(
    path: str | os.PathLike[str], limit: int, *, owner: int | None, offset: int, nofollow: bool
) -> tuple[bytes, bool, int]:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if nofollow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if nofollow and exc.errno == errno.ELOOP:
            raise NotOwned(path, -1 if owner is None else owner) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(path)
        if owner is not None and st.st_uid != owner:
            raise NotOwned(path, owner)
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
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
    return data[:limit], len(data) > limit, st.st_uid
