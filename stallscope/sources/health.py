"""Drive health from SMART: ``smartctl --json`` documents in, verdicts with reasons out.

The parser (:func:`parse_smartctl`) is pure and total: it takes whatever JSON value it is
given and always returns a :class:`DriveHealth`; a document it cannot make sense of gets the
verdict ``unknown`` with a reason that says so ("unrecognised ..."), never an exception. The thin
reader (:func:`read_smart`) is the only code that runs ``smartctl`` (an argv list, never a
shell; device names validated), and turns every way that can go wrong (not installed, no
permission, virtual disk, drive asleep) into an ``unknown`` record with the fix.

Classic equivalents: ``smartctl -H -A /dev/sda`` (ATA attributes: ID 5, 187, 188, 197, 198,
199, 9, 194 and SSD wear), ``smartctl -a /dev/nvme0`` (NVMe SMART/Health log: critical_warning,
media_errors, percentage_used, available_spare) and ``smartctl -a`` on SAS drives (grown defect
list, uncorrected errors). The verdict rules and their thresholds are documented in
``docs/disk-health.md``; the constants below are the single place they live.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Literal

from stallscope.errors import UsageError

__all__ = [
    "ATA_COUNTERS",
    "DriveHealth",
    "Growth",
    "RunResult",
    "Verdict",
    "apply_growth",
    "compute_growth",
    "explain_series",
    "health_findings",
    "iso_time",
    "parse_smartctl",
    "parse_smartctl_text",
    "read_smart",
    "smartctl_argv",
    "validate_device",
    "validate_device_type",
]

Verdict = Literal["ok", "ageing", "failing", "unknown"]
_Level = Literal["failing", "ageing", "unknown", "note"]

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
_WEAR_ATTRS = frozenset({
    "Wear_Leveling_Count", "Media_Wearout_Indicator", "Percent_Lifetime_Remain",
    "SSD_Life_Left", "Remaining_Lifetime_Perc", "Percent_Life_Remaining",
})
#: NVMe critical_warning bits: (bit, level, meaning)
_NVME_WARNING_BITS: tuple[tuple[int, _Level, str], ...] = (
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
    base: tuple[tuple[_Level, str], ...] = ()
    #: when values head for their thresholds at the current rate (smart_trend.Forecast), soonest
    #: first; from the drive's past checks
    forecast: tuple[Any, ...] = ()

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

def parse_smartctl_text(text: str | bytes, *, source: str | None = None) -> DriveHealth:
    """Parse the text of a ``smartctl --json`` output; non-JSON gives an ``unknown`` verdict."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        first = (text.decode("utf-8", "replace") if isinstance(text, bytes) else text)
        first = first.strip().splitlines()[0][:120] if first.strip() else "(empty)"
        return _unknown(
            f"unrecognised: not JSON ({exc.__class__.__name__}); smartctl ≥ 7 with --json "
            f"writes JSON, this starts with {first!r}", source=source)
    return parse_smartctl(doc, source=source)


def _unknown(reason: str, *, source: str | None = None, device: str | None = None,
             fixes: Sequence[str] = (), notes: Sequence[str] = ()) -> DriveHealth:
    return DriveHealth(device=device, model=None, serial=None, protocol=None,
                       verdict="unknown", reasons=(reason,), notes=tuple(notes),
                       fixes=tuple(fixes), source=source, base=(("unknown", reason),))


def parse_smartctl(doc: object, *, source: str | None = None) -> DriveHealth:
    """One ``smartctl --json -a`` document -> :class:`DriveHealth` (pure, never raises).

    Verdict without history: growth between checks is applied by :func:`apply_growth`."""
    try:
        return _parse(doc, source)
    except RecursionError:
        return _unknown("unrecognised: document nested too deeply", source=source)


def _messages(doc: Mapping[str, Any]) -> list[str]:
    msgs = _get(doc, "smartctl", "messages")
    out = []
    if isinstance(msgs, list):
        for m in msgs:
            s = _str(_get(m, "string"))
            if s:
                out.append(s.strip())
    return out


def _parse(doc: object, source: str | None) -> DriveHealth:
    d = _obj(doc)
    if d is None:
        return _unknown(f"unrecognised: a smartctl --json document is an object, "
                        f"not {type(doc).__name__}", source=source)
    device = _str(_get(d, "device", "name"))
    protocol = _str(_get(d, "device", "protocol"))
    if protocol not in ("ATA", "NVMe", "SCSI"):
        protocol = None
    messages = _messages(d)
    exit_status = _int(_get(d, "smartctl", "exit_status"))
    notes: list[str] = []

    fv = d.get("json_format_version")
    if isinstance(fv, list) and fv and _int(fv[0]) not in (None, 1):
        notes.append(f"json_format_version {fv[0]} is newer than this parser knows (1)")

    has_data = any(k in d for k in (
        "smart_status", "ata_smart_attributes", "nvme_smart_health_information_log",
        "scsi_grown_defect_list", "scsi_error_counter_log"))
    if exit_status is not None and exit_status & 0x03 and not has_data:
        # bit 0: command line did not parse; bit 1: device open failed
        msg = "; ".join(messages) or f"smartctl exit status {exit_status}"
        return _unknown(f"smartctl could not read {device or 'the device'}: {msg}",
                        source=source, device=device)
    if not has_data:
        if "smartctl" not in d and "device" not in d:
            return _unknown("unrecognised: no 'smartctl', 'device' or SMART data keys; "
                            "not a smartctl --json document", source=source)
        if _get(d, "smart_support", "available") is False:
            return _unknown(f"{device or 'the device'} has no SMART support (behind a USB "
                            "bridge or RAID controller? try --device-type sat or megaraid,N)",
                            source=source, device=device)
        if _get(d, "smart_support", "enabled") is False:
            return _unknown(f"SMART is disabled on {device or 'the device'}: enable it with "
                            f"`smartctl -s on {device or 'DEVICE'}`", source=source,
                            device=device)
        extra = f" ({'; '.join(messages)})" if messages else ""
        return _unknown(f"unrecognised: the document holds no SMART health data{extra}",
                        source=source, device=device)

    model = (_str(d.get("model_name")) or _str(d.get("scsi_model_name"))
             or " ".join(x for x in (_str(d.get("scsi_vendor")), _str(d.get("scsi_product")))
                         if x) or None)
    serial = _str(d.get("serial_number"))
    capacity = (_int(_get(d, "user_capacity", "bytes")) or _int(d.get("nvme_total_capacity")))
    if capacity is None:
        ns = d.get("nvme_namespaces")
        if isinstance(ns, list) and ns:
            capacity = _int(_get(ns[0], "size", "bytes"))
    rotation = _int(d.get("rotation_rate"))
    checked_at = _int(_get(d, "local_time", "time_t"))
    passed = _get(d, "smart_status", "passed")
    smart_passed = passed if isinstance(passed, bool) else None

    found: list[tuple[_Level, str]] = []
    attrs: dict[str, Any] = {}
    counters: dict[str, int] = {}

    if smart_passed is False:
        found.append(("failing", "SMART overall-health self-assessment: FAILED"))
    if exit_status is not None and exit_status >= 0:
        if exit_status & 0x08 and smart_passed is not False:
            found.append(("failing", "smartctl reports the disk is failing (exit status bit 3)"))
        if exit_status & 0x80:
            found.append(("ageing", "the self-test log records a failed self-test"))
        if exit_status & 0x40:
            notes.append("the device error log has entries (smartctl -l error)")
        if exit_status & 0x04:
            notes.append("some SMART commands failed; data may be incomplete")

    hours = _int(_get(d, "power_on_time", "hours"))
    temp = _int(_get(d, "temperature", "current"))

    if "ata_smart_attributes" in d or protocol == "ATA":
        _parse_ata(d, found, notes, attrs, counters, rotation)
    if "nvme_smart_health_information_log" in d:
        _parse_nvme(d, found, notes, attrs, counters)
    if "scsi_grown_defect_list" in d or "scsi_error_counter_log" in d:
        _parse_scsi(d, found, notes, attrs, counters)

    if hours is None:
        hours = _int(attrs.get("Power_On_Hours"))
    if hours is not None and hours >= 0:
        attrs["power_on_hours"] = hours
        if hours >= HOURS_NOTE:
            notes.append(f"powered on {hours} h ({hours / 8766:.1f} years)")
    if temp is not None:
        attrs["temperature_c"] = temp
        hot = NVME_HOT_C if protocol == "NVMe" else ATA_HOT_C
        if temp >= hot:
            notes.append(f"running hot: {temp} °C (≥ {hot} °C)")

    if not found and smart_passed is None and not counters:
        found.append(("unknown", "unrecognised: no overall-health result and no known "
                      "SMART counters in the document"))

    drive = DriveHealth(
        device=device, model=model, serial=serial, protocol=protocol, verdict="unknown",
        reasons=(), notes=tuple(notes), capacity_bytes=capacity, rotation_rate=rotation,
        checked_at=float(checked_at) if checked_at is not None else None,
        smart_passed=smart_passed, attributes=attrs, counters=counters, source=source,
        base=tuple(found))
    return apply_growth(drive, {})


def _medium(name: str, value: int, what: str, found: list[tuple[_Level, str]]) -> None:
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


def _parse_ata(d: Mapping[str, Any], found: list[tuple[_Level, str]], notes: list[str],
               attrs: dict[str, Any], counters: dict[str, int], rotation: int | None) -> None:
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
            lvl: _Level = "failing" if prefail else "ageing"
            kind = "pre-failure" if prefail else "old-age"
            found.append((lvl, f"{name} (SMART {aid}) normalized value {value} is at or below "
                          f"its threshold {thresh}: the drive's own {kind} criterion is met"))
        elif when == "past":
            found.append(("ageing" if prefail else "note",
                          f"{name} (SMART {aid}) was below its threshold in the past"))
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


def _parse_nvme(d: Mapping[str, Any], found: list[tuple[_Level, str]], notes: list[str],
                attrs: dict[str, Any], counters: dict[str, int]) -> None:
    log = _obj(d.get("nvme_smart_health_information_log"))
    if log is None:
        notes.append("nvme_smart_health_information_log is not an object")
        return
    for k in ("critical_warning", "media_errors", "percentage_used", "available_spare",
              "available_spare_threshold", "unsafe_shutdowns", "num_err_log_entries",
              "warning_temp_time", "critical_comp_time", "power_on_hours", "temperature"):
        v = _int(log.get(k))
        if v is not None:
            attrs[k] = v
    cw = _int(log.get("critical_warning"))
    if cw is not None and cw > 0:
        for bit, lvl, text in _NVME_WARNING_BITS:
            if cw & bit:
                found.append((lvl, f"NVMe critical_warning {cw:#04x}: {text}"))
        if cw & ~0x3F:
            found.append(("ageing", f"NVMe critical_warning {cw:#04x} has bits this "
                          "parser does not know"))
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
            found.append(("failing", f"available_spare {spare}% is below its threshold "
                          f"{spare_th}%"))
        elif spare <= spare_th + SPARE_MARGIN_PCT:
            found.append(("ageing", f"available_spare {spare}% is close to its threshold "
                          f"{spare_th}%"))
    wtt = _int(log.get("warning_temp_time"))
    if wtt:
        notes.append(f"{wtt} min above the warning temperature (warning_temp_time)")
    us = counters.get("unsafe_shutdowns")
    if us:
        notes.append(f"{us} unsafe shutdowns (power lost without a flush)")


def _parse_scsi(d: Mapping[str, Any], found: list[tuple[_Level, str]], notes: list[str],
                attrs: dict[str, Any], counters: dict[str, int]) -> None:
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
            _medium("scsi_uncorrected_errors", total,
                    "reads/writes/verifies that failed after retries", found)


# --- growth and verdict -------------------------------------------------------------------

def compute_growth(previous: Mapping[str, int], current: Mapping[str, int],
                   since: str) -> dict[str, Growth]:
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
    found = list(drive.base)
    notes = list(drive.notes)
    for k, g in growth.items():
        delta = g.end - g.start
        text = f"{k} grew {g.start} → {g.end} since {g.since}"
        if k in _MEDIUM_GROWTH:
            if delta >= FAST_GROWTH:
                found.append(("failing", f"{text} (+{delta}, ≥ {FAST_GROWTH}: defects are "
                              "spreading fast)"))
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
    reasons = [t for lvl, t in sorted(
        (x for x in found if x[0] != "note"), key=lambda x: rank.get(x[0], 3))]
    notes += [t for lvl, t in found if lvl == "note"]
    if verdict == "ok":
        what = "overall-health PASSED" if drive.smart_passed else "no warning signs"
        if not drive.counters:
            reasons = [what]
        elif drive.protocol == "ATA":
            reasons = [f"{what}; no reallocated, pending or uncorrectable sectors"]
        else:
            reasons = [f"{what}; no media errors or warnings"]
    return replace(drive, verdict=verdict, reasons=tuple(reasons), notes=tuple(notes),
                   growth=dict(growth))


def explain_series(drives: Sequence[DriveHealth]) -> list[DriveHealth]:
    """Saved documents -> one record per drive, growth between its checks applied.

    Documents of one drive (same serial, or same model + capacity when the serial is missing
    or redacted) are checks of that drive, ordered by their ``local_time`` (oldest first;
    ties keep the given order). Each drive's latest check is returned, with growth measured
    from its earliest check. Documents that identify no drive are returned as they are."""
    from stallscope.sources.smart_trend import drive_levels, forecast_drive  # imports this

    groups: dict[str, list[tuple[int, DriveHealth]]] = {}
    order: list[str | int] = []
    loose: dict[int, DriveHealth] = {}
    for i, dr in enumerate(drives):
        key = dr.identity() if dr.counters or dr.smart_passed is not None else None
        if key is None:
            loose[i] = dr
            order.append(i)
            continue
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((i, dr))
    out: list[DriveHealth] = []
    for item in order:
        if isinstance(item, int):
            out.append(loose[item])
            continue
        checks = sorted(groups[item], key=lambda p: (p[1].checked_at or 0.0, p[0]))
        first, last = checks[0][1], checks[-1][1]
        if len(checks) == 1:
            out.append(last)
            continue
        since = iso_time(first.checked_at) if first.checked_at is not None else (
            first.source or "the first check")
        judged = apply_growth(last, compute_growth(first.counters, last.counters, since))
        history = [(c.checked_at, drive_levels(c)) for _i, c in checks
                   if c.checked_at is not None]
        out.append(replace(judged, forecast=tuple(forecast_drive(history, last.attributes))))
    return out


# --- findings for the diagnosis -----------------------------------------------------------

def health_findings(drives: Iterable[DriveHealth]) -> list[dict[str, Any]]:
    """``disk_health`` findings (the ``diagnose --json`` finding shape) for every ageing or
    failing drive; ok and unknown drives give none."""
    out: list[dict[str, Any]] = []
    for dr in drives:
        if dr.verdict not in ("ageing", "failing"):
            continue
        failing = dr.verdict == "failing"
        name = dr.device or dr.model or "a drive"
        fixes = [
            {"action": f"Back up the data on {name} now" + (" and replace the drive"
                                                            if failing else ""),
             "why": "reallocation and uncorrectable reads grow until data is lost"
             if failing else "the medium is degrading; a backup is cheap insurance"},
            {"action": "Move the training data to a healthy local SSD/NVMe",
             "why": "reads that hit weak sectors are retried for seconds, stalling the loader"},
        ]
        if not failing:
            fixes.append({"action": f"Re-check with `stallscope disk {dr.device or ''}` "
                          "daily; growth turns this into 'failing'",
                          "why": "growth of these counters, not their value, is the warning"})
        out.append({
            "kind": "disk_health",
            "severity": "critical" if failing else "warning",
            "confidence": 0.9 if failing else 0.7,
            "summary": f"{name} ({dr.model or 'unknown model'}) is {dr.verdict}: "
                       f"{dr.reasons[0] if dr.reasons else 'see evidence'}",
            "evidence": {
                "device": dr.device, "model": dr.model, "serial": dr.serial,
                "protocol": dr.protocol, "verdict": dr.verdict, "reasons": list(dr.reasons),
                "growth": {k: g.to_json() for k, g in dr.growth.items()},
                "counters": dict(dr.counters),
            },
            "fixes": fixes,
            "est_speedup": 1.0,
        })
    return out


# --- the thin reader ----------------------------------------------------------------------

_DEVICE_RE = re.compile(r"^/dev/[A-Za-z0-9][A-Za-z0-9._+:@-]*(?:/[A-Za-z0-9][A-Za-z0-9._+:@-]*)*$")
_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(?:[,+][A-Za-z0-9_/.-]+)*$")


def validate_device(name: str) -> str:
    """``sda`` / ``/dev/sda`` / ``/dev/disk/by-id/...`` -> the ``/dev`` path, or UsageError.

    Only names made of letters, digits and ``._+:@-`` under ``/dev`` pass: nothing that
    smartctl could read as an option, and no ``..``."""
    n = name.strip()
    if n and not n.startswith("/"):
        n = "/dev/" + n
    if not _DEVICE_RE.match(n) or "/../" in n + "/" or "/./" in n + "/":
        raise UsageError(f"not a device name: {name!r} (expected e.g. sda, /dev/nvme0n1)")
    return n


def validate_device_type(dtype: str) -> str:
    """A smartctl ``-d`` value (``sat``, ``nvme``, ``megaraid,3``...), or UsageError."""
    if not _TYPE_RE.match(dtype) or len(dtype) > 40:
        raise UsageError(f"not a smartctl device type: {dtype!r} (e.g. sat, nvme, megaraid,0)")
    return dtype


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: bytes
    stderr: bytes


Runner = Callable[[Sequence[str], float], RunResult]


def _default_runner(argv: Sequence[str], timeout: float) -> RunResult:
    p = subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False)
    return RunResult(p.returncode, p.stdout, p.stderr)


def smartctl_argv(device: str, *, device_type: str | None = None,
                  smartctl: Sequence[str] = ("smartctl",)) -> list[str]:
    """The argv :func:`read_smart` runs (``--nocheck=standby``: a sleeping disk is not woken)."""
    argv = [*smartctl, "--json", "--all", "--nocheck=standby"]
    if device_type:
        argv += ["-d", validate_device_type(device_type)]
    return [*argv, validate_device(device)]


def _open_fixes(smartctl_path: str, euid: int, user: str) -> list[str]:
    """The fixes for a drive SMART cannot open. Each names only what exists, and puts its one
    multi-word command last, in backticks, so that the terminal can print it on a line of its
    own (commands are never wrapped: they must survive copy and paste)."""
    if euid == 0:  # a sudoers line for root grants nothing: name the account to grant
        user = "<the user who runs stallscope>"
    grant = [
        "grant exactly smartctl, nothing else, with this sudoers line, then run stallscope "
        f"disk with --sudo: `echo '{user} ALL=(root) NOPASSWD: {smartctl_path}' | sudo tee "
        "/etc/sudoers.d/stallscope-smartctl`",
        "or, where a systemd service runs stallscope disk, give that service the capabilities "
        "CAP_SYS_RAWIO and CAP_DAC_READ_SEARCH instead (NVMe admin commands also need "
        "CAP_SYS_ADMIN) in its unit: `AmbientCapabilities=CAP_SYS_RAWIO CAP_DAC_READ_SEARCH`",
    ]
    place = [
        "in a container: mount the devices and allow raw commands, or better run stallscope "
        "disk on the host; the container flags: `-v /dev:/dev -v /sys:/sys --cap-add "
        "SYS_RAWIO`",
        "on a virtual disk (virtio, cloud volume) SMART belongs to the host's physical "
        "drives: check them on the host, or the provider's volume health",
    ]
    # as root, a grant changes nothing: where the device lives is the likelier cause
    return place + grant if euid == 0 else grant + place


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "USER"


def read_smart(device: str, *, device_type: str | None = None,
               smartctl: Sequence[str] = ("smartctl",), runner: Runner | None = None,
               timeout: float = 30.0, euid: int | None = None) -> DriveHealth:
    """Run ``smartctl --json --all DEVICE`` and parse it (the thin reader; never raises for a
    problem on the machine — those become an ``unknown`` verdict with the fix).

    Equivalent: ``sudo smartctl -a /dev/sda``. Raises UsageError only for a bad device name.
    """
    dev = validate_device(device)
    run = runner or _default_runner
    uid = os.geteuid() if euid is None else euid
    argv = smartctl_argv(dev, device_type=device_type, smartctl=smartctl)
    exe = next((a for a in smartctl if "smartctl" in a), smartctl[-1])
    path = shutil.which(exe) or exe
    try:
        res = run(argv, timeout)
    except FileNotFoundError:
        return _unknown(f"{exe} is not installed: cannot read SMART of {dev}", device=dev,
                        source="smartctl",
                        fixes=("install smartmontools ≥ 7 (the package has this name in "
                               "apt, dnf, yum and zypper): `apt install smartmontools`",))
    except subprocess.TimeoutExpired:
        return _unknown(f"smartctl did not answer within {timeout:.0f} s for {dev}",
                        device=dev, source="smartctl")
    except PermissionError as exc:
        return _unknown(f"cannot run {exe}: {exc.strerror}", device=dev, source="smartctl")
    if not res.stdout.strip():
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        fixes: list[str] = []
        if smartctl and smartctl[0] == "sudo":
            fixes = _open_fixes(path, 1, os.environ.get("USER") or _user_name(uid))[:1]
        return _unknown(f"{exe} printed nothing for {dev} (exit {res.returncode}): "
                        f"{err[0] if err else 'no message'}", device=dev, source="smartctl",
                        fixes=fixes)
    drive = parse_smartctl_text(res.stdout, source="smartctl")
    if drive.verdict == "unknown" and not drive.counters and drive.smart_passed is None:
        text = " ".join(drive.reasons)
        if "Unable to detect device type" in text and device_type is None:
            # smartctl guesses the type from the name; /dev/vda, /dev/xvda... it cannot. Ask
            # for SAT, what a user would try after reading "please specify -d".
            return read_smart(dev, device_type="sat", smartctl=smartctl, runner=run,
                              timeout=timeout, euid=uid)
        low = text.lower()
        if "standby" in low or "sleep" in low:
            return _unknown(f"{dev} is asleep (standby); not woken up to read SMART",
                            device=dev, source="smartctl")
        if "permission denied" in low or "operation not permitted" in low:
            who = ("even as root: the kernel or the container runtime forbids raw commands to "
                   "this device" if uid == 0 else "SMART needs raw device access")
            user = os.environ.get("USER") or os.environ.get("LOGNAME") or _user_name(uid)
            m = re.search(r"failed: ([^;]*)", text)
            msg = m.group(1).strip() if m else text
            return _unknown(f"cannot open {dev} for SMART ({who}): {msg}", device=dev,
                            source="smartctl", fixes=_open_fixes(path, uid, user))
        if "no such device" in low or "no such file" in low:
            return _unknown(f"no such device: {dev}", device=dev, source="smartctl")
    if drive.device is None:
        drive = replace(drive, device=dev)
    return drive
