"""No fork while another thread is importing a module.

A forked child gets one thread: the one that called ``fork()``. A module lock that another
thread of the parent held at that moment (it was importing the module) stays held in the child,
by a thread that does not exist there, and the child's own first ``import`` of that module
waits for ever. The probe's threads import while they start (the store, the standalone session,
the alert actions: ``smtplib`` brings ``hmac``), and a training starts its DataLoader workers at
the same moment: a worker's ``import numpy.random`` (``secrets`` → ``hmac``) then hung in one
run of many (measured: the writer thread imported ``hmac`` 0.1 s before the workers did).

:func:`install` registers a hook that runs before every ``os.fork()`` of this process (the
DataLoader's workers included): it waits, at most :data:`WAIT_S`, until no other thread owns an
import's module lock. A fork from a thread that is itself importing does not wait for itself.
Reading which locks are held uses importlib's own table (``importlib._bootstrap._module_locks``,
the same in CPython 3.10 to 3.13); where it is missing the hook does nothing.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["WAIT_S", "importing_elsewhere", "install"]

#: the longest a fork waits for another thread's import to finish, seconds
WAIT_S = 5.0

_installed = False
_install_lock = threading.Lock()


def importing_elsewhere() -> bool:
    """Another thread of this process owns a module's import lock right now."""
    try:
        from importlib import _bootstrap

        table = _bootstrap._module_locks  # type: ignore[attr-defined]
        refs = list(table.values())
    except (ImportError, AttributeError, RuntimeError):  # another Python: nothing to read
        return False
    me = threading.get_ident()
    for ref in refs:
        try:
            lock = ref()
        except TypeError:  # not a weak reference in some other version
            lock = ref
        owner = getattr(lock, "owner", None)
        if owner is not None and owner != me:
            return True
    return False


def _before_fork() -> None:
    deadline = time.monotonic() + WAIT_S
    while importing_elsewhere() and time.monotonic() < deadline:
        time.sleep(0.001)


def install() -> None:
    """Register the hook once per process (from the first thread the probe starts)."""
    global _installed
    with _install_lock:
        if _installed or not hasattr(os, "register_at_fork"):
            return
        os.register_at_fork(before=_before_fork)
        _installed = True
