"""``stallscope runs``: list stored runs."""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from stallscope.analysis.facts.build import exit_status, run_duration
from stallscope.cli._common import out_console, safe
from stallscope.errors import RunNotFound, StallscopeError, UsageError
from stallscope.sources.owner import describe
from stallscope.store import DEFAULT_OUT, RunStore, read_meta
from stallscope.store.rundir import _root, known_runs, run_state
from stallscope.textsafe import plain


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list stored runs")
    p.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"where runs are (default $STALLSCOPE_OUT, else ./{DEFAULT_OUT}); runs "
        "started elsewhere are listed too, from the per-user run index",
    )
    p.add_argument(
        "--here",
        action="store_true",
        help="only the runs in --out, not those the run index knows elsewhere",
    )
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
        return time.strftime("%m-%d %H:%M", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return "?"


def owner_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The owner a run recorded (``meta.json`` ``owner``: pod or Slurm job), if any."""
    owner = meta.get("owner")
    return (
        {str(k): v for k, v in owner.items() if isinstance(v, (str, int, list))}
        if isinstance(owner, dict) and owner
        else None
    )


def stored_verdict(run_dir: Path, meta: dict[str, Any]) -> str | None:
    """The run's verdict from meta.json; for a run that has none (``run --quiet``, a standalone
    probe's run, an older run), the diagnosis's, written back so that it is made once (best
    effort: a run folder that cannot be written is diagnosed again next time)."""
    v = meta.get("verdict")
    if isinstance(v, str):
        return v
    try:
        from stallscope.analysis.diagnose import diagnose_run

        v = diagnose_run(run_dir)["verdict"]
    except Exception:  # an unreadable run has no verdict; `runs` lists it all the same
        return None
    remember_verdict(run_dir, v)
    return v


def remember_verdict(run_dir: Path, verdict: str) -> None:
    """Keep the verdict in meta.json for ``runs`` (best effort)."""
    from stallscope.store.rundir import write_meta

    try:
        write_meta(run_dir, {**read_meta(run_dir), "verdict": verdict})
    except (OSError, RunNotFound):
        pass


def run(args: argparse.Namespace) -> int:
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is not a directory")
    rows = _rows(args)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        out_console.print(f"no runs in {args.out}/ (start one with `stallscope run -- CMD`)")
        return 0
    here = _root(args.out).resolve()
    if not out_console.is_terminal:  # a pipe or a file: whole fields, for grep and awk
        _print_lines(rows, here)
        return 0
    out_console.print(_table(rows, here))
    return 0


def _rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """A row for each run (``--here``: in the folder, else every run known), what ``--json``
    prints; a run whose meta.json cannot be read has its error instead."""
    rows: list[dict[str, Any]] = []
    from stallscope.store.rundir import list_runs

    for d in list_runs(_root(args.out)) if args.here else known_runs(args.out):
        try:
            meta = read_meta(d)
        except RunNotFound as exc:
            rows.append({"run": d.name, "path": str(d), "error": str(exc)})
            continue
        start = meta.get("start") or 0
        state = run_state(meta)  # the same answer as `show`
        last = _last_sample(d) if state == "interrupted" else None
        rows.append(
            {
                "run": d.name,
                "path": str(d),
                "command": meta.get("command"),
                "start": start,
                "duration_s": run_duration(meta, last),
                "exit_code": exit_status(meta)[0],
                "running": state == "running",
                "state": state,
                "owner": owner_of(meta),
                # what the diagnosis said: stored by `run` at its end, else diagnosed now (a
                # `run --quiet` run, a standalone probe's run) and kept for next time
                "verdict": stored_verdict(d, meta) if state != "running" else None,
            }
        )
    return rows


def _table(rows: list[dict[str, Any]], here: Path) -> Table:
    """The runs as a table for the terminal: the verdict and owner columns where a run has
    one, the folder where a run is elsewhere and the width allows."""
    # the folder column only where it fits (`runs --json` always has each run's path)
    elsewhere = out_console.width >= 110 and any(
        Path(r["path"]).resolve().parent != here for r in rows
    )
    owned = any(r.get("owner") for r in rows)  # a shared node: whose run each one is
    t = Table(show_edge=False)
    # run ids are what users copy into the next command: never folded or cut; the command
    # and the folder give way instead
    run_w = max(len(r["run"]) for r in rows)
    t.add_column("run", no_wrap=True, min_width=run_w)
    t.add_column("started", no_wrap=True, min_width=11)
    t.add_column("duration", no_wrap=True, justify="right", min_width=8)
    t.add_column("exit", no_wrap=True, min_width=11)
    verdicts = any(r.get("verdict") for r in rows)
    if verdicts:
        t.add_column("verdict", no_wrap=True, overflow="ellipsis", max_width=18)
    own_w = max((len(describe(r.get("owner"))) for r in rows), default=0) if owned else 0
    if owned:
        t.add_column(
            "owner",
            no_wrap=True,
            overflow="ellipsis",
            min_width=min(own_w, 40),
            max_width=min(own_w, 40),
        )
    rest = max(
        12,
        out_console.width
        - run_w
        - 11
        - 8
        - 11
        - min(own_w, 40)
        - 3 * (5 if elsewhere else 4)
        - (3 if owned else 0)
        - (21 if verdicts else 0),
    )
    cmd_w = rest * 2 // 3 if elsewhere else rest
    t.add_column("command", no_wrap=True, overflow="ellipsis", max_width=cmd_w)
    if elsewhere:
        t.add_column("in", no_wrap=True, overflow="ellipsis", max_width=rest - cmd_w)
    for r in rows:
        t.add_row(*_table_row(r, here, elsewhere=elsewhere, verdicts=verdicts, owned=owned))
    return t


def _table_row(
    r: dict[str, Any], here: Path, *, elsewhere: bool, verdicts: bool, owned: bool
) -> list[str]:
    """One run's cells, its error in place of the command when it has one."""
    parent = Path(r["path"]).resolve().parent
    where = [safe(str(parent)) if parent != here else "."] if elsewhere else []
    if "error" in r:
        return [
            safe(r["run"]),
            "-",
            "-",
            "-",
            *(["-"] if verdicts else []),
            *(["-"] if owned else []),
            f"[red]{safe(r['error'])}[/]",
            *where,
        ]
    return [
        safe(r["run"]),
        _when(r["start"]),
        "-" if r["duration_s"] is None else f"{r['duration_s']:.0f} s",
        (str(r["exit_code"]) if r["exit_code"] is not None else "-")
        if r["state"] == "finished"
        else r["state"],
        *([safe(r.get("verdict") or "-")] if verdicts else []),
        *([safe(describe(r.get("owner")) or "-")] if owned else []),
        safe(" ".join(r["command"] or [])[:60]),
        *where,
    ]


def _print_lines(rows: list[dict[str, Any]], here: Path) -> None:
    """One line a run, tab-separated, nothing cut or folded (what a pipe or a file gets): run,
    started, duration, exit, verdict, owner, command, folder."""
    print("\t".join(("run", "started", "duration", "exit", "verdict", "owner", "command", "in")))
    for r in rows:
        parent = Path(r["path"]).resolve().parent
        where = "." if parent == here else str(parent)
        if "error" in r:
            fields = [r["run"], "-", "-", "-", "-", "-", r["error"], where]
        else:
            fields = [
                r["run"],
                _when(r["start"]),
                "-" if r["duration_s"] is None else f"{r['duration_s']:.0f} s",
                (str(r["exit_code"]) if r["exit_code"] is not None else "-")
                if r["state"] == "finished"
                else r["state"],
                r.get("verdict") or "-",
                describe(r.get("owner")) or "-",
                " ".join(r["command"] or []),
                where,
            ]
        print("\t".join(plain(f, None) for f in fields))  # a tab in a field shows as \t
