"""``stallscope snapshot [--interval S] [--every S [--count N]] [--json]``: one sample of every
source over S seconds; with ``--every``, one sample every S seconds (the ``iostat -x 1`` /
``nvidia-smi -l`` habit), as tables or as JSON lines."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from rich.table import Table

from stallscope import units
from stallscope.cli._common import interval_type, number_type, out_console, safe
from stallscope.collect import take_sample
from stallscope.errors import UsageError
from stallscope.sources import SOURCE_NAMES, open_sources, snapshot_doc


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "snapshot",
        help="one sample of every source",
        description="Sample GPU, disk and host over S seconds and print it.",
    )
    p.add_argument(
        "--interval",
        type=interval_type,
        default=1.0,
        help="seconds to measure rates over (default 1)",
    )
    p.add_argument(
        "--every",
        type=_every,
        metavar="S",
        help="repeat: one sample every S seconds until Ctrl-C (JSON lines with --json)",
    )
    p.add_argument("--count", type=_count, metavar="N", help="with --every: stop after N samples")
    p.add_argument("--json", action="store_true", help="print JSON (keys: docs/architecture.md)")
    p.set_defaults(func=run)


def _every(text: str) -> float:
    try:
        return interval_type(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--interval", "--every")) from None


_count = number_type(
    "--count", int, lambda n: 1 <= n <= 10**9, "a whole number", "between 1 and 1000000000"
)


def repeat(every: float, count: int | None, emit: Callable[[dict[str, Any]], None]) -> int:
    """Sample every ``every`` seconds (rates over each interval, from the previous sample:
    the sources stay open) and hand each document to ``emit``; returns samples taken."""
    sources, unavailable = open_sources(SOURCE_NAMES)
    n = 0
    try:
        now = time.time()
        for s in sources:
            s.sample(now)  # prime the counters
        next_t = time.monotonic() + every
        while count is None or n < count:
            time.sleep(max(0.0, next_t - time.monotonic()))
            next_t += every
            now = time.time()
            payloads = {s.name: s.sample(now) for s in sources}
            emit(snapshot_doc(time.time(), every, payloads, unavailable))
            n += 1
    finally:
        for s in sources:
            s.close()
    return n


def snapshot(interval: float) -> dict[str, Any]:
    """One sample of every machine-wide source, in the ``snapshot --json`` shape."""
    sources, unavailable = open_sources(SOURCE_NAMES)
    try:
        payloads = take_sample(sources, interval)
    finally:
        for s in sources:
            s.close()
    return snapshot_doc(time.time(), interval, payloads, unavailable)


_DISK_COLUMNS = (
    ("r_s", "r/s"),
    ("rkb_s", "rkB/s"),
    ("r_await_ms", "r_await"),
    ("w_s", "w/s"),
    ("wkb_s", "wkB/s"),
    ("w_await_ms", "w_await"),
    ("aqu_sz", "aqu-sz"),
    ("util_pct", "%util"),
)


def _num(v: Any) -> str:
    return units.number(v) if isinstance(v, (int, float)) else "-"


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return ",".join(map(str, v)) or "-"
    return units.number(v)


def run(args: argparse.Namespace) -> int:
    if args.count is not None and args.every is None:
        raise UsageError("--count needs --every S")
    if args.every is not None:

        def emit(doc: dict[str, Any]) -> None:
            if args.json:
                print(json.dumps(doc), flush=True)  # one object per line
            else:
                out_console.print(f"[bold]{time.strftime('%H:%M:%S')}[/]", highlight=False)
                render(doc)

        try:
            repeat(args.every, args.count, emit)
        except KeyboardInterrupt:
            return 0
        return 0
    doc = snapshot(args.interval)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    render(doc)
    return 0


def render(doc: dict[str, Any]) -> None:
    """One snapshot document as tables."""
    for g in doc.get("gpu", []):
        t = Table(
            title=f"gpu{g.get('index')} {safe(str(g.get('name')))}",
            title_justify="left",
            show_edge=False,
            show_header=False,
        )
        for k, v in g.items():
            if k not in ("index", "name", "processes"):
                t.add_row(k, safe(_fmt(v)))
        out_console.print(t)
    if doc.get("disk"):
        # the iostat -x columns that matter most, under iostat's own names; --json has all 12
        t = Table(
            title="disk (iostat -x; --json for every field)", title_justify="left", show_edge=False
        )
        t.add_column("device")
        for _key, label in _DISK_COLUMNS:
            t.add_column(label, justify="right")
        for dev, f in doc["disk"].items():
            t.add_row(safe(dev), *(_num(f.get(k)) for k, _ in _DISK_COLUMNS))
        out_console.print(t)
    if doc.get("host"):
        t = Table(title="host", title_justify="left", show_edge=False, show_header=False)
        for k, v in doc["host"].items():
            t.add_row(k, safe(_fmt(v)))
        out_console.print(t)
    for name, reason in doc["unavailable"].items():
        out_console.print(f"[yellow]{name}[/]: {safe(reason)}")
