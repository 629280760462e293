"""The seam every metric source plugs into.

A source is a thin, stateful reader around pure parsers: ``open()`` checks that it can
work here (raising :class:`~stallscope.errors.SourceUnavailable` with the reason if not),
``sample(now)`` returns one JSON-able payload in the shape of the ``snapshot --json``
contract (see DESIGN.md), computing rates against its own previous reading. The first
``sample`` after ``open`` may return ``None`` for counter-based sources (nothing to diff yet).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar


class Source(abc.ABC):
    """One metric source (gpu, disk, host, procs...)."""

    name: ClassVar[str]

    def open(self) -> None:  # noqa: B027 - optional hook
        """Check the source works here; raise SourceUnavailable(reason) if not."""

    @abc.abstractmethod
    def sample(self, now: float) -> Any:
        """Return one payload (JSON-able), or None while priming counters."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles (NVML, file descriptors)."""
