"""``stallscope runs``: list stored runs."""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from stallscope.cli._common import out_console, safe
from stallscope.errors import RunNotFound, StallscopeError, UsageError
from stallscope.store import DEFAULT_OUT, RunStore, list_runs, read_meta
from stallscope.store.rundir import run_state


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list stored runs")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"where runs are (default ./{DEFAULT_OUT})")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _last_sample(run_dir: Path) -> float | None:
    """Time of an interrupted run's last sample (None when run.db cannot tell)."""
    try:
        store = RunStore(run_dir / "run.db", readonly=True)
    except StallscopeError:
        return None
    try:
        span = store.time_range()
    except sqlite3.Error:
        return None
    finally:
        store.close()
    return span[1] if span else None


def _when(ts: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return "?"


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
        start = meta.get("start") or 0
        state = run_state(meta)  # the same answer as `show`
        end = (meta.get("end") if state == "finished" else time.time() if state == "running"
               else _last_sample(d))
        rows.append({
            "run": d.name, "path": str(d), "command": meta.get("command"),
            "start": start,
            "duration_s": None if end is None else round(max(0.0, end - start), 1),
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
        t.add_row(safe(r["run"]), _when(r["start"]),
                  "-" if r["duration_s"] is None else f"{r['duration_s']:.0f} s",
                  str(r["exit_code"]) if r["state"] == "finished" else r["state"],
                  safe(" ".join(r["command"] or [])[:60]))
    out_console.print(t)
    return 0
