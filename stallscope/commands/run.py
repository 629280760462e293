"""``stallscope run [--interval S] [--data PATH] [--out DIR] -- CMD ...``

Runs CMD as a child under monitoring, forwards signals, exits with its exit code, and prints
a summary, the diagnosis and the run directory at the end."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from stallscope.collector import Collector
from stallscope.commands._common import err_console, interval_type, keep_full_type, safe
from stallscope.errors import StallscopeError, UsageError
from stallscope.sources import SOURCE_NAMES, open_sources
from stallscope.store import DEFAULT_OUT, RunStore, base_meta, new_run_dir, write_meta

_FORWARD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
            signal.SIGUSR2)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a command under monitoring",
                       description="Run CMD as a child, sample the machine while it runs, and "
                       "print a summary and diagnosis at the end.")
    p.add_argument("--interval", type=interval_type, default=5.0,
                   help="seconds between samples (default 5; 1 for debugging)")
    p.add_argument("--data", metavar="PATH",
                   help="where the dataset lives; its block device is watched closely")
    p.add_argument("--out", metavar="DIR", default=DEFAULT_OUT,
                   help=f"directory for run directories (default ./{DEFAULT_OUT})")
    p.add_argument("--keep-full", type=keep_full_type, default=3600.0, metavar="S",
                   help="keep full resolution for the last S seconds; older samples are "
                   "downsampled to 1-minute min/mean/max (default 3600)")
    p.add_argument("--quiet", action="store_true", help="print only the run directory at the end")
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


def data_devices(path: str | None) -> tuple[list[str], str | None]:
    """Block devices under the dataset path, and a note when they cannot be found."""
    if path is None:
        return [], None
    if not os.path.exists(path):
        raise UsageError(f"--data {path}: no such file or directory")
    try:
        from stallscope.sources.disk import devices_for_path
    except ImportError:
        return [], "disk source not available"
    try:
        devs = devices_for_path(path)
    except (OSError, ValueError, StallscopeError) as exc:  # e.g. mountinfo unreadable: go on
        return [], f"cannot map {path} to a block device: {exc}"
    if not devs:
        return [], f"{path} is not on a local block device (tmpfs or network filesystem?)"
    return list(devs), None


def run(args: argparse.Namespace) -> int:
    cmd = _resolve(list(args.cmd))
    devices, dev_note = data_devices(args.data)
    run_dir = new_run_dir(args.out, Path(cmd[0]).name)
    store = RunStore(run_dir / "run.db")
    started = time.time()
    meta = base_meta(cmd, start=started, interval_s=args.interval, data=args.data,
                     data_devices=devices, monitor_pid=os.getpid())
    write_meta(run_dir, meta)

    # open the machine-wide sources before the child starts: NVML init takes a moment and the
    # first sample should see the child from its start
    sources, unavailable = open_sources(SOURCE_NAMES, disk_devices=None)
    env = dict(os.environ, STALLSCOPE_RUN_DIR=str(run_dir.resolve()))
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
    collector: Collector | None = None
    health: list[dict[str, Any]] = []
    health_thread = None
    try:
        try:
            child = subprocess.Popen(cmd, env=env)
        except OSError as exc:
            store.close()
            for src in sources:
                src.close()
            shutil.rmtree(run_dir, ignore_errors=True)
            raise UsageError(f"cannot start {cmd[0]}: {exc.strerror or exc}") from exc
        early = list(received)
        started_child.append(child)
        for signum in early:
            _send(child, signum)
        try:
            procs, procs_unavail = open_sources(("procs",), root_pid=child.pid)
            unavailable.update(procs_unavail)
            if dev_note:
                unavailable["data"] = dev_note
            meta["unavailable"] = unavailable
            meta["pid"] = child.pid
            write_meta(run_dir, meta)
            if devices:  # the dataset's drive: SMART once per run, off the main path
                health_thread = threading.Thread(target=_check_health, args=(devices, health),
                                                 name="stallscope-smart", daemon=True)
                health_thread.start()
            collector = Collector(store, sources + procs, interval=args.interval,
                                  unavailable=unavailable, keep_full_s=args.keep_full)
            collector.start()
        except (StallscopeError, OSError, sqlite3.Error) as exc:
            # monitoring broke, training must not: keep waiting for the child
            err_console.print(f"stallscope: monitoring stopped: {safe(str(exc))}",
                              soft_wrap=True)
        code = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if collector is not None:
            collector.stop()
    meta["end"] = time.time()
    meta["exit_code"] = code
    meta["signals_forwarded"] = [signal.Signals(s).name for s in received]
    meta["samples"] = collector.samples if collector is not None else 0
    if health_thread is not None:
        health_thread.join(timeout=30)
        meta["disk_health"] = health
    try:
        store.finalize_roles()
    except sqlite3.Error as exc:
        err_console.print(f"stallscope: could not record process roles: {exc}", soft_wrap=True)
    probes = store.probes()
    if probes:  # the probe's view of the DataLoader, per rank (DESIGN: meta holds loader config)
        meta["loader_config"] = {str(p["rank"]): p["config"] for p in probes}
    write_meta(run_dir, meta)
    store.finish()
    store.close()

    if not args.quiet:
        from stallscope.commands.show import print_run

        print_run(run_dir, console=err_console, with_diagnosis=True)
    # soft_wrap: scripts parse this line; it must not be folded at the terminal width
    err_console.print(f"run directory: [bold]{safe(str(run_dir))}[/]", soft_wrap=True)
    if not args.quiet:
        err_console.print(f"next: stallscope report {safe(str(run_dir))}  ·  "
                          f"stallscope diagnose {safe(str(run_dir))} --json", style="dim",
                          soft_wrap=True)
    return code if code >= 0 else 128 - code


def _send(child: subprocess.Popen[bytes], signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass  # it already exited; its exit code is what we return


def _check_health(devices: list[str], out: list[dict[str, Any]]) -> None:
    from stallscope.health_state import check_drives

    drives, _notes = check_drives(devices)
    out.extend(d.to_json() for d in drives)


def _terminal_delivered() -> bool:
    """True when our process group is the terminal's foreground group (Ctrl-C went to all)."""
    try:
        fd = sys.stdin.fileno()
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError):
        return False
