"""One node agent: the machine-wide sources, the collector, its two sinks (Prometheus and the
local run store) and the HTTP server, started and stopped in one place.

The order matters: the listening socket is bound first (a port in use is one line and nothing
is created), then the sources open (NVML init), then the run directory, then sampling and
serving. :meth:`Agent.stop` stops serving, takes a last sample, closes the sources and finishes
the store (``meta.json`` end time, sample count; ``run.db`` out of WAL mode).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from stallscope.agent.config import AgentConfig, parse_listen
from stallscope.agent.exporter import PrometheusSink
from stallscope.agent.memory import STORE_CACHE_KIB, TrimSink
from stallscope.agent.server import AgentHTTPServer, make_server
from stallscope.agent.steps import StepFollower, runs_of_indexes
from stallscope.agent.trainprocs import TrainerProcs
from stallscope.agent.trainstacks import TrainerStacks
from stallscope.alerts.actions import AlertSink
from stallscope.collect.collector import Collector
from stallscope.collect.sinks import StoreSink
from stallscope.errors import StallscopeError
from stallscope.metrics import Point
from stallscope.sources import SOURCE_NAMES, open_sources, snapshot_doc
from stallscope.sources.base import Counter, Source
from stallscope.sources.podresources import PodResources
from stallscope.store import RunStore, base_meta, new_run_dir, write_meta

__all__ = ["Agent", "OnlyGpus"]

log = logging.getLogger("stallscope.agent")


class OnlyGpus(Source):
    """The gpu source limited to some NVML indices (config ``gpus``)."""

    name = "gpu"

    def __init__(self, inner: Source, indices: list[int]) -> None:
        self.inner = inner
        self.keep = set(indices)

    def open(self) -> None:
        self.inner.open()

    def sample(self, now: float) -> Any:
        payload = self.inner.sample(now)
        if payload is None:
            return None
        return [g for g in payload if g.get("index") in self.keep]

    def points(self, payload: Any) -> list[Point]:
        return self.inner.points(payload)

    def entities(self, payload: Any) -> dict[str, dict[str, Any]]:
        return self.inner.entities(payload)

    def counters(self) -> list[Counter]:
        return self.inner.counters()

    def drain_events(self) -> list[tuple[str, str]]:
        return self.inner.drain_events() + super().drain_events()

    def close(self) -> None:
        self.inner.close()


def kubelet_client(socket_path: str | None) -> PodResources | None:
    """A client of the kubelet's pod-resources socket: the one configured, else the default
    path when it exists (a Kubernetes node); None off Kubernetes or with ``""``."""
    from stallscope.sources.podresources import DEFAULT_SOCKET

    if socket_path == "":
        return None
    path = socket_path or DEFAULT_SOCKET
    if socket_path is None and not os.path.exists(path):
        return None
    return PodResources(path)


class StoreError(StallscopeError):
    """The agent's store cannot be written (a full or read-only disk): one line, exit 1."""

    exit_code = 1


class Agent:
    """See the module docstring. ``argv`` is recorded as the run's command."""

    def __init__(self, config: AgentConfig, argv: list[str] | None = None) -> None:
        self.config = config
        self.argv = argv or ["stallscope", "agent"]
        self.server: AgentHTTPServer | None = None
        self.collector: Collector | None = None
        self.store: RunStore | None = None
        self.store_sink: StoreSink | None = None
        self.prom: PrometheusSink
        self.steps: StepFollower | None = None
        self.kubelet: PodResources | None = None
        self.alerts: AlertSink | None = None
        self.run_dir: Path | None = None
        self.meta: dict[str, Any] = {}
        self._serving: threading.Thread | None = None
        self._stopped = False

    @property
    def address(self) -> str:
        """Where it listens, as ``host:port`` (the real port when 0 was asked for)."""
        assert self.server is not None
        host, port = str(self.server.server_address[0]), int(self.server.server_address[1])
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        cfg = self.config
        host, port = parse_listen(cfg.listen)
        self.server = make_server(host, port)  # ListenError: nothing else was created
        try:
            self._start_sampling()
        except BaseException:
            self.server.server_close()
            raise
        self.server.agent = self
        self._serving = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="stallscope-agent-http",
            daemon=True,
        )
        self._serving.start()

    def _start_sampling(self) -> None:
        cfg = self.config
        sources, unavailable = open_sources(SOURCE_NAMES, disk_devices=cfg.devices)
        if cfg.gpus is not None:
            sources = [OnlyGpus(s, cfg.gpus) if s.name == "gpu" else s for s in sources]
        if cfg.smart:
            smart, smart_why = open_sources(("smart",), smart_devices=cfg.smart)
            sources += smart
            unavailable.update(smart_why)
        self.steps = StepFollower(runs_of_indexes(cfg.run_indexes))
        # on Kubernetes, the kubelet says which pod holds which GPU (sources/podresources.py)
        self.kubelet = kubelet_client(cfg.kubelet_socket)
        # the processes of the trainings it follows: run, role, rank and owner labels
        sources.append(
            TrainerProcs(self.steps, kubelet=self.kubelet, worker_series=cfg.worker_series)
        )
        # and where their training threads spend their time (their own sampled stacks)
        stacks = TrainerStacks(self.steps)
        sources.append(stacks)
        self.prom = PrometheusSink(
            [*SOURCE_NAMES, "procs", "stacks"],
            unavailable,
            steps=self.steps,
            loader=stacks.loader,
            host_label=cfg.host_label,
            hostname=cfg.hostname,
            gpu_owners=self.kubelet.device_owners if self.kubelet is not None else None,
        )
        try:
            self.run_dir = new_run_dir(cfg.store_path(), "agent")
            self.meta = base_meta(
                self.argv,
                start=time.time(),
                interval_s=cfg.interval_s,
                pid=None,
                agent={
                    "listen": cfg.listen,
                    "keep_full_s": cfg.keep_full_s,
                    "gpus": cfg.gpus,
                    "devices": cfg.devices,
                    "run_indexes": cfg.run_indexes,
                    "smart": cfg.smart,
                    "alerts": [r.name for r in cfg.rules().rules],
                },
                unavailable=unavailable,
            )
            write_meta(self.run_dir, self.meta)
            self.store = RunStore(self.run_dir / "run.db", cache_kib=STORE_CACHE_KIB)
        except BaseException as exc:
            for s in sources:
                s.close()
            if self.run_dir is not None:  # nothing half-made is left behind
                shutil.rmtree(self.run_dir, ignore_errors=True)
            if isinstance(exc, (OSError, sqlite3.Error)):
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise StoreError(
                    f"cannot write the agent's store in {cfg.store_path()}: {why}"
                ) from None
            raise
        self.store_sink = StoreSink(self.store, keep_full_s=cfg.keep_full_s)
        # the alert engine: the shipped defaults and the config's [[alerts]]; every alert is
        # an event in the agent's run store, and its actions run as in `stallscope run`
        self.alerts = AlertSink(cfg.rules(), run=str(self.run_dir))
        self.alerts.findings_dir = self.run_dir  # `finding` rules: the agent's own run
        # a resident set that stays flat for days (agent/memory.py)
        self.collector = Collector(
            sources,
            [self.prom, self.store_sink, self.alerts, TrimSink()],
            interval=cfg.interval_s,
            unavailable=unavailable,
        )
        self.collector.start()

    # --- what the API answers -------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any] | None:
        """The latest sample in the ``snapshot --json`` shape, or None before the first."""
        sample = self.prom.latest
        if sample is None:
            return None
        return snapshot_doc(
            sample.ts,
            self.config.interval_s,
            {name: r.payload for name, r in sample.readings.items()},
            self.prom.unavailable,
        )

    def health(self) -> dict[str, Any]:
        doc = self.prom.health()
        doc["interval_s"] = self.config.interval_s
        doc["run_dir"] = str(self.run_dir)
        doc["store_errors"] = self.store_sink.errors if self.store_sink else 0
        firing = sorted(self.alerts.engine.firing()) if self.alerts is not None else []
        doc["alerts_firing"] = [{"alert": n, "entity": e} for n, e in firing]
        if self.kubelet is not None:  # where pod names come from, and why not when they don't
            doc["kubelet"] = {"socket": self.kubelet.socket_path, "problem": self.kubelet.problem}
        return doc

    def history(
        self, metric: str, entity: str | None, since_ts: float
    ) -> list[tuple[str, list[list[float]]]]:
        """Points of ``metric`` newer than ``since_ts`` from the run store, per entity; read
        through a connection of its own (WAL: readers never block the writer)."""
        if self.run_dir is None:
            return []
        try:
            store = RunStore(self.run_dir / "run.db", readonly=True)
        except (sqlite3.Error, OSError):
            return []
        try:
            out = []
            for s in store.read(metric, entity):
                pts = [[round(t, 3), v] for t, v in zip(s.ts, s.v) if t >= since_ts]
                out.append((s.entity, pts))
            return out
        finally:
            store.close()

    # --- stopping -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop serving and sampling; finish the store. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        if self.server is not None:
            if self._serving is not None:
                self.server.shutdown()
            self.server.server_close()
        if self.collector is not None:
            self.collector.stop()
        if self.steps is not None:
            self.steps.close()
        if self.kubelet is not None:
            self.kubelet.close()
        if self.store is None or self.run_dir is None:
            return
        self.meta.update(
            end=time.time(), exit_code=0, samples=self.collector.samples if self.collector else 0
        )
        try:
            write_meta(self.run_dir, self.meta)
        except OSError as exc:
            log.warning("cannot write %s/meta.json: %s", self.run_dir, exc.strerror or exc)
        self.store.finish_and_close()
