"""Issue 50: ``run --pid`` never watches itself.

``bash -c 'stallscope run --pid $$ ...'`` watches the shell that started it, and that shell's
tree holds this stallscope and its py-spy: those are never sampled nor taken for the trainer
(the shell's other Python child is), SIGINT ends the monitoring at once, and a shell with
nothing else under it is refused in one line."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from conftest import stallscope_argv

from stallscope.store import RunStore, read_meta

#: the shell's own trainer: a Python child that keeps one core busy
BUSY = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"


def _stallscope_under(shell: int, timeout: float = 30) -> psutil.Process:
    """The stallscope process the shell runs (its child whose command line is ours)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for p in psutil.Process(shell).children():
                if "stallscope" in p.cmdline()[1:3]:
                    return p
        except psutil.Error:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no stallscope under the shell {shell}")


def _recorded(run_dir: Path) -> dict[str, dict[str, str]]:
    st = RunStore(run_dir / "run.db", readonly=True)
    try:
        return {str(e["entity"]): dict(e["attrs"]) for e in st.entities("procs")}
    finally:
        st.close()


def test_attach_to_the_shell_that_started_it_watches_the_shells_trainer_not_itself(
    tmp_path: Path,
) -> None:
    out = tmp_path / "runs"
    mon = shlex.join(
        stallscope_argv("run", "--pid", "$$", "--interval", "0.3", "--out", str(out))
    ).replace("'$$'", "$$")
    script = (
        f"{shlex.quote(sys.executable)} -c {shlex.quote(BUSY)} & child=$!\n"
        f"echo $child > {shlex.quote(str(tmp_path / 'child.pid'))}\n"
        f"{mon}\necho stallscope-exit=$?\nkill $child\n"
    )
    shell = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        me = _stallscope_under(shell.pid)
        # until the run has samples of the tree (and py-spy has started), at most 40 s
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            time.sleep(0.5)
            dbs = list(out.glob("*/run.db"))
            if dbs and time.monotonic() > deadline - 35 and _recorded(dbs[0].parent):
                break
        spies = [c.pid for c in me.children(recursive=True) if c.name() == "py-spy"]
        child = int((tmp_path / "child.pid").read_text())
        t0 = time.monotonic()
        me.send_signal(signal.SIGINT)
        me.wait(timeout=60)
        took = time.monotonic() - t0
        stdout, err = shell.communicate(timeout=60)
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()
        os.system(f"pkill -KILL -P {shell.pid} 2>/dev/null")
    assert "stallscope-exit=0" in stdout, err[-2000:]
    assert took < 10, f"SIGINT took {took:.1f} s to end the monitoring"
    [run_dir] = list(out.iterdir())
    assert read_meta(run_dir)["ended"] == "detached"
    procs = _recorded(run_dir)
    assert str(me.pid) not in procs, procs
    assert not set(map(str, spies)) & set(procs), (spies, procs)
    assert not [a for a in procs.values() if a.get("name") == "py-spy"], procs
    assert str(child) in procs and str(shell.pid) in procs, procs
    assert procs[str(child)]["role"] == "main", procs
    flat = " ".join(err.split())
    if "sampling the stacks" in flat:  # py-spy is here: it samples the shell's trainer only
        assert f"the Python trainer it runs, pid {child} stallscope: watching" in flat, flat[-1500:]


def test_attach_to_a_shell_with_nothing_else_under_it_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    out = tmp_path / "runs"
    mon = shlex.join(
        stallscope_argv("run", "--pid", "$$", "--interval", "0.3", "--out", str(out))
    ).replace("'$$'", "$$")
    r = subprocess.run(
        ["bash", "-c", f"{mon}\necho stallscope-exit=$?\n"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "stallscope-exit=2" in r.stdout, (r.stdout, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "nothing to watch" in lines[0] and "stallscope itself" in lines[0], lines
    assert not out.exists() or not list(out.iterdir())


def test_the_procs_source_leaves_out_an_excluded_process_and_what_it_started() -> None:
    """The tree walk (children files and the full /proc scan alike) never enters an excluded
    process: neither it nor its children (stallscope's py-spy) are sampled."""
    from stallscope.sources.procs import ProcsSource

    code = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
        " for _ in range(2)]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(60)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout is not None
        keep, skip = map(int, root.stdout.readline().split())
        for rescan_every in (60, 1):  # children files, then a full scan each sample
            src = ProcsSource(root.pid, rescan_every=rescan_every, exclude={skip})
            src.open()
            try:
                for _ in range(3):
                    payload = src.sample(time.monotonic()) or {}
                    time.sleep(0.1)
            finally:
                src.close()
            assert set(payload) == {str(root.pid), str(keep)}, (payload.keys(), skip)
    finally:
        root.kill()
        root.wait()
        os.system(f"pkill -KILL -P {root.pid} 2>/dev/null")


def test_python_trainers_never_names_stallscope_itself() -> None:
    from stallscope.cli.run import python_trainers

    shell = subprocess.Popen(
        ["bash", "-c", f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(60)' & wait"]
    )
    try:
        deadline = time.monotonic() + 20
        kids: list[int] = []
        while not kids and time.monotonic() < deadline:
            kids = [c.pid for c in psutil.Process(shell.pid).children()]
            time.sleep(0.05)
        [child] = kids
        assert python_trainers(shell.pid) == [child]
        assert python_trainers(shell.pid, exclude={child}) == [shell.pid]
    finally:
        os.system(f"pkill -KILL -P {shell.pid} 2>/dev/null")
        shell.kill()
        shell.wait()
