"""``stallscope disk [PATH|DEVICE] [--bench] [--engine builtin|fio] [--json]`` and
``stallscope disk --smartctl-json FILE ... [--json]``: SMART health with growth since earlier
checks, and a read benchmark of the filesystem holding PATH.

Classic equivalents: ``smartctl -a DEVICE`` (health), ``hdparm -Tt`` and ``fio`` (bench).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
from collections.abc import Sequence
from typing import Any

from rich.padding import Padding
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from stallscope.cli._common import bounded, err_console, out_console, size_type, usage_type
from stallscope.errors import UsageError
from stallscope.sources.blockdev import describe_path, device_info
from stallscope.sources.smart import (
    DriveHealth,
    check_drives,
    explain_series,
    parse_smartctl_text,
    validate_device_type,
)
from stallscope.textsafe import TERMINAL_LIMIT, plain, split_commands
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

#: /sys/block names that are never physical drives
_SKIP = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")
_COLOR = {"ok": "green", "ageing": "yellow", "failing": "bold red", "unknown": "dim"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "disk",
        help="SMART health (+ growth since last check) and read benchmark",
        description="Health of the drives under PATH (or of DEVICE, or of every drive), with "
        "the growth of failure-predicting SMART counters since earlier checks; --bench "
        "measures what the filesystem holding PATH delivers to a data loader.",
    )
    p.add_argument(
        "target",
        nargs="?",
        metavar="PATH|DEVICE",
        help="a path (its drives; the bench runs on its filesystem) or a device "
        "(sda, /dev/nvme0n1); default: every drive, and '.' for --bench",
    )
    p.add_argument(
        "--bench",
        action="store_true",
        help="read benchmark: page cache vs cold sequential, 4 KiB random, "
        "small files (writes temporary files next to PATH)",
    )
    p.add_argument(
        "--engine",
        choices=("builtin", "fio"),
        default="builtin",
        help="fio: also run the same plan through fio and show both side by side",
    )
    p.add_argument(
        "--size",
        type=size_type,
        default=BenchPlan.size_bytes,
        metavar="SIZE",
        help="bench file size (default 256M; bigger than the drive's cache "
        "gives truer cold figures)",
    )
    p.add_argument(
        "--seconds",
        type=bounded("--seconds", float, 0.05, 600),
        default=BenchPlan.seconds,
        help="duration of each timed bench phase (default 2)",
    )
    p.add_argument(
        "--files",
        type=bounded("--files", int, 1, 1_000_000),
        default=BenchPlan.small_files,
        help="number of 100 KiB files in the small-file phase (default 1000)",
    )
    p.add_argument(
        "--smartctl-json",
        nargs="+",
        metavar="FILE",
        default=None,
        help="explain saved `smartctl --json` outputs instead of reading drives; "
        "two of one drive are two checks: their growth is reported",
    )
    p.add_argument(
        "--device-type",
        type=usage_type(validate_device_type),
        metavar="TYPE",
        help="smartctl -d TYPE (sat, nvme, megaraid,N ...)",
    )
    p.add_argument(
        "--sudo",
        action="store_true",
        help="run smartctl through `sudo -n` (see docs/disk-health.md for the "
        "one-line sudoers grant)",
    )
    p.add_argument(
        "--no-state",
        action="store_true",
        help="do not read or update the state file of earlier checks",
    )
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


def _health(
    devices: Sequence[str], args: argparse.Namespace, notes: list[str]
) -> list[DriveHealth]:
    smartctl: tuple[str, ...] = ("sudo", "-n", "smartctl") if args.sudo else ("smartctl",)
    drives, more = check_drives(
        devices, device_type=args.device_type, smartctl=smartctl, use_state=not args.no_state
    )
    notes.extend(more)
    return drives


#: the largest --smartctl-json file read: smartctl's JSON is a few hundred kB at most
MAX_SMARTCTL_JSON = 16 << 20


def read_saved(path: str, limit: int = MAX_SMARTCTL_JSON) -> bytes:
    """The bytes of a saved smartctl output: a regular file of at most ``limit`` bytes. A FIFO
    (which would block), a device (``/dev/zero`` never ends) or a directory is refused in one
    line, before a byte is read."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UsageError(
            f"cannot read {path}: not a regular file (give a file saved from "
            "`smartctl --json --all DEVICE`)"
        )
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > limit:
            raise UsageError(
                f"cannot read {path}: {st.st_size:,} bytes, over the "
                f"{limit >> 20} MiB cap (smartctl's JSON is a few hundred kB)"
            )
        try:
            data = fh.read(limit + 1)  # a file that grew since fstat is cut here
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise UsageError(
            f"cannot read {path}: over the {limit >> 20} MiB cap (smartctl's "
            "JSON is a few hundred kB)"
        )
    return data


def _from_files(files: Sequence[str]) -> list[DriveHealth]:
    """Saved ``smartctl --json`` files; a device smartctl could not read is explained as the
    live path explains it (asleep, not allowed, not there, type unknown)."""
    import os

    from stallscope.sources.smart.runner import explain_unreadable

    docs = []
    for f in files:
        d = parse_smartctl_text(read_saved(f), source=f)
        if d.verdict == "unknown" and not d.counters and d.smart_passed is None:
            told = explain_unreadable(
                d,
                d.device or _device_in(d) or "the device",
                uid=os.geteuid(),
                smartctl_path="smartctl",
                source=f,
            )
            d = told if told is not None else d
        docs.append(d)
    return explain_series(docs)


def _device_in(d: DriveHealth) -> str | None:
    """The device a saved document's error names (``Smartctl open device: /dev/vda``)."""

    m = re.search(r"(/dev/[A-Za-z0-9/_.-]+)", " ".join(d.reasons))
    return m.group(1) if m else None


# --- bench ----------------------------------------------------------------------------------


class _Bar:
    """rich progress bar on stderr, one task per phase."""

    def __init__(self, enabled: bool) -> None:
        # no refresh thread: it would compete for the GIL with the timed reads and show up
        # as latency; the engines call back every ~0.1 s and the bar is redrawn then
        self.progress = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
            disable=not enabled,
            auto_refresh=False,
        )
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
    report = BenchReport(
        path=os.path.abspath(path),
        mount_point=pd.mount_point,
        fstype=pd.fstype,
        devices=list(devices),
        device_class=cls,
        plan=plan,
    )
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


def _line(*parts: str | tuple[str, str]) -> Text:
    """One line of output: machine text is clipped and shown literally (no markup parsed, no
    highlighting: rich's highlighter takes seconds on a long string)."""
    return Text.assemble(*parts, no_wrap=False)


def _print(text: Text | str, *, indent: int = 0, command: bool = False) -> None:
    """Print a line; ``command``: never folded by rich (it must survive copy and paste),
    otherwise wrapped with its continuation lines indented under the first."""
    if isinstance(text, str):
        text = Text(text)
    if command:
        out_console.print(Text(" " * indent) + text, soft_wrap=True, highlight=False, markup=False)
    else:
        out_console.print(
            Padding(text, (0, 0, 0, indent), expand=False), highlight=False, markup=False
        )


#: the cap of sentences we compose around machine text (reasons, notes, advice); a single
#: machine string (model, serial, path) is capped at TERMINAL_LIMIT
_LONG = 4 * TERMINAL_LIMIT


#: a command in advice: `...` holding a space (a single word wraps nowhere)
def _print_fixes(fixes: Sequence[str]) -> None:
    _print("fix:", indent=2)
    for f in fixes:
        prose, commands = split_commands(f)
        _print(Text("* ") + Text(plain(prose, _LONG)), indent=4)
        for c in commands:
            _print(Text(plain(c, _LONG)), indent=8, command=True)


def _print_drives(drives: Sequence[DriveHealth], notes: Sequence[str]) -> None:
    shown: dict[tuple[str, ...], str] = {}  # fixes already printed -> the drive they were for
    for d in drives:
        color = _COLOR.get(d.verdict, "")
        title = " ".join(x for x in (d.device or d.source or "drive", d.model, d.protocol) if x)
        _print(_line((plain(title), "bold"), ": ", (d.verdict, color)))
        if d.serial:
            _print(_line("serial ", plain(d.serial)), indent=2)
        for r in d.reasons:
            _print(_line("- ", plain(r, _LONG)), indent=2)
        for k, g in d.growth.items():
            _print(
                _line(
                    ("growth", "yellow"), f" {plain(k)} {g.start} → {g.end} since {plain(g.since)}"
                ),
                indent=2,
            )
        for f in d.forecast:
            _print(_line(("forecast", "yellow"), f" {plain(f.text(), _LONG)}"), indent=2)
        for n in d.notes:
            _print(_line((f"note: {plain(n, _LONG)}", "dim")), indent=2)
        if d.fixes:
            same = shown.get(tuple(d.fixes))
            if same is not None:  # the same advice for a second drive: once is enough
                _print(_line("fix: as for ", plain(same), " above"), indent=2)
            else:
                _print_fixes(d.fixes)
                shown[tuple(d.fixes)] = title
    for n in notes:
        _print(_line((f"note: {plain(n, _LONG)}", "dim")))


def _print_bench(report: BenchReport) -> None:
    exp = HEALTHY.get(report.device_class)
    out_console.print()
    _print(
        _line(
            ("bench", "bold"),
            f" {plain(report.path)} on {plain(report.mount_point)} "
            f"({plain(report.fstype)}, "
            f"{plain(', '.join(report.devices) or 'no block device')}): "
            f"{exp.label if exp else 'device class unknown'}",
        )
    )
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
            return float(
                r.rand_lat_us.get(key.removeprefix("rand_lat_").removesuffix("_us"), float("nan"))
            )
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
    out_console.print(t, highlight=False)
    for r in report.results:
        for n in r.notes:
            _print(_line((f"note ({r.engine}): {plain(n, _LONG)}", "dim")))
    if exp and exp.note:
        _print(_line((plain(exp.note, _LONG), "dim")))
    for f in report.flags:
        _print(_line((f"! {plain(f, _LONG)}", "bold yellow")))


def run(args: argparse.Namespace) -> int:
    notes: list[str] = []
    if args.smartctl_json is not None:
        if args.target or args.bench:
            raise UsageError(
                "--smartctl-json explains saved files: give no PATH|DEVICE and no --bench with it"
            )
        drives = _from_files(args.smartctl_json)
        report = None
    else:
        path, devices, why = _resolve(args.target)
        if args.bench and path is None:
            raise UsageError(
                "--bench reads files on a filesystem, never a raw device: give a "
                "PATH on the filesystem to test"
            )
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
    smartctl file was not recognised; else 0 (a drive SMART cannot open, live or saved, is
    reported with its cause and fix, but is not an error of the check)."""
    if any(d.verdict == "failing" for d in drives):
        return 1
    if saved and any(d.verdict == "unknown" and not d.explained for d in drives):
        return 3
    return 0
