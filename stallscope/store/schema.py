"""``run.db``'s layout: the tables, the schema version and the migration of an older store,
and the SQL both its readers and the incremental readers elsewhere build on (which step columns a
store has, the step rows not read yet, what a readable row holds). The layout is described in
:mod:`stallscope.store.db`."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path

from stallscope.errors import StallscopeError
from stallscope.metrics import lookup
from stallscope.version import __version__

__all__ = [
    "SCHEMA_VERSION",
    "comm_column",
    "migrate",
    "n_column",
    "newer_message",
    "step_ranks",
    "steps_after",
    "user_version",
]

#: the layout of run.db this code writes, kept in ``PRAGMA user_version``. The first release's
#: layout (``info.schema_version`` 1; ``steps.comm_s`` came later by ALTER TABLE, without a new
#: version) left user_version at 0; 2 is that layout with ``steps.comm_s`` always there; 3 adds
#: ``steps.n`` (steps a row covers, 1 in every older row); 4 adds ``step_packs`` (older step
#: rows packed, :mod:`stallscope.store.steppack`, their times to the microsecond); 5 keeps
#: one value a ``rollup`` bucket, ``v``, what readers read (the mean, the max for metrics whose
#: mean is not a value they can take), where 4 and before kept ``vmin, vmean, vmax``; 6 adds
#: ``rollup_packs`` (the buckets of each series and hour packed, :mod:`stallscope.store.buckets`)
#: and writes step packs of format 2 (:mod:`stallscope.store.steppack`; format 1 is still read);
#: 7 adds ``samples`` (each sample one row, :mod:`stallscope.store.samples`), where 6 and before
#: wrote a ``points`` row a point (still read, and folded by the next downsampling). Bump it
#: with each change of the layout and teach :func:`migrate` the step from the previous one.
SCHEMA_VERSION = 7

_SCHEMA = """
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series(
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, entity TEXT NOT NULL, UNIQUE(name, entity));
CREATE TABLE IF NOT EXISTS points(
    ts REAL NOT NULL, series INTEGER NOT NULL, v REAL NOT NULL,
    PRIMARY KEY(ts, series)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS samples(
    ts REAL NOT NULL PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup(
    ts REAL NOT NULL, series INTEGER NOT NULL, n INTEGER NOT NULL, v REAL NOT NULL,
    PRIMARY KEY(ts, series)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entities(
    source TEXT NOT NULL, entity TEXT NOT NULL, attrs TEXT NOT NULL,
    first_ts REAL NOT NULL, last_ts REAL NOT NULL, PRIMARY KEY(source, entity));
CREATE TABLE IF NOT EXISTS events(
    ts REAL NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps(
    rank INTEGER NOT NULL, step INTEGER NOT NULL, ts REAL NOT NULL,
    wait_s REAL NOT NULL, host_s REAL NOT NULL, h2d_s REAL, gpu_busy_s REAL, gpu_idle_s REAL,
    samples INTEGER, epoch INTEGER, comm_s REAL, n INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY(rank, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS step_packs(
    rank INTEGER NOT NULL, last INTEGER NOT NULL, first INTEGER NOT NULL, rows INTEGER NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY(rank, last)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup_packs(
    ts INTEGER NOT NULL, series INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY(ts, series)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS probes(
    rank INTEGER PRIMARY KEY, pid INTEGER NOT NULL, config TEXT NOT NULL,
    steps INTEGER NOT NULL DEFAULT 0, dropped INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL);
"""


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def newer_message(path: Path, version: int) -> str:
    return (
        f"{path} was written by a newer stallscope (run.db schema version {version}; this "
        f"stallscope {__version__} reads versions up to {SCHEMA_VERSION}): read it with "
        "that release or a later one"
    )


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring a writer's store to :data:`SCHEMA_VERSION`: a new (empty) file gets the whole
    layout, an older store (version 0: the first release's) what it lacks, then the version.
    One IMMEDIATE transaction, so that two writers opening the same store at once (the
    collector and an attached probe's mirror) migrate it once. A store at the version with its
    whole layout is not written at all; one that lost a table or ``steps.comm_s`` gets it back
    (as every writer's opening did before the version was kept)."""
    if user_version(db) == SCHEMA_VERSION and _layout_complete(db):
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        version = user_version(db)  # another writer may have done it meanwhile
        if version > SCHEMA_VERSION:
            raise StallscopeError(newer_message(path, version))
        # version 0 (the first release, or a new file): every table that is missing, then
        # steps.comm_s where the table predates it (the first release's own layout)
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        if comm_column(db) == "NULL":
            db.execute("ALTER TABLE steps ADD COLUMN comm_s REAL")
        if n_column(db) == "1":  # version 2 and before: one step a row
            db.execute("ALTER TABLE steps ADD COLUMN n INTEGER NOT NULL DEFAULT 1")
        if not rollup_has_v(db):  # version 4 and before: min, mean and max a bucket
            _rollup_to_v(db)
        # version 5 and before: no rollup_packs (made above, with every missing table); their
        # buckets stay rows until a downsampling packs the whole hours, their step packs of
        # format 1 stay as they are (both read as they are)
        # version 6 and before: no samples (made above); their points rows stay where they are,
        # read with the samples, until a downsampling folds them into buckets
        if version < SCHEMA_VERSION:
            db.execute(
                "INSERT OR REPLACE INTO info VALUES('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            db.execute(f"PRAGMA user_version = {int(SCHEMA_VERSION)}")
        db.commit()
    except BaseException:
        db.rollback()
        raise


#: the tables of :data:`_SCHEMA`
_TABLES = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", _SCHEMA))


def _layout_complete(db: sqlite3.Connection) -> bool:
    """Every table of the layout is there, ``steps.comm_s`` and ``steps.n`` included (two
    reads, no write)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return _TABLES <= tables and {"comm_s", "n"} <= _step_columns(db) and rollup_has_v(db)


def rollup_has_v(conn: sqlite3.Connection) -> bool:
    """Whether ``rollup`` keeps one value a bucket (schema version 5), rather than ``vmin, vmean,
    vmax`` (4 and before; read-only readers read those as they are)."""
    return "v" in {r[1] for r in conn.execute("PRAGMA table_info(rollup)")}


def rollup_is_max(name: str) -> bool:
    """Whether a bucket of metric ``name`` stands for its max (bitmasks, link generations: their
    mean is not a value they can take), else its mean."""
    m = lookup(name)
    return m is not None and m.rollup == "max"


def max_series(conn: sqlite3.Connection) -> list[int]:
    """The ids of the series whose buckets keep their max (:func:`rollup_is_max`)."""
    return [
        int(i)
        for i, n in conn.execute("SELECT id, name FROM series")
        if isinstance(i, int) and isinstance(n, str) and rollup_is_max(n)
    ]


def _rollup_to_v(db: sqlite3.Connection) -> None:
    """A version-4-or-older ``rollup`` rewritten with the one value a reader reads (in the
    migration's transaction)."""
    ids = ",".join(str(i) for i in max_series(db))  # whole numbers, never user input
    db.execute("ALTER TABLE rollup RENAME TO rollup_v4")
    for statement in _SCHEMA.split(";"):
        if "TABLE IF NOT EXISTS rollup(" in statement:
            db.execute(statement)
    db.execute(
        "INSERT INTO rollup(ts, series, n, v) SELECT ts, series, n, "
        f"CASE WHEN series IN ({ids}) THEN vmax ELSE vmean END FROM rollup_v4"
    )
    db.execute("DROP TABLE rollup_v4")


def _step_columns(conn: sqlite3.Connection) -> set[str]:
    return {r[1] for r in conn.execute("PRAGMA table_info(steps)")}


def comm_column(conn: sqlite3.Connection) -> str:
    """``comm_s``, or ``NULL`` for a run.db written before communication time (read-only
    readers do not add the column): what a SELECT of the steps puts in its place."""
    return "comm_s" if "comm_s" in _step_columns(conn) else "NULL"


def n_column(conn: sqlite3.Connection) -> str:
    """``n``, or ``1`` for a run.db written before rows of several steps (schema version 3;
    read-only readers do not add the column): what a SELECT of the steps puts in its place."""
    return "n" if "n" in _step_columns(conn) else "1"


def step_ranks(conn: sqlite3.Connection) -> list[int]:
    """The ranks that have step rows, found through the (rank, step) key one rank at a time
    (a handful of index seeks, however many rows: never a scan of the table)."""
    ranks: list[int] = []
    cur = conn.execute("SELECT min(rank) FROM steps").fetchone()[0]
    while isinstance(cur, int) and len(ranks) < 100_000:
        ranks.append(cur)
        cur = conn.execute("SELECT min(rank) FROM steps WHERE rank > ?", (cur,)).fetchone()[0]
    return ranks


def steps_after(last: Mapping[int, int], ranks: Iterable[int] = ()) -> tuple[str, list[int]]:
    """SQL condition (and its arguments) for the step rows not read yet: per rank the steps
    after its last one read (``last``), every step of a rank in ``ranks`` not read before.
    Each term is a range of the (rank, step) key, so SQLite reads only the new rows (a
    ``NOT IN`` for unseen ranks made it scan the whole table at every read: 90 ms at 560,000
    rows). ("", []) when there is no rank at all."""
    every = sorted(set(last) | set(ranks))
    if not every:
        return "", []
    where = " OR ".join(["(rank=? AND step>?)"] * len(every))
    return where, [x for r in every for x in (r, last.get(r, -(1 << 62)))]


def _finite(col: str) -> str:
    """SQL: ``col`` holds a finite number (not text, a blob, NULL or inf; NaN is stored as
    NULL). ``col`` is a fixed column name, never user input."""
    return f"(typeof({col}) IN ('real', 'integer') AND {col} > -9e999 AND {col} < 9e999)"


def _finite_or_null(col: str) -> str:
    return f"({col} IS NULL OR {_finite(col)})"


def _int_or_null(col: str) -> str:
    return f"({col} IS NULL OR typeof({col}) = 'integer')"


_POINT_OK = f"typeof(series) = 'integer' AND {_finite('ts')} AND {_finite('v')}"
#: a readable bucket of a version 5 rollup (:func:`rollup_has_v`)
_ROLLUP_V_OK = f"typeof(series) = 'integer' AND {_finite('ts')} AND {_finite('v')}"
#: a readable bucket of a version 4 (or older) rollup
_ROLLUP_OK = (
    f"typeof(series) = 'integer' AND {_finite('ts')} AND {_finite('vmean')} AND {_finite('vmax')}"
)
_STEP_COLUMNS = "rank, step, ts, wait_s, host_s, h2d_s, gpu_busy_s, gpu_idle_s, samples, epoch"
_STEP_OK = " AND ".join(
    ["typeof(rank) = 'integer'", "typeof(step) = 'integer'"]
    + [_finite(c) for c in ("ts", "wait_s", "host_s")]
    + [_finite_or_null(c) for c in ("h2d_s", "gpu_busy_s", "gpu_idle_s")]
    + [_int_or_null(c) for c in ("samples", "epoch")]
)
#: a row's step count is a whole number of steps, at least one
_N_OK = "typeof(n) = 'integer' AND n >= 1"
