"""CPU per refresh of ``stallscope top`` vs the classic tools, measured in the same run.

    .venv/bin/python benchmarks/bench_top.py [--seconds 10] [--glances-path DIR]

Each live tool runs full-screen in its own private tmux server (80x24, refreshing every 1 s,
watching a 9-process trainer-like tree: a parent with 8 children) and its CPU (utime + stime
from /proc/PID/stat, the whole process) is read after a warm-up and again ``--seconds`` later;
CPU per refresh = that difference / refreshes. ``top`` here includes everything it does per
refresh: sampling GPU/disk/host/procs, drawing, rich's screen update.

Baselines: ``glances -t 1`` (the same kind of full-chain live view; measured only when it can be
imported: ``pip install --target DIR glances`` and pass ``--glances-path DIR``; it is not a
stallscope dependency), and spawning ``iostat -x 1 1`` + ``top -bn1`` once per refresh (what a
shell loop around the classic tools costs: their own CPU plus fork/exec).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK")

TREE = textwrap.dedent("""
    import os, time
    for _ in range(8):
        if os.fork() == 0:
            time.sleep(600); os._exit(0)
    print(os.getpid(), flush=True)
    time.sleep(600)
""")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process so far."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def in_tmux(argv: list[str], env: dict[str, str], seconds: float, warmup: float = 3.0) -> float:
    """CPU seconds per second of ``argv`` running full-screen in an 80x24 tmux."""
    sock = f"bench-top-{uuid.uuid4().hex[:8]}"
    cmd = " ".join(argv) + "; sleep 600"
    subprocess.run(
        [
            "tmux",
            "-L",
            sock,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "b",
            "-x",
            "80",
            "-y",
            "24",
            cmd,
        ],
        env=env,
        check=True,
    )
    try:
        time.sleep(warmup)
        shell = int(
            subprocess.run(
                ["tmux", "-L", sock, "display-message", "-p", "-t", "b", "#{pane_pid}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        kids = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
        pid = int(kids[0])
        c0, t0 = proc_cpu(pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = proc_cpu(pid), time.monotonic()
        return (c1 - c0) / (t1 - t0)
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


def spawn_classic(rounds: int) -> float:
    """CPU seconds (ours + children) per spawn of ``iostat -x 1 1`` + ``top -bn1``."""

    def cpu() -> float:
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    c0 = cpu()
    for _ in range(rounds):
        subprocess.run(["iostat", "-x", "1", "1"], stdout=subprocess.DEVNULL, check=True)
        subprocess.run(
            ["top", "-bn1"],
            stdout=subprocess.DEVNULL,
            check=True,
            env=dict(os.environ, COLUMNS="80", LINES="24"),
        )
    return (cpu() - c0) / rounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="measuring time per tool")
    ap.add_argument(
        "--glances-path",
        default=None,
        help="a directory with glances installed (pip install --target DIR)",
    )
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is needed", file=sys.stderr)
        return 2
    tree = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    assert tree.stdout is not None
    root = int(tree.stdout.readline())
    env = dict(os.environ, PYTHONPATH=str(ROOT), LANG="C.UTF-8", TERM="xterm-256color")
    results: dict[str, float] = {}
    try:
        results["stallscope top --pid (9 procs)"] = in_tmux(
            [sys.executable, "-m", "stallscope", "top", "--pid", str(root), "--interval", "1"],
            env,
            args.seconds,
        )
        results["stallscope top (machine only)"] = in_tmux(
            [sys.executable, "-m", "stallscope", "top", "--interval", "1"], env, args.seconds
        )
        if args.glances_path:
            genv = dict(env, PYTHONPATH=args.glances_path)
            results["glances -t 1"] = in_tmux(
                [sys.executable, "-m", "glances", "-t", "1"], genv, args.seconds, warmup=5.0
            )
        if shutil.which("iostat") and shutil.which("top"):
            results["spawn iostat -x 1 1 + top -bn1"] = spawn_classic(20)
    finally:
        tree.kill()
        tree.wait()
    top = results["stallscope top --pid (9 procs)"]
    print(f"{'tool':38} {'CPU ms/refresh':>15} {'top / tool':>11}")
    for name, v in results.items():
        print(f"{name:38} {v * 1e3:15.2f} {top / v if v else float('nan'):11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
