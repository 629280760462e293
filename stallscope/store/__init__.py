"""The run store: one directory per run holding ``run.db`` (SQLite, WAL) and ``meta.json``.

:mod:`stallscope.store.db` writes and reads ``run.db``; :mod:`stallscope.store.rundir` makes,
names and finds run directories and reads and writes their ``meta.json``. See
docs/architecture.md for both layouts.
"""

from __future__ import annotations

from stallscope.metrics import Point
from stallscope.store.db import SCHEMA_VERSION, RunStore, Series, StepRow
from stallscope.store.rundir import (
    DEFAULT_OUT,
    base_meta,
    find_run,
    list_runs,
    new_run_dir,
    read_meta,
    write_meta,
)

__all__ = [
    "DEFAULT_OUT",
    "SCHEMA_VERSION",
    "Point",
    "RunStore",
    "Series",
    "StepRow",
    "base_meta",
    "find_run",
    "list_runs",
    "new_run_dir",
    "read_meta",
    "write_meta",
]
