"""``stallscope runs``: list stored runs."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from stallscope.cli._common import out_console, safe
from stallscope.errors import RunNotFound, UsageError
from stallscope.store import DEFAULT_OUT, list_runs, read_meta


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list stored runs")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"where runs are (default ./{DEFAULT_OUT})")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _alive(pid: object) -> bool:
    """Whether the stallscope process that wrote a run is still there (None: unknown, an older
    run or a standalone probe: taken as running)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run(args: argparse.Namespace) -> int:
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is not a directory")
    rows: list[dict[str, Any]] = []
    for d in list_runs(args.out):
        try:
            meta = read_meta(d)
        except RunNotFound as exc:
            rows.append({"run": d.name, "path": str(d), "error": str(exc)})
            continue
        end = meta.get("end")
        start = meta.get("start") or 0
        state = "finished" if end is not None else (
            "running" if _alive(meta.get("monitor_pid")) else "interrupted")
        rows.append({
            "run": d.name, "path": str(d), "command": meta.get("command"),
            "start": start, "duration_s": round((end or time.time()) - start, 1),
            "exit_code": meta.get("exit_code"), "running": state == "running", "state": state,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        out_console.print(f"no runs in {args.out}/ (start one with `stallscope run -- CMD`)")
        return 0
    t = Table(show_edge=False)
    for col in ("run", "started", "duration", "exit", "command"):
        t.add_column(col)
    for r in rows:
        if "error" in r:
            t.add_row(safe(r["run"]), "-", "-", "-", f"[red]{safe(r['error'])}[/]")
            continue
        t.add_row(safe(r["run"]), time.strftime("%Y-%m-%d %H:%M", time.localtime(r["start"])),
                  f"{r['duration_s']:.0f} s",
                  str(r["exit_code"]) if r["state"] == "finished" else r["state"],
                  safe(" ".join(r["command"] or [])[:60]))
    out_console.print(t)
    return 0
