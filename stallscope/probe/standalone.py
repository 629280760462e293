"""The probe's own monitored session, for trainers started without ``stallscope run``.

Everything the probe does beyond recording steps when nobody else watches the run lives here:
making the run directory, writing ``meta.json``, sampling GPU, disk, host and the process tree,
and finishing ``meta.json`` at exit, through the same
:class:`~stallscope.collect.session.Session` that ``stallscope run`` uses, so ``meta.json`` has
the same keys whichever started the run. The interface is narrow (:func:`start_standalone` ->
:class:`StandaloneRun` with ``start_sampling()`` and ``finish()``).

Imports of the session, the store and the sources stay inside the functions: importing the
probe must stay light, and none of them is needed under ``stallscope run``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from stallscope.probe.notices import LOGGER, warn

if TYPE_CHECKING:
    from stallscope.collect.session import Session

__all__ = [
    "DEFAULT_COLLECT_S",
    "ExitStatus",
    "StandaloneRun",
    "default_label",
    "env_int",
    "interval_from_env",
    "standalone_rules",
    "start_standalone",
]

#: seconds between machine samples of the standalone collector (env STALLSCOPE_INTERVAL)
DEFAULT_COLLECT_S = 5.0


#: the launcher's rank and world size variables this probe reads, at most this (a million ranks)
MAX_RANKS = 1 << 20


def env_int(name: str) -> int | None:
    """``$name`` as an int from 0 to :data:`MAX_RANKS` (a rank or a world size), None when
    unset; anything else is said once and counts as unset."""
    from stallscope.envvars import env_number

    v = env_number(name, int, 0, MAX_RANKS, -1, instead="ignored", logger=LOGGER)
    return None if v < 0 else v


def interval_from_env() -> float:
    """``$STALLSCOPE_INTERVAL`` seconds, between 0.1 and 3600 as ``--interval``, else
    :data:`DEFAULT_COLLECT_S` (said once if bad: ``inf`` or ``1e309`` would stop the collector's
    thread)."""
    from stallscope.envvars import env_number

    return env_number(
        "STALLSCOPE_INTERVAL", float, 0.1, 3600, DEFAULT_COLLECT_S, kind="seconds", logger=LOGGER
    )


def group_from_env() -> float:
    """``$STALLSCOPE_GROUP_MS`` as seconds (0: a step record per step), else
    :data:`~stallscope.probe.buffer.GROUP_S` (said once if bad)."""
    from stallscope.envvars import env_number
    from stallscope.probe.buffer import GROUP_S

    return (
        env_number(
            "STALLSCOPE_GROUP_MS",
            float,
            0,
            60_000,
            GROUP_S * 1000.0,
            kind="milliseconds",
            logger=LOGGER,
        )
        / 1000.0
    )


def default_label() -> str:
    """The run's name: the training script's (``train`` for ``python train.py``)."""
    return Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"


def _shared_run_dir(out: Path, label: str) -> tuple[Path | None, int]:
    """The run directory all ranks started by one launcher agree on: named after the launcher
    (parent) process's start time and pid. Returns (dir, launcher pid)."""
    import psutil

    ppid = os.getppid()
    try:
        started = psutil.Process(ppid).create_time()
    except psutil.Error:
        return None, os.getpid()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    path = out / f"{stamp}-{label}-ddp{ppid}"
    path.mkdir(parents=True, exist_ok=True)
    return path, ppid


def standalone_rules() -> Any:
    """The alert rules of a standalone run: ``$STALLSCOPE_ALERTS`` (a rules file, as for
    ``stallscope run --alerts``) over the shipped defaults; the defaults alone when it is unset
    or wrong (said once)."""
    from stallscope.alerts import load_rules, parse_rules
    from stallscope.errors import UsageError

    path = os.environ.get("STALLSCOPE_ALERTS")
    if path:
        try:
            return load_rules(path)
        except UsageError as exc:
            from stallscope.textsafe import plain

            # the file's name is the user's text: the error quoting it is shown, clipped
            warn(
                f"STALLSCOPE_ALERTS: {plain(str(exc).splitlines()[0], 300)}; using the "
                "shipped alert rules"
            )
    return parse_rules({}, "defaults")


class ExitStatus:
    """The trainer's exit status as ``meta.json`` records it: 1 once an uncaught exception
    reached ``sys.excepthook`` (which still runs as before), else 0. Installed when made, on the
    training thread (a crash in the first step must still be seen); :meth:`restore` puts the
    previous hook back."""

    def __init__(self) -> None:
        self.code = 0
        prev = self._prev = sys.excepthook

        def hook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            self.code = 1  # an uncaught exception ends the process with status 1
            prev(tp, value, tb)

        sys.excepthook = hook

    def restore(self) -> None:
        sys.excepthook = self._prev


class StandaloneRun:
    """A monitored session of the probe's own: its run directory and, on the lead process (the
    node's local rank 0), a :class:`~stallscope.collect.session.Session` sampling the machine.
    Other ranks only write steps into ``run_dir``; their ``start_sampling`` and ``finish`` do
    nothing."""

    def __init__(
        self, run_dir: Path, *, meta: dict[str, Any] | None, root_pid: int, interval: float
    ) -> None:
        self.run_dir = run_dir
        self.lead = meta is not None
        self._meta = meta
        self._root_pid = root_pid
        self._interval = interval
        self._session: Session | None = None

    def start_sampling(self) -> None:
        """Start sampling GPU, disk, host and the process tree in a background thread. Called
        once the probe's own store has made the run database; may raise (the caller reports
        it, steps are recorded all the same)."""
        if self._meta is None:
            return
        from stallscope.alerts.actions import AlertSink
        from stallscope.collect.session import Session

        alerts = AlertSink(standalone_rules(), run=str(self.run_dir))
        alerts.attach_run(self.run_dir)
        self._session = Session(self.run_dir, self._meta, interval=self._interval, sinks=[alerts])
        self._session.watch(self._root_pid)

    def finish(
        self,
        exit_code: int,
        probe_stats: Mapping[str, Any],
        loader_config: Mapping[str, Any] | None,
    ) -> None:
        """Stop sampling and complete ``meta.json`` as ``stallscope run`` does (the session
        records end, exit code, samples, roles and ``loader_config`` from the run's probes),
        plus the probe's counts (``probe``). ``loader_config`` ({str(rank): config}) is the
        probe's own view, used when the store holds none."""
        meta = self._meta
        if meta is None:
            return
        if loader_config:
            meta["loader_config"] = dict(loader_config)
        if self._session is not None:
            self._session.finish(exit_code, probe=dict(probe_stats))
            return
        from stallscope.store import write_meta

        meta["end"] = time.time()
        meta["exit_code"] = exit_code
        meta["samples"] = 0
        meta["probe"] = dict(probe_stats)
        write_meta(self.run_dir, meta)


def start_standalone(label: str, interval: float, *, start: float) -> StandaloneRun:
    """Set up a monitored session for a trainer that ``stallscope run`` does not watch: a new
    run directory under ``$STALLSCOPE_OUT`` (default ``./stallscope-runs``) named after
    ``label``, with ``meta.json`` (command, ``start`` wall time, versions, ``interval`` of
    machine samples). Ranks started together by one launcher (torchrun: ``$LOCAL_WORLD_SIZE`` or
    ``$WORLD_SIZE`` > 1) share one directory named after the launcher; only the node's local
    rank 0 writes ``meta.json`` and samples the machine. Raises when no directory can be made."""
    from stallscope.store import base_meta, new_run_dir, write_meta
    from stallscope.store.paths import default_out, out_problem
    from stallscope.textsafe import plain

    out = default_out()
    why = out_problem(out)
    if why:  # said by the writer as why no run is written; the training goes on
        raise ValueError(f"$STALLSCOPE_OUT {plain(out, 100)} {why}")
    lead, root_pid, run_dir = True, os.getpid(), None
    world = env_int("LOCAL_WORLD_SIZE") or env_int("WORLD_SIZE") or 1
    if world > 1:
        # ranks launched together (torchrun) share one run directory named after their
        # launcher; the node's local rank 0 samples the machine for all of them
        run_dir, root_pid = _shared_run_dir(Path(out), label)
        lead = (env_int("LOCAL_RANK") or 0) == 0
    if run_dir is None:
        run_dir = new_run_dir(out, label)
    if lead:
        from stallscope.store.index import record_run

        record_run(run_dir)
    if not lead:
        return StandaloneRun(run_dir, meta=None, root_pid=root_pid, interval=interval)
    meta = base_meta(list(sys.argv), start=start, interval_s=interval, mode="probe", pid=root_pid)
    write_meta(run_dir, meta)
    return StandaloneRun(run_dir, meta=meta, root_pid=root_pid, interval=interval)
