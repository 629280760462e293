"""``run.db``: one SQLite file (WAL while written) per run.

Layout:

``series(id, name, entity)``
    one row per time series; ``name`` is a metric of :mod:`stallscope.metrics`
    (``disk.r_await_ms``), ``entity`` what it is about (``vda``, ``gpu0``, ``pid:4242``, ``cpu3``,
    ``""`` for the host as a whole).
``samples(ts, data)``
    full-resolution samples, one row each, clustered by time (appends stay sequential): ``data``
    holds the sample's series ids (runs of consecutive ids) and values (the 8 bytes of each
    double, nothing rounded) (:mod:`stallscope.store.samples`, schema version 7: ~8 bytes a
    point and one INSERT a sample, against ~27 bytes and a row a point in ``points``). A blob
    that cannot be read is skipped and counted (``skipped["samples"]``), as is a point of no
    known series (by :meth:`RunStore.read_all`).
``points(ts, series, v)``
    full-resolution points of schema version 6 and before, a row each: read with the samples
    (:meth:`RunStore.read`, :meth:`RunStore.read_all`, :meth:`RunStore.time_range`), left where
    they are by a writer's migration and folded into buckets by its next
    :meth:`RunStore.downsample`; a store of version 7 writes none.
``rollup(ts, series, n, v)``
    older samples (and points) downsampled into fixed buckets of ``n`` samples; a long run
    keeps full resolution for a recent window only, so its size is bounded (see
    ``benchmarks/bench_store_size.py``). ``v`` is what a reader reads for the bucket: the mean,
    the max for metrics whose mean is not a value they can take (bitmasks, link generations;
    :func:`~stallscope.store.schema.rollup_is_max`). Stores of schema version 4 and before kept
    ``vmin, vmean, vmax`` (read as they are read-only, rewritten by a writer's migration). The
    buckets of every hour wholly downsampled move into ``rollup_packs``
    (:meth:`RunStore.downsample`); the newer ones stay here.
``rollup_packs(ts, series, data)``
    the buckets of one series whose start is in the hour from ``ts``, packed into ``data``
    (:mod:`stallscope.store.buckets`, schema version 6: ~6 bytes a bucket against ~23 as a row;
    nothing rounded, a packed bucket reads as its row did). :meth:`RunStore.read`,
    :meth:`RunStore.read_all` and :meth:`RunStore.time_range` read packs and rows as one; a
    pack that cannot be read is skipped and counted (``skipped["rollup_packs"]``).
``entities(source, entity, attrs, first_ts, last_ts)``
    what is known about an entity that is not a number (GPU name, process cmdline and role).
``events(ts, source, kind, message)``
    things said once: a source unavailable, a GPU lost, a probe buffer overflow.
``steps(rank, step, ...)``
    per training step timings written by the in-trainer probe. A row covers ``n`` consecutive
    steps (1: one step, ``step`` its number); steps shorter than the probe's
    :data:`~stallscope.probe.buffer.GROUP_S` are written ``n`` to a row, ``step`` the last of
    them, ``wait_s``, ``host_s``, ``h2d_s``, ``samples`` and ``comm_s`` their sums, ``ts``
    the first's start plus their data wait (so ``ts - wait_s`` and ``ts + host_s`` are the
    rows' ends at any ``n``). Rows older than :data:`STEPS_PLAIN_S` move into
    ``step_packs`` (:meth:`RunStore.pack_steps`, called by the collector with its
    downsampling); the newer ones stay here, for the readers that follow a run as it goes (they
    read new rows by ``(rank, step)``).
``step_packs(rank, last, first, rows, data)``
    older step rows of one rank, ``first`` to ``last``, packed into ``data``
    (:mod:`stallscope.store.steppack`: ~5.3 bytes a row against ~70 as a row; at 100 steps/s a
    day of rows took 400 MB), their times to the microsecond: a row reads exactly as written
    while it is a row (the probe's tests add sums up exactly), to the microsecond once packed.
    :meth:`RunStore.steps` reads packs and rows as one.
``probes(rank, ...)``
    one row per probe (rank): loader configuration, drops.

Schema version: ``PRAGMA user_version`` holds :data:`SCHEMA_VERSION` (also written to
``info.schema_version``). A store of an older layout (user_version 0: the first release's, with
or without ``steps.comm_s``) is migrated in place when a writer opens it (what is missing is
added, then the version set, in one transaction); a read-only opening never writes and reads an
older store as it is. A store of a newer version than this code knows is refused with one
:class:`~stallscope.errors.StallscopeError`.

Crash safety: WAL journal, one transaction per collector interval. A ``kill -9`` loses at most
the interval in flight; the database stays consistent (``PRAGMA integrity_check``). Readers may
open a run while it is being written (WAL allows one writer and many readers).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stallscope.errors import RunNotFound, StallscopeError
from stallscope.metrics import Point
from stallscope.store.buckets import pack_buckets, packed, packed_span
from stallscope.store.packs import (
    STEPS_PLAIN_S,
    merge_steps,
    pack_rows,
    packed_rows,
    packed_steps_after,
)
from stallscope.store.rows import Series, StepRow, StepTuple, StepValues
from stallscope.store.samples import (
    KEYS,
    Packer,
    fold_samples,
    read_samples,
    samples_span,
    write_sample,
)
from stallscope.store.schema import (
    _N_OK,
    _POINT_OK,
    _ROLLUP_OK,
    _ROLLUP_V_OK,
    _STEP_COLUMNS,
    _STEP_OK,
    SCHEMA_VERSION,
    _finite,
    comm_column,
    max_series,
    migrate,
    n_column,
    newer_message,
    rollup_has_v,
    rollup_is_max,
    step_ranks,
    steps_after,
    user_version,
)
from stallscope.units import finite_or_none

__all__ = [
    "SCHEMA_VERSION",
    "RunStore",
    "Series",
    "StepRow",
    "StepTuple",
    "StepValues",
    "comm_column",
    "n_column",
    "packed_steps_after",
    "step_ranks",
    "steps_after",
]

#: rows bound by one INSERT of :meth:`RunStore.add_step_block` (9 parameters each, under
#: SQLite's 32,766)
BLOCK_ROWS = 3600


@functools.lru_cache(maxsize=8)
def _block_sql(n: int) -> str:
    """An INSERT of ``n`` :data:`StepTuple` rows after two parameters (rank, ts base)."""
    return (
        "INSERT OR REPLACE INTO steps(rank, step, ts, wait_s, host_s, samples, epoch, h2d_s, "
        "n) SELECT ?1, column1, column2 + ?2, column3, column4, column5, column6, column7, "
        "column9 FROM (VALUES " + ",".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * n) + ")"
    )


#: the INSERT of :meth:`RunStore.add_step_values`
_VALUES_SQL = (
    f"INSERT OR REPLACE INTO steps({_STEP_COLUMNS}, comm_s, n) "
    "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class RunStore:
    """Writer and reader of one ``run.db``."""

    def __init__(
        self, path: str | os.PathLike[str], *, readonly: bool = False, cache_kib: int | None = None
    ) -> None:
        """``cache_kib``: SQLite's page cache for this connection (its default: 2,000 KiB)."""
        self.path = Path(path)
        self.readonly = readonly
        from stallscope.safefile import is_regular

        # a FIFO or a device in its place would hang or feed SQLite forever
        if os.path.lexists(self.path) and not is_regular(self.path):
            raise StallscopeError(f"{self.path} is not a regular file")
        try:
            if readonly:
                if not self.path.exists():
                    raise RunNotFound(f"no run database at {self.path}")
                self.db = sqlite3.connect(
                    f"file:{self.path}?mode=ro", uri=True, timeout=10.0, check_same_thread=False
                )
                try:
                    tables = {
                        r[0]
                        for r in self.db.execute(
                            "SELECT name FROM sqlite_master WHERE type='table'"
                        )
                    }
                except sqlite3.OperationalError:
                    # a WAL database in a directory we cannot write (a copied or archived run):
                    # read it as an immutable file instead
                    self.db.close()
                    self.db = sqlite3.connect(
                        f"file:{self.path}?immutable=1", uri=True, check_same_thread=False
                    )
                    tables = {
                        r[0]
                        for r in self.db.execute(
                            "SELECT name FROM sqlite_master WHERE type='table'"
                        )
                    }
                if "series" not in tables:
                    raise StallscopeError(f"{self.path} is not a stallscope run database")
                self._check_version()  # an older one is read as it is (readers tolerate it)
            else:
                self.db = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False)
                self._check_version()  # before anything is written to a newer store
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                migrate(self.db, self.path)
            self.db.execute("PRAGMA busy_timeout=10000")
            if cache_kib is not None:
                self.db.execute(f"PRAGMA cache_size=-{max(64, int(cache_kib))}")
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise StallscopeError(f"cannot open run database {self.path}: {exc}") from exc
        except BaseException:
            self._close_quietly()
            raise
        self._series: dict[tuple[str, str], int] = {}
        self._packer = Packer()
        #: a sample's row kept back to be written with the next one (:meth:`add_points`
        #: ``hold``): at most one, so a crash loses at most that one interval's sample
        self._held: tuple[float, bytes] | None = None
        #: rows the readers skipped as unreadable, by table (see "reading" below)
        self.skipped: dict[str, int] = {}

    def _check_version(self) -> None:
        """Refuse a store written by a newer stallscope (its layout is not known here)."""
        version = user_version(self.db)
        if version > SCHEMA_VERSION:
            raise StallscopeError(newer_message(self.path, version))

    def _close_quietly(self) -> None:
        db = getattr(self, "db", None)
        if db is not None:
            try:
                db.close()
            except sqlite3.Error:
                pass

    # --- writing -------------------------------------------------------------------------------
    def _series_id(self, name: str, entity: str) -> int:
        key = (name, entity)
        sid = self._series.get(key)
        if sid is None:
            self.db.execute("INSERT OR IGNORE INTO series(name, entity) VALUES(?, ?)", key)
            row = self.db.execute("SELECT id FROM series WHERE name=? AND entity=?", key).fetchone()
            sid = int(row[0])
            self._series[key] = sid
        return sid

    @property
    def held(self) -> bool:
        """Whether a sample's row is kept back, not written yet (:meth:`add_points`)."""
        return self._held is not None

    def add_points(
        self,
        ts: float,
        points: Iterable[Point],
        touch: Sequence[tuple[str, Sequence[str], float]] = (),
        *,
        hold: bool = False,
    ) -> int:
        """Append one sample's points in one transaction; returns how many were stored (values
        that are not finite numbers are left out). ``touch``: (source, entities, last seen
        time) (:meth:`touch_entities`), in the same transaction (one commit a sample).

        ``hold``: keep this sample's row back, to be written in the transaction of the next
        one (or at :meth:`flush`, which every reader of samples, :meth:`downsample` and
        :meth:`finish` call first): two samples share a commit's cost (at the 0.25-s interval
        ``add_points`` went from 0.38 to 0.25-0.28 ms a sample, ``sample_parts.py``). At most
        one row is held (with one held already, or with ``touch``, this one is written at
        once): a crash loses at most that one sample. On a failed write the held row is lost
        with it."""
        # a value that is not a finite number (inf, -inf, NaN) is dropped, never stored: SQLite
        # turns NaN into NULL and readers would have to skip inf ("v - v" is NaN for them). A
        # series twice in one sample keeps its last value (as a row replaced did).
        pts = points if isinstance(points, list) else list(points)
        keys = list(map(KEYS, pts))
        blob, n = self._packer.again(keys, pts) or (None, 0)
        if blob is None:  # other series than the last sample's, or a value left out
            sid = self._series.get
            values: dict[int, float] = {}
            for p in pts:
                if (v := float(p.value)) - v == 0.0:
                    values[sid((p.name, p.entity)) or self._series_id(p.name, p.entity)] = v
            n = len(values)
            if values:
                blob = self._packer.pack(values, keys if n == len(pts) else None)
        held, self._held = self._held, None
        if hold and held is None and blob is not None and not touch:
            self._held = (ts, blob)
            return n
        with self.db:
            if held is not None:
                write_sample(self.db, *held)
            # the whole sample one row (samples.py): one statement, a blob of ~8 bytes a point
            if blob is not None:
                write_sample(self.db, ts, blob)
            for source, entities, seen in touch:
                self.db.executemany(
                    "UPDATE entities SET last_ts=? WHERE source=? AND entity=?",
                    [(seen, source, e) for e in entities],
                )
        return n

    def flush(self) -> None:
        """Write the sample's row held back by :meth:`add_points`, if any."""
        held, self._held = self._held, None
        if held is not None:
            with self.db:
                write_sample(self.db, *held)

    def upsert_entity(self, source: str, entity: str, attrs: dict[str, Any], ts: float) -> None:
        with self.db:
            self.db.execute(
                "INSERT INTO entities VALUES(?, ?, ?, ?, ?) ON CONFLICT(source, entity) "
                "DO UPDATE SET attrs=excluded.attrs, last_ts=excluded.last_ts",
                (source, entity, json.dumps(attrs, sort_keys=True), ts, ts),
            )

    def touch_entities(self, source: str, entities: Sequence[str], ts: float) -> None:
        with self.db:
            self.db.executemany(
                "UPDATE entities SET last_ts=? WHERE source=? AND entity=?",
                [(ts, source, e) for e in entities],
            )

    def set_attrs(self, source: str, attrs: dict[str, dict[str, Any]]) -> None:
        """Replace the attributes of several entities of ``source`` (e.g. the process roles the
        whole run shows, recorded at its end)."""
        with self.db:
            self.db.executemany(
                "UPDATE entities SET attrs=? WHERE source=? AND entity=?",
                [(json.dumps(a, sort_keys=True), source, e) for e, a in attrs.items()],
            )

    def add_event(self, ts: float, source: str, kind: str, message: str) -> None:
        with self.db:
            self.db.execute("INSERT INTO events VALUES(?, ?, ?, ?)", (ts, source, kind, message))

    def add_steps(self, rows: Iterable[StepRow]) -> int:
        return self.add_step_values(
            [
                (
                    r.rank,
                    r.step,
                    r.ts,
                    r.wait_s,
                    r.host_s,
                    r.h2d_s,
                    r.gpu_busy_s,
                    r.gpu_idle_s,
                    r.samples,
                    r.epoch,
                    r.comm_s,
                    r.n,
                )
                for r in rows
            ]
        )

    def add_step_block(self, rank: int, ts_base: float, rows: Sequence[StepTuple]) -> int:
        """Steps of one rank in the probe's hand-over layout (:data:`StepTuple`, ``ts`` =
        ``ts_base`` + the row's clock), without GPU or collective times: what the probe's writer
        thread writes. Each statement binds up to :data:`BLOCK_ROWS` rows at once, so the
        interpreter lock is handed back once per block rather than once per row (the writer
        shares the trainer's interpreter: per row, a trainer that keeps the lock busy made it
        wait up to a switch interval, 5 ms, and a 20k-steps/s loop outran it)."""
        db = self.db
        with db:
            for i in range(0, len(rows), BLOCK_ROWS):
                block = rows[i : i + BLOCK_ROWS]
                db.execute(
                    _block_sql(len(block)), [rank, ts_base, *itertools.chain.from_iterable(block)]
                )
        return len(rows)

    def add_step_values(self, values: list[StepValues]) -> int:
        """Steps as bare tuples in :class:`StepRow`'s field order (what the probe's writer
        thread builds: no object per step, since it shares the trainer's interpreter)."""
        with self.db:
            self.db.executemany(_VALUES_SQL, values)
        return len(values)

    def update_steps_gpu(self, rows: Iterable[tuple[int, int, float | None, float | None]]) -> None:
        """Fill in GPU busy/idle times once their CUDA events completed.

        Rows are (rank, step, busy_s, idle_s)."""
        with self.db:
            self.db.executemany(
                "UPDATE steps SET gpu_busy_s=?, gpu_idle_s=? WHERE rank=? AND step=?",
                [(b, i, r, s) for r, s, b, i in rows],
            )

    def set_probe(
        self, rank: int, pid: int, config: dict[str, Any], steps: int, dropped: int
    ) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO probes VALUES(?, ?, ?, ?, ?, ?)",
                (
                    rank,
                    pid,
                    json.dumps(config, sort_keys=True, default=str),
                    steps,
                    dropped,
                    time.time(),
                ),
            )

    def downsample(self, older_than: float, bucket_s: float = 60.0) -> int:
        """Fold full-resolution samples (:func:`~stallscope.store.samples.fold_samples`; and the
        points of a store of schema version 6 and before) older than ``older_than`` into
        ``bucket_s`` buckets, and pack the buckets of every hour before them
        (:func:`~stallscope.store.buckets.pack_buckets`). One transaction.

        Only whole buckets are folded, so a bucket is never split between the two tables.
        Returns the number of points folded."""
        cutoff = (older_than // bucket_s) * bucket_s
        self.flush()
        with self.db:
            # a bucket keeps what readers read: its mean, its max for the series of
            # max_series (their ids: whole numbers, never user input)
            max_ids = max_series(self.db)
            is_max = f"series IN ({','.join(str(i) for i in max_ids)})"
            self.db.execute(
                f"""INSERT INTO rollup(ts, series, n, v)
                   SELECT CAST(ts / :b AS INTEGER) * :b AS bt, series, COUNT(*),
                          CASE WHEN {is_max} THEN MAX(v) ELSE AVG(v) END
                   FROM points WHERE ts < :c GROUP BY bt, series
                   ON CONFLICT(ts, series) DO UPDATE SET
                     v = CASE WHEN {is_max} THEN MAX(v, excluded.v)
                         ELSE (v * n + excluded.v * excluded.n) / (n + excluded.n) END,
                     n = n + excluded.n""",
                {"b": bucket_s, "c": cutoff},
            )
            cur = self.db.execute("DELETE FROM points WHERE ts < ?", (cutoff,))
            folded = int(cur.rowcount)  # rows of schema version 6 and before, then samples
            if self._has_samples():
                folded += fold_samples(self.db, cutoff, bucket_s, frozenset(max_ids))
            # the buckets of the hours now wholly folded: packed, a pack a series and hour
            pack_buckets(self.db, cutoff, bucket_s, frozenset(max_ids))
        return folded

    def pack_steps(self, now: float, keep_s: float = STEPS_PLAIN_S) -> int:
        """Pack the step rows older than ``keep_s`` at ``now`` (:func:`~stallscope.store.packs.
        pack_rows`); returns how many rows. One transaction."""
        with self.db:
            return pack_rows(self.db, now - keep_s)

    def checkpoint(self) -> None:
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def finish(self) -> None:
        """End of the run: fold the WAL into the file and leave WAL mode, so the finished run is
        one self-contained file that can be copied, archived and read from read-only media."""
        self.flush()
        self.checkpoint()
        try:
            self.db.execute("PRAGMA journal_mode=DELETE")
        except sqlite3.OperationalError:
            pass  # a reader still has it open: it stays in WAL mode, which is fine

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.db.close()

    def finish_and_close(self) -> None:
        """:meth:`finish` where the disk allows (a full or failing disk leaves the run in WAL
        mode, still a sound run), then :meth:`close`."""
        try:
            self.finish()
        except (sqlite3.Error, OSError):
            pass
        self.close()

    # --- reading -------------------------------------------------------------------------------
    # Readers are tolerant: a row whose columns do not hold what the schema says (a text or a
    # blob in a numeric column, NULL, inf, attributes that are not a JSON object, a point of an
    # unknown series) is skipped and counted in ``skipped`` (table -> rows), and the rest is read.
    # Where cheap the filter runs in SQL (``typeof``), else in Python.

    def _skip(self, table: str, n: int) -> None:
        if n:
            self.skipped[table] = self.skipped.get(table, 0) + n

    def series_keys(self, prefix: str = "") -> list[tuple[str, str]]:
        rows = self.db.execute(
            "SELECT name, entity FROM series WHERE name LIKE ? ORDER BY name, entity",
            (prefix + "%",),
        ).fetchall()
        return [(str(n), str(e)) for n, e in rows]

    def read(self, name: str, entity: str | None = None) -> list[Series]:
        """All series of metric ``name`` (one entity, or every entity), oldest first.

        Rolled-up buckets contribute their mean (their max for metrics whose mean is not a
        value they can take: bitmasks, link generations) at the bucket's start time."""
        if entity is None:
            ids = self.db.execute(
                "SELECT id, entity FROM series WHERE name=? ORDER BY entity", (name,)
            ).fetchall()
        else:
            ids = self.db.execute(
                "SELECT id, entity FROM series WHERE name=? AND entity=?", (name, entity)
            ).fetchall()
        col = "v" if rollup_has_v(self.db) else "vmax" if rollup_is_max(name) else "vmean"
        packs, bad = packed(self.db, [i for i, _ in ids]) if ids else ([], 0)
        self._skip("rollup_packs", bad)
        by_id: dict[int, list[tuple[float, float]]] = {}
        for sid, buckets in packs:
            by_id.setdefault(sid, []).extend(buckets)
        out: dict[int, Series] = {}
        ends: list[list[int]] = []
        for sid, ent in ids:
            s = out[sid] = Series(name, str(ent))
            for ts, v in by_id.get(sid, ()):
                s.ts.append(ts)
                s.v.append(v)
            ends.append([len(s.ts)])
            for ts, v in self.db.execute(
                # col is one of three fixed column names, never user input
                f"SELECT ts, {col} FROM rollup WHERE series=? AND {_finite('ts')} AND "
                f"{_finite(col)} UNION ALL SELECT ts, v FROM points WHERE series=? AND "
                f"{_finite('ts')} AND {_finite('v')} ORDER BY 1",
                (sid, sid),
            ):
                s.ts.append(float(ts))
                s.v.append(float(v))
            ends[-1].append(len(s.ts))
        # then the samples (schema version 7), once for every series asked for (what cannot be
        # read is skipped, counted by read_all as rows are)
        self._read_samples(out, unknown=False)
        for s, at in zip(out.values(), ends):
            _in_order(s, at)
        return list(out.values())

    def read_all(self) -> dict[tuple[str, str], Series]:
        """Every series in the run, keyed by (name, entity); unreadable rows are skipped."""
        names: dict[int, tuple[str, str]] = {}
        bad = 0
        for i, n, e in self.db.execute("SELECT id, name, entity FROM series"):
            if isinstance(i, int) and isinstance(n, str) and isinstance(e, str):
                names[i] = (n, e)
            else:
                bad += 1
        self._skip("series", bad)
        out: dict[tuple[str, str], Series] = {k: Series(*k) for k in names.values()}
        use_max = {sid for sid, (n, _) in names.items() if rollup_is_max(n)}
        # Packed buckets (the oldest) first, then rollup buckets, then points (rows of schema
        # version 6 and before), then samples, each in time order (the primary key's, no sort).
        # Rows are checked here rather than in SQL: typeof() filters cost SQLite more than these
        # tests cost Python. A series of another id, a value or time that is not a finite number
        # (text, blob, NULL, inf: "x - x" is NaN or raises) is skipped.
        packs, bad = packed(self.db)
        for sid, buckets in packs:
            key = names.get(sid)
            if key is None:  # a pack of no known series
                bad += 1
                continue
            s = out[key]
            s.ts += [ts for ts, _ in buckets]
            s.v += [v for _, v in buckets]
        self._skip("rollup_packs", bad)
        ends = {k: [len(s.ts)] for k, s in out.items()}
        if rollup_has_v(self.db):
            rollup: Iterable[tuple[Any, Any, Any]] = self.db.execute(
                "SELECT ts, series, v FROM rollup ORDER BY ts"
            )
        else:  # version 4 and before
            rollup = (
                (ts, sid, vmax if sid in use_max else vmean)
                for ts, sid, vmean, vmax in self.db.execute(
                    "SELECT ts, series, vmean, vmax FROM rollup ORDER BY ts"
                )
            )
        self._skip("rollup", _append_points(out, names, rollup))
        for k, s in out.items():
            ends[k].append(len(s.ts))
        self._skip(
            "points",
            _append_points(
                out, names, self.db.execute("SELECT ts, series, v FROM points ORDER BY ts")
            ),
        )
        for k, s in out.items():
            ends[k].append(len(s.ts))
        by_id = {sid: out[key] for sid, key in names.items()}
        self._skip("samples", self._read_samples(by_id, unknown=True))
        for k, at in ends.items():  # parts out of order: see _in_order
            _in_order(out[k], at)
        return out

    def _has_samples(self) -> bool:
        """Whether the store has a ``samples`` table (schema version 7; an older store opened
        read-only has none)."""
        return (
            self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='samples'"
            ).fetchone()
            is not None
        )

    def _read_samples(self, targets: dict[int, Series], *, unknown: bool) -> int:
        """Append the points of every sample to the series of ``targets`` (by id), in time
        order; returns how many samples could not be read (:func:`~stallscope.store.samples.
        unpack`), and with ``unknown`` the points of series not in ``targets`` too."""
        self.flush()  # this connection's own reads see every sample it was given
        if not self._has_samples():
            return 0
        return read_samples(self.db, targets, unknown=unknown)

    def entities(self, source: str | None = None) -> list[dict[str, Any]]:
        """Entities with their attributes (a JSON object); rows whose attributes are not one
        are skipped. A first/last time that is not a finite number reads as None."""
        q = "SELECT source, entity, attrs, first_ts, last_ts FROM entities"
        args: tuple[Any, ...] = ()
        if source is not None:
            q += " WHERE source=?"
            args = (source,)
        out = []
        bad = 0
        for s, e, a, f, la in self.db.execute(q + " ORDER BY source, entity", args):
            attrs = _json_object(a)
            if not (isinstance(s, str) and isinstance(e, str)) or attrs is None:
                bad += 1
                continue
            out.append(
                {
                    "source": s,
                    "entity": e,
                    "attrs": attrs,
                    "first_ts": _finite_or_none(f),
                    "last_ts": _finite_or_none(la),
                }
            )
        self._skip("entities", bad)
        return out

    def events(self) -> list[dict[str, Any]]:
        ok = (
            f"{_finite('ts')} AND typeof(source)='text' AND typeof(kind)='text' "
            "AND typeof(message)='text'"
        )
        out = [
            {"ts": ts, "source": s, "kind": k, "message": m}
            for ts, s, k, m in self.db.execute(
                f"SELECT ts, source, kind, message FROM events WHERE {ok} ORDER BY ts"
            )
        ]
        [(bad,)] = self.db.execute(f"SELECT COUNT(*) FROM events WHERE NOT ({ok})").fetchall()
        self._skip("events", int(bad))
        return out

    def steps(self, rank: int | None = None) -> list[StepRow]:
        # a run.db of the first release opened read-only (not migrated) may lack comm_s
        comm = (
            f"CASE WHEN {_finite('comm_s')} THEN comm_s END"
            if comm_column(self.db) == "comm_s"
            else "NULL"
        )
        # a row's step count: a run.db before version 3 has one step a row
        has_n = n_column(self.db) == "n"
        ok = _STEP_OK + (f" AND {_N_OK}" if has_n else "")
        q = f"SELECT {_STEP_COLUMNS}, {comm}, {'n' if has_n else '1'} FROM steps WHERE {ok}"
        args: tuple[Any, ...] = ()
        if rank is not None:
            q += " AND rank=?"
            args = (rank,)
        packed = self._packed_steps(rank)
        out = [StepRow(*row) for row in self.db.execute(q + " ORDER BY rank, step", args)]
        if rank is None:
            [(bad,)] = self.db.execute(f"SELECT COUNT(*) FROM steps WHERE NOT ({ok})").fetchall()
            self._skip("steps", int(bad))
        return merge_steps(packed, out) if packed else out

    def _packed_steps(self, rank: int | None) -> list[StepRow]:
        """The rows of the step packs (:func:`~stallscope.store.packs.packed_rows`); a pack that
        cannot be read is skipped and counted."""
        out, bad = packed_rows(self.db, rank)
        self._skip("step_packs", bad)
        return out

    def probes(self) -> list[dict[str, Any]]:
        out = []
        bad = 0
        for r, p, c, s, d, u in self.db.execute(
            "SELECT rank, pid, config, steps, dropped, updated FROM probes ORDER BY rank"
        ):
            if not all(isinstance(x, int) for x in (r, p, s, d)):
                bad += 1
                continue
            config = _json_object(c)
            out.append(
                {
                    "rank": r,
                    "pid": p,
                    "config": config if config is not None else {},
                    "steps": s,
                    "dropped": d,
                    "updated": _finite_or_none(u),
                }
            )
        self._skip("probes", bad)
        return out

    def time_range(self) -> tuple[float, float] | None:
        """First and last readable sample time (samples, points, rollup and its packs), None
        without samples."""
        lo = hi = None
        rolled = _ROLLUP_V_OK if rollup_has_v(self.db) else _ROLLUP_OK
        for table, ok in (("points", _POINT_OK), ("rollup", rolled)):
            # ORDER BY ts LIMIT 1 walks the primary key: a few rows, not the table
            for order in ("ASC", "DESC"):
                row = self.db.execute(
                    f"SELECT ts FROM {table} WHERE {ok} ORDER BY ts {order} LIMIT 1"
                ).fetchone()
                if row is None:
                    continue
                t = float(row[0])
                lo = t if lo is None or t < lo else lo
                hi = t if hi is None or t > hi else hi
        for span in (self._samples_span(), packed_span(self.db)):
            if span is None:
                continue
            lo = span[0] if lo is None or span[0] < lo else lo
            hi = span[1] if hi is None or span[1] > hi else hi
        if lo is None or hi is None:
            return None
        return lo, hi

    def _samples_span(self) -> tuple[float, float] | None:
        self.flush()
        return samples_span(self.db) if self._has_samples() else None

    def integrity_ok(self) -> bool:
        return bool(self.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok")


_NUM = (float, int)


def _in_order(s: Series, ends: Sequence[int]) -> None:
    """Sort ``s`` by time where its parts (each in time order, ending at ``ends``) are not
    one after the other: a bucket newer than a point (only in a damaged store), a bucket left a
    row (one a pack could not hold) older than a pack."""
    if any(0 < i < len(s.ts) and s.ts[i - 1] > s.ts[i] for i in ends):
        pairs = sorted(zip(s.ts, s.v))
        s.ts, s.v = [t for t, _ in pairs], [v for _, v in pairs]


def _append_points(
    out: dict[tuple[str, str], Series],
    names: dict[int, tuple[str, str]],
    rows: Iterable[tuple[Any, Any, Any]],
) -> int:
    """Append ``(ts, series id, value)`` rows to their series; returns how many rows were not
    a known series with a finite number at a finite time (skipped)."""
    bad = 0
    for ts, sid, v in rows:
        key = names.get(sid)
        if key is None or type(ts) not in _NUM or type(v) not in _NUM or ts - ts or v - v:
            bad += 1
            continue
        s = out[key]
        s.ts.append(float(ts))
        s.v.append(float(v))
    return bad


_finite_or_none = finite_or_none  # the one check (units.py)


def _json_object(text: Any) -> dict[str, Any] | None:
    """A stored JSON object, or None when it is not one (not text, not JSON, a list, nested
    too deep for the parser)."""
    if not isinstance(text, str):
        return None
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, dict) else None
