"""The gpu source, run against NVML replays derived from real nvidia-smi captures.

No GPU here: ``NvmlReplay`` answers pynvml's function names from
``tests/fixtures/nvml-replay-*-from-nvidia-smi-*.json`` (see tests/fixtures/README-nvml.md), so
``GpuSource`` runs its one real code path. The no-driver test calls the real pynvml.
"""

from __future__ import annotations

import copy
import ctypes.util
import importlib.util
import json
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest
from conftest import FIXTURES, ROOT

from stallscope import metrics
from stallscope.errors import SourceUnavailable
from stallscope.sources.base import Source
from stallscope.sources.gpu import THROTTLE_REASONS, GpuSource, decode_throttle
from stallscope.testing.nvml_replay import NvmlRecorder, NvmlReplay, ReplayMissing

CAPTURES = ROOT.parent / "shared" / "fixtures" / "nvidia-smi"

H100_IDLE = "nvml-replay-h100-80gb-hbm3-idle-from-nvidia-smi-590.48.01.json"
H100_LOAD = "nvml-replay-h100-80gb-hbm3-load-from-nvidia-smi-590.48.01.json"
H200_LOAD = "nvml-replay-h200-load-from-nvidia-smi-590.48.01.json"
H100_MIG_LOAD = "nvml-replay-h100-mig-load-from-nvidia-smi-590.48.01.json"
L40S_LOAD = "nvml-replay-l40s-load-from-nvidia-smi-595.80.json"
RTX2080_IDLE = "nvml-replay-rtx-2080-super-idle-from-nvidia-smi-595.71.05.json"
RTX4080_LOAD = "nvml-replay-rtx-4080-super-load-from-nvidia-smi-595.71.05.json"
ALL_REPLAYS = sorted(p.name for p in FIXTURES.glob("nvml-replay-*.json"))

# the gpu keys of docs/architecture.md's `snapshot --json`, and the extra ones this source adds
DESIGN_KEYS = {
    "index",
    "name",
    "uuid",
    "util_pct",
    "mem_util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "temp_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "throttle",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "pcie_rx_kb_s",
    "pcie_tx_kb_s",
    "ecc_errors",
}
EXTRA_KEYS = {
    "pci_bus_id",
    "sm_clock_max_mhz",
    "throttle_mask",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "processes",
    "mig",
    # issue 38: GPU health and the non-blocking reading
    "mem_temp_c",
    "energy_j",
    "pcie_replays",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "row_remap_pending",
    "row_remap_failed",
    "retired_pages",
    "retired_pages_pending",
    "xid_count",
    "xid_last",
    "xid_errors",
    "health_problem",
    "pcie_from",
}


def doc(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def one(name: str, **kw: Any) -> dict[str, Any]:
    """The single GPU reading of a one-GPU replay."""
    source = GpuSource(NvmlReplay(doc(name)), **kw)
    source.open()
    payload = source.sample(0.0)
    source.close()
    assert len(payload) == 1
    return payload[0]


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- no driver: the real pynvml ---------------------------------------------------------------
no_nvml_here = pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="libnvidia-ml.so is installed here; this test needs a machine without the driver",
)


@no_nvml_here
def test_no_driver_is_unavailable_with_reason_real_pynvml() -> None:
    source = GpuSource()  # the real pynvml backend
    with pytest.raises(SourceUnavailable) as exc:
        source.open()
    assert str(exc.value) == "no NVIDIA driver (libnvidia-ml.so not found)"
    assert isinstance(exc.value.__cause__, pynvml.NVMLError_LibraryNotFound)
    # said once: later calls give the same reason without trying again
    with pytest.raises(SourceUnavailable, match=r"libnvidia-ml\.so not found"):
        source.sample(0.0)
    source.close()  # nothing to release, must not raise


@no_nvml_here
def test_record_script_without_driver_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = load_script("record_nvml")
    assert record.main(["--label", "idle", "--out", str(tmp_path)]) == 1
    assert "no NVIDIA driver (libnvidia-ml.so not found)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_init_failure_is_said_once_and_not_retried() -> None:
    replay = NvmlReplay(doc(H100_LOAD), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    source = GpuSource(replay)
    for _ in range(3):
        with pytest.raises(SourceUnavailable) as exc:
            source.sample(0.0)
        assert str(exc.value) == "NVIDIA driver not loaded (nvmlInit: Driver Not Loaded)"
        assert "\n" not in str(exc.value)
    assert replay.calls.count("nvmlInit") == 1


def test_no_gpus_is_unavailable() -> None:
    empty = doc(H100_LOAD)
    empty["devices"] = []
    empty["system"]["nvmlDeviceGetCount"] = 0
    replay = NvmlReplay(empty)
    source = GpuSource(replay)
    for _ in range(2):
        with pytest.raises(SourceUnavailable, match="no NVIDIA GPU visible to NVML"):
            source.sample(0.0)
    assert replay.calls.count("nvmlDeviceGetCount") == 1
    assert replay.initialized == 0  # NVML released at once


def test_lazy_nothing_happens_before_first_use_and_close_shuts_down() -> None:
    replay = NvmlReplay(doc(H100_LOAD))
    source = GpuSource(replay)
    assert isinstance(source, Source) and source.name == "gpu"
    assert replay.calls == []
    assert len(source.sample(0.0)) == 1  # sample() without open() opens
    assert replay.calls[0] == "nvmlInit" and replay.initialized == 1
    source.close()
    assert replay.initialized == 0 and replay.calls[-1] == "nvmlShutdown"


# -- real values flow through -----------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_REPLAYS)
def test_payload_has_exactly_the_contract_keys(name: str) -> None:
    replay = NvmlReplay(doc(name))
    source = GpuSource(replay)
    payload = source.sample(0.0)
    source.close()
    assert len(payload) == len(doc(name)["devices"]) == 1
    for gpu in payload:
        assert set(gpu) == DESIGN_KEYS | EXTRA_KEYS
        # every gpu metric the source itself reads (the collector derives the others; the
        # per-process ones come from each entry of `processes`)
        assert {
            m.key
            for m in metrics.by_source("gpu")
            if not m.derived and m.label not in ("gpu_pid", "gpu_mig")
        } <= set(gpu)
        proc_keys = {"pid", "used_mib", "sm_pct", "mem_util_pct"}
        assert all(set(p) == proc_keys for p in gpu["processes"] or ())
        json.dumps(gpu)  # JSON-able
        assert gpu["name"] and gpu["name"].startswith("NVIDIA")
        assert gpu["mem_total_mib"] > 0 and gpu["power_limit_w"] > 0
        assert 0 <= gpu["mem_used_mib"] <= gpu["mem_total_mib"]
        assert gpu["sm_clock_mhz"] <= gpu["sm_clock_max_mhz"]
        assert gpu["pcie_gen"] <= gpu["pcie_gen_max"]


def test_h100_under_load_reads_like_its_capture() -> None:
    # values copied by hand from the capture's load query-gpu CSV and -q
    gpu = one(H100_LOAD)
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["util_pct"] == 100.0
    assert gpu["mem_util_pct"] == 11.0
    assert gpu["power_w"] == pytest.approx(631.95)
    assert gpu["power_limit_w"] == pytest.approx(700.0)
    assert (gpu["mem_used_mib"], gpu["mem_total_mib"]) == (19818, 81559)
    assert gpu["temp_c"] == 59.0
    assert (gpu["sm_clock_mhz"], gpu["sm_clock_max_mhz"]) == (1980, 1980)
    assert (gpu["pcie_gen"], gpu["pcie_gen_max"], gpu["pcie_width"], gpu["pcie_width_max"]) == (
        5,
        5,
        16,
        16,
    )
    assert (gpu["pcie_rx_kb_s"], gpu["pcie_tx_kb_s"]) == (6346, 3092)
    assert gpu["throttle"] == [] and gpu["throttle_mask"] == 0
    assert gpu["ecc_errors"] == 0
    assert gpu["processes"] == [
        # pmon: the two memory hogs hold memory and run nothing; gpu_burn has the SMs
        {"pid": 11327, "used_mib": 2566, "sm_pct": 0.0, "mem_util_pct": 0.0},
        {"pid": 11328, "used_mib": 1542, "sm_pct": 0.0, "mem_util_pct": 0.0},
        {"pid": 11345, "used_mib": 15690, "sm_pct": 99.0, "mem_util_pct": 10.0},
    ]
    # nvidia-smi shows no GPM, so the derived replay has none
    assert gpu["sm_active_pct"] is None and gpu["tensor_active_pct"] is None


def test_h100_idle_is_clocked_down_by_gpu_idle() -> None:
    gpu = one(H100_IDLE)
    assert gpu["util_pct"] == 0.0
    assert gpu["power_w"] == pytest.approx(69.85)
    assert gpu["sm_clock_mhz"] == 345
    assert gpu["throttle"] == ["gpu_idle"] and gpu["throttle_mask"] == 0x1
    assert gpu["processes"] == []


def test_h200_under_load() -> None:
    gpu = one(H200_LOAD)
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["mem_total_mib"] == 143771 and gpu["mem_used_mib"] == 32362
    assert gpu["util_pct"] == 100.0
    assert gpu["power_w"] == pytest.approx(627.40)
    assert (gpu["pcie_rx_kb_s"], gpu["pcie_tx_kb_s"]) == (8691, 4217)


def test_mig_parent_has_no_utilization_but_the_rest() -> None:
    gpu = one(H100_MIG_LOAD)
    # nvidia-smi prints [N/A] for utilization.gpu/memory in MIG mode: None, not a crash
    assert gpu["util_pct"] is None and gpu["mem_util_pct"] is None
    assert gpu["power_w"] == pytest.approx(433.78)
    assert gpu["mem_used_mib"] == 11125
    assert [p["pid"] for p in gpu["processes"]] == [21180, 21181, 21198]


def test_l40s_under_load() -> None:
    gpu = one(L40S_LOAD)
    assert gpu["name"] == "NVIDIA L40S"
    assert (gpu["pcie_gen"], gpu["pcie_rx_kb_s"], gpu["pcie_tx_kb_s"]) == (4, 2012109, 259423)
    assert gpu["ecc_errors"] == 0  # ECC on
    assert gpu["power_limit_w"] == pytest.approx(350.0)


def test_geforce_without_ecc_and_with_power_cap_at_idle() -> None:
    gpu = one(RTX2080_IDLE)
    assert gpu["ecc_errors"] is None  # ecc.mode.current is [N/A] on GeForce
    assert gpu["throttle"] == ["sw_power_cap"] and gpu["throttle_mask"] == 0x4
    assert (gpu["pcie_gen"], gpu["pcie_gen_max"]) == (1, 3)  # link trained down at idle
    # graphics processes (Xorg etc.) count too
    # (idle: NVML has no per-process samples, so each ran nothing)
    assert gpu["processes"] == [
        {"pid": 1696, "used_mib": 176, "sm_pct": 0.0, "mem_util_pct": 0.0},
        {"pid": 4584, "used_mib": 3, "sm_pct": 0.0, "mem_util_pct": 0.0},
    ]
    gpu = one(RTX4080_LOAD)
    assert gpu["ecc_errors"] is None
    assert gpu["pcie_rx_kb_s"] == 1436230


# -- throttle decoding ------------------------------------------------------------------------
def test_decode_throttle() -> None:
    assert decode_throttle(0) == []
    assert decode_throttle(0x1FF) == [
        "gpu_idle",
        "applications_clocks",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal",
        "hw_thermal",
        "hw_power_brake",
        "display_clocks",
    ]
    assert decode_throttle(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]
    assert decode_throttle(0x8 | 0x1000) == ["hw_slowdown", "unknown_0x1000"]
    # the bits are NVML's own
    assert dict(THROTTLE_REASONS)[pynvml.nvmlClocksEventReasonHwThermalSlowdown] == "hw_thermal"
    assert dict(THROTTLE_REASONS)[pynvml.nvmlClocksEventReasonSwPowerCap] == "sw_power_cap"
    assert dict(THROTTLE_REASONS)[pynvml.nvmlClocksThrottleReasonBoardLimit] == "board_limit"


def test_old_driver_falls_back_to_throttle_reasons() -> None:
    old = doc(H100_LOAD)
    dev = old["devices"][0]
    dev["nvmlDeviceGetCurrentClocksEventReasons"] = {"nvml_error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
    dev["nvmlDeviceGetCurrentClocksThrottleReasons"] = 0x44
    source = GpuSource(NvmlReplay(old))
    gpu = source.sample(0.0)[0]
    assert gpu["throttle"] == ["sw_power_cap", "hw_thermal"] and gpu["throttle_mask"] == 0x44


# -- N/A and errors ---------------------------------------------------------------------------
def test_not_supported_field_becomes_none_and_the_rest_stays() -> None:
    replay = NvmlReplay(doc(H100_LOAD))
    replay.fail(0, pynvml.NVML_ERROR_NOT_SUPPORTED, {"nvmlDeviceGetTemperature"})
    gpu = GpuSource(replay).sample(0.0)[0]
    assert gpu["temp_c"] is None
    assert gpu["power_w"] == pytest.approx(631.95)


def test_other_nvml_error_is_logged_once_and_gives_none(caplog: pytest.LogCaptureFixture) -> None:
    replay = NvmlReplay(doc(H100_LOAD))
    replay.fail(
        0,
        pynvml.NVML_ERROR_NO_PERMISSION,
        {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"},
    )
    source = GpuSource(replay)
    with caplog.at_level(logging.WARNING, logger="stallscope.sources.gpu"):
        for _ in range(3):
            gpu = source.sample(0.0)[0]
            assert gpu["processes"] is None and gpu["util_pct"] == 100.0
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2  # one per function, not per sample
    assert all("Insufficient Permissions" in w for w in warned)


def test_incomplete_replay_fails_loudly() -> None:
    broken = doc(H100_LOAD)
    del broken["devices"][0]["nvmlDeviceGetPowerUsage"]
    with pytest.raises(ReplayMissing, match="nvmlDeviceGetPowerUsage"):
        GpuSource(NvmlReplay(broken)).sample(0.0)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN])
def test_gpu_lost_mid_run_is_reported_once_and_others_go_on(
    code: int, caplog: pytest.LogCaptureFixture
) -> None:
    # a two-GPU machine made of two real readings
    replay = NvmlReplay.load(FIXTURES / H100_LOAD, FIXTURES / H200_LOAD)
    source = GpuSource(replay)
    first = source.sample(0.0)
    assert [g["name"] for g in first] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    replay.fail(0, code)
    with caplog.at_level(logging.WARNING, logger="stallscope.sources.gpu"):
        for _ in range(3):
            rest = source.sample(1.0)
            assert [g["index"] for g in rest] == [1]
            assert rest[0]["power_w"] == pytest.approx(627.40)
    assert list(source.lost) == [0]
    gone = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert len(gone) == 1
    assert gone[0].startswith("GPU 0 (NVIDIA H100 80GB HBM3")
    source.close()


def test_gpu_lost_before_open_is_skipped() -> None:
    replay = NvmlReplay.load(FIXTURES / H100_LOAD, FIXTURES / L40S_LOAD)
    replay.fail(1, pynvml.NVML_ERROR_GPU_IS_LOST)
    source = GpuSource(replay)
    assert [g["name"] for g in source.sample(0.0)] == ["NVIDIA H100 80GB HBM3"]
    assert list(source.lost) == [1]


# -- GPM (Hopper+) ----------------------------------------------------------------------------
def gpm_doc(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """The H100 load replay with GPM answers added. The GPM numbers are made up (nvidia-smi
    does not show GPM); what is tested is the two-sample protocol and where values land."""
    d = copy.deepcopy(doc(H100_LOAD))
    d["devices"][0]["nvmlGpmQueryDeviceSupport"] = {"version": 1, "isSupportedDevice": 1}
    d["devices"][0]["nvmlGpmMetricsGet"] = readings
    return d


def test_gpm_two_samples_per_interval() -> None:
    replay = NvmlReplay(
        gpm_doc(
            [
                {
                    "NVML_GPM_METRIC_SM_UTIL": 91.25,
                    "NVML_GPM_METRIC_SM_OCCUPANCY": 37.5,
                    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 62.0,
                },
                {
                    "NVML_GPM_METRIC_SM_UTIL": 40.0,
                    "NVML_GPM_METRIC_SM_OCCUPANCY": 12.5,
                    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"},
                },
            ]
        )
    )
    clock = FakeClock()
    source = GpuSource(replay, clock=clock)
    source.open()
    assert replay.calls.count("nvmlGpmSampleGet") == 1  # the first sample is taken at open
    clock.t += 1.0
    gpu = source.sample(1.0)[0]
    assert (gpu["sm_active_pct"], gpu["sm_occupancy_pct"], gpu["tensor_active_pct"]) == (
        91.25,
        37.5,
        62.0,
    )
    assert gpu["util_pct"] == 100.0  # "a kernel ran" vs how much of the SMs: both reported
    clock.t += 1.0
    gpu = source.sample(2.0)[0]  # the replay checks sample1 is the previous call's sample2
    assert (gpu["sm_active_pct"], gpu["sm_occupancy_pct"], gpu["tensor_active_pct"]) == (
        40.0,
        12.5,
        None,
    )
    assert replay.calls.count("nvmlGpmMetricsGet") == 2
    # each interval starts where the previous one ended: samples 1-2, then 2-3
    assert replay.gpm_pairs == [(0, 1, 2), (0, 2, 3)]
    assert len(replay.live_samples) == 2  # two buffers, reused
    source.close()
    assert replay.live_samples == set()


def test_gpm_too_soon_keeps_the_older_sample() -> None:
    replay = NvmlReplay(
        gpm_doc(
            [
                {
                    "NVML_GPM_METRIC_SM_UTIL": 77.0,
                    "NVML_GPM_METRIC_SM_OCCUPANCY": 20.0,
                    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5.0,
                }
            ]
        )
    )
    clock = FakeClock()
    source = GpuSource(replay, clock=clock)
    source.open()
    clock.t += 0.05  # under NVML's 100 ms refresh
    assert source.sample(0.0)[0]["sm_active_pct"] is None
    assert "nvmlGpmMetricsGet" not in replay.calls
    clock.t += 0.1  # 150 ms since the sample taken at open
    assert source.sample(0.0)[0]["sm_active_pct"] == 77.0
    source.close()


def test_gpm_off_or_unsupported_takes_no_samples() -> None:
    replay = NvmlReplay(gpm_doc([{"NVML_GPM_METRIC_SM_UTIL": 1.0}]))
    GpuSource(replay, gpm=False).sample(0.0)
    assert not any(c.startswith("nvmlGpm") for c in replay.calls)
    replay = NvmlReplay(doc(L40S_LOAD))  # Ada: GPM query says not supported
    gpu = GpuSource(replay).sample(0.0)[0]
    assert gpu["sm_active_pct"] is None
    assert "nvmlGpmSampleAlloc" not in replay.calls


# -- recording --------------------------------------------------------------------------------
def test_recorder_round_trip_gives_the_same_payload() -> None:
    """record_nvml.py's recorder, wrapped around a replay instead of a real GPU: what it writes
    replays to the same readings, GPM included."""
    original = gpm_doc(
        [
            {
                "NVML_GPM_METRIC_SM_UTIL": 55.5,
                "NVML_GPM_METRIC_SM_OCCUPANCY": 30.0,
                "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 12.0,
            }
        ]
    )
    original["devices"][0]["nvmlDeviceGetTemperature"] = {
        "NVML_TEMPERATURE_GPU": {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"}
    }
    clock = FakeClock()
    recorder = NvmlRecorder(NvmlReplay(original))
    source = GpuSource(recorder, clock=clock)
    source.open()
    clock.t += 1.0
    recorded_payload = source.sample(0.0)
    source.close()
    recorded = json.loads(json.dumps(recorder.document({"kind": "recorded-nvml"})))
    (got,), (want,) = (
        recorded["devices"][0]["nvmlGpmMetricsGet"],
        original["devices"][0]["nvmlGpmMetricsGet"],
    )
    assert {k: got[k] for k in want} == want
    # the source also asked GPM for the PCIe rates, which this replay does not have
    assert {k: v for k, v in got.items() if k not in want} == {
        "NVML_GPM_METRIC_PCIE_TX_PER_SEC": {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"},
        "NVML_GPM_METRIC_PCIE_RX_PER_SEC": {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"},
    }

    clock2 = FakeClock()
    again = GpuSource(NvmlReplay(recorded), clock=clock2)
    again.open()
    clock2.t += 1.0
    assert again.sample(0.0) == recorded_payload
    assert recorded_payload[0]["temp_c"] is None and recorded_payload[0]["sm_active_pct"] == 55.5
    again.close()


def test_recorder_round_trip_of_a_mig_gpu() -> None:
    """The recorder files a MIG device's answers under its GPU's mig_devices, so a recording
    of a real MIG GPU replays to the same GPU instances and per-process answers."""
    original = doc("nvml-replay-h200-mig-load-from-nvidia-smi-590.48.01.json")
    recorder = NvmlRecorder(NvmlReplay(original))
    source = GpuSource(recorder, gpm=False)
    first = source.sample(0.0)
    source.close()
    recorded = json.loads(json.dumps(recorder.document({"kind": "recorded-nvml"})))
    assert [m["nvmlDeviceGetGpuInstanceId"] for m in recorded["devices"][0]["mig_devices"]] == [
        2,
        2,
        3,
        9,
        10,
    ]
    again = GpuSource(NvmlReplay(recorded), gpm=False)
    assert again.sample(0.0) == first and first[0]["mig"]
    again.close()


def test_record_script_names() -> None:
    record = load_script("record_nvml")
    assert record.card_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert record.card_slug("NVIDIA GeForce RTX 4080 SUPER") == "rtx-4080-super"


# -- the fixtures are what the script derives -------------------------------------------------
def test_fixture_set_covers_the_required_cards() -> None:
    for name in (H100_IDLE, H100_LOAD, H200_LOAD, H100_MIG_LOAD, L40S_LOAD, RTX2080_IDLE):
        prov = doc(name)["provenance"]
        assert prov["kind"] == "derived-from-nvidia-smi"
        assert prov["capture_file"].endswith(".txt") and len(prov["capture_sha256"]) == 64


@pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"nvidia-smi captures not at {CAPTURES}")
def test_fixtures_regenerate_identically_from_the_captures(tmp_path: Path) -> None:
    make = load_script("make_nvml_replay")
    captures = sorted(CAPTURES.glob("*.txt"))
    assert captures
    assert make.main([*map(str, captures), "--out", str(tmp_path)]) == 0
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == ALL_REPLAYS
    for name in made:
        assert (tmp_path / name).read_text() == (FIXTURES / name).read_text(), name


# --- GPU use per process, and a GPU held but idle ----------------------------------------------


def test_gpu_use_per_process_reaches_prometheus_and_a_held_idle_gpu_is_named(
    tmp_path: Path,
) -> None:
    """Real readings put together: the H100 at idle (its capture's idle phase: 0% busy) with the
    two memory hogs of its load phase still holding 2566 and 1542 MiB and running nothing (pmon
    shows them so): the state of a node whose training died while its helpers kept their
    contexts. The exporter gives each process's memory and SM share with the GPU's labels and its
    pid; a run of that state, 12 minutes on a stepped clock, is diagnosed gpu_held_idle naming
    both holders."""
    from prometheus_client import generate_latest

    from stallscope.agent.exporter import PrometheusSink
    from stallscope.analysis.diagnose import diagnose_run
    from stallscope.collect import Collector, StoreSink
    from stallscope.store import RunStore, base_meta, new_run_dir, write_meta

    idle = doc("nvml-replay-h100-80gb-hbm3-idle-from-nvidia-smi-590.48.01.json")
    load = doc(H100_LOAD)
    dev = idle["devices"][0]
    hogs = [
        p
        for p in load["devices"][0]["nvmlDeviceGetComputeRunningProcesses"]
        if p["pid"] in (11327, 11328)
    ]
    dev["nvmlDeviceGetComputeRunningProcesses"] = hogs
    # pmon showed no sample for the hogs: NVML's "none since then"
    assert dev["nvmlDeviceGetProcessUtilization"] == {"nvml_error": "NVML_ERROR_NOT_FOUND"}
    gpu = GpuSource(NvmlReplay(idle), gpm=False)
    gpu.open()
    run_dir = new_run_dir(tmp_path, "held")
    t = [1_700_000_000.0]
    write_meta(run_dir, base_meta(["python", "train.py"], start=t[0], interval_s=60.0))
    store = RunStore(run_dir / "run.db")
    prom = PrometheusSink(["gpu"], hostname="gpu-node-1")
    c = Collector([gpu], [prom, StoreSink(store)], interval=60.0, clock=lambda: t[0])
    for _ in range(13):
        c.sample_once()
        t[0] += 60.0
    text = generate_latest(prom.registry).decode()
    c.stop(final_sample=False)
    store.close()
    lines = [ln for ln in text.splitlines() if ln.startswith("stallscope_gpu_process_")]
    mem = next(ln for ln in lines if "memory_used_bytes" in ln and 'pid="11327"' in ln)
    assert 'gpu="0"' in mem and 'UUID="GPU-' in mem and 'Hostname="gpu-node-1"' in mem
    assert float(mem.rsplit(" ", 1)[1]) == 2566 * 1048576
    sm = next(ln for ln in lines if "sm_utilization_ratio" in ln and 'pid="11328"' in ln)
    assert float(sm.rsplit(" ", 1)[1]) == 0.0, sm
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["end"] = t[0]
    write_meta(run_dir, meta)
    found = [f for f in diagnose_run(run_dir)["findings"] if f["kind"] == "gpu_held_idle"]
    assert found, "no gpu_held_idle"
    ev = found[0]["evidence"]
    assert ev["gpu"] == "gpu0" and ev["idle_s"] >= 600
    assert {(h["pid"], h["mem_mib"]) for h in ev["holders"]} == {(11327, 2566), (11328, 1542)}


def test_under_mig_no_process_utilization_and_no_idle_verdict() -> None:
    """MIG: NVML keeps no per-process samples (pmon shows '-' for the busy gpu_burn too) and no
    GPU utilization: the per-process SM share is absent, never 0."""
    mig = doc("nvml-replay-h100-mig-load-from-nvidia-smi-590.48.01.json")
    source = GpuSource(NvmlReplay(mig), gpm=False)
    [g] = source.sample(0.0)
    source.close()
    assert g["util_pct"] is None and g["processes"]
    assert all(p["sm_pct"] is None and p["mem_util_pct"] is None for p in g["processes"])
    names = {pt.name for pt in source.points([g])}
    # the recording holds three processes' memory (2,296, 1,272 and 7,484 MiB): kept, per pid
    assert sorted(p["used_mib"] for p in g["processes"]) == [1272, 2296, 7484]
    mem = [pt for pt in source.points([g]) if pt.name == "gpu.proc_mem_mib"]
    assert sorted(pt.value for pt in mem) == [1272.0, 2296.0, 7484.0]
    assert "gpu.proc_sm_pct" not in names and "gpu.util_pct" not in names


@pytest.mark.parametrize(
    ("name", "want"),
    [
        # nvidia-smi's MIG devices table of the H100: GI 2 3g.40gb 11091/40448 MiB under load...
        (
            "nvml-replay-h100-mig-load-from-nvidia-smi-590.48.01.json",
            [
                (2, "3g.40gb", 11091, 40448),
                (3, "2g.20gb", 17, 20096),
                (9, "1g.10gb", 9, 9984),
                (10, "1g.10gb", 9, 9984),
            ],
        ),
        # ...and the H200's, whose GPU instance 2 holds two compute instances (1c.3g.71gb and
        # 2c.3g.71gb sharing one framebuffer): one GPU instance, listed once
        (
            "nvml-replay-h200-mig-load-from-nvidia-smi-590.48.01.json",
            [
                (2, "3g.71gb", 16925, 71424),
                (3, "2g.35gb", 17, 33280),
                (9, "1g.18gb", 9, 16384),
                (10, "1g.18gb", 9, 16384),
            ],
        ),
    ],
)
def test_mig_instances_read_like_nvidia_smis_mig_table(
    name: str, want: list[tuple[Any, ...]]
) -> None:
    source = GpuSource(NvmlReplay(doc(name)), gpm=False)
    [g] = source.sample(0.0)
    got = [
        (m["gpu_instance_id"], m["profile"], m["mem_used_mib"], m["mem_total_mib"])
        for m in g["mig"]
    ]
    assert got == want
    assert all(m["uuid"].startswith("MIG-") for m in g["mig"])
    points = {(p.name, p.entity): p.value for p in source.points([g])}
    assert points[("gpu.mig_mem_used_mib", "gpu0/gi2")] == want[0][2]
    ents = source.entities([g])
    assert ents["gpu0/gi9"]["mig_profile"] == want[2][1]
    source.close()


def test_a_gpu_not_in_mig_mode_has_no_instances() -> None:
    for name in (H100_LOAD, "nvml-replay-l40s-load-from-nvidia-smi-595.80.json"):
        source = GpuSource(NvmlReplay(doc(name)), gpm=False)
        [g] = source.sample(0.0)
        source.close()
        assert g["mig"] is None, name
