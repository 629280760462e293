"""SMART documents in, facts and findings out: the pure parser of ``smartctl --json``.

:func:`parse_document` is pure and total: it takes whatever JSON value it is given and always
returns a :class:`DriveHealth`; a document it cannot make sense of gets the verdict ``unknown``
with a reason that says so ("unrecognised ..."), never an exception. What it returns holds the
drive's facts and what the document itself says (``base``: failing/ageing/unknown findings and
notes); the verdict is judged from those in :mod:`.verdict` (:func:`~.verdict.parse_smartctl`
parses and judges in one call).

Classic equivalents: ``smartctl -H -A /dev/sda`` (ATA attributes: ID 5, 187, 188, 197, 198,
199, 9, 194 and SSD wear), ``smartctl -a /dev/nvme0`` (NVMe SMART/Health log: critical_warning,
media_errors, percentage_used, available_spare) and ``smartctl -a`` on SAS drives (grown defect
list, uncorrected errors). The verdict rules and their thresholds are documented in
``docs/disk-health.md``; the constants below are the single place they live.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, NamedTuple

__all__ = [
    "ATA_COUNTERS",
    "FAST_GROWTH",
    "INTERFACE_COUNTERS",
    "MEDIUM_FAIL_AT",
    "WEAR_AGEING_PCT",
    "WEAR_FAILING_PCT",
    "DriveHealth",
    "Growth",
    "Level",
    "Verdict",
    "iso_time",
    "parse_document",
    "parse_document_text",
    "unknown_drive",
]

Verdict = Literal["ok", "ageing", "failing", "unknown"]
#: the level of one finding; "note" findings do not change the verdict
Level = Literal["failing", "ageing", "unknown", "note"]


# --- thresholds (documented in docs/disk-health.md; change both together) -----------------

#: ATA attributes tracked as counters for growth: SMART ID -> canonical name
ATA_COUNTERS: dict[int, str] = {
    5: "Reallocated_Sector_Ct",
    187: "Reported_Uncorrect",
    188: "Command_Timeout",
    197: "Current_Pending_Sector",
    198: "Offline_Uncorrectable",
    199: "UDMA_CRC_Error_Count",
}
#: medium-defect counters: any non-zero value is "ageing"; at or above the value, "failing"
MEDIUM_FAIL_AT: dict[str, int] = {
    "Reallocated_Sector_Ct": 100,  # spare sectors are finite; hundreds of remaps = spreading defect
    "Current_Pending_Sector": 10,  # sectors unreadable right now
    "Offline_Uncorrectable": 10,  # sectors the offline scan could not read back
    "Reported_Uncorrect": 10,  # reads the drive's ECC could not recover
    "media_errors": 10,  # NVMe unrecovered data-integrity errors
    "scsi_grown_defect_list": 100,  # SAS equivalent of reallocations
    "scsi_uncorrected_errors": 10,  # SAS reads/writes/verifies that failed
}
#: interface counters: growth is "ageing" (cable, backplane, power), an absolute value is a note
INTERFACE_COUNTERS: dict[str, str] = {
    "Command_Timeout": "commands timed out: check power and the data cable/backplane",
    "UDMA_CRC_Error_Count": "transfers failed their CRC: replace or reseat the SATA cable",
}
#: growth of a medium counter by at least this much between two checks is "failing"
FAST_GROWTH = 50
#: NVMe percentage_used (and ATA SSD wear used) at which a drive is ageing / failing
WEAR_AGEING_PCT = 80
WEAR_FAILING_PCT = 100
#: NVMe available_spare within this many points above its threshold is "ageing"
SPARE_MARGIN_PCT = 10
#: notes only (they do not change the verdict)
HOURS_NOTE = 43_800  # 5 years powered on
ATA_HOT_C = 60  # most HDDs are rated for 60 °C
NVME_HOT_C = 70

#: ATA SSD wear attributes whose *normalized* value is "life left, %"
_WEAR_ATTRS = frozenset(
    {
        "Wear_Leveling_Count",
        "Media_Wearout_Indicator",
        "Percent_Lifetime_Remain",
        "SSD_Life_Left",
        "Remaining_Lifetime_Perc",
        "Percent_Life_Remaining",
    }
)
#: NVMe critical_warning bits: (bit, level, meaning)
_NVME_WARNING_BITS: tuple[tuple[int, Level, str], ...] = (
    (0x01, "failing", "available spare capacity is below its threshold"),
    (0x02, "ageing", "temperature is outside the drive's rated range: check cooling"),
    (0x04, "failing", "NVM subsystem reliability is degraded (media or internal errors)"),
    (0x08, "failing", "the drive has put its media in read-only mode"),
    (0x10, "failing", "the volatile memory backup device (power-loss protection) has failed"),
    (0x20, "failing", "the persistent memory region has become unreliable"),
)
_REDACTED = frozenset({"", "redacted", "n/a", "unknown", "0", "none"})


# --- records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Growth:
    """A counter that grew between two checks of one drive."""

    start: int  #: value at the earlier check
    end: int  #: value now
    since: str  #: ISO-8601 time of the earlier check

    def to_json(self) -> dict[str, Any]:
        return {"from": self.start, "to": self.end, "since": self.since}


@dataclass(frozen=True)
class DriveHealth:
    """The health of one drive as one ``smartctl --json`` document shows it.

    ``attributes`` is a flat summary (SMART attribute names, NVMe log field names, units in the
    key where not a count: ``power_on_hours``, ``temperature_c``); ``counters`` is the subset
    that only ever grows and is compared between checks (see :func:`compute_growth`).
    """

    device: str | None
    model: str | None
    serial: str | None
    protocol: str | None  #: "ATA", "NVMe", "SCSI", or None when unknown
    verdict: Verdict
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    capacity_bytes: int | None = None
    rotation_rate: int | None = None  #: rpm; 0 = solid state
    checked_at: float | None = None  #: smartctl's local_time.time_t (Unix seconds)
    smart_passed: bool | None = None  #: overall-health self-assessment
    attributes: Mapping[str, Any] = field(default_factory=dict)
    counters: Mapping[str, int] = field(default_factory=dict)
    growth: Mapping[str, Growth] = field(default_factory=dict)
    source: str | None = None  #: file it came from, or "smartctl"
    #: (level, text) found in the document itself; growth is judged on top of these
    base: tuple[tuple[Level, str], ...] = ()
    #: when values head for their thresholds at the current rate (history.Forecast), soonest
    #: first; from the drive's past checks
    forecast: tuple[Any, ...] = ()
    #: an ``unknown`` verdict whose cause is known and said (asleep, not allowed, not there):
    #: an answer about the device, not a document stallscope failed to understand
    explained: bool = False

    def identity(self) -> str | None:
        """Key that recognises this drive across checks: serial, else model + capacity."""
        if self.serial and self.serial.strip().lower() not in _REDACTED:
            return f"serial:{self.serial.strip()}"
        if self.model and self.capacity_bytes:
            return f"model:{self.model.strip()}|{self.capacity_bytes}"
        return None

    def to_json(self) -> dict[str, Any]:
        """The ``disk --json`` drive object (docs/architecture.md), plus notes/fixes/source."""
        out: dict[str, Any] = {
            "device": self.device,
            "model": self.model,
            "serial": self.serial,
            "protocol": self.protocol,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "growth": {k: g.to_json() for k, g in self.growth.items()},
            "attributes": dict(self.attributes),
            "notes": list(self.notes),
            "fixes": list(self.fixes),
            "capacity_bytes": self.capacity_bytes,
            "smart_passed": self.smart_passed,
            "checked_at": iso_time(self.checked_at) if self.checked_at is not None else None,
        }
        if self.forecast:
            out["forecast"] = [f.to_json() for f in self.forecast]
        if self.source is not None:
            out["source"] = self.source
        return out


# --- small type-safe accessors (the parser must survive any JSON value) --------------------


def _obj(v: object) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None


def _int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _get(doc: object, *keys: str) -> object:
    cur: object = doc
    for k in keys:
        d = _obj(cur)
        if d is None:
            return None
        cur = d.get(k)
    return cur


def iso_time(ts: float) -> str:
    """Unix seconds -> ``2026-11-20T10:00:00+00:00`` (UTC, whole seconds)."""
    try:
        return datetime.fromtimestamp(int(ts), tz=timezone.utc).isoformat()
    except (OverflowError, OSError, ValueError):
        return str(ts)


#: ASCII digits only, at most 19 (a 64-bit count): a longer run is not a count, and int() of
#: thousands of digits raises ValueError
_FIRST_INT = re.compile(r"\s*([0-9]{1,19})(?![0-9])")


def _raw_count(attr: Mapping[str, Any]) -> int | None:
    """An ATA attribute's raw count.

    smartctl's ``raw.string`` starts with the count in its human form ("304", "0 0 0" for
    Seagate's packed Command_Timeout, "33 (Min/Max 20/45)"); ``raw.value`` is the packed
    48-bit integer, right only when nothing is packed. Prefer the string's first integer."""
    raw = _obj(attr.get("raw"))
    if raw is None:
        return None
    s = _str(raw.get("string"))
    if s is not None:
        m = _FIRST_INT.match(s)
        if m:
            return int(m.group(1))
    v = _int(raw.get("value"))
    return v if v is not None and v >= 0 else None


# --- the parser ---------------------------------------------------------------------------


def parse_document_text(text: str | bytes, *, source: str | None = None) -> DriveHealth:
    """Parse the text of a ``smartctl --json`` output; non-JSON gives an ``unknown`` verdict."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        first = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        first = first.strip().splitlines()[0][:120] if first.strip() else "(empty)"
        return unknown_drive(
            f"unrecognised: not JSON ({exc.__class__.__name__}); smartctl ≥ 7 with --json "
            f"writes JSON, this starts with {first!r}",
            source=source,
        )
    return parse_document(doc, source=source)


def unknown_drive(
    reason: str,
    *,
    source: str | None = None,
    device: str | None = None,
    fixes: Sequence[str] = (),
    notes: Sequence[str] = (),
    explained: bool = False,
) -> DriveHealth:
    """A drive whose SMART could not be read or judged: verdict ``unknown`` for ``reason``."""
    return DriveHealth(
        device=device,
        model=None,
        serial=None,
        protocol=None,
        verdict="unknown",
        reasons=(reason,),
        notes=tuple(notes),
        fixes=tuple(fixes),
        source=source,
        base=(("unknown", reason),),
        explained=explained,
    )


def parse_document(doc: object, *, source: str | None = None) -> DriveHealth:
    """One ``smartctl --json -a`` document -> :class:`DriveHealth` (pure, never raises).

    The document's own findings are in ``base``; a readable document is not judged yet
    (verdict ``unknown``, no reasons): :func:`~.verdict.apply_growth` does that."""
    try:
        return _parse(doc, source)
    except RecursionError:
        return unknown_drive("unrecognised: document nested too deeply", source=source)


def _messages(doc: Mapping[str, Any]) -> list[str]:
    msgs = _get(doc, "smartctl", "messages")
    out = []
    if isinstance(msgs, list):
        for m in msgs:
            s = _str(_get(m, "string"))
            if s:
                out.append(s.strip())
    return out


#: keys that hold SMART health data; a document with none of them is only an error report
_DATA_KEYS = (
    "smart_status",
    "ata_smart_attributes",
    "nvme_smart_health_information_log",
    "scsi_grown_defect_list",
    "scsi_error_counter_log",
)


class _Facts(NamedTuple):
    """What a document says about the drive itself (no judgement)."""

    model: str | None
    serial: str | None
    capacity: int | None
    rotation: int | None
    checked_at: int | None
    smart_passed: bool | None


def _parse(doc: object, source: str | None) -> DriveHealth:
    d = _obj(doc)
    if d is None:
        return unknown_drive(
            f"unrecognised: a smartctl --json document is an object, not {type(doc).__name__}",
            source=source,
        )
    device = _str(_get(d, "device", "name"))
    protocol = _str(_get(d, "device", "protocol"))
    if protocol not in ("ATA", "NVMe", "SCSI"):
        protocol = None
    exit_status = _int(_get(d, "smartctl", "exit_status"))
    if not any(k in d for k in _DATA_KEYS):
        return _without_data(d, device, exit_status, source)

    facts = _facts(d)
    found: list[tuple[Level, str]] = []
    notes = _format_notes(d)
    attrs: dict[str, Any] = {}
    counters: dict[str, int] = {}
    _overall_health(facts.smart_passed, exit_status, found, notes)
    if "ata_smart_attributes" in d or protocol == "ATA":
        _parse_ata(d, found, notes, attrs, counters, facts.rotation)
    if "nvme_smart_health_information_log" in d:
        _parse_nvme(d, found, notes, attrs, counters)
    if "scsi_grown_defect_list" in d or "scsi_error_counter_log" in d:
        _parse_scsi(d, found, notes, attrs, counters)
    _hours_and_temperature(d, protocol, attrs, notes)
    if not found and facts.smart_passed is None and not counters:
        found.append(
            (
                "unknown",
                "unrecognised: no overall-health result and no known "
                "SMART counters in the document",
            )
        )
    return DriveHealth(
        device=device,
        model=facts.model,
        serial=facts.serial,
        protocol=protocol,
        verdict="unknown",
        reasons=(),
        notes=tuple(notes),
        capacity_bytes=facts.capacity,
        rotation_rate=facts.rotation,
        checked_at=float(facts.checked_at) if facts.checked_at is not None else None,
        smart_passed=facts.smart_passed,
        attributes=attrs,
        counters=counters,
        source=source,
        base=tuple(found),
    )


def _without_data(
    d: Mapping[str, Any], device: str | None, exit_status: int | None, source: str | None
) -> DriveHealth:
    """The ``unknown`` record of a document with no SMART data: why there is none."""
    messages = _messages(d)
    if exit_status is not None and exit_status & 0x03:
        # bit 0: command line did not parse; bit 1: device open failed
        msg = "; ".join(messages) or f"smartctl exit status {exit_status}"
        return unknown_drive(
            f"smartctl could not read {device or 'the device'}: {msg}", source=source, device=device
        )
    if "smartctl" not in d and "device" not in d:
        return unknown_drive(
            "unrecognised: no 'smartctl', 'device' or SMART data keys; "
            "not a smartctl --json document",
            source=source,
        )
    if _get(d, "smart_support", "available") is False:
        return unknown_drive(
            f"{device or 'the device'} has no SMART support (behind a USB "
            "bridge or RAID controller? try --device-type sat or megaraid,N)",
            source=source,
            device=device,
        )
    if _get(d, "smart_support", "enabled") is False:
        return unknown_drive(
            f"SMART is disabled on {device or 'the device'}: enable it with "
            f"`smartctl -s on {device or 'DEVICE'}`",
            source=source,
            device=device,
        )
    extra = f" ({'; '.join(messages)})" if messages else ""
    return unknown_drive(
        f"unrecognised: the document holds no SMART health data{extra}",
        source=source,
        device=device,
    )


def _facts(d: Mapping[str, Any]) -> _Facts:
    model = (
        _str(d.get("model_name"))
        or _str(d.get("scsi_model_name"))
        or " ".join(x for x in (_str(d.get("scsi_vendor")), _str(d.get("scsi_product"))) if x)
        or None
    )
    capacity = _int(_get(d, "user_capacity", "bytes")) or _int(d.get("nvme_total_capacity"))
    if capacity is None:
        ns = d.get("nvme_namespaces")
        if isinstance(ns, list) and ns:
            capacity = _int(_get(ns[0], "size", "bytes"))
    passed = _get(d, "smart_status", "passed")
    return _Facts(
        model=model,
        serial=_str(d.get("serial_number")),
        capacity=capacity,
        rotation=_int(d.get("rotation_rate")),
        checked_at=_int(_get(d, "local_time", "time_t")),
        smart_passed=passed if isinstance(passed, bool) else None,
    )


def _format_notes(d: Mapping[str, Any]) -> list[str]:
    """A note when the document's JSON format is newer than this parser knows."""
    fv = d.get("json_format_version")
    if isinstance(fv, list) and fv and _int(fv[0]) not in (None, 1):
        return [f"json_format_version {fv[0]} is newer than this parser knows (1)"]
    return []


def _overall_health(
    smart_passed: bool | None,
    exit_status: int | None,
    found: list[tuple[Level, str]],
    notes: list[str],
) -> None:
    """The self-assessment and smartctl's exit status bits."""
    if smart_passed is False:
        found.append(("failing", "SMART overall-health self-assessment: FAILED"))
    if exit_status is None or exit_status < 0:
        return
    if exit_status & 0x08 and smart_passed is not False:
        found.append(("failing", "smartctl reports the disk is failing (exit status bit 3)"))
    if exit_status & 0x80:
        found.append(("ageing", "the self-test log records a failed self-test"))
    if exit_status & 0x40:
        notes.append("the device error log has entries (smartctl -l error)")
    if exit_status & 0x04:
        notes.append("some SMART commands failed; data may be incomplete")


def _hours_and_temperature(
    d: Mapping[str, Any], protocol: str | None, attrs: dict[str, Any], notes: list[str]
) -> None:
    """Power-on hours and temperature (notes only); ATA hours from attribute 9 as fallback."""
    hours = _int(_get(d, "power_on_time", "hours"))
    if hours is None:
        hours = _int(attrs.get("Power_On_Hours"))
    if hours is not None and hours >= 0:
        attrs["power_on_hours"] = hours
        if hours >= HOURS_NOTE:
            notes.append(f"powered on {hours} h ({hours / 8766:.1f} years)")
    temp = _int(_get(d, "temperature", "current"))
    if temp is not None:
        attrs["temperature_c"] = temp
        hot = NVME_HOT_C if protocol == "NVMe" else ATA_HOT_C
        if temp >= hot:
            notes.append(f"running hot: {temp} °C (≥ {hot} °C)")


def _medium(name: str, value: int, what: str, found: list[tuple[Level, str]]) -> None:
    if value <= 0:
        return
    fail_at = MEDIUM_FAIL_AT[name]
    if value >= fail_at:
        found.append(("failing", f"{name} = {value} (≥ {fail_at}): {what}"))
    else:
        found.append(("ageing", f"{name} = {value}: {what}"))


_ATA_WHAT = {
    "Reallocated_Sector_Ct": "sectors already remapped to spares (SMART 5)",
    "Reported_Uncorrect": "reads the drive could not correct (SMART 187)",
    "Current_Pending_Sector": "sectors unreadable now, waiting to be remapped (SMART 197)",
    "Offline_Uncorrectable": "sectors the offline scan could not read (SMART 198)",
}


def _parse_ata(
    d: Mapping[str, Any],
    found: list[tuple[Level, str]],
    notes: list[str],
    attrs: dict[str, Any],
    counters: dict[str, int],
    rotation: int | None,
) -> None:
    table = _get(d, "ata_smart_attributes", "table")
    if not isinstance(table, list):
        if "ata_smart_attributes" in d:
            notes.append("ata_smart_attributes has no readable table")
        return
    for a in table:
        a = _obj(a)
        if a is None:
            continue
        aid = _int(a.get("id"))
        name = _str(a.get("name")) or (f"Attribute_{aid}" if aid is not None else None)
        if aid is None or name is None or not 1 <= aid <= 255:
            continue
        raw = _raw_count(a)
        value = _int(a.get("value"))
        thresh = _int(a.get("thresh"))
        if name not in ("Not_In_Use", "Unknown_Attribute") and aid in ATA_COUNTERS:
            canon = ATA_COUNTERS[aid]
            if aid == 188 and raw is not None and raw > 0xFFFF:
                raw &= 0xFFFF  # Seagate packs three 16-bit counts; the low one is the total
            if raw is not None:
                counters[canon] = raw
                attrs[canon] = raw
        elif raw is not None:
            attrs.setdefault(name, raw)
        if aid == 9 and raw is not None:
            attrs["Power_On_Hours"] = raw
        if name in _WEAR_ATTRS and value is not None and 0 <= value <= 100 and not rotation:
            attrs["ssd_life_left_pct"] = value
        prefail = _get(a, "flags", "prefailure") is True
        when = _str(a.get("when_failed"))
        if when is None and value is not None and thresh is not None and thresh > 0:
            when = "now" if value <= thresh else ""
        if when == "now":
            lvl: Level = "failing" if prefail else "ageing"
            kind = "pre-failure" if prefail else "old-age"
            found.append(
                (
                    lvl,
                    f"{name} (SMART {aid}) normalized value {value} is at or below "
                    f"its threshold {thresh}: the drive's own {kind} criterion is met",
                )
            )
        elif when == "past":
            found.append(
                (
                    "ageing" if prefail else "note",
                    f"{name} (SMART {aid}) was below its threshold in the past",
                )
            )
    for canon, what in _ATA_WHAT.items():
        if canon in counters:
            _medium(canon, counters[canon], what, found)
    for canon, what in INTERFACE_COUNTERS.items():
        if counters.get(canon, 0) > 0:
            notes.append(f"{canon} = {counters[canon]}: {what}")
    life = _int(attrs.get("ssd_life_left_pct"))
    if life is not None:
        used = 100 - life
        if life <= 1:
            found.append(("failing", f"SSD wear: {life}% of rated life left"))
        elif used >= WEAR_AGEING_PCT:
            found.append(("ageing", f"SSD wear: {life}% of rated life left"))


def _parse_nvme(
    d: Mapping[str, Any],
    found: list[tuple[Level, str]],
    notes: list[str],
    attrs: dict[str, Any],
    counters: dict[str, int],
) -> None:
    log = _obj(d.get("nvme_smart_health_information_log"))
    if log is None:
        notes.append("nvme_smart_health_information_log is not an object")
        return
    for k in (
        "critical_warning",
        "media_errors",
        "percentage_used",
        "available_spare",
        "available_spare_threshold",
        "unsafe_shutdowns",
        "num_err_log_entries",
        "warning_temp_time",
        "critical_comp_time",
        "power_on_hours",
        "temperature",
    ):
        v = _int(log.get(k))
        if v is not None:
            attrs[k] = v
    cw = _int(log.get("critical_warning"))
    if cw is not None and cw > 0:
        for bit, lvl, text in _NVME_WARNING_BITS:
            if cw & bit:
                found.append((lvl, f"NVMe critical_warning {cw:#04x}: {text}"))
        if cw & ~0x3F:
            found.append(
                ("ageing", f"NVMe critical_warning {cw:#04x} has bits this parser does not know")
            )
    for k in ("media_errors", "unsafe_shutdowns", "num_err_log_entries"):
        v = _int(log.get(k))
        if v is not None and v >= 0:
            counters[k] = v
    me = counters.get("media_errors")
    if me is not None:
        _medium("media_errors", me, "unrecovered data-integrity errors", found)
    used = _int(log.get("percentage_used"))
    if used is not None:
        if used >= WEAR_FAILING_PCT:
            found.append(("failing", f"percentage_used = {used}%: rated endurance exhausted"))
        elif used >= WEAR_AGEING_PCT:
            found.append(("ageing", f"percentage_used = {used}% of rated endurance"))
    spare = _int(log.get("available_spare"))
    spare_th = _int(log.get("available_spare_threshold"))
    if spare is not None and spare_th is not None and 0 <= spare_th <= 100:
        if spare < spare_th:
            found.append(
                ("failing", f"available_spare {spare}% is below its threshold {spare_th}%")
            )
        elif spare <= spare_th + SPARE_MARGIN_PCT:
            found.append(
                ("ageing", f"available_spare {spare}% is close to its threshold {spare_th}%")
            )
    wtt = _int(log.get("warning_temp_time"))
    if wtt:
        notes.append(f"{wtt} min above the warning temperature (warning_temp_time)")
    us = counters.get("unsafe_shutdowns")
    if us:
        notes.append(f"{us} unsafe shutdowns (power lost without a flush)")


def _parse_scsi(
    d: Mapping[str, Any],
    found: list[tuple[Level, str]],
    notes: list[str],
    attrs: dict[str, Any],
    counters: dict[str, int],
) -> None:
    gdl = _int(d.get("scsi_grown_defect_list"))
    if gdl is not None and gdl >= 0:
        counters["scsi_grown_defect_list"] = gdl
        attrs["scsi_grown_defect_list"] = gdl
        _medium("scsi_grown_defect_list", gdl, "defects found since manufacture", found)
    log = _obj(d.get("scsi_error_counter_log"))
    if log is not None:
        total = 0
        seen = False
        for kind in ("read", "write", "verify"):
            v = _int(_get(log, kind, "total_uncorrected_errors"))
            if v is not None and v >= 0:
                attrs[f"scsi_{kind}_uncorrected_errors"] = v
                total += v
                seen = True
        if seen:
            counters["scsi_uncorrected_errors"] = total
            _medium(
                "scsi_uncorrected_errors",
                total,
                "reads/writes/verifies that failed after retries",
                found,
            )
