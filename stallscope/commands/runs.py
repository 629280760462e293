"""``stallscope runs``: list stored runs."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.table import Table

from stallscope.commands._common import out_console, safe
from stallscope.errors import RunNotFound
from stallscope.store import DEFAULT_OUT, list_runs, read_meta


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list stored runs")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"where runs are (default ./{DEFAULT_OUT})")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for d in list_runs(args.out):
        try:
            meta = read_meta(d)
        except RunNotFound as exc:
            rows.append({"run": d.name, "path": str(d), "error": str(exc)})
            continue
        end = meta.get("end")
        start = meta.get("start") or 0
        rows.append({
            "run": d.name, "path": str(d), "command": meta.get("command"),
            "start": start, "duration_s": round((end or time.time()) - start, 1),
            "exit_code": meta.get("exit_code"), "running": end is None,
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
                  f"{r['duration_s']:.0f} s", "running" if r["running"] else str(r["exit_code"]),
                  safe(" ".join(r["command"] or [])[:60]))
    out_console.print(t)
    return 0
