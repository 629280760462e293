"""``stallscope export RUN --format csv|parquet [-o FILE] [--what points|steps]``.

Both formats have the same columns. Time series come in long form, one row per sample:

``time``     the sample's time to the millisecond: in CSV, ISO 8601 local time with the UTC
             offset (``2025-11-21T14:03:07.250+01:00``); in Parquet, a timestamp (milliseconds,
             UTC: ``timestamp[ms, tz=UTC]``), the same instant
``t_s``      seconds since the run's start (milliseconds)
``metric``   ``<source>.<key>`` of :mod:`stallscope.metrics` (``disk.r_await_ms``)
``entity``   what it is about (``nvme0n1``, ``gpu0``, a process id, empty for the host)
``role``     for process series: ``main``, ``worker`` or ``launcher`` (:meth:`RunData.roles`)
``process``  for process series: the process's name
``value``    rounded to 6 significant digits (whole numbers from 100000 up)

Steps (``--what steps``): ``rank, step, time, t_s, wait_s, host_s, h2d_s, gpu_busy_s,
gpu_idle_s, samples, epoch``, seconds rounded the same way. Empty (null) where unknown.
"""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from stallscope.analysis.rundata import RunData, load_run
from stallscope.cli._common import RUN_HELP, add_out_option, resolve_run
from stallscope.errors import UsageError

#: column -> type ("time": an aware datetime, to the millisecond; "str", "float", "int"), for
#: each --what
POINT_COLUMNS = {
    "time": "time",
    "t_s": "float",
    "metric": "str",
    "entity": "str",
    "role": "str",
    "process": "str",
    "value": "float",
}
STEP_COLUMNS = {
    "rank": "int",
    "step": "int",
    "time": "time",
    "t_s": "float",
    "wait_s": "float",
    "host_s": "float",
    "h2d_s": "float",
    "gpu_busy_s": "float",
    "gpu_idle_s": "float",
    "samples": "int",
    "epoch": "int",
    "n": "int",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="time series out as CSV or Parquet",
        description="Export a run's time series (long form, one row per sample: time (CSV: ISO "
        "8601 local, ms; Parquet: a UTC timestamp, ms), t_s (seconds since the start), "
        "metric, entity, role and process (for process series), value (6 significant "
        "digits)) or its per-step probe records (rank, step, time, t_s, wait_s, host_s, h2d_s, "
        "gpu_busy_s, gpu_idle_s, samples, epoch). CSV and Parquet have the same columns.",
    )
    p.add_argument("run", metavar="RUN", help=RUN_HELP)
    p.add_argument("--format", choices=("csv", "parquet"), default="csv")
    p.add_argument(
        "--what",
        choices=("points", "steps"),
        default="points",
        help="time series (default) or per-step probe records",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="output file (default: stdout for csv)")
    add_out_option(p)
    p.set_defaults(func=run)


def tidy(v: float) -> float:
    """6 significant digits (no ``0.30000000000000004``); whole numbers from 100000 up, so a
    large value keeps its units digit."""
    if abs(v) >= 1e5 and abs(v) < 1e15:
        return float(round(v))
    return float(f"{v:.6g}")


class _Clock:
    """Unix time -> (an aware local datetime to the millisecond, seconds since ``start``);
    samples share their time across many points, so each is converted once."""

    def __init__(self, start: float) -> None:
        self.start = start
        self._at: dict[float, datetime | None] = {}

    def at(self, ts: float) -> datetime | None:
        if ts in self._at:
            return self._at[ts]
        try:
            d: datetime | None = datetime.fromtimestamp(ts).astimezone()
        except (OverflowError, OSError, ValueError):  # past the calendar's years
            d = None
        if d is not None:  # milliseconds, as CSV writes them and Parquet stores them
            d = d.replace(microsecond=d.microsecond // 1000 * 1000)
        self._at[ts] = d
        return d

    def since(self, ts: float) -> float:
        return round(ts - self.start, 3)


def _start(data: RunData) -> float:
    start = data.meta.get("start")
    return float(start) if isinstance(start, (int, float)) else data.t0


def table(data: RunData, what: str) -> tuple[dict[str, str], list[tuple[Any, ...]]]:
    """The columns (name -> type) and rows of an export of ``data``."""
    clock = _Clock(_start(data))
    if what == "steps":
        rows = [
            (
                r.rank,
                r.step,
                clock.at(r.ts),
                clock.since(r.ts),
                tidy(r.wait_s),
                tidy(r.host_s),
                *(None if x is None else tidy(x) for x in (r.h2d_s, r.gpu_busy_s, r.gpu_idle_s)),
                r.samples,
                r.epoch,
                r.n,
            )
            for r in data.steps
        ]
        return STEP_COLUMNS, rows
    roles = data.roles()
    keyed: list[tuple[float, str, str, tuple[Any, ...]]] = []
    for (name, entity), s in data.series.items():
        role = process = None
        if name.startswith("procs."):
            role = roles.get(entity)
            proc_name = data.entity_attrs("procs", entity).get("name")
            process = proc_name if isinstance(proc_name, str) else None
        keyed.extend(
            (t, name, entity, (clock.at(t), clock.since(t), name, entity, role, process, tidy(v)))
            for t, v in zip(s.ts, s.v)
        )
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return POINT_COLUMNS, [k[3] for k in keyed]


def run(args: argparse.Namespace) -> int:
    run_dir = resolve_run(args.run, args.out)
    data = load_run(run_dir)
    columns, rows = table(data, args.what)
    note = data.skipped_note()
    if note:  # the export is what could be read; say once what could not
        sys.stderr.write(f"stallscope: {run_dir.name}: {note}\n")
    if args.what == "steps" and not rows:  # the header alone would read as an export that broke
        sys.stderr.write(
            f"stallscope: {run_dir.name} has no per-step records: the probe writes "
            "them (wrap the loader with stallscope.watch(loader)); the export has "
            "its header only\n"
        )
    if args.format == "parquet":
        if not args.output:
            raise UsageError("--format parquet needs -o FILE")
        _write_parquet(args.output, columns, rows)
        return 0
    if args.output:
        try:
            with Path(args.output).open("w", newline="") as f:
                _write_csv(f, list(columns), rows)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror}") from exc
    else:
        _write_csv(sys.stdout, list(columns), rows)
    return 0


def _write_parquet(path: str, columns: dict[str, str], rows: list[tuple[Any, ...]]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(
            "parquet export needs pyarrow: pip install 'stallscope[parquet]'"
        ) from None
    types = {
        "str": pa.string(),
        "float": pa.float64(),
        "int": pa.int64(),
        "time": pa.timestamp("ms", tz="UTC"),
    }
    arrays = [
        pa.array([r[i] for r in rows], type=types[kind]) for i, kind in enumerate(columns.values())
    ]
    try:
        pq.write_table(pa.Table.from_arrays(arrays, names=list(columns)), path)
    except (OSError, pa.ArrowException) as exc:
        raise UsageError(f"cannot write {path}: {exc}") from exc


def _cell(v: Any) -> Any:
    """A float as few digits as it needs: ``100`` not ``100.0``, ``0.3``; a time as ISO 8601
    with milliseconds and the UTC offset."""
    if isinstance(v, datetime):
        return v.isoformat(timespec="milliseconds")
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return int(v)
    return v


def _write_csv(f: IO[str], header: list[str], rows: list[tuple[Any, ...]]) -> None:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(tuple(_cell(v) for v in r) for r in rows)
