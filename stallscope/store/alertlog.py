"""A run directory's ``alerts.jsonl``: the alert transitions, one JSON object a line.

The alert engine appends each transition with :func:`append` (one ``write`` of one whole line on
an ``O_APPEND`` descriptor, so a reader never takes half a line for a whole one); the probe's
writer thread reads the lines added since its last look with :class:`AlertTail`. What a line
holds is the alert's webhook body plus ``notify`` and ``probe`` (docs/architecture.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["ALERTS_FILE", "MAX_LINE", "AlertTail", "alert_line", "append"]

#: the file the alert engine appends transitions to, in the run directory
ALERTS_FILE = "alerts.jsonl"
#: longest line read (a transition is ~400 bytes; anything longer is not ours)
MAX_LINE = 64 * 1024


def alert_line(d: dict[str, Any]) -> bytes:
    """One transition as :data:`ALERTS_FILE` holds it."""
    return (json.dumps(d, separators=(",", ":"), default=str) + "\n").encode()


def append(run_dir: Path, d: dict[str, Any]) -> None:
    """Append one transition to ``run_dir``'s :data:`ALERTS_FILE` with a single write.
    Raises OSError."""
    fd = os.open(run_dir / ALERTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, alert_line(d))
    finally:
        os.close(fd)


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        d = json.loads(line)
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


class AlertTail:
    """Reads the whole lines appended to a run's :data:`ALERTS_FILE` since the last look."""

    def __init__(self) -> None:
        self.offset = 0  #: bytes of the file read so far

    def read(self, run_dir: Path) -> tuple[list[dict[str, Any]] | None, bool]:
        """``(records, restarted)``: the JSON objects of the whole lines added since the last
        look, oldest first (a line that is not one is left out), None when no whole line was
        added; ``restarted`` is True when the file shrank (it was replaced: reading starts
        over). A line still being written is left for the next look. Raises OSError when the
        file is there but cannot be read."""
        path = run_dir / ALERTS_FILE
        try:
            size = os.stat(path).st_size
        except OSError:
            return None, False  # nothing fired yet
        restarted = size < self.offset
        if restarted:
            self.offset = 0
        if size == self.offset:
            return None, restarted
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n")
        if end < 0:  # a line still being written (or one too long to be ours: skipped)
            if len(data) >= MAX_LINE:
                self.offset += len(data)
            return None, restarted
        self.offset += end + 1
        recs = [r for r in (_record(x) for x in data[:end].split(b"\n") if x) if r is not None]
        return recs, restarted
