"""A fork while another thread imports must not leave the child waiting for ever on that
module's import lock (stallscope/forksafe.py). This hung a DataLoader worker of an autotuned
training once in CI: the probe's writer thread was importing ``hmac`` (alert actions → smtplib)
as the workers started, and each worker imports it too (numpy.random → secrets → hmac)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from stallscope import forksafe

SLOW = """\
import os, time
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "inside"), "w").close()
time.sleep(1.0)
"""

FORK = textwrap.dedent("""\
    import os, sys, threading, time
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    if sys.argv[1] == "guarded":
        from stallscope import forksafe
        forksafe.install()
    threading.Thread(target=lambda: __import__("slowmod"), daemon=True).start()
    while not os.path.exists(os.path.join(here, "inside")):  # the thread is mid-import
        time.sleep(0.001)
    pid = os.fork()
    if pid == 0:
        import slowmod  # noqa: F401  (a worker's first import of the same module)
        os._exit(0)
    t0 = time.monotonic()
    while time.monotonic() - t0 < float(sys.argv[2]):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            print("child finished")
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung")
""")


def _fork_during_import(tmp_path: Path, mode: str) -> str:
    d = tmp_path / mode
    d.mkdir()
    (d / "slowmod.py").write_text(SLOW)
    (d / "forker.py").write_text(FORK)
    # bare: the child never finishes, so any wait tells; guarded: a ceiling for a busy box
    limit = "2" if mode == "bare" else "30"
    out = subprocess.run(
        [sys.executable, str(d / "forker.py"), mode, limit],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_fork_waits_for_another_thread_s_import_so_the_child_can_import_it(
    tmp_path: Path,
) -> None:
    # the hazard itself, without the hook: the child never gets the module's lock
    assert _fork_during_import(tmp_path, "bare") == "child hung"
    # with the hook the fork waits for the import, and the child's import is a lookup
    assert _fork_during_import(tmp_path, "guarded") == "child finished"


def test_a_thread_s_own_import_is_not_another_s(tmp_path: Path) -> None:
    """A fork from inside an import (a training started at module import) does not wait for
    itself; the same import seen from another thread does count."""
    (tmp_path / "selfcheck.py").write_text(
        textwrap.dedent("""\
        import threading
        from stallscope import forksafe
        MINE = forksafe.importing_elsewhere()
        seen = []
        t = threading.Thread(target=lambda: seen.append(forksafe.importing_elsewhere()))
        t.start()
        t.join()
        OTHERS = seen[0]
    """)
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import selfcheck  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("selfcheck", None)
    assert selfcheck.MINE is False and selfcheck.OTHERS is True
    assert forksafe.importing_elsewhere() is False  # nothing importing now


def test_a_recorder_installs_the_hook_before_its_thread_starts(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""\
        from stallscope import forksafe
        before = forksafe._installed
        from stallscope.probe.recorder import Recorder
        r = Recorder(rank=0, run_dir={str(tmp_path)!r}, register_atexit=False)
        print(before, forksafe._installed)
        r.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
