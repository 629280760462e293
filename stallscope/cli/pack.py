"""`stallscope pack`: pack a small-file dataset into WebDataset tar shards, or verify shards.

    stallscope pack SRC DST [--shard-size 1GB | --samples-per-shard N] [--workers N] [--verify]
    stallscope pack --verify DST

Progress (files/s, MB/s) goes to stderr; ``--json`` prints the result as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from stallscope.cli._common import usage_type
from stallscope.errors import UsageError
from stallscope.tools.pack import (
    DEFAULT_LOADER_WORKERS,
    DEFAULT_RANKS,
    PackProgress,
    PackResult,
    ShardRecord,
    VerifyResult,
    human_bytes,
    pack,
    parse_size,
    verify,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pack",
        help="pack a small-file dataset into WebDataset tar shards",
        usage="stallscope pack SRC DST [options]\n       stallscope pack --verify DST [--json]",
        description="Pack an ImageFolder tree (SRC/<class>/<file>) or a file list (CSV with a "
        'header \'path,label\', or JSON lines {"path":…, "label":…}) into WebDataset shards '
        "DST/shard-NNNNNN.tar with DST/manifest.json. Deterministic (same input, same bytes) "
        "and resumable (run the same command again after an interruption). "
        "`stallscope pack --verify DST` checks finished shards.",
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="SRC DST",
        help="source and destination; with --verify alone: DST",
    )
    _add_packing_options(p)
    _add_reader_options(p)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a stallscope shard set of other input/options in DST",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="re-read every shard and check counts and sha256 against the manifest",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _add_packing_options(p: argparse.ArgumentParser) -> None:
    """What goes into the shards: their size, the sample order, the keys; and the threads
    that read ahead of the writer."""
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--shard-size",
        type=usage_type(parse_size),
        metavar="SIZE",
        help="target bytes per shard, e.g. 500MB, 1GB, 512MiB (default: 1 GB, or "
        "less, down to 100 MB, so that every rank × worker reader gets a shard)",
    )
    size.add_argument(
        "--samples-per-shard",
        type=_positive,
        metavar="N",
        help="exactly N samples per shard (the last one takes the rest)",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        default=4,
        metavar="N",
        help="threads reading files ahead of the tar writer (default 4); the output "
        "does not depend on it",
    )
    order = p.add_mutually_exclusive_group()
    order.add_argument(
        "--shuffle-seed",
        type=int,
        default=0,
        metavar="S",
        help="seed of the sample order shuffle (default 0)",
    )
    order.add_argument(
        "--keep-order",
        action="store_true",
        help="keep the source order (class-sorted for ImageFolder) instead",
    )
    p.add_argument(
        "--strict-keys",
        action="store_true",
        help="reject file names with dots before the extension instead of "
        "replacing the dots by '_'",
    )


def _add_reader_options(p: argparse.ArgumentParser) -> None:
    """Who will read the shards: the layout warnings weigh the shard count against them."""
    p.add_argument(
        "--ranks",
        type=_positive,
        default=None,
        metavar="R",
        help=f"DDP ranks that will read the shards, for the warnings (default {DEFAULT_RANKS})",
    )
    p.add_argument(
        "--loader-workers",
        type=_positive,
        default=None,
        metavar="W",
        help=f"DataLoader workers per rank, for the warnings (default {DEFAULT_LOADER_WORKERS})",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


class _RateColumn(ProgressColumn):
    """files done/total, files/s and MB/s averaged since the phase began."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        files = int(task.fields.get("files", 0))
        total = int(task.fields.get("total_files", 0))
        if elapsed <= 0:
            return Text(f"{files}/{total} files", style="progress.data.speed")
        return Text(
            f"{files}/{total} files {files / elapsed:,.0f} files/s "
            f"{task.completed / elapsed / 1e6:,.1f} MB/s",
            style="progress.data.speed",
        )


class _RichProgress(PackProgress):
    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(
            TextColumn("{task.description:>9}"),
            BarColumn(),
            _RateColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task: TaskID | None = None
        self.files = 0

    def __enter__(self) -> _RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def start(self, phase: str, files: int, nbytes: int) -> None:
        if self.task is not None:
            self.bar.stop_task(self.task)
        self.files = 0
        self.task = self.bar.add_task(phase, total=max(nbytes, 1), files=0, total_files=files)

    def advance(self, files: int, nbytes: int) -> None:
        if self.task is None:
            return
        self.files += files
        self.bar.update(self.task, advance=nbytes, files=self.files)

    def shard_done(self, record: ShardRecord) -> None:
        return


def _print_pack(console: Console, result: PackResult) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    info = result.to_json()
    table.add_row("shards", f"{info['shards']}  ({info['pattern']})")
    table.add_row("samples", f"{info['samples']:,}")
    table.add_row(
        "bytes",
        f"{human_bytes(info['shard_bytes'])} in shards, "
        f"{human_bytes(info['source_bytes'])} of files",
    )
    if result.kept_shards:
        table.add_row(
            "resumed",
            f"{result.kept_shards} finished shard(s) kept, {result.written_shards} written",
        )
    table.add_row(
        "speed",
        f"{info['files_per_s']:,.0f} files/s, {info['mb_per_s']:,.1f} MB/s "
        f"({info['seconds']:.1f} s)",
    )
    table.add_row("manifest", info["manifest"])
    console.print(table)


def _print_verify(console: Console, result: VerifyResult) -> None:
    if result.ok:
        console.print(
            f"verified {result.checked} shard(s), {result.samples:,} samples, "
            f"{human_bytes(result.bytes)}: all sizes, counts and sha256 match"
        )
    else:
        for problem in result.problems:
            console.print(f"[red]FAIL[/red] {problem}", highlight=False)


def run(args: argparse.Namespace) -> int:
    if args.verify and len(args.paths) == 1:
        src, dst = None, args.paths[0]
    elif len(args.paths) == 2:
        src, dst = args.paths
    else:
        raise UsageError("expected SRC DST (or --verify DST)")
    err = Console(stderr=True)
    out = Console(highlight=False)
    report: dict[str, Any] = {}
    show = not args.no_progress
    progress = _RichProgress(err)
    code = 0
    if show:
        progress.__enter__()
    try:
        if src is not None:
            result = pack(
                src,
                dst,
                shard_size=args.shard_size,
                samples_per_shard=args.samples_per_shard,
                workers=args.workers,
                shuffle_seed=None if args.keep_order else args.shuffle_seed,
                strict_keys=args.strict_keys,
                overwrite=args.overwrite,
                ranks=args.ranks,
                loader_workers=args.loader_workers,
                progress=progress if show else None,
            )
            report = result.to_json()
        checked = verify(dst, progress=progress if show else None) if args.verify else None
    finally:
        if show:
            progress.__exit__()
    if src is not None:
        for warning in result.warnings:
            err.print(f"stallscope: warning: {warning}", highlight=False, soft_wrap=True)
    if checked is not None:
        code = 0 if checked.ok else 1
        report = {**report, "verify": checked.to_json()} if src is not None else checked.to_json()
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
        return code
    if src is not None:
        _print_pack(out, result)
    if checked is not None:
        _print_verify(out, checked)
    return code
