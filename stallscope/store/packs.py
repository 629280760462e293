"""The step packs of ``run.db`` in SQLite (:mod:`stallscope.store.steppack` makes and reads a
pack's bytes): which rows are packed and when, reading them back, and merging them with the
rows still rows. Used by :class:`~stallscope.store.db.RunStore` and by the readers that follow a
run as it goes (:func:`packed_steps_after`)."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Mapping

from stallscope.store.rows import StepRow
from stallscope.store.schema import _finite, step_ranks
from stallscope.store.steppack import pack_us, unpack

__all__ = [
    "PACK_ROWS",
    "STEPS_PLAIN_S",
    "merge_steps",
    "pack_rows",
    "packed_rows",
    "packed_steps_after",
]

#: step rows are packed (:meth:`RunStore.pack_steps`) once this old (seconds): every reader
#: that follows a run as it goes reads them as rows long before
STEPS_PLAIN_S = 300.0
#: rows a step pack holds at most (at 100 steps/s about ten minutes: ~300 kB unpacked, ~200 kB
#: as Python rows); the rows of one packing are split into packs of equal size: a pack of the
#: few rows past a limit compressed half as well, and each pack leaves ~2 kB of its last page
#: unused (at 20,000, the limit before, 100 steps/s packed every 5 minutes made a pack of 20,000
#: rows and one of ~100 each time)
PACK_ROWS = 40000


def pack_rows(db: sqlite3.Connection, older_than: float) -> int:
    """Pack the step rows of a time before ``older_than`` (:data:`PACK_ROWS` rows a pack at
    most), inside the caller's transaction; returns how many rows. The rows left as rows are
    the newer ones (what the readers that follow a run as it goes read: the live view, the
    agent, the collector's steps source, mirrors), those a reader would skip as unreadable (still
    counted as skipped) and those beyond what a pack holds."""
    # times as whole microseconds, converted by SQLite (as steppack.us would, in C)
    comm = f"CASE WHEN {_finite('comm_s')} THEN CAST(round(comm_s * 1e6) AS INTEGER) END"
    cond = f"rank=? AND ts<? AND {_PACKABLE}"
    cols = ", ".join(
        ["step"]
        + [f"CAST(round({c} * 1e6) AS INTEGER)" for c in _PACKED_TIMES]
        + ["samples", "epoch"]
    )
    done = 0
    for rank in step_ranks(db):
        rows = db.execute(
            f"SELECT {cols}, {comm}, n FROM steps WHERE {cond} ORDER BY step",
            (rank, older_than),
        ).fetchall()
        if not rows:
            continue
        # every row of the time packs (the rule): the rows of each pack's steps go by key
        # alone, without the check again (a third of the time)
        (old,) = db.execute(
            "SELECT COUNT(*) FROM steps WHERE rank=? AND ts<?", (rank, older_than)
        ).fetchone()
        drop = ("rank=? AND ts<?" if old == len(rows) else cond) + " AND step BETWEEN ? AND ?"
        size = -(-len(rows) // -(-len(rows) // PACK_ROWS))  # equal packs, PACK_ROWS at most
        for i in range(0, len(rows), size):
            part = rows[i : i + size]
            first, last = part[0][0], part[-1][0]
            db.execute(
                "INSERT OR REPLACE INTO step_packs VALUES(?, ?, ?, ?, ?)",
                (rank, last, first, len(part), pack_us(part)),
            )
            db.execute(f"DELETE FROM steps WHERE {drop}", (rank, older_than, first, last))
        done += len(rows)
    return done


def packed_rows(db: sqlite3.Connection, rank: int | None) -> tuple[list[StepRow], int]:
    """The rows of the step packs (none in a store before schema version 4) in (rank, step)
    order, and how many packs could not be read (left out)."""
    if not _has_packs(db):
        return [], 0
    q = "SELECT rank, data FROM step_packs"
    args: tuple[int, ...] = ()
    if rank is not None:
        q += " WHERE rank=?"
        args = (rank,)
    out: list[StepRow] = []
    bad = 0
    for r, data in db.execute(q + " ORDER BY rank, last", args):
        try:
            rows = unpack(data)
        except ValueError:
            bad += 1
            continue
        if not isinstance(r, int):
            bad += 1
            continue
        out += [StepRow(r, *row) for row in rows]
    return out, bad


def _has_packs(db: sqlite3.Connection) -> bool:
    return bool(
        db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='step_packs'"
        ).fetchone()
    )


def packed_steps_after(conn: sqlite3.Connection, last: Mapping[int, int]) -> list[StepRow]:
    """The packed step rows after each rank's last step read (``last``; every packed row of a
    rank not in it), in (rank, step) order: what a reader that follows a run as it goes (reading
    the ``steps`` rows after its cursor) did not see because they were packed first (it began
    following the run late, or paused longer than :data:`STEPS_PLAIN_S`). Read them in the
    same read transaction as the rows, so that no row is in neither or both. A pack that cannot
    be read is left out; [] for a store before schema version 4."""
    if not conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='step_packs'"
    ).fetchone():
        return []
    out: list[StepRow] = []
    for (rank,) in conn.execute("SELECT DISTINCT rank FROM step_packs ORDER BY rank").fetchall():
        if not isinstance(rank, int):
            continue
        after = last.get(rank, -(1 << 62))
        for (data,) in conn.execute(
            "SELECT data FROM step_packs WHERE rank=? AND last>? ORDER BY last", (rank, after)
        ).fetchall():
            try:
                rows = unpack(data)
            except ValueError:
                continue
            out += [StepRow(rank, *r[:9], r[9], r[10]) for r in rows if r[0] > after]
    return out


#: the time columns of a step row before ``samples``, in a pack's order
_PACKED_TIMES = ("ts", "wait_s", "host_s", "h2d_s", "gpu_busy_s", "gpu_idle_s")

#: SQL: a readable step row whose values a pack holds (64-bit whole microseconds and their
#: differences: times within ~3,000 years of 1970, counts under 2**60); others stay rows
#: (what the readers read: the store's _STEP_OK and _N_OK, in fewer terms: a finite number is
#: one under 1e11 here, an abs() that excludes inf; tested equal on unreadable rows)
_BIG = 1152921504606846976  # 2**60
_PACKABLE = " AND ".join(
    [f"typeof(step) = 'integer' AND abs(step) < {_BIG}"]
    + [f"typeof({c}) IN ('real', 'integer') AND abs({c}) < 1e11" for c in _PACKED_TIMES[:3]]
    + [
        f"({c} IS NULL OR (typeof({c}) IN ('real', 'integer') AND abs({c}) < 1e11))"
        for c in _PACKED_TIMES[3:]
    ]
    + [
        f"({c} IS NULL OR (typeof({c}) = 'integer' AND abs({c}) < {_BIG}))"
        for c in ("samples", "epoch")
    ]
    + [f"typeof(n) = 'integer' AND n >= 1 AND n < {_BIG}", "abs(coalesce(comm_s, 0)) < 1e11"]
)


def merge_steps(packed: list[StepRow], rows: list[StepRow]) -> list[StepRow]:
    """Packed rows and rows (each in (rank, step) order) in (rank, step) order; a row written
    again after its step was packed (a recorder restarted on the same rank) wins over the
    packed one, as ``INSERT OR REPLACE`` made it win over the row it replaced."""
    by_rank: dict[int, list[StepRow]] = {}
    for r in rows:  # the newest minutes: few
        by_rank.setdefault(r.rank, []).append(r)
    out: list[StepRow] = []
    for rank, group in itertools.groupby(packed, key=lambda r: r.rank):
        part = list(group)
        mine = by_rank.pop(rank, [])
        if mine and part[-1].step >= mine[0].step:  # overlapping: the later write stays
            keep = {r.step: r for r in part}
            keep.update((r.step, r) for r in mine)
            part, mine = [keep[k] for k in sorted(keep)], []
        out += part
        out += mine
    if by_rank:  # ranks with rows only
        for mine in by_rank.values():
            out += mine
        out.sort(key=lambda r: r.rank)  # stable: each rank's rows stay in step order
    return out
