"""A monitored session: the run directory, ``meta.json``, the sources, the collector and its
sinks, set up and finished in one place.

``stallscope run`` and the standalone probe both use it (and the agent will), so ``meta.json``
has the same keys whichever started the run. The facts the diagnosis needs about the machine are
recorded here, at run time (cores, RAM, the dataset's size, SMART of its drive; each disk's
sysfs facts go with its entity), so that a run directory diagnosed later, or on another machine,
gives the same answer.

Typical use::

    session = Session.create(out, label, command, interval=5.0, data="/data")
    session.watch(child.pid)          # the process tree to follow; starts sampling
    ...
    session.finish(exit_code)         # stop, record roles and loader config, close
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallscope.collect.collector import Collector
from stallscope.collect.sinks import Sink, StoreSink
from stallscope.errors import StallscopeError, UsageError
from stallscope.sources import SOURCE_NAMES, open_sources
from stallscope.sources.owner import read_owner
from stallscope.store import RunStore, base_meta, new_run_dir, write_meta
from stallscope.store.index import record_run
from stallscope.store.rundir import writer_stamp

__all__ = ["Session", "data_devices", "dataset_bytes"]

log = logging.getLogger("stallscope.collect")

#: seconds the background walk of the dataset may take before its size is left unknown
DATASET_WALK_S = 10.0
#: the default sampling: every second for the first two minutes (a short run, or the start of
#: a long one, gets enough samples to show its shape), then every 5 s (a week-long run stays
#: cheap: about 0.03% of one core, and its run.db bounded)
DEFAULT_INTERVAL_S = 5.0
DEFAULT_WARMUP = (1.0, 120.0)


def data_devices(path: str | None) -> tuple[list[str], str | None]:
    """Block devices under the dataset path, and a note when they cannot be found."""
    if path is None:
        return [], None
    if not os.path.exists(path):
        raise UsageError(f"--data {path}: no such file or directory")
    try:
        from stallscope.sources.blockdev import devices_for_path
    except ImportError:
        return [], "disk source not available"
    try:
        devs = devices_for_path(path)
    except (OSError, ValueError, StallscopeError) as exc:  # e.g. mountinfo unreadable: go on
        return [], f"cannot map {path} to a block device: {exc}"
    if not devs:
        return [], f"{path} is not on a local block device (tmpfs or network filesystem?)"
    return list(devs), None


def dataset_bytes(path: str, budget_s: float = DATASET_WALK_S) -> int | None:
    """Size of the dataset folder (or file), or None if walking it takes longer than
    ``budget_s``."""
    total = 0
    deadline = time.monotonic() + budget_s
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        for root, _dirs, files in os.walk(path):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_size
                except OSError:
                    continue
            if time.monotonic() > deadline:
                return None
    except OSError:
        return None
    return total


#: seconds between reads of the slow facts of a run (the trainer's cgroup read limits)
FACTS_S = 2.0


class Session:
    """One monitored run: see the module docstring."""

    def __init__(
        self,
        run_dir: Path,
        meta: dict[str, Any],
        *,
        interval: float,
        warmup: tuple[float, float] | None = None,
        keep_full_s: float = 3600.0,
        sinks: Sequence[Sink] = (),
        unavailable: dict[str, str] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.meta = meta
        self.interval = interval
        self.warmup = warmup
        if warmup is not None:
            meta["warmup_interval_s"], meta["warmup_s"] = warmup
        self.store = RunStore(run_dir / "run.db")
        self.store_sink = StoreSink(self.store, keep_full_s=keep_full_s)
        self.sinks: list[Sink] = [self.store_sink, *sinks]
        write_meta(run_dir, meta)
        # the machine-wide sources open before the trainer starts: NVML init takes a moment and
        # the first sample should see the trainer from its start
        self.sources, self.unavailable = open_sources(SOURCE_NAMES)
        self.unavailable.update(unavailable or {})
        # the probe's steps, summarised per rank for the alert engine (data-wait share, slow
        # rank), and SMART of the dataset's drives, for the alerts
        drives = list(meta.get("data_devices") or ())
        more, why = open_sources(
            ("probe", "smart") if drives else ("probe",), run_dir=run_dir, smart_devices=drives
        )
        self.sources += more
        self.unavailable.update(why)
        self.collector: Collector | None = None
        self._facts: threading.Thread | None = None
        self._health: list[dict[str, Any]] = []
        #: the trainer's cgroup read limits per device, bytes/s (the latest seen)
        self._read_limits: dict[str, int] = {}
        self._facts_stop = threading.Event()
        self._dataset_bytes: list[int] = []
        #: every process's CPU time when the watching began (sources/others.py), and when
        self._others: dict[int, tuple[float, str, float, float]] | None = None
        self._others_at = 0.0
        self.finished = False
        #: what :meth:`finish` could not write, in words (empty when everything was recorded)
        self.not_recorded: list[str] = []

    @classmethod
    def create(
        cls,
        out: str | os.PathLike[str],
        label: str,
        command: list[str],
        *,
        interval: float,
        warmup: tuple[float, float] | None = None,
        data: str | None = None,
        keep_full_s: float = 3600.0,
        sinks: Sequence[Sink] = (),
        **meta_extra: Any,
    ) -> Session:
        """A new run directory under ``out`` (raises UsageError for a bad ``data`` path or an
        output directory that cannot be made)."""
        devices, note = data_devices(data)
        run_dir = new_run_dir(out, label)
        record_run(run_dir)
        meta = base_meta(
            command,
            start=time.time(),
            interval_s=interval,
            data=data,
            data_devices=devices,
            **meta_extra,
        )
        if isinstance(meta.get("monitor_pid"), int):
            meta["monitor_stamp"] = writer_stamp(meta["monitor_pid"])  # known again later
        try:
            return cls(
                run_dir,
                meta,
                interval=interval,
                warmup=warmup,
                keep_full_s=keep_full_s,
                sinks=sinks,
                unavailable={"data": note} if note else None,
            )
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise

    @property
    def samples(self) -> int:
        return self.collector.samples if self.collector is not None else 0

    def add_source(self, source: Any) -> str | None:
        """Open one more source for this run (before :meth:`watch`); the reason it cannot
        work, else None."""
        from stallscope.errors import SourceUnavailable

        try:
            source.open()
        except SourceUnavailable as exc:
            self.unavailable[source.name] = str(exc)
            return str(exc)
        self.sources.append(source)
        return None

    def watch(self, root_pid: int, exclude: frozenset[int] = frozenset()) -> None:
        """Follow the process tree under ``root_pid`` and start sampling; the ``exclude`` pids
        and what they start are never part of it (``run --pid``: stallscope itself)."""
        procs, more = open_sources(("procs",), root_pid=root_pid, exclude=exclude)
        self.unavailable.update(more)
        self.meta["unavailable"] = self.unavailable
        self.meta["pid"] = root_pid
        self.meta["pid_stamp"] = writer_stamp(root_pid)
        owner = read_owner(root_pid)
        if owner.known:  # the pod or Slurm job the trainer runs in (sources/owner.py)
            self.meta["owner"] = owner.record()
        write_meta(self.run_dir, self.meta)
        self._others_at = time.time()
        try:  # who else uses the cores, from now to the end (sources/others.py)
            from stallscope.sources.others import cpu_snapshot

            self._others = cpu_snapshot()
        except Exception:  # a nicety: never a reason not to watch the training
            self._others = None
        self._facts = threading.Thread(
            target=self._record_facts, args=(root_pid,), name="stallscope-facts", daemon=True
        )
        self._facts.start()
        self.collector = Collector(
            self.sources + procs,
            self.sinks,
            interval=self.interval,
            warmup=self.warmup,
            unavailable=self.unavailable,
        )
        self.collector.start()

    def _record_facts(self, root_pid: int) -> None:
        """Slow facts, off the main path: SMART of the dataset's drives, the dataset's size,
        and the read limits of the trainer's cgroup (read until the run ends: a wrapper may
        join a cgroup after it started, as ``docker``'s and ``examples/constrain.py`` do)."""
        self._note_read_limits(root_pid)
        devices = self.meta.get("data_devices") or []
        if devices:
            from stallscope.sources.smart import check_drives

            drives, _notes = check_drives(devices)
            self._health.extend(d.to_json() for d in drives)
        path = self.meta.get("data")
        if path:
            size = dataset_bytes(path)
            if size:
                self._dataset_bytes.append(size)
        # the cgroup's read limits change rarely: every FACTS_S, whatever the interval (at
        # --interval 0.25 reading them each interval was a tenth of the monitor's CPU)
        while not self._facts_stop.wait(FACTS_S):
            self._note_read_limits(root_pid)

    def _note_read_limits(self, root_pid: int) -> None:
        from stallscope.sources.cgroup import read_limits

        limits = read_limits(root_pid)
        if limits:
            self._read_limits = limits

    def finish(self, exit_code: int | None, **meta_extra: Any) -> dict[str, Any]:
        """Stop sampling, record what the whole run shows (process roles, the probes' loader
        configuration, the slow facts) and close the run. Returns the final ``meta.json``.

        Never raises for a store or a run directory that cannot be written (a full disk, a
        removed directory): what could not be recorded is listed in :attr:`not_recorded` (and
        said on stderr), and the caller goes on to return the trainer's exit code."""
        if self.finished:
            return self.meta
        self.finished = True
        if self.collector is not None:
            self.collector.stop()
        else:
            for src in self.sources:
                src.close()
        meta = self.meta
        meta["end"] = time.time()
        meta["exit_code"] = exit_code
        meta["samples"] = self.samples
        meta.update(meta_extra)
        if self._facts is not None:
            self._facts_stop.set()
            self._facts.join(timeout=30)
            if self._read_limits:
                meta["read_limits"] = dict(self._read_limits)
            if meta.get("data_devices"):
                meta["disk_health"] = list(self._health)
            if self._dataset_bytes:
                meta["dataset_bytes"] = self._dataset_bytes[0]
        self._record_others(meta)
        try:
            self._record_roles()
            probes = self.store.probes()
        except (sqlite3.Error, OSError) as exc:
            self.not_recorded.append(f"process roles ({exc})")
            probes = []
        if probes:  # the probe's view of the DataLoader, per rank
            meta["loader_config"] = {str(p["rank"]): p["config"] for p in probes}
        if self.store_sink.errors:
            self.not_recorded.insert(
                0,
                f"{self.store_sink.errors} of {self.samples} samples "
                f"(could not write {self.store.path})",
            )
        try:
            write_meta(self.run_dir, meta)
        except OSError as exc:
            (self.run_dir / "meta.json.tmp").unlink(missing_ok=True)
            self.not_recorded.append(
                f"the end of the run in meta.json (end time, exit code {exit_code}, sample "
                f"count: {exc.strerror or exc}); it still says the run started"
            )
        self.store.finish_and_close()
        if self.not_recorded:
            log.warning("not recorded: %s", "; ".join(self.not_recorded))
        return meta

    def _record_others(self, meta: dict[str, Any]) -> None:
        """``busy_others``: the processes outside the training's tree that used the most CPU
        during the run (each ≥ 5% of a core)."""
        before = self._others
        if before is None:
            return
        try:
            from stallscope.sources.others import busiest_others, cpu_snapshot

            tree = {
                int(e["entity"])
                for e in self.store.entities("procs")
                if str(e.get("entity", "")).isdigit()
            }
            tree |= {os.getpid(), int(meta.get("pid") or 0)}
            seconds = time.time() - self._others_at
            meta["busy_others"] = busiest_others(
                before, cpu_snapshot(), seconds, tree, self._others_at
            )
        except Exception as exc:  # a nicety: the run's record goes on without it
            self.not_recorded.append(f"the busiest other processes ({exc})")

    def _record_roles(self) -> None:
        """The procs entities' ``role`` as the whole run shows it (the probe's pid, DataLoader
        workers' parents, launchers): the sampler only knew the tree's root."""
        from stallscope.sources.roles import infer_roles
        from stallscope.sources.stacks.aggregate import ranked_pids, read_records

        procs = self.store.entities("procs")
        trainers = {str(p["pid"]) for p in self.store.probes()}
        trainers |= ranked_pids(read_records(self.run_dir))  # whatever the tree shows
        roles = infer_roles(procs, trainers)
        self.store.set_attrs(
            "procs",
            {e["entity"]: dict(e["attrs"], role=roles.get(e["entity"], "worker")) for e in procs},
        )

    def discard(self) -> None:
        """The trainer could not even start: remove the run directory."""
        for src in self.sources:
            try:
                src.close()
            except Exception:
                pass
        self.store.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
