"""``stallscope disk [PATH|DEVICE] [--bench] [--engine builtin|fio] [--json]`` and
``stallscope disk --smartctl-json FILE ... [--json]``: SMART health with growth since earlier
checks, and a read benchmark of the filesystem holding PATH.

Classic equivalents: ``smartctl -a DEVICE`` (health), ``hdparm -Tt`` and ``fio`` (bench).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from stallscope.cli._common import bounded, err_console, out_console, safe, size_type
from stallscope.errors import UsageError
from stallscope.sources.disk import describe_path, device_info
from stallscope.sources.health import (
    DriveHealth,
    explain_series,
    parse_smartctl_text,
    validate_device_type,
)
from stallscope.tools.diskbench import (
    HEALTHY,
    BenchPlan,
    BenchReport,
    BenchResult,
    classify,
    compare,
    judge,
    run_builtin,
    run_fio,
)
from stallscope.tools.health_state import check_drives

#: /sys/block names that are never physical drives
_SKIP = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")
_COLOR = {"ok": "green", "ageing": "yellow", "failing": "bold red", "unknown": "dim"}


def _dtype(text: str) -> str:
    try:
        return validate_device_type(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "disk", help="SMART health (+ growth since last check) and read benchmark",
        description="Health of the drives under PATH (or of DEVICE, or of every drive), with "
        "the growth of failure-predicting SMART counters since earlier checks; --bench "
        "measures what the filesystem holding PATH delivers to a data loader.")
    p.add_argument("target", nargs="?", metavar="PATH|DEVICE",
                   help="a path (its drives; the bench runs on its filesystem) or a device "
                   "(sda, /dev/nvme0n1); default: every drive, and '.' for --bench")
    p.add_argument("--bench", action="store_true",
                   help="read benchmark: page cache vs cold sequential, 4 KiB random, "
                   "small files (writes temporary files next to PATH)")
    p.add_argument("--engine", choices=("builtin", "fio"), default="builtin",
                   help="fio: also run the same plan through fio and show both side by side")
    p.add_argument("--size", type=size_type, default=BenchPlan.size_bytes, metavar="SIZE",
                   help="bench file size (default 256M; bigger than the drive's cache "
                   "gives truer cold figures)")
    p.add_argument("--seconds", type=bounded("--seconds", float, 0.05, 600),
                   default=BenchPlan.seconds,
                   help="duration of each timed bench phase (default 2)")
    p.add_argument("--files", type=bounded("--files", int, 1, 1_000_000),
                   default=BenchPlan.small_files,
                   help="number of 100 KiB files in the small-file phase (default 1000)")
    p.add_argument("--smartctl-json", nargs="+", metavar="FILE", default=None,
                   help="explain saved `smartctl --json` outputs instead of reading drives; "
                   "two of one drive are two checks: their growth is reported")
    p.add_argument("--device-type", type=_dtype, metavar="TYPE",
                   help="smartctl -d TYPE (sat, nvme, megaraid,N ...)")
    p.add_argument("--sudo", action="store_true",
                   help="run smartctl through `sudo -n` (see docs/disk-health.md for the "
                   "one-line sudoers grant)")
    p.add_argument("--no-state", action="store_true",
                   help="do not read or update the state file of earlier checks")
    p.add_argument("--json", action="store_true", help="print JSON (keys: docs/architecture.md)")
    p.set_defaults(func=run)


# --- health ---------------------------------------------------------------------------------

def _all_drives(sys_root: str = "/sys") -> list[str]:
    try:
        names = sorted(os.listdir(os.path.join(sys_root, "block")))
    except OSError:
        return []
    return [n for n in names if not n.startswith(_SKIP)]


def _resolve(target: str | None) -> tuple[str | None, list[str], str]:
    """-> (path for the bench or None, device names, why no devices)."""
    if target is None:
        return ".", _all_drives(), "no drives under /sys/block"
    if os.path.exists(target):
        st = os.stat(target)
        if stat.S_ISBLK(st.st_mode):
            return None, [os.path.basename(os.path.realpath(target))], ""
        pd = describe_path(target)
        return target, list(pd.devices), pd.reason
    name = target.removeprefix("/dev/")
    if "/" not in name and os.path.exists(os.path.join("/sys/class/block", name)):
        return None, [name], ""
    raise UsageError(f"no such file, directory or device: {target}")


def _health(devices: Sequence[str], args: argparse.Namespace,
            notes: list[str]) -> list[DriveHealth]:
    smartctl: tuple[str, ...] = ("sudo", "-n", "smartctl") if args.sudo else ("smartctl",)
    drives, more = check_drives(devices, device_type=args.device_type, smartctl=smartctl,
                                use_state=not args.no_state)
    notes.extend(more)
    return drives


def _from_files(files: Sequence[str]) -> list[DriveHealth]:
    docs = []
    for f in files:
        try:
            data = Path(f).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {f}: {exc.strerror}") from None
        docs.append(parse_smartctl_text(data, source=f))
    return explain_series(docs)


# --- bench ----------------------------------------------------------------------------------

class _Bar:
    """rich progress bar on stderr, one task per phase."""

    def __init__(self, enabled: bool) -> None:
        # no refresh thread: it would compete for the GIL with the timed reads and show up
        # as latency; the engines call back every ~0.1 s and the bar is redrawn then
        self.progress = Progress(TextColumn("{task.description:<28}"), BarColumn(),
                                 TimeElapsedColumn(), console=err_console, transient=True,
                                 disable=not enabled, auto_refresh=False)
        self.tasks: dict[str, TaskID] = {}
        self.prefix = ""

    def __call__(self, phase: str, frac: float) -> None:
        key = f"{self.prefix}{phase}"
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(key, total=1.0)
        self.progress.update(self.tasks[key], completed=frac, refresh=True)


def _bench(path: str, devices: list[str], args: argparse.Namespace) -> BenchReport:
    plan = BenchPlan(size_bytes=args.size, seconds=args.seconds, small_files=args.files)
    pd = describe_path(path)
    infos = []
    for d in devices:
        try:
            infos.append(device_info(d))
        except UsageError:
            continue
    cls = classify(pd.fstype, infos)
    directory = path if os.path.isdir(path) else (os.path.dirname(os.path.abspath(path)))
    report = BenchReport(path=os.path.abspath(path), mount_point=pd.mount_point,
                         fstype=pd.fstype, devices=list(devices), device_class=cls, plan=plan)
    bar = _Bar(enabled=err_console.is_terminal)
    with bar.progress:
        bar.prefix = "builtin "
        report.results.append(run_builtin(directory, plan, bar))
        if args.engine == "fio":
            bar.prefix = ""
            report.results.append(run_fio(directory, plan, bar))
    report.flags = judge(report.results[0], cls)
    return report


# --- output ---------------------------------------------------------------------------------

def _print_drives(drives: Sequence[DriveHealth], notes: Sequence[str]) -> None:
    for d in drives:
        color = _COLOR.get(d.verdict, "")
        title = " ".join(x for x in (d.device or d.source or "drive", d.model, d.protocol) if x)
        out_console.print(f"[bold]{safe(title)}[/bold]: [{color}]{d.verdict}[/{color}]")
        if d.serial:
            out_console.print(f"  serial {safe(d.serial)}")
        for r in d.reasons:
            out_console.print(f"  - {safe(r)}")
        for k, g in d.growth.items():
            out_console.print(f"  [yellow]growth[/yellow] {safe(k)} {g.start} → {g.end} "
                              f"since {safe(g.since)}")
        for n in d.notes:
            out_console.print(f"  [dim]note: {safe(n)}[/dim]")
        if d.fixes:
            out_console.print("  fix:")
            for f in d.fixes:
                out_console.print(f"    * {safe(f)}")
    for n in notes:
        out_console.print(f"[dim]note: {safe(n)}[/dim]")


def _print_bench(report: BenchReport) -> None:
    exp = HEALTHY.get(report.device_class)
    out_console.print(f"\n[bold]bench[/bold] {safe(report.path)} on "
                      f"{safe(report.mount_point)} ({safe(report.fstype)}, "
                      f"{', '.join(report.devices) or 'no block device'}): "
                      f"{exp.label if exp else 'device class unknown'}")
    t = Table(show_edge=False)
    t.add_column("figure (queue depth 1)")
    for r in report.results:
        t.add_column(r.engine, justify="right")
    if len(report.results) == 2:
        t.add_column("diff", justify="right")
    if exp:
        t.add_column(f"healthy {exp.label}", justify="right")
    rows: list[tuple[str, str, Any]] = [
        ("page cache seq read, MB/s", "seq_cached_mb_s", None),
        ("cold seq read, MB/s", "seq_cold_mb_s", exp.seq_cold_mb_s if exp else None),
        ("4 KiB random read, IOPS", "rand_iops", exp.rand_iops if exp else None),
        ("4 KiB latency p50, µs", "rand_lat_p50_us", None),
        ("4 KiB latency p99, µs", "rand_lat_p99_us", None),
        ("100 KiB files, files/s", "small_files_per_s", exp.small_files_per_s if exp else None),
    ]
    cmp = compare(*report.results) if len(report.results) == 2 else {}

    def value(r: BenchResult, key: str) -> float:
        if key.startswith("rand_lat_"):
            return float(r.rand_lat_us.get(key.removeprefix("rand_lat_").removesuffix("_us"),
                                           float("nan")))
        return float(getattr(r, key))

    for label, key, healthy in rows:
        cells = [label] + [f"{value(r, key):,.1f}" for r in report.results]
        if cmp:
            c = cmp.get(key)
            d = c.get("diff_pct") if c else None
            cells.append(f"{d:+.1f}%" if d is not None else "")
        if exp:
            cells.append(f"{healthy[0]:,.0f}–{healthy[1]:,.0f}" if healthy else "")
        t.add_row(*cells)
    out_console.print(t)
    for r in report.results:
        for n in r.notes:
            out_console.print(f"[dim]note ({r.engine}): {safe(n)}[/dim]")
    if exp and exp.note:
        out_console.print(f"[dim]{safe(exp.note)}[/dim]")
    for f in report.flags:
        out_console.print(f"[bold yellow]! {safe(f)}[/bold yellow]")


def run(args: argparse.Namespace) -> int:
    notes: list[str] = []
    if args.smartctl_json is not None:
        if args.target or args.bench:
            raise UsageError("--smartctl-json explains saved files: give no PATH|DEVICE and "
                             "no --bench with it")
        drives = _from_files(args.smartctl_json)
        report = None
    else:
        path, devices, why = _resolve(args.target)
        if args.bench and path is None:
            raise UsageError("--bench reads files on a filesystem, never a raw device: give a "
                             "PATH on the filesystem to test")
        if not devices and why:
            notes.append(f"no drive to check: {why}")
        drives = _health(devices, args, notes)
        report = _bench(path, devices, args) if args.bench and path is not None else None
    if args.json:
        doc: dict[str, Any] = {"drives": [d.to_json() for d in drives]}
        if report is not None:
            doc["bench"] = report.to_json()
        if notes:
            doc["notes"] = notes
        out_console.file.write(json.dumps(doc, indent=2) + "\n")
        return _exit_status(drives, saved=args.smartctl_json is not None)
    _print_drives(drives, notes)
    if report is not None:
        _print_bench(report)
    return _exit_status(drives, saved=args.smartctl_json is not None)


def _exit_status(drives: Sequence[DriveHealth], *, saved: bool) -> int:
    """1 when a drive is failing (so `stallscope disk || alert` works); 3 when a saved
    smartctl file was not recognised; else 0 (a live drive SMART cannot open is reported, with
    its fix, but is not an error of the check)."""
    if any(d.verdict == "failing" for d in drives):
        return 1
    if saved and any(d.verdict == "unknown" for d in drives):
        return 3
    return 0
