"""``stallscope diagnose RUN [--json]``: findings for a run."""

from __future__ import annotations

import argparse
import json
import sys

from stallscope.analysis.diagnose import diagnose_run, print_diagnosis
from stallscope.analysis.rundata import load_run
from stallscope.cli._common import out_console
from stallscope.store import DEFAULT_OUT, find_run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help="name the bottleneck of a run",
                       description="Findings for a run: the bottleneck, the evidence (numbers "
                       "and the rule behind them), fixes, and an upper-bound speedup.")
    p.add_argument("run", metavar="RUN", help="run directory, run id (or prefix), or 'latest'")
    p.add_argument("--json", action="store_true", help="print JSON (keys: docs/architecture.md)")
    p.add_argument("--out", default=DEFAULT_OUT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_dir = find_run(args.run, args.out)
    data = load_run(run_dir)
    doc = diagnose_run(run_dir, data)
    note = data.skipped_note()
    if note:  # the diagnosis is of what could be read; say once what could not
        sys.stderr.write(f"stallscope: {run_dir.name}: {note}\n")
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print_diagnosis(doc, out_console)
    return 0
