"""``stallscope report RUN [-o FILE.html]``: a self-contained HTML report of one run."""

from __future__ import annotations

import argparse
from pathlib import Path

from stallscope.cli._common import RUN_HELP, add_out_option, resolve_run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="self-contained HTML report of a run",
        description="Write one HTML file (no network, no external assets) that opens with the "
        "verdict and fixes, then time-aligned plots of GPU, data wait, disk, CPU and memory, "
        "the summary table and the run's events. Prints the file's path.",
    )
    p.add_argument("run", metavar="RUN", help=RUN_HELP)
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE.html",
        type=Path,
        default=None,
        help="where to write the report (default: RUN/report.html); a symlink "
        "writes its target, a directory gets DIR/report.html, a device or FIFO is "
        "refused",
    )
    add_out_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stallscope.report import write_report

    run_dir = resolve_run(args.run, args.out)
    path = write_report(run_dir, args.output)
    print(path)
    return 0
