"""``stallscope top`` reading the local agent instead of sampling the machine itself.

When a ``stallscope agent`` answers on this machine, ``top`` can take the machine-wide readings
(GPU, disk, host) from its ``/api/v1/snapshot`` rather than opening NVML and reading
``/proc/diskstats`` a second time: the numbers on the screen are then the ones Prometheus
scrapes. The process tree of ``--pid`` is still read locally (the agent does not follow one).

Each machine-wide source becomes an :class:`AgentPart`: a :class:`~stallscope.sources.Source`
whose ``sample`` is the agent's payload for that source, turned into points and entities by the
real source class (so nothing downstream knows where the reading came from). One HTTP request
serves all the parts of one sample. When the agent stops answering, each part opens its real
source and samples directly from then on, and says so once as a run event.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from stallscope.sources import Source, make_source
from stallscope.sources.base import Reading

#: where ``stallscope agent`` listens unless told otherwise
DEFAULT_AGENT = "http://127.0.0.1:10127"
#: seconds to wait for the agent (it answers from memory: anything slower is not usable)
TIMEOUT_S = 0.5


def _get(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            if resp.status != 200:
                return None
            doc = json.loads(resp.read(4 << 20))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return doc if isinstance(doc, dict) else None


def agent_interval(base: str) -> float | None:
    """The sampling interval of the stallscope agent at ``base``, or None when none answers
    there (or what answers is not a stallscope agent)."""
    if not base.startswith(("http://", "https://")):
        return None
    doc = _get(base.rstrip("/") + "/api/v1/health")
    if doc is None or "sources" not in doc:
        return None
    iv = doc.get("interval_s")
    return float(iv) if isinstance(iv, (int, float)) and not isinstance(iv, bool) else None


def default_agent() -> str:
    return os.environ.get("STALLSCOPE_AGENT", DEFAULT_AGENT)


class AgentFeed:
    """The agent's snapshot, fetched once per sample time and shared by the parts."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self._now: float | None = None
        self._doc: dict[str, Any] | None = None
        self.failed = False

    def part(self, name: str, now: float) -> tuple[bool, Any]:
        """(answered, payload of ``name``) for the sample at ``now``."""
        if now != self._now:
            self._now = now
            self._doc = None if self.failed else _get(self.base + "/api/v1/snapshot")
            ts = self._doc.get("ts") if isinstance(self._doc, dict) else None
            if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                self._doc = None  # not an agent's snapshot ({}, garbage): sample directly
            if self._doc is None:
                self.failed = True
        if self._doc is None:
            return False, None
        return True, self._doc.get(name)


class AgentPart(Source):
    """One source's readings taken from the agent; the real source's shape."""

    def __init__(self, shape: Source, feed: AgentFeed) -> None:
        self.name = shape.name  # type: ignore[misc]
        self.transient_entities = shape.transient_entities  # type: ignore[misc]
        self.shape = shape
        self.feed = feed
        self.direct = False

    def sample(self, now: float) -> Any:
        if not self.direct:
            answered, payload = self.feed.part(self.name, now)
            if answered and isinstance(payload, list if self.name == "gpu" else dict):
                return payload
            self.direct = True  # no answer, or none of this source's shape: read it here
            try:
                self.shape.open()
            except Exception as exc:
                self.emit(
                    "note",
                    f"the agent at {self.feed.base} stopped answering, and "
                    f"sampling directly failed: {exc}",
                )
                raise
            self.emit("note", f"the agent at {self.feed.base} stopped answering: sampling directly")
        return self.shape.sample(now)

    def read(self, now: float, *, counters: bool = False) -> Reading | None:
        if self.direct:
            return self.shape.read(now, counters=counters)
        return super().read(now, counters=counters)

    def points(self, payload: Any) -> list[Any]:
        return self.shape.points(payload)

    def entities(self, payload: Any) -> dict[str, dict[str, Any]]:
        return self.shape.entities(payload)

    def drain_events(self) -> list[tuple[str, str]]:
        return super().drain_events() + self.shape.drain_events()

    def close(self) -> None:
        if self.direct:
            self.shape.close()


def agent_sources(base: str, names: Sequence[str]) -> tuple[list[Source], dict[str, str]]:
    """A part per source the agent has (from its first snapshot); the sources it lacks are
    reported unavailable with the agent's own reason."""
    first = _get(base.rstrip("/") + "/api/v1/snapshot") or {}
    got = first.get("unavailable")
    lacking: dict[str, Any] = got if isinstance(got, dict) else {}
    feed = AgentFeed(base)
    out: list[Source] = []
    unavailable: dict[str, str] = {}
    for name in names:
        if name in lacking:
            unavailable[name] = f"{lacking[name]} (the agent's reading)"
            continue
        out.append(AgentPart(make_source(name), feed))
    return out, unavailable
