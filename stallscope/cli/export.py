"""``stallscope export RUN --format csv|parquet [-o FILE] [--what points|steps]``."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import IO

from stallscope.errors import UsageError
from stallscope.store import DEFAULT_OUT, RunStore, find_run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="time series out as CSV or Parquet",
                       description="Export a run's time series (long form: ts, metric, entity, "
                       "value) or its per-step probe records.")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--format", choices=("csv", "parquet"), default="csv")
    p.add_argument("--what", choices=("points", "steps"), default="points",
                   help="time series (default) or per-step probe records")
    p.add_argument("-o", "--output", metavar="FILE", help="output file (default: stdout for csv)")
    p.add_argument("--out", default=DEFAULT_OUT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def rows(store: RunStore, what: str) -> tuple[list[str], list[tuple[object, ...]]]:
    if what == "steps":
        header = ["rank", "step", "ts", "wait_s", "host_s", "h2d_s", "gpu_busy_s", "gpu_idle_s",
                  "samples", "epoch"]
        return header, [tuple(getattr(r, h) for h in header) for r in store.steps()]
    out: list[tuple[object, ...]] = []
    for (name, entity), s in sorted(store.read_all().items()):
        out.extend((t, name, entity, v) for t, v in zip(s.ts, s.v))
    out.sort(key=lambda r: (float(r[0]), str(r[1]), str(r[2])))  # type: ignore[arg-type]
    return ["ts", "metric", "entity", "value"], out


def run(args: argparse.Namespace) -> int:
    run_dir = find_run(args.run, args.out)
    store = RunStore(run_dir / "run.db", readonly=True)
    try:
        header, data = rows(store, args.what)
    finally:
        store.close()
    if args.format == "parquet":
        if not args.output:
            raise UsageError("--format parquet needs -o FILE")
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError("parquet export needs pyarrow: pip install pyarrow") from None
        cols = {h: [r[i] for r in data] for i, h in enumerate(header)}
        try:
            pq.write_table(pa.table(cols), args.output)
        except (OSError, pa.ArrowException) as exc:
            raise UsageError(f"cannot write {args.output}: {exc}") from exc
        return 0
    if args.output:
        try:
            with Path(args.output).open("w", newline="") as f:
                _write_csv(f, header, data)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror}") from exc
    else:
        _write_csv(sys.stdout, header, data)
    return 0


def _write_csv(f: IO[str], header: list[str], data: list[tuple[object, ...]]) -> None:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(data)
