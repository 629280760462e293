"""SMART health: the parser on recorded smartctl outputs, growth, state file, the reader with
the real smartctl."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, tool_missing

from stallscope.errors import UsageError
from stallscope.sources.smart import (
    MAX_CHECKS,
    WINDOW_S,
    Check,
    DriveHealth,
    Growth,
    HealthState,
    apply_growth,
    compute_growth,
    default_state_path,
    explain_series,
    iso_time,
    parse_smartctl,
    parse_smartctl_text,
    pick_baseline,
    read_smart,
    smartctl_argv,
    validate_device,
    validate_device_type,
)

SHARED = ROOT.parent / "shared" / "fixtures" / "smartctl"
OWN = sorted(p for p in FIXTURES.glob("smartctl-*.json") if "virtio" not in p.name)


def load(name: str) -> DriveHealth:
    path = FIXTURES / f"smartctl-{name}.json"
    return parse_smartctl_text(path.read_bytes(), source=path.name)


def doc(name: str) -> dict:
    return json.loads((FIXTURES / f"smartctl-{name}.json").read_text())


def _check_real_document(path: Path) -> DriveHealth:
    d = parse_smartctl_text(path.read_bytes(), source=path.name)
    # a real, complete document always gets a judgement, never "unknown"
    assert d.verdict in ("ok", "ageing", "failing"), (path.name, d.reasons)
    assert d.reasons and all(isinstance(r, str) and r for r in d.reasons)
    assert d.protocol in ("ATA", "NVMe", "SCSI")
    assert d.model and d.device and d.device.startswith("/dev/")
    assert d.counters, path.name
    json.dumps(d.to_json())
    return d


@pytest.mark.parametrize("path", OWN, ids=lambda p: p.name)
def test_copied_fixtures_parse(path: Path) -> None:
    _check_real_document(path)


def test_every_shared_fixture_parses() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present (the copied subset is tested above)")
    files = sorted(SHARED.glob("*.json"))
    assert len(files) == 168
    verdicts = [(_check_real_document(p).verdict, p.name) for p in files]
    failing = {n for v, n in verdicts if v == "failing"}
    assert "nvme-null-SAMSUNG_MZWLL3T2HAJQ-00005-nvme0.json" in failing
    assert "ST3500418AS_12.json" in failing
    # a fleet of mostly healthy drives: the rules must not cry wolf
    assert sum(v == "ok" for v, _ in verdicts) >= 150


def test_design_contract_keys() -> None:
    j = load("ST3500418AS_11").to_json()
    for key in (
        "device",
        "model",
        "serial",
        "protocol",
        "verdict",
        "reasons",
        "growth",
        "attributes",
    ):
        assert key in j
    assert j["device"] == "/dev/sdb" and j["model"] == "ST3500418AS" and j["protocol"] == "ATA"
    assert j["attributes"]["Reallocated_Sector_Ct"] == 1
    assert j["attributes"]["power_on_hours"] == 44670


def test_growth_case_from_two_saved_checks() -> None:
    first, second = load("ST3500418AS_11"), load("ST3500418AS_12")
    assert first.verdict == "ageing"
    assert "Reallocated_Sector_Ct = 1" in first.reasons[0]
    assert first.identity() == second.identity()  # serial redacted: model + capacity
    [drive] = explain_series([first, second])
    assert drive.verdict == "failing"
    g = drive.to_json()["growth"]
    assert g == {
        "Reallocated_Sector_Ct": {"from": 1, "to": 304, "since": "2009-02-13T23:31:30+00:00"}
    }
    assert any("grew 1 → 304" in r for r in drive.reasons)


def test_series_orders_by_local_time() -> None:
    older, newer = doc("ST3500418AS_12"), doc("ST3500418AS_11")
    older["local_time"]["time_t"] = 1_700_000_000
    newer["local_time"]["time_t"] = 1_700_086_400
    # given newest first: still ordered oldest first, and a decrease is no growth
    [drive] = explain_series([parse_smartctl(newer), parse_smartctl(older)])
    assert drive.counters["Reallocated_Sector_Ct"] == 1
    assert "Reallocated_Sector_Ct" not in drive.growth  # 304 -> 1: a decrease is no growth
    assert drive.verdict == "ageing"


def test_series_keeps_different_drives_apart() -> None:
    out = explain_series([load("ST3500418AS_11"), load("MB0500EBNCR_13"), load("ST3500418AS_12")])
    assert [d.model for d in out] == ["ST3500418AS", "MB0500EBNCR"]
    assert out[1].growth == {}


def test_failing_nvme() -> None:
    d = load("nvme-null-SAMSUNG_MZWLL3T2HAJQ-00005-nvme0")
    assert d.verdict == "failing" and d.protocol == "NVMe"
    assert d.attributes["critical_warning"] == 16
    assert any("volatile memory backup" in r for r in d.reasons)
    assert d.smart_passed is False


def test_healthy_nvme_and_hdd() -> None:
    for name in (
        "nvme-null-Samsung_SSD_970_EVO_Plus_250GB-nvme0",
        "sat-Seagate_Exos_X16-ST16000NM001G-2KK103-sda",
        "HITACHI_H109060SESUN600G_10",
    ):
        d = load(name)
        assert d.verdict == "ok", (name, d.reasons)
    nv = load("nvme-null-Samsung_SSD_970_EVO_Plus_250GB-nvme0")
    assert {"media_errors", "percentage_used", "available_spare"} <= set(nv.attributes)


def test_scsi_defects_fail() -> None:
    d = load("SEAGATE_ST373453LC_26")
    assert d.verdict == "failing" and d.protocol == "SCSI"
    assert d.counters["scsi_grown_defect_list"] == 260
    assert d.counters["scsi_uncorrected_errors"] == 536


def test_reported_uncorrect_is_ageing() -> None:
    d = load("MB0500EBNCR_13")
    assert d.verdict == "ageing"
    assert d.reasons == ("Reported_Uncorrect = 1: reads the drive could not correct (SMART 187)",)


def test_seagate_packed_command_timeout() -> None:
    d = load("sat-Seagate_Constellation_ES.3-ST3000NM0033-9ZM178-sdc")
    assert d.counters["Command_Timeout"] == 4  # 17180131332 = 0x0004_0004_0004
    assert d.attributes["temperature_c"] == 22


def test_ssd_wear() -> None:
    d = load("sat-Intel_730_and_DC_S35x0_3610_3700_Series_SSDs-INTEL_SSDSC2BB016T4-sdf")
    assert d.attributes["ssd_life_left_pct"] == 15
    assert d.verdict == "ageing" and "15% of rated life left" in d.reasons[0]


def test_exit_status_error_log_is_a_note() -> None:
    d = load("HGST_HUS724020ALE640_28")
    assert any("error log" in n for n in d.notes)


def test_growth_rules() -> None:
    base = load("sat-Seagate_Exos_X16-ST16000NM001G-2KK103-sda")
    assert base.verdict == "ok"
    slow = apply_growth(base, {"Current_Pending_Sector": Growth(0, 3, "t0")})
    assert slow.verdict == "ageing"
    fast = apply_growth(base, {"Reallocated_Sector_Ct": Growth(0, 60, "t0")})
    assert fast.verdict == "failing"
    cable = apply_growth(base, {"UDMA_CRC_Error_Count": Growth(0, 2, "t0")})
    assert cable.verdict == "ageing" and "cable" in cable.reasons[0]
    power = apply_growth(base, {"unsafe_shutdowns": Growth(1, 2, "t0")})
    assert power.verdict == "ok" and any("unsafe_shutdowns" in n for n in power.notes)
    # growth is re-judged from the document's own findings, not accumulated
    again = apply_growth(fast, {})
    assert again.verdict == "ok" and again.growth == {}


def test_compute_growth() -> None:
    g = compute_growth({"a": 1, "b": 5, "c": 2}, {"a": 3, "b": 4, "d": 9}, "then")
    assert g == {"a": Growth(1, 3, "then")}


def test_recorded_open_failures() -> None:
    d = parse_smartctl_text((FIXTURES / "smartctl-7.3-virtio-vda-sat-eperm.json").read_bytes())
    assert d.verdict == "unknown"
    assert "Operation not permitted" in d.reasons[0]
    d = parse_smartctl_text(
        (FIXTURES / "smartctl-7.3-virtio-vda-unable-to-detect.json").read_bytes()
    )
    assert d.verdict == "unknown" and "Unable to detect device type" in d.reasons[0]


@pytest.mark.parametrize(
    "bad", [b"", b"not json", b"[1, 2]", b"42", b'{"foo": 1}', b'{"smartctl": {"exit_status": 0}}']
)
def test_unrecognised(bad: bytes) -> None:
    d = parse_smartctl_text(bad)
    assert d.verdict == "unknown"
    assert "unrecognised" in d.reasons[0]


def test_smart_disabled_and_unsupported() -> None:
    base = {"smartctl": {"exit_status": 4}, "device": {"name": "/dev/sdz", "protocol": "ATA"}}
    d = parse_smartctl({**base, "smart_support": {"available": True, "enabled": False}})
    assert d.verdict == "unknown" and "smartctl -s on /dev/sdz" in d.reasons[0]
    d = parse_smartctl({**base, "smart_support": {"available": False}})
    assert d.verdict == "unknown" and "no SMART support" in d.reasons[0]


@pytest.mark.parametrize(
    "name,want",
    [
        ("sda", "/dev/sda"),
        ("/dev/nvme0n1", "/dev/nvme0n1"),
        ("/dev/disk/by-id/ata-ST3500418AS_9VM1", "/dev/disk/by-id/ata-ST3500418AS_9VM1"),
    ],
)
def test_validate_device_ok(name: str, want: str) -> None:
    assert validate_device(name) == want


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-d",
        "--scan",
        "sda;reboot",
        "sda b",
        "/dev/../etc/x",
        "/etc/passwd",
        "/dev/sda/..",
        "$(id)",
        "/dev/-a",
    ],
)
def test_validate_device_rejects(name: str) -> None:
    with pytest.raises(UsageError):
        validate_device(name)


def test_validate_device_type() -> None:
    assert validate_device_type("megaraid,3") == "megaraid,3"
    for bad in ("-a", "sat;id", "SAT X", ""):
        with pytest.raises(UsageError):
            validate_device_type(bad)


def test_argv_is_a_list_with_device_last() -> None:
    argv = smartctl_argv("sda", device_type="sat")
    assert argv == ["smartctl", "--json", "--all", "--nocheck=standby", "-d", "sat", "/dev/sda"]


# --- the reader with the real smartctl ------------------------------------------------------


def _need_smartctl() -> None:
    if shutil.which("smartctl") is None:
        tool_missing("smartctl")


def test_real_smartctl_cannot_open_virtio_disk() -> None:
    _need_smartctl()
    if not os.path.exists("/dev/vda"):
        pytest.skip("this machine has no /dev/vda (the virtio disk this test is about)")
    d = read_smart("/dev/vda")
    assert d.verdict == "unknown"
    assert d.reasons[0].startswith("cannot open /dev/vda")
    assert "Operation not permitted" in d.reasons[0] or "Permission denied" in d.reasons[0]
    fixes = " ".join(d.fixes)
    assert "-v /dev:/dev -v /sys:/sys" in fixes
    # as root no grant is advised (root has its rights): the container or the virtual disk is
    # the cause; as a normal user the narrow grant comes first
    assert ("NOPASSWD:" in fixes) == (os.geteuid() != 0), fixes
    d = read_smart("/dev/vda", euid=1000)
    assert "sudoers" in d.fixes[0] and "NOPASSWD:" in d.fixes[0] and "smartctl" in d.fixes[0]
    grants = " ".join(d.fixes)
    assert "CAP_SYS_RAWIO" in grants and "CAP_DAC_READ_SEARCH" in grants
    d = read_smart("/dev/vda", euid=0)
    assert not any("NOPASSWD" in f for f in d.fixes) and "/dev:/dev" in d.fixes[0]


def test_real_smartctl_no_such_device() -> None:
    _need_smartctl()
    d = read_smart("/dev/stallscope-no-such-disk0")
    assert d.verdict == "unknown" and "no such device" in d.reasons[0]


def test_smartctl_not_installed() -> None:
    d = read_smart("sda", smartctl=("/nonexistent/bin/smartctl",))
    assert d.verdict == "unknown" and "not installed" in d.reasons[0]
    assert "smartmontools" in d.fixes[0]


# --- the state file -------------------------------------------------------------------------


def test_default_state_path() -> None:
    assert default_state_path({"STALLSCOPE_STATE_DIR": "/x"}) == Path("/x/smart.json")
    assert default_state_path({"XDG_STATE_HOME": "/s", "HOME": "/h"}) == Path(
        "/s/stallscope/smart.json"
    )
    assert default_state_path({"HOME": "/h"}) == Path("/h/.local/state/stallscope/smart.json")


def test_pick_baseline() -> None:
    day = 86400.0
    checks = [Check(0.0, {}), Check(20 * day, {}), Check(39 * day, {})]
    assert pick_baseline(checks, 40 * day).ts == 20 * day  # oldest within 30 days
    assert pick_baseline(checks[:1], 40 * day).ts == 0.0  # none recent: the latest before
    assert pick_baseline([], 40 * day) is None
    assert pick_baseline([Check(50 * day, {})], 40 * day) is None  # future checks ignored
    assert WINDOW_S == 30 * day


def test_state_growth_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "state" / "smart.json"
    t0 = 1_795_000_000.0
    st = HealthState.load(path)
    first = st.observe(load("ST3500418AS_11"), t0)
    assert first.growth == {}
    st.save()
    st = HealthState.load(path)  # a later run reads what the first one wrote
    second = st.observe(load("ST3500418AS_12"), t0 + 86400)
    assert second.verdict == "failing"
    assert second.to_json()["growth"]["Reallocated_Sector_Ct"] == {
        "from": 1,
        "to": 304,
        "since": iso_time(t0),
    }
    st.save()
    # a third check a day later still reports the growth against the month-old baseline
    third = HealthState.load(path).observe(load("ST3500418AS_12"), t0 + 2 * 86400)
    assert third.growth["Reallocated_Sector_Ct"].start == 1
    saved = json.loads(path.read_text())
    assert saved["version"] == 1 and len(next(iter(saved["drives"].values()))["checks"]) == 2


def test_state_ignores_unknown_drives(tmp_path: Path) -> None:
    st = HealthState.load(tmp_path / "s.json")
    d = parse_smartctl_text(b"garbage")
    assert st.observe(d, 1.0) is d and st.drives == {}


def test_state_bounded(tmp_path: Path) -> None:
    st = HealthState.load(tmp_path / "s.json")
    for i in range(MAX_CHECKS + 10):
        st.record("k", float(i), {"a": i})
    assert len(st.drives["k"]) == MAX_CHECKS and st.drives["k"][0].ts == 10.0


@pytest.mark.parametrize(
    "content",
    ["{not json", '{"version": 99}', "[]", '{"version": 1, "drives": {"k": {"checks": [1]}}}'],
)
def test_damaged_state_is_set_aside(tmp_path: Path, content: str) -> None:
    path = tmp_path / "smart.json"
    path.write_text(content)
    st = HealthState.load(path)
    assert st.drives == {} and st.note and "damaged" in st.note
    assert (tmp_path / "smart.json.bad").read_text() == content
    st.observe(load("ST3500418AS_11"), 1.0)
    st.save()
    assert HealthState.load(path).drives
