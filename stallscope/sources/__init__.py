"""Metric sources, one module each, and the explicit registry of them.

``open_sources`` builds the sources a collector or ``snapshot`` needs and opens each one;
a source that cannot work here is reported once with its reason and left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stallscope.errors import SourceUnavailable
from stallscope.sources.base import Source

__all__ = ["SOURCE_NAMES", "Source", "make_source", "open_sources", "snapshot_doc"]

#: every machine-wide source, in display order (``procs`` needs a root pid: see make_source)
SOURCE_NAMES: tuple[str, ...] = ("gpu", "disk", "host")


def snapshot_doc(ts: float, interval_s: float, payloads: Mapping[str, Any],
                 unavailable: Mapping[str, str]) -> dict[str, Any]:
    """The ``snapshot --json`` document (docs/architecture.md): one key per machine-wide source
    that gave a payload, in display order, and ``unavailable`` (source -> why). One builder for
    ``snapshot``, ``snapshot --count`` and the agent's ``/api/v1/snapshot``."""
    doc: dict[str, Any] = {"ts": round(ts, 3), "interval_s": interval_s}
    for name in SOURCE_NAMES:
        if payloads.get(name) is not None:
            doc[name] = payloads[name]
    doc["unavailable"] = dict(unavailable)
    return doc


def make_source(name: str, *, root_pid: int | None = None,
                disk_devices: Sequence[str] | None = None) -> Source:
    """Construct (not open) one source by name."""
    if name == "gpu":
        from stallscope.sources.gpu import GpuSource

        return GpuSource()
    if name == "disk":
        from stallscope.sources.disk import DiskSource

        return DiskSource(devices=disk_devices)
    if name == "host":
        from stallscope.sources.host import HostSource

        return HostSource()
    if name == "procs":
        from stallscope.sources.procs import ProcsSource

        if root_pid is None:
            raise ValueError("procs source needs root_pid")
        return ProcsSource(root_pid)
    raise ValueError(f"unknown source {name!r}")


def open_sources(names: Sequence[str], *, root_pid: int | None = None,
                 disk_devices: Sequence[str] | None = None
                 ) -> tuple[list[Source], dict[str, str]]:
    """Open each named source; returns (working sources, {name: reason} for the others)."""
    ok: list[Source] = []
    unavailable: dict[str, str] = {}
    for name in names:
        try:
            src = make_source(name, root_pid=root_pid, disk_devices=disk_devices)
            src.open()
        except SourceUnavailable as exc:
            unavailable[name] = str(exc)
            continue
        except OSError as exc:
            unavailable[name] = f"{exc.strerror or exc}"
            continue
        except ImportError as exc:
            unavailable[name] = f"needs the Python module {exc.name}, which is not installed"
            continue
        ok.append(src)
    return ok, unavailable
