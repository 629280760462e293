"""``stallscope top [--pid PID] [--interval S] [--count N]``: the whole chain, live.

GPUs, disks (iostat -x fields), host CPU/memory/swap/shm/PSI and, with ``--pid``, the trainer's
process tree, refreshed every interval. Keys: q quit, c/m/r sort processes by CPU / memory /
read rate, p pause. When stdout is not a terminal: one plain frame per interval."""

from __future__ import annotations

import argparse

from stallscope.cli._common import bounded, interval_type, watchable_process


def _pid(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pid must be a process id, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"--pid must be a positive process id, got {text!r}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "top",
        help="live view of GPUs, disks, host and a trainer's processes",
        description="A live terminal view of the whole chain: GPUs, disks "
        "(iostat -x fields), host CPU, memory, swap, /dev/shm, PSI and, with "
        "--pid, the trainer and its workers. Keys: q quit, c/m/r sort processes "
        "by CPU/memory/read rate, p pause. When stdout is not a terminal, one "
        "plain frame is printed per interval.",
    )
    p.add_argument(
        "--pid",
        type=_pid,
        default=None,
        help="also show this process and its descendants (the trainer and its DataLoader workers)",
    )
    p.add_argument(
        "--interval", type=interval_type, default=1.0, help="seconds between refreshes (default 1)"
    )
    p.add_argument(
        "--count",
        type=bounded("--count", int, 1, 10**9),
        default=None,
        metavar="N",
        help="exit after N frames (default: until q or Ctrl-C)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--agent",
        metavar="URL",
        help="take GPU, disk and host readings from the stallscope agent at URL "
        "(e.g. http://127.0.0.1:10127); default: the local agent when one answers "
        "there and samples at least as often as --interval",
    )
    src.add_argument(
        "--no-agent",
        action="store_true",
        help="sample the machine directly even when an agent runs",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stallscope.errors import UsageError
    from stallscope.live.agent_feed import agent_interval, default_agent
    from stallscope.live.app import run_top

    agent: str | None = None
    if args.agent:
        if agent_interval(args.agent) is None:
            raise UsageError(
                f"--agent {args.agent}: no stallscope agent answers there (GET /api/v1/health)"
            )
        agent = args.agent
    elif not args.no_agent:
        iv = agent_interval(default_agent())
        if iv is not None and iv <= args.interval:
            agent = default_agent()
    if args.pid is not None:
        watchable_process(args.pid)  # the same message and exit code as run --pid
    return run_top(
        interval=args.interval,
        pid=args.pid,
        count=None if args.count is None else int(args.count),
        agent=agent,
    )
