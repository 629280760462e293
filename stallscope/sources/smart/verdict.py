"""The verdict of a drive: its document's own findings plus the growth of its counters.

``failing`` if any finding is failing, else ``ageing`` if any is ageing, else ``unknown`` if the
document could not be judged, else ``ok`` (docs/disk-health.md). Growth between two checks
(:func:`compute_growth`) adds findings of its own: a medium counter that grows is ageing, one
that grows fast is failing. :func:`parse_smartctl` parses a document (:mod:`.parse`) and
judges it without history. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from stallscope.sources.smart.parse import (
    FAST_GROWTH,
    INTERFACE_COUNTERS,
    MEDIUM_FAIL_AT,
    DriveHealth,
    Growth,
    Level,
    Verdict,
    parse_document,
    parse_document_text,
)

__all__ = ["apply_growth", "compute_growth", "parse_smartctl", "parse_smartctl_text"]


def parse_smartctl(doc: object, *, source: str | None = None) -> DriveHealth:
    """One ``smartctl --json -a`` document -> :class:`DriveHealth` (pure, never raises).

    Verdict without history: growth between checks is applied by :func:`apply_growth`."""
    return apply_growth(parse_document(doc, source=source), {})


def parse_smartctl_text(text: str | bytes, *, source: str | None = None) -> DriveHealth:
    """Parse the text of a ``smartctl --json`` output; non-JSON gives an ``unknown`` verdict."""
    return apply_growth(parse_document_text(text, source=source), {})


def compute_growth(
    previous: Mapping[str, int], current: Mapping[str, int], since: str
) -> dict[str, Growth]:
    """Counters that grew from ``previous`` to ``current`` (keys in both; decreases ignored:
    a counter only shrinks when the drive was replaced or reset)."""
    out: dict[str, Growth] = {}
    for k, now in current.items():
        before = previous.get(k)
        if isinstance(before, int) and not isinstance(before, bool) and now > before:
            out[k] = Growth(before, now, since)
    return out


_MEDIUM_GROWTH = frozenset(MEDIUM_FAIL_AT)


def apply_growth(drive: DriveHealth, growth: Mapping[str, Growth]) -> DriveHealth:
    """Return ``drive`` with ``growth`` attached and its verdict re-judged.

    Verdict: ``failing`` if any reason is failing, else ``ageing`` if any is ageing, else
    ``unknown`` if the document could not be judged, else ``ok``."""
    found: list[tuple[Level, str]] = list(drive.base)
    notes = list(drive.notes)
    for k, g in growth.items():
        delta = g.end - g.start
        text = f"{k} grew {g.start} → {g.end} since {g.since}"
        if k in _MEDIUM_GROWTH:
            if delta >= FAST_GROWTH:
                found.append(
                    ("failing", f"{text} (+{delta}, ≥ {FAST_GROWTH}: defects are spreading fast)")
                )
            else:
                found.append(("ageing", f"{text}: the medium is degrading"))
        elif k in INTERFACE_COUNTERS:
            found.append(("ageing", f"{text}: {INTERFACE_COUNTERS[k]}"))
        else:
            notes.append(text)
    levels = {lvl for lvl, _ in found}
    verdict: Verdict
    if "failing" in levels:
        verdict = "failing"
    elif "ageing" in levels:
        verdict = "ageing"
    elif "unknown" in levels:
        verdict = "unknown"
    else:
        verdict = "ok"
    rank = {"failing": 0, "ageing": 1, "unknown": 2}
    reasons = [
        t
        for lvl, t in sorted((x for x in found if x[0] != "note"), key=lambda x: rank.get(x[0], 3))
    ]
    notes += [t for lvl, t in found if lvl == "note"]
    if verdict == "ok":
        what = "overall-health PASSED" if drive.smart_passed else "no warning signs"
        if not drive.counters:
            reasons = [what]
        elif drive.protocol == "ATA":
            reasons = [f"{what}; no reallocated, pending or uncorrectable sectors"]
        else:
            reasons = [f"{what}; no media errors or warnings"]
    return replace(
        drive, verdict=verdict, reasons=tuple(reasons), notes=tuple(notes), growth=dict(growth)
    )
