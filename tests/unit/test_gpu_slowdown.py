"""gpu_slowdown: the GPU slowed the training (issue 52, part 1).

Each run here is recorded the way ``stallscope run`` records one: the gpu source reads the
direct NVML recording of a lent H200 (tests/fixtures/gpu-h200/, ``NvmlReplay``) through the
collector into a run store, one sample a second, with the clock, throttle-reason, power-limit,
temperature and XID answers changed mid-run; the probe's steps are built as
tests/diagnose_inputs.py builds them. Each test holds a positive case beside its negative one,
so each fails without the rule (stallscope/analysis/diagnose/rules/slowdown.py)."""

from __future__ import annotations

import copy
import io
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import FIXTURES

from stallscope.alerts import AlertEngine, parse_rules
from stallscope.analysis.diagnose import diagnose_run
from stallscope.analysis.gpuevents import health_events
from stallscope.analysis.rundata import load_run
from stallscope.collect.collector import Collector
from stallscope.collect.sinks import StoreSink
from stallscope.sources.gpu import GpuSource
from stallscope.store import RunStore, StepRow
from stallscope.store.rundir import base_meta, new_run_dir, write_meta
from stallscope.testing.nvml_replay import NvmlReplay

H200 = FIXTURES / "gpu-h200" / "nvml-h200-load-nvml-580.159.04.json"
T0 = 1_763_712_000.0
SECONDS = 240
AT = 120  #: the second the GPU changes
PIDS = (741, 742)  #: the recorded trainer's pid on GPU 0; a second rank's on GPU 1


def _doc(gpus: int) -> dict[str, Any]:
    """The recorded H200 under training load (97% busy), ``gpus`` of it: each GPU's trainer
    holds 11 GB of memory (its rank's process)."""
    doc: dict[str, Any] = json.loads(H200.read_text())
    dev = doc["devices"][0]
    dev["nvmlDeviceGetUtilizationRates"] = {"gpu": 97, "memory": 40}
    devices = []
    for i in range(gpus):
        d = copy.deepcopy(dev)
        d["nvmlDeviceGetUUID"] = f"{dev['nvmlDeviceGetUUID']}-{i}"
        for p in d["nvmlDeviceGetComputeRunningProcesses"]:
            p["pid"] = PIDS[i]
        d["nvmlDeviceGetProcessUtilization"] = {"nvml_error": "NVML_ERROR_NOT_FOUND"}
        devices.append(d)
    doc["devices"] = devices
    doc["system"]["nvmlDeviceGetCount"] = gpus
    return doc


def _steps(rank: int, pace: Callable[[float], float | None], seed: int = 1) -> list[StepRow]:
    """The probe's steps of one rank: each lasts ``pace(t)`` seconds (t into the run; None: no
    training step then, an evaluation), ±3% noise."""
    rnd = random.Random(seed + rank)
    out, t, i = [], 0.5, 0
    while t < SECONDS - 1:
        step = pace(t)
        if step is None:
            t += 0.5
            continue
        step *= 1 + rnd.uniform(-0.03, 0.03)
        wait = 0.002
        out.append(StepRow(rank, i, T0 + t + wait, wait, step - wait, samples=64, epoch=0))
        t += step
        i += 1
    return out


def record(
    tmp_path: Path,
    name: str,
    *,
    gpus: int = 1,
    change: Callable[[NvmlReplay, int], None] | None = None,
    paces: tuple[Callable[[float], float | None], ...] = (lambda t: 0.100,),
) -> Path:
    """A run folder: the gpu source over the H200 replay, sampled each second through the
    collector into run.db (``change(replay, second)`` alters NVML's answers as it goes), and
    one rank's probe steps per pace."""
    replay = NvmlReplay(_doc(gpus))
    t = [T0]
    source = GpuSource(replay, clock=lambda: t[0], gpm=False, background=False)
    run_dir = new_run_dir(tmp_path, name)
    write_meta(run_dir, base_meta(["python", "train.py"], start=T0, interval_s=1.0))
    store = RunStore(run_dir / "run.db")
    c = Collector([source], [StoreSink(store)], interval=1.0, clock=lambda: t[0])
    for second in range(SECONDS):
        t[0] = T0 + second
        if change is not None:
            change(replay, second)
        while source.poll_events(0):  # the XID thread's work, in step with the samples
            pass
        c.sample_once()
    c.stop(final_sample=False)
    for rank, pace in enumerate(paces):
        rows = _steps(rank, pace)
        store.add_steps(rows)
        store.set_probe(rank, PIDS[rank], {"num_workers": 4}, len(rows), 0)
    store.close()
    meta = json.loads((run_dir / "meta.json").read_text())
    meta.update(end=T0 + SECONDS, exit_code=0)
    write_meta(run_dir, meta)
    return run_dir


def thermal(
    gpu: int = 0, clock: int = 1410, mask: int = 0x40, temp: int = 87
) -> Callable[[NvmlReplay, int], None]:
    """From AT on, GPU ``gpu`` runs hot: its SM clock at ``clock`` MHz, the reason ``mask``."""

    def change(replay: NvmlReplay, second: int) -> None:
        if second == AT:
            dev = replay.devices[gpu]
            dev["nvmlDeviceGetClockInfo"] = {"NVML_CLOCK_SM": clock}
            dev["nvmlDeviceGetCurrentClocksEventReasons"] = mask
            dev["nvmlDeviceGetTemperature"] = {"NVML_TEMPERATURE_GPU": temp}

    return change


def slower(at: float = AT, before: float = 0.100, after: float = 0.122) -> Callable[[float], float]:
    return lambda t: before if t < at else after


def found(run_dir: Path) -> list[dict[str, Any]]:
    return [f for f in diagnose_run(run_dir)["findings"] if f["kind"] == "gpu_slowdown"]


# -- the finding, its time and its cause --------------------------------------------------------
def test_a_thermal_clock_drop_that_slows_the_steps_is_named_with_its_numbers(
    tmp_path: Path,
) -> None:
    """GPU 0 throttles for heat at 2:00 (SM clock 1,980 → 1,410 MHz, hw_thermal, 87 °C) and the
    steps go from 100 to 122 ms: the finding says when, by how much, and why."""
    [f] = found(record(tmp_path, "hot", change=thermal(), paces=(slower(),)))
    ev = f["evidence"]
    assert abs(ev["start_s"] - AT) <= 3, ev["start_s"]
    assert 0.17 <= ev["slower_share"] <= 0.27, ev["slower_share"]
    [cause] = ev["causes"]
    assert cause["cause"] == "sm_clock" and cause["reasons"] == ["hw_thermal"]
    assert (cause["sm_clock_before_mhz"], cause["sm_clock_after_mhz"]) == (1980, 1410)
    assert cause["temp_c"] == 87
    s = f["summary"]
    assert "Steps 22% slower (100 → 12" in s and ", 2:00 into the run, when" in s
    assert "GPU 0's SM clock fell from 1,980 to 1,410 MHz (HW thermal slowdown, 87 °C)" in s
    assert f["severity"] == "warning" and f["est_speedup"] > 1.15
    assert any("cooling" in x["action"] for x in f["fixes"])


def test_a_clock_that_drops_while_step_time_holds_is_no_finding(tmp_path: Path) -> None:
    """The same throttled clock with steps at their pace, and an evaluation (no steps for 30 s,
    the GPU idle at a low clock) with the same pace after it: no finding. The slowed steps
    beside them get one."""
    assert found(record(tmp_path, "control", change=thermal(), paces=(slower(),)))
    assert not found(record(tmp_path, "steady", change=thermal(), paces=(lambda t: 0.100,)))

    def idle_eval(replay: NvmlReplay, second: int) -> None:
        dev = replay.devices[0]
        evaluating = AT <= second < AT + 30
        dev["nvmlDeviceGetClockInfo"] = {"NVML_CLOCK_SM": 345 if evaluating else 1980}
        dev["nvmlDeviceGetCurrentClocksEventReasons"] = 0x1 if evaluating else 0
        dev["nvmlDeviceGetUtilizationRates"] = {"gpu": 0 if evaluating else 97, "memory": 0}

    evaluation = record(
        tmp_path, "eval", change=idle_eval, paces=(lambda t: None if AT <= t < AT + 30 else 0.100,)
    )
    assert not found(evaluation)


def test_slower_steps_without_a_gpu_cause_are_no_finding(tmp_path: Path) -> None:
    """Steps 22% slower while the GPU keeps its clock, reasons and health: the change is seen,
    and it is not the GPU's. The same steps over a throttled GPU are."""
    run_dir = record(tmp_path, "cpu-side", paces=(slower(),))
    doc = diagnose_run(run_dir)
    assert not [f for f in doc["findings"] if f["kind"] == "gpu_slowdown"]
    assert found(record(tmp_path, "gpu-side", change=thermal(), paces=(slower(),)))


def test_an_xid_with_remapped_rows_is_stored_with_its_step_and_names_the_slowdown(
    tmp_path: Path,
) -> None:
    """A contained ECC error (XID 94) at 2:00 remaps a row; the steps slow then. The XID and
    the remap are events of the run, each with its time and the step it happened in, in
    ``show``, ``show --json``, ``diagnose --json`` and the report; the finding is critical."""

    def ecc(replay: NvmlReplay, second: int) -> None:
        if second == AT:
            replay.xid(0, 94)
            replay.devices[0]["nvmlDeviceGetRemappedRows"] = [0, 1, 1, 0]
            replay.devices[0]["nvmlDeviceGetTotalEccErrors"] = {
                "NVML_MEMORY_ERROR_TYPE_UNCORRECTED,NVML_VOLATILE_ECC": 1
            }

    run_dir = record(tmp_path, "xid", change=ecc, paces=(slower(after=0.140),))
    data = load_run(run_dir)
    told = health_events(data)
    kinds = sorted(e["kind"] for e in told)
    assert kinds == ["gpu_health", "gpu_health", "gpu_health", "gpu_xid"], told
    xid = next(e for e in told if e["kind"] == "gpu_xid")
    assert xid["xid"] == 94 and xid["gpu"] == "gpu0" and xid["at_s"] == AT
    # the step running at 2:00: 1,200 steps of 100 ms before it
    assert xid["step"]["rank"] == 0 and abs(xid["step"]["step"] - 1200) <= 40, xid["step"]
    messages = " | ".join(e["message"] for e in told)
    assert "1 row remapped after uncorrectable ECC errors (1 in all)" in messages
    assert "1 new uncorrected ECC error (1 in all)" in messages
    assert "a row remap waits for a GPU reset" in messages

    [f] = found(run_dir)
    assert f["severity"] == "critical"
    causes = {c["cause"] for c in f["evidence"]["causes"]}
    assert "xid" in causes and "health_event" in causes
    assert "GPU 0 raised XID 94 at 2:00 (rank 0's step" in f["summary"]
    assert "contained ECC error" in f["summary"]
    assert f["evidence"]["health_events"][0]["step"] == xid["step"]
    assert any("reset GPU 0" in x["action"] for x in f["fixes"])

    from rich.console import Console

    from stallscope.cli.show import load_summary, print_run
    from stallscope.report import write_report

    buf = io.StringIO()
    print_run(run_dir, Console(file=buf, width=300, color_system=None))
    shown = buf.getvalue()
    assert "GPU health events" in shown and "XID 94" in shown, shown
    assert "2:00 into the run, rank 0's step" in shown
    assert any(e["kind"] == "gpu_xid" for e in load_summary(run_dir)["events"])  # show --json
    html = write_report(run_dir, tmp_path / "r.html").read_text()
    timeline = html[html.index('id="timeline"') : html.index('id="summary"')]
    assert "XID 94" in timeline and "rank 0&#x27;s step" in timeline  # the note, escaped
    assert "SM clock MHz" in timeline  # the clocks beside the events


def test_a_rank_slowed_by_its_own_gpu_is_named_the_straggler(tmp_path: Path) -> None:
    """Two ranks under DDP, one GPU each (each rank's process held memory on its GPU). GPU 1's
    power limit is lowered from 700 to 450 W at 2:00: its clock falls under the power cap, and
    both ranks' steps slow (rank 0 waits for rank 1 in the all-reduce). Rank 1 is named, by
    its own GPU."""

    def capped(replay: NvmlReplay, second: int) -> None:
        if second == AT:
            dev = replay.devices[1]
            dev["nvmlDeviceGetEnforcedPowerLimit"] = 450000
            dev["nvmlDeviceGetClockInfo"] = {"NVML_CLOCK_SM": 1590}
            dev["nvmlDeviceGetCurrentClocksEventReasons"] = 0x4

    run_dir = record(
        tmp_path, "ddp", gpus=2, change=capped, paces=(slower(after=0.125), slower(after=0.125))
    )
    [f] = found(run_dir)
    ev = f["evidence"]
    assert ev["gpu"] == "gpu1" and ev["straggler_rank"] == 1 and ev["rank_gpu_known"] is True
    assert ev["ranks"] == [0, 1]
    [cause] = ev["causes"]
    assert cause["reasons"] == ["sw_power_cap"]
    assert (cause["power_limit_before_w"], cause["power_limit_after_w"]) == (700, 450)
    assert "power cap" in f["summary"] and "lowered from 700 to 450 W" in f["summary"]
    assert "Rank 1 is the straggler, slowed by its own GPU (gpu1)" in f["summary"]
    assert "rank 0 slowed with it" in f["summary"]
    assert any("power limit" in x["action"] for x in f["fixes"])
    # the same ranks with GPU 1 throttled while their steps hold: nothing
    assert not found(
        record(
            tmp_path, "ddp-steady", gpus=2, change=capped, paces=(lambda t: 0.100, lambda t: 0.100)
        )
    )


def test_new_ecc_errors_are_a_health_problem_and_fire_the_gpu_health_alert() -> None:
    """Remapped rows and uncorrected ECC errors that grow during the run are told once each
    (``gpu_health`` events) and make ``gpu.health_problem`` 1, so the shipped ``gpu_health``
    alert fires on them (docs/alerts.md)."""
    replay = NvmlReplay(_doc(1))
    source = GpuSource(replay, gpm=False, background=False)
    engine = AlertEngine(parse_rules({}, "defaults").rules)
    fired = []
    for second in range(5):
        if second == 3:
            replay.devices[0]["nvmlDeviceGetTotalEccErrors"] = {
                "NVML_MEMORY_ERROR_TYPE_UNCORRECTED,NVML_VOLATILE_ECC": 2
            }
        reading = source.read(T0 + second)
        assert reading is not None
        for tr in engine.evaluate(T0 + second, reading.points):
            fired.append((second, tr.rule.name, tr.entity, tr.state))
    told = source.drain_events()
    source.close()
    assert told == [("gpu_health", "GPU 0: 2 new uncorrected ECC errors (2 in all)")]
    assert fired == [(3, "gpu_health", "gpu0", "firing")], fired


def _ddp_steps(rank: int, comm: float, seed: int = 1) -> list[StepRow]:
    """One rank's steps under DDP for the whole run: 125 ms each, ``comm`` of it in the
    all-reduce (the fast rank waits there for the slow one), ±3% noise."""
    rnd = random.Random(seed + rank)
    out, t = [], 0.5
    for i in range(int((SECONDS - 2) / 0.125)):
        step = 0.125 * (1 + rnd.uniform(-0.03, 0.03))
        wait = 0.002
        out.append(
            StepRow(
                rank, i, T0 + t + wait, wait, step - wait, samples=64, epoch=0, comm_s=comm * step
            )
        )
        t += step
    return out


def _ddp_run(tmp_path: Path, name: str, change: Callable[[NvmlReplay, int], None] | None) -> Path:
    """Two ranks, one GPU each, the whole run with rank 0 waiting in the all-reduce 30% of its
    step and rank 1 2%: rank 1 is the straggler."""
    run_dir = record(tmp_path, name, gpus=2, change=change, paces=())
    store = RunStore(run_dir / "run.db")
    for rank, comm in ((0, 0.30), (1, 0.02)):
        rows = _ddp_steps(rank, comm)
        store.add_steps(rows)
        store.set_probe(rank, PIDS[rank], {"num_workers": 4}, len(rows), 0)
    store.close()
    return run_dir


def _straggler(run_dir: Path) -> dict[str, Any]:
    [f] = [f for f in diagnose_run(run_dir)["findings"] if f["kind"] == "straggler_rank"]
    return f


def test_a_straggler_whose_own_gpu_runs_slower_all_run_is_named_by_its_gpu(
    tmp_path: Path,
) -> None:
    """No change point (GPU 1 is hot from the first second), so no gpu_slowdown: the
    straggler's cause is its GPU, read against the other rank's."""

    def hot_from_start(replay: NvmlReplay, second: int) -> None:
        thermal(gpu=1)(replay, AT if second == 0 else -1)

    f = _straggler(_ddp_run(tmp_path, "ddp-hot", hot_from_start))
    ev = f["evidence"]
    assert ev["rank"] == 1 and ev["cause"] == "gpu", ev
    gpu = ev["gpu"]
    assert gpu["gpu"] == "gpu1" and gpu["rank_gpu_known"] is True
    assert gpu["sm_clock_mhz"] == 1410 and gpu["peers_sm_clock_mhz"] > 1410 / (1 - 0.08)
    assert gpu["reasons"] == ["hw_thermal"] and gpu["temp_c"] == 87
    assert "its GPU (gpu1) ran at 1,410 MHz" in f["summary"] and "HW thermal" in f["summary"]
    assert f["fixes"][0]["action"].startswith("check the GPU's cooling")
    assert "while its rank lagged" in f["fixes"][0]["why"]


def test_a_straggler_on_a_gpu_like_the_others_keeps_its_compute_cause(tmp_path: Path) -> None:
    f = _straggler(_ddp_run(tmp_path, "ddp-cool", None))
    assert f["evidence"]["rank"] == 1 and f["evidence"]["cause"] == "compute"
    assert f["evidence"]["gpu"] is None and "cooling" not in json.dumps(f["fixes"])
