"""One run reader: everything a run recorded, loaded once per command into a :class:`RunData`.

The summary, the diagnosis and the report all read a ``RunData``; none of them opens ``run.db``
or looks at the machine. :func:`load_run` fills it from a run directory (``meta.json`` and
``run.db`` in one pass: a one-hour run at 1 Hz holds about a million points, and every extra
pass costs about a second). ``load_prometheus`` (:mod:`stallscope.analysis.promdata`) fills
the same structure from a Prometheus server: series by (metric, entity), entities with their
attributes, steps per rank.

Recorded facts the diagnosis uses (never read again from the machine, so a run copied elsewhere,
its dataset gone, gives the same diagnosis): ``meta.json`` (cores, RAM, ``dataset_bytes``,
``disk_health``, ``loader_config``) and the disk entities' sysfs facts (``device_info``).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stallscope.errors import UsageError
from stallscope.sources.stacks.aggregate import ranked_pids, read_records
from stallscope.sources.stacks.fetches import read_histograms
from stallscope.store import RunStore, Series, StepRow, read_meta
from stallscope.units import finite_or_none

T = TypeVar("T")

__all__ = ["RunData", "load_run"]


@dataclass
class RunData:
    """A stored run; times are UNIX seconds."""

    meta: dict[str, Any]
    series: dict[tuple[str, str], Series]
    steps: list[StepRow] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    entities: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: the sampled stacks' records, by time (``<run>/stacks/``; :mod:`stallscope.analysis.stacks`)
    stacks: list[dict[str, Any]] = field(default_factory=list)
    #: uncaught exceptions of the trainer's Python processes, by time (``<run>/errors.jsonl``,
    #: written by the hook ``run`` injects): ``{"ts", "pid", "error"}``
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: each process's batches' cost histogram (pid -> bucket -> batches; ``<run>/fetches/``,
    #: :mod:`stallscope.sources.stacks.fetches`): the DataLoader workers' batch by batch
    batch_costs: dict[int, dict[int, int]] = field(default_factory=dict)
    run_dir: Path = field(default_factory=Path)
    span: tuple[float, float] | None = None  #: first and last sample time, None if no samples
    #: rows of run.db that could not be read (a wrong type, NULL, inf...), by table; the rest of
    #: the run was read
    skipped: dict[str, int] = field(default_factory=dict)
    #: parts of run.db that could not be read at all (a table or column missing), in words
    unreadable: list[str] = field(default_factory=list)
    _roles: dict[str, str] | None = field(default=None, repr=False)
    _summary: dict[str, Any] | None = field(default=None, repr=False)
    _window: Any = field(default=None, repr=False)
    _facts: Any = field(default=None, repr=False)
    _axis: tuple[float, float] | None = field(default=None, repr=False)

    def skipped_note(self) -> str | None:
        """ "skipped 3 unreadable rows in run.db (points 3)", None when every row was read."""
        n = sum(self.skipped.values())
        if not n:
            return None
        where = ", ".join(f"{t} {k}" for t, k in sorted(self.skipped.items()))
        return f"skipped {n} unreadable row{'s' if n != 1 else ''} in run.db ({where})"

    # --- series ---------------------------------------------------------------------------------
    def get(self, name: str, entity: str = "") -> Series | None:
        return self.series.get((name, entity))

    def all(self, name: str) -> list[Series]:
        """Every series of metric ``name``, by entity order."""
        return [s for (n, _), s in sorted(self.series.items()) if n == name]

    def metric(self, name: str) -> dict[str, Series]:
        """Every series of metric ``name`` that has samples, by entity."""
        return {ent: s for (n, ent), s in sorted(self.series.items()) if n == name and s.v}

    # --- entities and facts ---------------------------------------------------------------------
    def entity_attrs(self, source: str, entity: str) -> dict[str, Any]:
        for e in self.entities:
            if e["source"] == source and e["entity"] == entity:
                attrs = e.get("attrs")
                return attrs if isinstance(attrs, dict) else {}
        return {}

    def roles(self) -> dict[str, str]:
        """pid -> role ("main", "worker", "launcher") of the trainer's processes."""
        if self._roles is None:
            from stallscope.sources.roles import infer_roles

            probe_pids = {str(p["pid"]) for p in self.probes if p.get("pid") is not None}
            probe_pids |= ranked_pids(self.stacks)  # trainers, whatever the tree looks like
            self._roles = infer_roles(
                [e for e in self.entities if e["source"] == "procs"], probe_pids
            )
        return self._roles

    def device_info(self) -> dict[str, dict[str, Any]]:
        """What sysfs said about each disk when the run recorded it (kind, rotational...)."""
        return {
            e["entity"]: e["attrs"]
            for e in self.entities
            if e["source"] == "disk" and isinstance(e.get("attrs"), dict) and e["attrs"]
        }

    @property
    def dataset_bytes(self) -> int | None:
        v = self.meta.get("dataset_bytes")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    @property
    def disk_health(self) -> list[dict[str, Any]]:
        return list(self.meta.get("disk_health") or [])

    def summary(self) -> dict[str, Any]:
        """The run's summary (:func:`stallscope.analysis.summary.summarize`), computed once."""
        if self._summary is None:
            from stallscope.analysis.summary import summarize

            self._summary = summarize(self)
        return self._summary

    def window(self) -> Any:
        """The training window (:func:`stallscope.analysis.window.window_of`), computed once:
        the summary and the diagnosis share it."""
        if self._window is None:
            from stallscope.analysis.window import window_of

            self._window = window_of(self)
        return self._window

    def facts(self) -> Any:
        """The run's facts (:func:`stallscope.analysis.facts.compute_facts`), computed once:
        every surface (show, diagnose, compare, report, runs) renders these, never figures of
        its own."""
        if self._facts is None:
            from stallscope.analysis.facts import compute_facts

            self._facts = compute_facts(self)
        return self._facts

    # --- time -----------------------------------------------------------------------------------
    @property
    def t0(self) -> float:
        """Start of the shared time axis (see :meth:`time_axis`)."""
        return self.time_axis()[0]

    @property
    def t1(self) -> float:
        return self.time_axis()[1]

    def time_axis(self) -> tuple[float, float]:
        """Start and end of a shared time axis: the run's start/end, its samples and steps."""
        if self._axis is None:
            self._axis = self._compute_axis()
        return self._axis

    def _compute_axis(self) -> tuple[float, float]:
        starts = [
            t
            for t in (_num(self.meta.get("start")), self.span[0] if self.span else None)
            if t is not None
        ]
        ends = [
            t
            for t in (_num(self.meta.get("end")), self.span[1] if self.span else None)
            if t is not None
        ]
        if self.steps:
            starts.append(min(s.ts - s.wait_s for s in self.steps))
            ends.append(max(s.ts + s.host_s for s in self.steps))
        t0 = min(starts) if starts else 0.0
        t1 = max(ends) if ends else t0
        return t0, (t1 if t1 > t0 else t0 + 1.0)


def pick_training(data: RunData, run_id: str | None = None) -> str | None:
    """An agent's store holds the processes of every training it followed (their ``run``
    attribute): keep one, so a diagnosis speaks of one training. ``run_id`` chooses it (an id
    or a prefix); by default the one with the most process points. Records the choice in
    ``meta["training"]`` and every training seen, with its process points, in
    ``meta["trainings"]``; returns the choice (None when the store followed none)."""
    procs = {
        str(e["entity"]): str((e.get("attrs") or {}).get("run") or "")
        for e in data.entities
        if e.get("source") == "procs"
    }
    points: dict[str, int] = {}
    for (name, ent), ser in data.series.items():
        if name.startswith("procs.") and procs.get(ent):
            points[procs[ent]] = points.get(procs[ent], 0) + len(ser.ts)
    if not points:
        return None
    if run_id is not None:
        matches = [r for r in points if r == run_id] or [r for r in points if r.startswith(run_id)]
        if len(matches) != 1:
            known = ", ".join(sorted(points))
            raise UsageError(
                f"{'no' if not matches else 'more than one'} training "
                f"{run_id!r} in this agent store (it followed: {known})"
            )
        chosen = matches[0]
    else:
        chosen = max(points, key=lambda r: (points[r], r))
    gone = {ent for ent, r in procs.items() if r != chosen}
    data.entities = [
        e for e in data.entities if not (e.get("source") == "procs" and str(e["entity"]) in gone)
    ]
    for key in [k for k in data.series if k[0].startswith("procs.") and k[1] in gone]:
        del data.series[key]
    data._roles = None
    data.meta["training"] = chosen
    data.meta["trainings"] = dict(sorted(points.items()))
    return chosen


def load_run(run_dir: Path, training: str | None = None) -> RunData:
    """Read ``meta.json`` and ``run.db`` of ``run_dir`` once (raises RunNotFound when absent).

    Damaged stores are read as far as they can be: unreadable rows are skipped and counted in
    ``RunData.skipped``; a missing optional table (steps, probes, entities, events) or column
    reads as empty and is named in ``RunData.unreadable``. A run without its series or points
    raises (one line through the CLI)."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    store = RunStore(run_dir / "run.db", readonly=True)
    unreadable: list[str] = []

    def optional(what: str, read: Callable[[], list[T]]) -> list[T]:
        try:
            return read()
        except sqlite3.OperationalError as exc:
            if not str(exc).startswith(("no such table", "no such column")):
                raise
            unreadable.append(f"{what} ({exc})")
            return []

    try:
        series = store.read_all()
        entities = optional("entities", store.entities)
        data = RunData(
            meta=meta,
            series=series,
            steps=optional("steps", store.steps),
            probes=optional("probes", store.probes),
            entities=[_clean_entity(e) for e in entities],
            events=optional("events", store.events),
            run_dir=run_dir,
            stacks=read_records(run_dir),
            errors=read_errors(run_dir),
            batch_costs=read_histograms(run_dir),
            span=_span(series),
            skipped=dict(store.skipped),
            unreadable=unreadable,
        )
    finally:
        store.close()
    if "agent" in meta:  # a node agent's store: one training at a time (pick_training)
        pick_training(data, training)
    elif training is not None:
        raise UsageError(
            f"{run_dir.name} is one training's run, not an agent's store: "
            "--run-id chooses among the trainings an agent followed"
        )
    return data


#: the most of errors.jsonl read (a line a crashed process; a few kB in practice)
MAX_ERRORS_BYTES = 1 << 20


def read_errors(run_dir: Path) -> list[dict[str, Any]]:
    """The trainer's uncaught exceptions the run recorded (regular file, bounded; lines that
    are not such records are skipped), by time."""
    import json

    from stallscope.safefile import read_bounded

    try:
        raw, _more = read_bounded(run_dir / "errors.jsonl", MAX_ERRORS_BYTES)
    except OSError:
        return []
    out = []
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(rec, dict)
            and isinstance(rec.get("error"), str)
            and isinstance(rec.get("ts"), (int, float))
            and math.isfinite(rec["ts"])
        ):
            out.append({"ts": float(rec["ts"]), "pid": rec.get("pid"), "error": rec["error"][:500]})
    return sorted(out, key=lambda r: r["ts"])


def _span(series: dict[tuple[str, str], Series]) -> tuple[float, float] | None:
    """First and last sample time of the series read (each is sorted by time)."""
    firsts = [s.ts[0] for s in series.values() if s.ts]
    if not firsts:
        return None
    return min(firsts), max(s.ts[-1] for s in series.values() if s.ts)


#: process attributes readers compare and hash (roles, names): anything else is dropped
_PROC_TEXT = ("name", "cmdline", "role")


def _clean_entity(e: dict[str, Any]) -> dict[str, Any]:
    """A process entity whose name, command line or role is not text, or whose parent is not a
    process id, loses that attribute (a foreign or damaged store), so role inference and the
    summary can compare them."""
    if e["source"] != "procs":
        return e
    attrs = dict(e["attrs"])
    for k in _PROC_TEXT:
        if k in attrs and not isinstance(attrs[k], str):
            del attrs[k]
    ppid = attrs.get("ppid")
    if ppid is not None and (not isinstance(ppid, (int, str)) or isinstance(ppid, bool)):
        del attrs["ppid"]
    return dict(e, attrs=attrs)


_num = finite_or_none  # the one check (units.py)
