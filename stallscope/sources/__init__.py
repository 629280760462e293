"""Metric sources, one module each, and the explicit registry of them.

``open_sources`` builds the sources a collector or ``snapshot`` needs and opens each one;
a source that cannot work here is reported once with its reason and left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope.errors import SourceUnavailable
from stallscope.sources.base import Source

__all__ = [
    "REGISTRY",
    "SOURCE_NAMES",
    "Source",
    "SourceArgs",
    "make_source",
    "open_sources",
    "snapshot_doc",
]

#: every machine-wide source, in display order (``procs`` needs a root pid: see make_source)
SOURCE_NAMES: tuple[str, ...] = ("gpu", "disk", "host")


def snapshot_doc(
    ts: float, interval_s: float, payloads: Mapping[str, Any], unavailable: Mapping[str, str]
) -> dict[str, Any]:
    """The ``snapshot --json`` document (docs/architecture.md): one key per machine-wide source
    that gave a payload, in display order, and ``unavailable`` (source -> why). One builder for
    ``snapshot``, ``snapshot --count`` and the agent's ``/api/v1/snapshot``."""
    doc: dict[str, Any] = {"ts": round(ts, 3), "interval_s": interval_s}
    for name in SOURCE_NAMES:
        if payloads.get(name) is not None:
            doc[name] = payloads[name]
    doc["unavailable"] = dict(unavailable)
    return doc


@dataclass(frozen=True)
class SourceArgs:
    """What a source may need besides its name: the trainer's root pid (``procs``), the disks to
    read (``disk``), the run folder (``probe``: the steps the probe wrote; ``stacks``), the
    drives whose SMART health to check (``smart``), the pids to sample with py-spy and at what
    rate (``stacks``), the pids the tree walk never enters (``procs``: stallscope's own)."""

    root_pid: int | None = None
    disk_devices: Sequence[str] | None = None
    run_dir: Path | None = None
    smart_devices: Sequence[str] = ()
    attach: Sequence[int] = ()
    stack_rate_hz: float | None = None
    exclude: frozenset[int] = frozenset()


def _gpu(_a: SourceArgs) -> Source:
    from stallscope.sources.gpu import GpuSource

    return GpuSource()


def _disk(a: SourceArgs) -> Source:
    from stallscope.sources.disk import DiskSource

    return DiskSource(devices=a.disk_devices)


def _host(_a: SourceArgs) -> Source:
    from stallscope.sources.host import HostSource

    return HostSource()


def _procs(a: SourceArgs) -> Source:
    from stallscope.sources.procs import ProcsSource

    if a.root_pid is None:
        raise ValueError("procs source needs root_pid")
    return ProcsSource(a.root_pid, exclude=a.exclude)


def _steps(a: SourceArgs) -> Source:
    from stallscope.sources.steps import StepsSource

    if a.run_dir is None:
        raise ValueError("probe source needs run_dir")
    return StepsSource(a.run_dir / "run.db")


def _smart(a: SourceArgs) -> Source:
    from stallscope.sources.smart import SmartSource

    return SmartSource(list(a.smart_devices))


def _stacks(a: SourceArgs) -> Source:
    from stallscope.sources.stacks.source import StacksSource

    if a.run_dir is None:
        raise ValueError("stacks source needs run_dir")
    return StacksSource(a.run_dir, a.attach, a.stack_rate_hz)


#: every source by name -> its factory (imports its module only when made): adding a source is
#: its module, a line here and its metrics in ``stallscope/metrics/`` (a module per source)
REGISTRY: dict[str, Callable[[SourceArgs], Source]] = {
    "gpu": _gpu,
    "disk": _disk,
    "host": _host,
    "procs": _procs,
    "probe": _steps,
    "smart": _smart,
    "stacks": _stacks,
}


def make_source(name: str, **kw: Any) -> Source:
    """Construct (not open) one source by name; ``kw`` are :class:`SourceArgs` fields."""
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown source {name!r}")
    return factory(SourceArgs(**kw))


def open_sources(names: Sequence[str], **kw: Any) -> tuple[list[Source], dict[str, str]]:
    """Open each named source (``kw``: :class:`SourceArgs` fields); returns (working sources,
    {name: reason} for the others)."""
    ok: list[Source] = []
    unavailable: dict[str, str] = {}
    for name in names:
        try:
            src = make_source(name, **kw)
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
