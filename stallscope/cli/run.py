"""``stallscope run [--interval S] [--data PATH] [--out DIR] -- CMD ...``

Runs CMD as a child under monitoring, forwards signals, exits with its exit code, and prints
a summary, the diagnosis and the run directory at the end."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from stallscope.alerts import load_rules, parse_rules
from stallscope.alerts.actions import AlertSink
from stallscope.cli._common import (
    err_console,
    interval_type,
    keep_full_type,
    nothing_but_self,
    own_processes,
    rate_type,
    runs_stallscope,
    safe,
    tree_without,
    watchable_process,
)
from stallscope.collect.session import DEFAULT_INTERVAL_S, DEFAULT_WARMUP, Session
from stallscope.errors import StallscopeError, UsageError
from stallscope.store import DEFAULT_OUT
from stallscope.store.paths import default_out
from stallscope.textsafe import plain

if TYPE_CHECKING:
    from stallscope.store.mirror import StepMirror

_FORWARD = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a command under monitoring",
        description="Run CMD as a child, sample the machine while it runs, and "
        "print a summary and diagnosis at the end.",
    )
    p.add_argument(
        "--interval",
        type=interval_type,
        default=None,
        help="seconds between samples (default: every 1 s for the first 2 minutes, "
        "then every 5 s; a value given here is used throughout)",
    )
    p.add_argument(
        "--data",
        metavar="PATH",
        help="where the dataset lives; its block device is watched closely",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help=f"directory for run directories (default $STALLSCOPE_OUT, else "
        f"./{DEFAULT_OUT}); every run is also listed in a per-user index, so "
        "`stallscope runs` finds it from any folder",
    )
    p.add_argument(
        "--keep-full",
        type=keep_full_type,
        default=3600.0,
        metavar="S",
        help="keep full resolution for the last S seconds; older samples are "
        "downsampled to 1-minute means, maxima for bitmasks and link generations "
        "(default 3600)",
    )
    p.add_argument(
        "--alerts",
        metavar="FILE",
        help="alert rules ([[alerts]] tables, see docs/alerts.md) evaluated on every "
        "sample; the shipped defaults (GPU too hot, throttled, /dev/shm nearly full, "
        "swapping, disk saturated and slow, SMART failing, data wait high, GPU "
        "memory growing, a slow rank) are recorded as run events even without it",
    )
    p.add_argument("--quiet", action="store_true", help="print only the run directory at the end")
    p.add_argument(
        "--pid",
        type=_pid_type,
        metavar="PID",
        help="attach to a training that is already running: monitor PID's process "
        "tree (DataLoader workers included, as they come and go) until it exits or "
        "Ctrl-C, which stops the monitoring only (the trainer is never signalled)",
    )
    p.add_argument(
        "--stack-rate",
        type=rate_type,
        default=None,
        metavar="HZ",
        help="samples per second of the trainer's stack, to tell data wait from "
        "compute with no code in the trainer (default 40 for a launched command, "
        "sampled from inside it; 10 with --pid, sampled by py-spy; see "
        "docs/diagnosis.md)",
    )
    p.add_argument("--no-stacks", action="store_true", help="do not sample the trainer's stacks")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    p.set_defaults(func=run)


def _resolve(cmd: list[str]) -> list[str]:
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command given: stallscope run [options] -- CMD ...")
    exe = cmd[0]
    if os.sep not in exe and shutil.which(exe) is None:
        raise UsageError(f"command not found: {exe}")
    if os.sep in exe and not os.access(exe, os.X_OK):
        raise UsageError(f"not an executable file: {exe}")
    return cmd


def _pid_type(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pid must be a process id, got {text!r}") from None
    if not 1 <= pid < 2**31:
        raise argparse.ArgumentTypeError(f"--pid must be a process id, got {text!r}")
    return pid


_PYTHON = re.compile(r"^(python[0-9.]*|pypy[0-9.]*)$")


def _is_python(p: Any) -> bool:
    import psutil

    try:
        exe = os.path.basename(p.exe() or "")
    except psutil.Error:
        exe = ""
    try:
        return bool(_PYTHON.match(p.name()) or _PYTHON.match(exe))
    except psutil.Error:
        return False


def _is_stallscope(p: Any) -> bool:
    import psutil

    try:
        return runs_stallscope(p.cmdline())
    except psutil.Error:
        return False


def python_trainers(pid: int, exclude: frozenset[int] = frozenset()) -> list[int]:
    """The pids whose Python stacks show the training of ``pid``'s tree: ``pid`` itself when it
    is Python (or when nothing in its tree is), else the topmost Python processes under it (a
    shell wrapper's trainer; that trainer's DataLoader workers are below it, not beside it).
    Never stallscope: the ``exclude`` pids and what is under them (:func:`own_processes`: this
    process and its py-spy), and no process that runs stallscope is taken for a trainer."""
    import psutil

    try:
        root = psutil.Process(pid)
        if _is_python(root) and not _is_stallscope(root):
            return [pid]
    except psutil.Error:
        return [pid]
    tree = tree_without(pid, exclude)
    py = set()
    for k in tree:
        try:
            proc = psutil.Process(k)
        except psutil.Error:
            continue
        if _is_python(proc) and not _is_stallscope(proc):
            py.add(k)
    return sorted(k for k in py if tree[k] not in py) or [pid]


def _alive(pid: int, started: float) -> bool:
    """The process still exists and is the one we attached to (not a reused pid)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - started) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def attach(
    args: argparse.Namespace,
    alert_sink: AlertSink,
    interval: float,
    warmup: tuple[float, float] | None,
) -> int:
    """``run --pid``: monitor a running process tree into a normal run directory."""
    if args.cmd and [c for c in args.cmd if c != "--"]:
        raise UsageError("--pid attaches to a running process: give no command")
    pid = args.pid
    cmdline, name, started = watchable_process(pid)
    own = own_processes(pid)  # never watched: this process, its py-spy, stallscopes above it
    if nothing_but_self(pid, own):
        raise UsageError(
            f"--pid {pid} ({plain(name, 60)}): nothing to watch there but this "
            "stallscope itself (that process started it and runs nothing else); "
            "start the training first, or give the trainer's pid"
        )
    session = Session.create(
        args.out or default_out(),
        name,
        cmdline,
        interval=interval,
        warmup=warmup,
        data=args.data,
        keep_full_s=args.keep_full,
        sinks=[alert_sink],
        monitor_pid=os.getpid(),
        attached=True,
    )
    alert_sink.attach_run(session.run_dir)
    if not args.no_stacks:
        _attach_stacks(args, session, pid, name, own)
    mirror = _probe_mirror(args, session, pid, started)
    stop: list[int] = []

    def detach(signum: int, _frame: FrameType | None) -> None:
        stop.append(signum)  # stop monitoring; never passed on to the trainer

    old = {s: signal.signal(s, detach) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    how = "exited"
    try:
        try:
            session.watch(pid, exclude=own)
        except (StallscopeError, OSError, sqlite3.Error) as exc:
            err_console.print(
                f"stallscope: monitoring stopped: {safe(str(exc))}", soft_wrap=True, highlight=False
            )
        if not args.quiet:
            err_console.print(
                f"stallscope: watching pid {pid} ({safe(name)}); Ctrl-C stops "
                "watching, the process goes on",
                soft_wrap=True,
                highlight=False,
            )
        ticks = 0
        while not stop and _alive(pid, started):
            time.sleep(0.25)
            ticks += 1
            if mirror is not None and ticks % 4 == 0:
                mirror.copy()
        if stop:
            how = "detached"
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if mirror is not None:  # the probe's last steps (it flushes at its exit)
            mirror.copy()
            mirror.close()
    # not our child: its exit code cannot be known
    _finish(session, None, ended=how)
    _print_end(args, session.run_dir)
    return 0


def _attach_stacks(
    args: argparse.Namespace, session: Session, pid: int, name: str, own: frozenset[int]
) -> None:
    """Sample the stacks of the Python trainer under pid (pid itself, or the Python processes
    a launcher that is not Python runs), saying so when it is not pid."""
    targets = python_trainers(pid, own)
    if targets != [pid] and not args.quiet:
        err_console.print(
            f"stallscope: pid {pid} ({safe(name)}) is not Python: sampling "
            f"the stacks of the Python trainer it runs, pid "
            f"{', '.join(map(str, targets))}",
            soft_wrap=True,
            highlight=False,
        )
    _stacks(args, session, attach=targets)


def _probe_mirror(
    args: argparse.Namespace, session: Session, pid: int, started: float
) -> StepMirror | None:
    """When the attached trainer has a standalone probe, its steps go to the probe's own run:
    copy them into this one (store/mirror.py), so this run's diagnosis has them."""
    from stallscope.store.mirror import StepMirror, probe_run_of

    probe_run = probe_run_of(pid, started)
    if probe_run is None:
        return None
    session.meta["probe_run"] = str(probe_run)
    if not args.quiet:
        err_console.print(
            f"stallscope: pid {pid} has the probe, reporting to "
            f"{safe(str(probe_run))}: its steps are joined into this run",
            soft_wrap=True,
            highlight=False,
        )
    mirror = StepMirror(probe_run / "run.db", session.store.path)
    mirror.copy()
    return mirror


def _stacks(
    args: argparse.Namespace, session: Session, attach: list[int] | None = None
) -> dict[str, str]:
    """Sample the trainer's stacks into the run: from inside a launched command (the
    environment it needs is returned), or with py-spy from outside for ``attach``. A sampler
    that cannot work is one line; the run goes on from system metrics."""
    from stallscope.sources import make_source
    from stallscope.sources.stacks import inproc, pyspy

    rate = args.stack_rate or (pyspy.DEFAULT_RATE_HZ if attach else inproc.DEFAULT_RATE_HZ)
    reason = session.add_source(
        make_source("stacks", run_dir=session.run_dir, attach=attach or (), stack_rate_hz=rate)
    )
    if reason is not None:
        if not args.quiet:
            err_console.print(
                f"stallscope: no stack sampling: {safe(reason)}; the diagnosis "
                "goes on from system metrics",
                soft_wrap=True,
                highlight=False,
            )
        return {}
    session.meta["stacks"] = {"sampler": "py-spy" if attach else "inproc", "rate_hz": rate}
    if attach:
        return {}
    inject = str(Path(inproc.__file__).parents[2] / "inject")
    path = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": inject + (os.pathsep + path if path else ""),
        "STALLSCOPE_STACKS_HZ": f"{rate:g}",
    }


def run(args: argparse.Namespace) -> int:
    rules = load_rules(args.alerts) if args.alerts else parse_rules({}, "defaults")
    alert_sink = AlertSink(rules)
    interval, warmup = (
        (args.interval, None) if args.interval is not None else (DEFAULT_INTERVAL_S, DEFAULT_WARMUP)
    )
    if args.pid is not None:
        return attach(args, alert_sink, interval, warmup)
    cmd = _resolve(list(args.cmd))
    session = Session.create(
        args.out or default_out(),
        run_label(cmd),
        cmd,
        interval=interval,
        warmup=warmup,
        data=args.data,
        keep_full_s=args.keep_full,
        sinks=[alert_sink],
        monitor_pid=os.getpid(),
    )
    alert_sink.attach_run(session.run_dir)
    env = dict(os.environ, STALLSCOPE_RUN_DIR=str(session.run_dir.resolve()))
    if not args.no_stacks:
        env.update(_stacks(args, session))
    received: list[int] = []
    started_child: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if not started_child:
            return  # the child is being started: sent right after it exists
        # Ctrl-C at a terminal already reached the child (same foreground process group):
        # sending it again would interrupt the child's own clean-up.
        if signum == signal.SIGINT and _terminal_delivered():
            return
        _send(started_child[0], signum)

    # handlers go in before the child starts, so a signal that arrives while it starts is
    # forwarded too instead of killing us and orphaning the child
    old = {s: signal.signal(s, forward) for s in _FORWARD}
    try:
        try:
            child = subprocess.Popen(cmd, env=env)
        except OSError as exc:
            session.discard()
            raise UsageError(f"cannot start {cmd[0]}: {exc.strerror or exc}") from exc
        early = list(received)
        started_child.append(child)
        for signum in early:
            _send(child, signum)
        try:
            session.watch(child.pid)
        except (StallscopeError, OSError, sqlite3.Error) as exc:
            # monitoring broke, training must not: keep waiting for the child
            err_console.print(f"stallscope: monitoring stopped: {safe(str(exc))}", soft_wrap=True)
        code = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    _finish(session, code, signals_forwarded=[signal.Signals(s).name for s in received])
    _print_end(args, session.run_dir)
    return code if code >= 0 else 128 - code


def _finish(session: Session, code: int | None, **extra: Any) -> None:
    """Close the run's record; whatever goes wrong there (a bug included) is one line, and the
    trainer's exit code still passes through."""
    try:
        session.finish(code, **extra)
    except Exception as exc:
        err_console.print(
            f"stallscope: the run's record could not be finished: "
            f"{safe(type(exc).__name__)}: {safe(str(exc))}",
            soft_wrap=True,
            highlight=False,
        )


#: launchers whose own name says nothing of the training they start
_LAUNCHERS = re.compile(
    r"^(python[0-9.]*|pypy[0-9.]*|torchrun|accelerate|deepspeed|"
    r"lightning|uv|poetry|conda|env|sh|bash|mpirun|srun)$"
)


def run_label(cmd: list[str]) -> str:
    """A run's name from its command: the script's (``train_cpu`` for ``python
    train_cpu.py``, ``torchrun --nproc-per-node 2 train.py``), the module's for ``python -m
    pkg.train``, else the program's own name, as the probe names its runs."""
    args = list(cmd)
    launched = False  # past a launcher: its flags and subcommand come next
    while args:
        head = args[0]
        if _LAUNCHERS.match(Path(head).name):
            args, launched = args[1:], True
        elif launched and head in ("run", "launch", "exec"):  # uv run, accelerate launch
            args = args[1:]
        elif launched and head.startswith("-"):
            args = args[1:]
            if head == "-m" and args:
                return args[0].rsplit(".", 1)[-1] or "run"
            if head == "-c":
                return Path(cmd[0]).name
            if (
                head.startswith("--")
                and "=" not in head
                and args
                and not args[0].startswith("-")
                and not args[0].endswith(".py")
            ):
                args = args[1:]  # the flag's value (--nproc-per-node 2)
        else:
            break
    if args:
        name = Path(args[0]).name
        return Path(name).stem if name.endswith(".py") else name
    return Path(cmd[0]).name


def _print_end(args: argparse.Namespace, run_dir: Path) -> None:
    """The summary, the diagnosis, the run directory and the next commands."""
    from stallscope.cli.runs import remember_verdict, stored_verdict

    try:
        if args.quiet:  # nothing printed, but `stallscope runs` still has the verdict
            stored_verdict(run_dir, {})
        else:
            from stallscope.cli.show import print_run

            verdict = print_run(run_dir, console=err_console, with_diagnosis=True)
            if verdict:  # for `stallscope runs`, without diagnosing every run again
                remember_verdict(run_dir, verdict)
    except Exception as exc:
        # the trainer's exit code passes through whatever happened to the record of it
        err_console.print(
            f"stallscope: cannot summarise the run: {safe(str(exc))}",
            soft_wrap=True,
            highlight=False,
        )
    # soft_wrap: scripts parse this line; it must not be folded at the terminal width
    err_console.print(f"run directory: [bold]{safe(str(run_dir))}[/]", soft_wrap=True)
    if not args.quiet:
        me, where = self_command(), shlex.quote(str(run_dir))
        err_console.print(
            f"next: {safe(me)} report {safe(where)}", style="dim", soft_wrap=True, highlight=False
        )
        err_console.print(
            f"      {safe(me)} diagnose {safe(where)} --json",
            style="dim",
            soft_wrap=True,
            highlight=False,
        )


def self_command() -> str:
    """How to run this stallscope again, as typed into a shell here: ``stallscope`` when that
    name on the PATH is this one, else the path it was started by (``.venv/bin/stallscope``
    after ``scripts/setup.sh`` without an activated environment), else ``python -m``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 and Path(argv0).name == "stallscope":
        found = shutil.which("stallscope")
        if found and Path(found).resolve() == Path(argv0).resolve():
            return "stallscope"
        return shlex.quote(argv0)
    return f"{shlex.quote(sys.executable)} -m stallscope"


def _send(child: subprocess.Popen[bytes], signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass  # it already exited; its exit code is what we return


def _terminal_delivered() -> bool:
    """True when our process group is the terminal's foreground group (Ctrl-C went to all)."""
    try:
        fd = sys.stdin.fileno()
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError):
        return False
