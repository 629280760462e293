"""The HTML report: sections, escaping of machine data, skipped plots, size and speed.

Runs are built synthetically in ``tmp_path`` with the real :class:`RunStore` and
:func:`write_meta`; the diagnosis is a hand-built ``diagnose --json`` document, plus the real
one where this stallscope has :mod:`stallscope.analysis.diagnose`.
"""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stallscope.analysis.diagnose import diagnose_run
from stallscope.errors import StallscopeError
from stallscope.report import render_report, write_report
from stallscope.report.plots import MAX_POINTS, clock, downsample, time_step
from stallscope.store import Point, RunStore, StepRow, write_meta

EVIL = "<script>alert(1)</script>"
EVIL2 = '"><img src=x onerror=alert(2)>'
EVIL_DIR = '"><img src=x onerror=alert(3)>'  # a run directory name (no slash allowed)
T0 = 1_763_712_000.0


def make_run(
    root: Path,
    *,
    name: str = "run",
    duration_s: int = 120,
    interval: float = 1.0,
    gpus: int = 2,
    disks: tuple[str, ...] = ("nvme0n1", "sda"),
    data_devices: tuple[str, ...] | None = ("nvme0n1",),
    workers: int = 3,
    steps: int = 300,
    sm_active: bool = True,
    host: bool = True,
    evil: bool = False,
    cores: int = 4,
) -> Path:
    """A stored run: an input-bound trainer (GPU idle when the data wait is high)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    gpu_name = f"NVIDIA H100 {EVIL}" if evil else "NVIDIA H100 80GB HBM3"
    evil_dev = f"sdb{EVIL2}"
    if evil:
        disks = (*disks, evil_dev)
        data_devices = (*(data_devices or ()), evil_dev)
    store = RunStore(run_dir / "run.db")
    pids = [str(4000 + i) for i in range(workers + 1)]
    for i, pid in enumerate(pids):
        role = "main" if i == 0 else "worker"
        pname = EVIL if evil and i == 1 else ("python" if i == 0 else "pt_data_worker")
        # workers are the trainer's children, as DataLoader workers are
        ppid = 1 if i == 0 else int(pids[0])
        store.upsert_entity(
            "procs",
            pid,
            {
                "name": pname,
                "role": role,
                "ppid": ppid,
                "cmdline": f"python train.py {EVIL2 if evil else ''}",
            },
            T0,
        )
    for g in range(gpus):
        store.upsert_entity("gpu", f"gpu{g}", {"name": gpu_name, "uuid": f"GPU-{g}"}, T0)
    n = int(duration_s / interval)
    for k in range(n):
        ts = T0 + k * interval
        phase = 0.5 + 0.5 * math.sin(k / 30.0)  # 1 = starved, 0 = fed
        pts: list[Point] = []
        for g in range(gpus):
            pts.append(Point("gpu.util_pct", f"gpu{g}", 95 - 80 * phase))
            if sm_active:
                pts.append(Point("gpu.sm_active_pct", f"gpu{g}", 70 - 60 * phase))
            pts.append(Point("gpu.mem_used_mib", f"gpu{g}", 30000.0 + k))
        for d in disks:
            busy = d in (data_devices or ())
            pts += [
                Point("disk.util_pct", d, 40 + 59 * phase if busy else 2.0),
                Point("disk.r_await_ms", d, 5 + 80 * phase if busy else 0.5),
                Point("disk.rkb_s", d, 150_000.0 if busy else 10.0),
                Point("disk.r_s", d, 1200.0 if busy else 1.0),
            ]
        if host:
            pts += [
                Point("host.cpu_pct", "", 30 + 10 * phase),
                Point("host.iowait_pct", "", 25 * phase),
                Point("host.cpu_max_core_pct", "", 99.0),
                Point("host.mem_used_mib", "", 12000.0 + k),
                Point("host.mem_total_mib", "", 23000.0),
                Point("host.page_cache_mib", "", 6000.0),
                Point("host.shm_used_mib", "", 900.0 + 5 * phase),
                Point("host.shm_total_mib", "", 11500.0),
                Point("host.swap_used_mib", "", 0.0),
            ]
            pts += [Point("host.cpu_core_pct", f"cpu{c}", 30.0) for c in range(cores)]
        for i, pid in enumerate(pids):
            pts += [
                Point("procs.cpu_pct", pid, 99.0 if i == 0 else 20 + 10 * phase),
                Point("procs.rss_mib", pid, 2000.0 if i == 0 else 600.0),
                Point("procs.read_kb_s", pid, 0.0 if i == 0 else 40_000.0),
                Point("procs.d_state", pid, float(i > 0 and k % 2 == 0)),
            ]
        pts.append(Point("collector.cpu_s", "", 0.002))
        store.add_points(ts, pts)
    rows: list[StepRow] = []
    dt = duration_s / max(steps, 1)
    for s in range(steps):
        phase = 0.5 + 0.5 * math.sin(s * dt / 30.0)
        rows.append(
            StepRow(
                0,
                s,
                T0 + s * dt,
                wait_s=dt * 0.8 * phase,
                host_s=dt * (1 - 0.8 * phase),
                gpu_busy_s=dt * (1 - 0.8 * phase),
                gpu_idle_s=dt * 0.8 * phase,
                samples=64,
                epoch=0,
            )
        )
    store.add_steps(rows)
    if steps:
        store.set_probe(
            0,
            4000,
            {
                "num_workers": workers,
                "pin_memory": False,
                "batch_size": 64,
                "dataset_type": EVIL if evil else "ImageFolder",
            },
            steps,
            0,
        )
    store.add_event(T0 + 1, "smart", "unavailable", f"cannot open /dev/vda {EVIL if evil else ''}")
    store.add_event(T0 + 5, "gpu", "note", "GPU clocks limited: thermal")
    store.close()
    unavailable: dict[str, str] = {"health": "smartctl: permission denied"}
    if not gpus:
        unavailable["gpu"] = f"NVML: driver not loaded {EVIL if evil else ''}".strip()
    write_meta(
        run_dir,
        {
            "command": ["python", "train.py", "--data", EVIL if evil else "/data/imagenet"],
            "host": f"node-7{EVIL2}" if evil else "node-7",
            "start": T0,
            "end": T0 + duration_s,
            "exit_code": 0,
            "interval_s": interval,
            "data": f"/data/{EVIL}" if evil else "/data/imagenet",
            "data_devices": list(data_devices or []),
            "physical_cores": cores,
            "logical_cores": cores * 2,
            "unavailable": unavailable,
            "samples": n,
        },
    )
    return run_dir


def diagnosis(run_dir: Path, evil: bool = False) -> dict[str, Any]:
    """A ``diagnose --json`` document as docs/architecture.md defines it."""
    x = EVIL if evil else ""
    return {
        "run": str(run_dir),
        "verdict": "input_bound.fetch",
        "stall_fraction": 0.42,
        "findings": [
            {
                "kind": "input_bound.fetch",
                "severity": "critical",
                "confidence": 0.85,
                "summary": f"Workers wait on reads from nvme0n1 {x}: the GPU idles 42% of the run.",
                "evidence": {
                    "disk_util_pct_p95": 99.1,
                    "r_await_ms_p95": 84.7,
                    "worker_d_state_share": 0.5,
                    f"device{x}": f"nvme0n1{EVIL2 if evil else ''}",
                    "window_s": [10, 110],
                    "per_worker": {"4001": 12.5, "4002": 13},
                    "signals": ["workers in D state in 50% of samples", f"read latency 85 ms {x}"],
                },
                "rule": f"data wait 42% ≥ 15% {x}",
                "fixes": [
                    {
                        "action": f"pack the dataset with `stallscope pack` {x}",
                        "why": "small files: 4 KiB requests",
                    },
                    {"action": "num_workers 3 → 8", "why": "workers mostly in D state"},
                ],
                "est_speedup": 1.72,
            },
            {
                "kind": "gpu_throttled",
                "severity": "warning",
                "confidence": 0.4,
                "summary": "gpu0 hit its thermal limit for 5 s.",
                "evidence": {"seconds": 5},
                "fixes": [],
                "est_speedup": 1.0,
            },
            {
                "kind": "new_kind.later",
                "severity": "info",
                "confidence": None,
                "summary": "A kind this renderer does not know yet.",
                "evidence": {},
                "fixes": [{"action": "nothing"}],
            },
        ],
    }


def _svg(doc: str, pid: str) -> str:
    m = re.search(rf'<svg id="svg-{pid}".*?</svg>', doc, re.S)
    assert m, f"no svg-{pid} in the report"
    return m.group(0)


# --- sections ------------------------------------------------------------------------------------
def test_report_opens_with_verdict_and_findings(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    doc = render_report(run, diagnosis(run))
    assert doc.startswith("<!DOCTYPE html>")
    order = [
        doc.index(f'id="{s}"')
        for s in (
            "run-header",
            "verdict",
            "findings",
            "timeline",
            "summary",
            "processes",
            "loader",
            "unavailable",
            "events",
        )
    ]
    assert order == sorted(order), "sections out of order"
    verdict = doc[doc.index('id="verdict"') : doc.index('id="findings"')]
    assert "storage cannot feed the trainer" in verdict
    assert "input_bound.fetch" in verdict
    assert "42%" in verdict and "×1.72" in verdict
    assert "pack the dataset" in verdict  # the first fix is in the banner
    assert doc.count('<article class="finding') == 3
    first = doc[doc.index('id="finding-0"') : doc.index('id="finding-1"')]
    assert "critical" in first and "85%" in first
    assert "84.7" in first and "99.1" in first  # evidence table
    assert "num_workers 3 → 8" in first and "workers mostly in D state" in first
    assert "10, 110" in first  # a time window
    assert "<li>workers in D state in 50% of samples</li>" in first  # signals, one per line
    assert "Rule: data wait 42% ≥ 15%" in first
    assert "new_kind.later" in doc  # unknown kinds are shown as they are
    # header
    header = doc[: doc.index('id="verdict"')]
    for text in (
        "python train.py --data /data/imagenet",
        "node-7",
        "exit code 0",
        "2:00",
        "every 1 s",
        "/data/imagenet",
    ):
        assert text in header, text


def test_every_plot_is_drawn_on_one_time_axis(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    doc = render_report(run, diagnosis(run))
    boxes = []
    for pid in ("gpu", "wait", "disk", "cpu", "mem"):
        svg = _svg(doc, pid)
        assert 'class="plot-svg"' in svg
        boxes.append(re.search(r'viewBox="([^"]*)"', svg).group(1).split()[2])  # type: ignore[union-attr]
        assert "2:00" in svg, f"{pid}: x axis does not reach the run's end"
    assert len(set(boxes)) == 1, "plots differ in width: their time axes would not line up"
    ids = re.findall(r'\sid="([^"]+)"', doc)
    assert len(ids) == len(set(ids)), "duplicate element ids across the inline SVGs"
    refs = {m.group(2) for m in re.finditer(r'(url\(#|href="#)([^")]*)', doc)}
    assert refs and refs <= set(ids), f"dangling references: {refs - set(ids)}"
    gpu = _svg(doc, "gpu")
    assert "SM active" in gpu and "NVIDIA H100 80GB HBM3" in gpu
    disk = _svg(doc, "disk")
    assert "nvme0n1" in disk and ">sda<" not in disk  # only the dataset's device
    assert "rank" not in _svg(doc, "wait")  # one rank: no rank labels
    cpu = _svg(doc, "cpu")
    assert "trainer (main process)" in cpu and "workers (3 seen)" in cpu and "iowait" in cpu
    mem = _svg(doc, "mem")
    assert "/dev/shm used" in mem and "swap used" in mem


def test_machine_data_is_escaped_everywhere(tmp_path: Path) -> None:
    run = make_run(tmp_path, name=EVIL_DIR, evil=True)
    doc = render_report(run, diagnosis(run, evil=True))
    assert EVIL not in doc and EVIL2 not in doc and EVIL_DIR not in doc
    assert doc.count("<script") == 1, "only the page's own script"
    assert "<img" not in doc  # "onerror=alert" stays, as harmless escaped text
    esc = html.escape(EVIL)
    # each place machine data reaches: header, findings, plots' legends, tables, events
    assert doc.count(esc) >= 8, doc.count(esc)
    for pid in ("gpu", "disk"):
        svg = _svg(doc, pid)
        assert "<script" not in svg and "<img" not in svg
        assert "&lt;" in svg, f"{pid}: machine text should appear, escaped"
    assert html.escape(EVIL2) in doc  # the host, device, command line
    assert "&lt;img src=x onerror=alert(3)&gt;" in doc  # the run directory name


def test_names_are_not_read_as_math(tmp_path: Path) -> None:
    """A ``$`` pair in a GPU name would be mathtext to matplotlib (and can fail to parse)."""
    run = make_run(tmp_path)
    db = RunStore(run / "run.db")
    db.upsert_entity("gpu", "gpu0", {"name": "odd $\\frac{$ name"}, T0)
    db.close()
    doc = render_report(run, diagnosis(run))
    assert "odd $\\frac{$ name" in _svg(doc, "gpu")


def test_absent_data_gives_one_line_notes(tmp_path: Path) -> None:
    run = make_run(tmp_path, gpus=0, steps=0, host=False, workers=0, disks=())
    doc = render_report(run, diagnosis(run))
    assert "<svg" not in doc.replace('<svg id="svg-', "")  # not a single plot drawn
    for pid, why in (
        ("gpu", "NVML: driver not loaded"),
        ("wait", "stallscope.watch(loader)"),
        ("disk", "No disk samples"),
        ("mem", "No memory samples"),
        ("phases", "No sampled stacks in this run"),
    ):
        m = re.search(rf'<div class="skipped" id="plot-{pid}">(.*?)</div>', doc)
        assert m, pid
        assert why in m.group(1) and "\n" not in m.group(1)
    # the CPU plot still has the trainer's main process
    assert 'id="svg-cpu"' in doc


def test_empty_and_unfinished_run(tmp_path: Path) -> None:
    """A run killed before its first sample: meta.json and an empty store."""
    run = tmp_path / "empty"
    run.mkdir()
    RunStore(run / "run.db").close()
    write_meta(
        run,
        {
            "command": ["python", "t.py"],
            "host": "h",
            "start": T0,
            "end": None,
            "exit_code": None,
            "interval_s": 1.0,
        },
    )
    doc = render_report(
        run,
        {"run": str(run), "verdict": "insufficient_data", "stall_fraction": None, "findings": []},
    )
    assert "still running" in doc
    assert "Not enough data to name a bottleneck" in doc
    assert "The diagnosis found nothing to report." in doc
    assert "No samples stored" in doc
    # every plot skipped with its reason (the sampled-stacks plot too)
    assert doc.count('class="skipped"') == 6 and "<svg" not in doc
    assert "No sampled stacks in this run" in doc


def test_missing_run_database_is_a_clear_error(tmp_path: Path) -> None:
    run = tmp_path / "nodb"
    run.mkdir()
    write_meta(run, {"command": ["x"], "start": T0})
    with pytest.raises(StallscopeError, match="no run database"):
        render_report(run, None)


def test_busiest_disk_when_no_dataset_device(tmp_path: Path) -> None:
    run = make_run(tmp_path, disks=("vda", "nvme0n1"), data_devices=None)
    db = RunStore(run / "run.db")
    for k in range(120):
        db.add_points(T0 + k, [Point("disk.util_pct", "nvme0n1", 80.0)])
    db.close()
    doc = render_report(run, None)
    assert "showing the busiest device, nvme0n1" in doc
    assert "nvme0n1" in _svg(doc, "disk") and ">vda<" not in _svg(doc, "disk")


def test_no_sm_activity_is_said(tmp_path: Path) -> None:
    run = make_run(tmp_path, sm_active=False, gpus=1)
    doc = render_report(run, diagnosis(run))
    assert "SM activity is not shown" in doc
    assert "SM active" not in _svg(doc, "gpu")


def test_without_a_diagnosis(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    doc = render_report(run, None)
    assert "No diagnosis" in doc and 'id="findings"' not in doc
    assert 'id="svg-gpu"' in doc


def test_ranks_and_gpu_idle_from_cuda_events(tmp_path: Path) -> None:
    run = make_run(tmp_path, steps=50)
    db = RunStore(run / "run.db")
    db.add_steps([StepRow(1, s, T0 + s * 2.0, 0.1, 1.9) for s in range(50)])
    db.close()
    wait = _svg(render_report(run, diagnosis(run)), "wait")
    assert "rank 0" in wait and "rank 1" in wait
    assert "GPU idle (CUDA events)" in wait
    assert "whole run: 42%" in wait


def test_no_network_references(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    doc = render_report(run, diagnosis(run))
    low = doc.lower()
    for bad in (
        'src="http',
        "src='http",
        'href="http',
        "href='http",
        "url(http",
        "@import",
        "<link",
        "<iframe",
        "<img",
    ):
        assert bad not in low, bad
    assert "default-src 'none'" in doc  # the CSP forbids loading anything


def test_write_report_default_path_and_cli(tmp_path: Path) -> None:
    run = make_run(tmp_path, duration_s=30, steps=30)
    out = write_report(run)
    assert out == run / "report.html" and out.read_text().startswith("<!DOCTYPE html>")
    target = tmp_path / "mail-me.html"
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "report", str(run), "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(target)
    assert 'id="timeline"' in target.read_text()


def test_cli_unknown_run_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "report", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_cli_unwritable_output_is_one_line(tmp_path: Path) -> None:
    run = make_run(tmp_path, duration_s=10, steps=10)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope",
            "report",
            str(run),
            "-o",
            str(tmp_path / "no" / "such" / "dir.html"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert proc.stderr.startswith("stallscope: error: cannot write")
    assert "Traceback" not in proc.stderr


def test_with_the_real_diagnosis(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    real = diagnose_run(run)
    doc = render_report(run, real)
    assert html.escape(str(real["verdict"])) in doc
    out = write_report(run)
    assert html.escape(str(real["verdict"])) in out.read_text()


# --- size and speed ------------------------------------------------------------------------------
def test_time_ticks_are_round_durations() -> None:
    assert time_step(120) == 15 and time_step(900) == 120 and time_step(3600) == 600
    assert time_step(0.5) == 1 and time_step(30 * 86400) == 3 * 86400
    assert clock(59.6) == "1:00" and clock(3725) == "1:02:05"


def test_downsample_keeps_spikes_and_bounds_points() -> None:
    np = pytest.importorskip("numpy")
    t = np.arange(100_000, dtype=float)
    v = np.zeros(100_000)
    v[54_321] = 100.0
    v[99_999] = -5.0
    tt, vv = downsample(t, v)
    assert len(tt) <= MAX_POINTS
    assert vv.max() == 100.0 and vv.min() == -5.0
    assert list(tt) == sorted(tt)
    short_t, _ = downsample(t[:10], v[:10])
    assert len(short_t) == 10
    v[1000:2000] = np.nan  # a hole (a source off) must stay a hole
    tt, vv = downsample(t, v)
    assert len(tt) <= MAX_POINTS and np.isnan(vv).any()
    assert vv[np.nanargmax(vv)] == 100.0


def test_one_hour_run_is_small_and_fast(tmp_path: Path) -> None:
    """1 h at 1 Hz, 4 GPUs, 4 disks, 1 trainer + 8 workers, 16 cores, 36,000 steps."""
    run = make_run(
        tmp_path,
        duration_s=3600,
        gpus=4,
        disks=("nvme0n1", "nvme1n1", "sda", "sdb"),
        workers=8,
        steps=36_000,
        cores=16,
    )
    doc_diag = diagnosis(run)
    # the same page for a one-minute run, timed on this machine now, is the yardstick
    small = make_run(
        tmp_path,
        name="small",
        duration_s=60,
        gpus=4,
        disks=("nvme0n1", "nvme1n1", "sda", "sdb"),
        workers=8,
        steps=600,
        cores=16,
    )
    small_diag = diagnosis(small)
    render_report(small, small_diag)  # warm: fonts, matplotlib's caches
    start = time.perf_counter()
    render_report(small, small_diag)
    small_s = time.perf_counter() - start
    start = time.perf_counter()
    doc = render_report(run, doc_diag)
    took = time.perf_counter() - start
    size = len(doc.encode())
    print(f"1 h report: {took:.2f} s ({small_s:.2f} s for 1 min), {size / 1024:.0f} KiB")
    assert size < 700 * 1024, f"{size / 1024:.0f} KiB: too big to mail"
    # the target is < 3 s: 60x the data costs little more than the fixed cost of a page (about
    # 2x here); a busy machine slows both alike, so the bound is a ratio, with a floor
    assert took < max(9.0, 4 * small_s), f"{took:.1f} s vs {small_s:.1f} s for 1 min"
    for pid in ("gpu", "wait", "disk", "cpu", "mem"):
        assert _svg(doc, pid)


def test_a_run_without_gpu_is_not_blamed_on_a_gpu(tmp_path: Path) -> None:
    """CPU training that is compute-bound is bound by the CPU; the verdict is said once at the
    top (not three times), and a speed-up of ×1.00 is not advertised."""
    run = make_run(tmp_path, gpus=0)
    doc = diagnosis(run)
    doc["verdict"] = "compute_bound"
    doc["findings"] = [
        {
            "kind": "compute_bound",
            "severity": "info",
            "confidence": 0.85,
            "summary": "Compute-bound (healthy): the trainer waited 7% of the time.",
            "evidence": {"stall_fraction": 0.07},
            "fixes": [],
            "est_speedup": 1.0,
            "rule": "data wait 7% < 15%",
        }
    ]
    html_doc = render_report(run, doc)
    verdict = html_doc[html_doc.index('id="verdict"') : html_doc.index('id="findings"')]
    assert "the CPU is the bottleneck" in verdict and "GPU" not in verdict
    assert "the GPU is the bottleneck" not in html_doc
    assert html_doc.count("the trainer waited 7% of the time") == 1
    assert "×1.00" not in html_doc
    # with a GPU, the GPU is the bottleneck
    run2 = make_run(tmp_path / "g", gpus=1)
    assert "the GPU is the bottleneck" in render_report(run2, {**doc, "run": str(run2)})


def test_loader_table_shows_ids_plainly_and_each_field_once(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    st = RunStore(run / "run.db")
    t0 = json.loads((run / "meta.json").read_text())["start"]
    st.set_probe(
        0,
        9487,
        {
            "rank": 0,
            "worker_pids": [9487, 9488],
            "updated": 1763712000.5,
            "loader": {"num_workers": 3, "batch_size": 1024},
            "epochs": [
                {"epoch": 0, "ts": t0 + 2.0, "iter_s": 0.25, "worker_pids": [9487, 9488]},
                {"epoch": 1, "ts": t0 + 61.5, "iter_s": 1.5},
            ],
        },
        12000,
        0,
    )
    st.close()
    doc = render_report(run, diagnosis(run))
    loader = doc[doc.index('id="loader"') : doc.index('id="unavailable"')]
    assert "9487, 9488" in loader and "9,487" not in loader
    # times as times: the last update as a date, each epoch's start as time into the run
    assert "1763712000.5" not in loader
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1763712000.5)) in loader
    assert ">61.5 s<" in loader and ">1.500 s<" in loader and str(t0 + 61.5) not in loader
    assert "</table>, <table" not in loader  # no stray commas between nested tables
    assert loader.count("<code>rank</code>") == 1
    assert "12,000" in loader  # a quantity keeps its grouping


def test_ranks_section_shows_each_rank(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    doc = diagnosis(run)
    doc["ranks"] = [
        {
            "rank": 0,
            "stall_fraction": 0.03,
            "step_ms_median": 100.0,
            "steps": 200,
            "pid": 200,
            "workers": 1,
            "worker_cpu_pct": 5.0,
        },
        {
            "rank": 1,
            "stall_fraction": 0.9,
            "step_ms_median": 101.0,
            "steps": 200,
            "pid": 300,
            "workers": 1,
            "worker_cpu_pct": 99.0,
        },
    ]
    page = render_report(run, doc)
    ranks = page[page.index('id="ranks"') : page.index('id="timeline"')]
    assert "90%" in ranks and "3%" in ranks and "99" in ranks
    assert 'id="ranks"' not in render_report(run, diagnosis(run))  # one rank: no section


def test_sampled_stacks_are_drawn_and_listed_escaped(tmp_path: Path) -> None:
    """A run with no probe but sampled stacks: the phases over time per rank, and each rank's
    heaviest folded stacks, with everything from the machine escaped."""
    from stallscope.sources.stacks.aggregate import append_record

    run = make_run(tmp_path, steps=0)
    evil = "<script>alert(1)</script> (x.py)"
    for rank, pid, data_s in ((0, 501, 0.1), (1, 502, 0.9)):
        for i in range(30):
            append_record(
                run / "stacks",
                {
                    "ts": T0 + i * 2,
                    "pid": pid,
                    "rank": rank,
                    "sampler": "inproc",
                    "n": 100,
                    "rate_hz": 50,
                    "s": {"data": data_s * 2, "compute": (1 - data_s) * 2},
                    "stacks": {
                        "main (t.py);__next__ (torch/utils/data/dataloader.py)": data_s * 2,
                        f"main (t.py);{evil}": (1 - data_s) * 2,
                    },
                    "stack_phase": {
                        "main (t.py);__next__ (torch/utils/data/dataloader.py)": "data",
                        f"main (t.py);{evil}": "compute",
                    },
                },
            )
    doc = render_report(run, diagnosis(run))
    svg = _svg(doc, "phases")
    assert "rank 1, data (90%)" in svg and "rank 0, data (10%)" in svg
    assert "<script>alert(1)" not in doc and "&lt;script&gt;alert(1)&lt;/script&gt;" in doc
    section = doc[doc.index('id="stacks"') :]
    assert "rank 1, pid 502: 60.0 s sampled" in section
    assert re.search(r"<td>data</td><td class=\"num\">54.00 s</td><td class=\"num\">90%", section)


def test_the_verdicts_speedup_is_a_sentence_of_its_own(tmp_path: Path) -> None:
    """Issue 40: the banner put a cpu_contention estimate (x1.63) in the data-wait sentence,
    whose own finding said x1.55. Each number belongs to the sentence it sits in."""
    run = make_run(tmp_path)
    d = diagnosis(run)
    d["verdict"] = "cpu_contention"
    d["findings"].insert(
        0,
        {
            "kind": "cpu_contention",
            "severity": "warning",
            "confidence": 0.8,
            "summary": "Other processes took the cores.",
            "evidence": {},
            "fixes": [{"action": "move them"}],
            "est_speedup": 1.63,
        },
    )
    doc = render_report(run, d)
    verdict = doc[doc.index('id="verdict"') : doc.index('id="findings"')]
    wait = re.search(r"<p>The trainer waited for data[^<]*<b>42%</b>[^<]*\.</p>", verdict)
    assert wait and "×" not in wait.group(0), verdict
    assert (
        '<p id="verdict-speedup">Fixing this (cpu_contention) could make training up to '
        "<b>×1.63</b> faster.</p>"
    ) in verdict


def test_our_own_words_read_as_prose_in_the_report(tmp_path: Path) -> None:
    """Issue 40: the report showed literal Markdown backticks, raw evidence keys
    (`worker_blkio_pct`) and a first card titled only "Evidence for the verdict"."""
    run = make_run(tmp_path)
    d = diagnosis(run)
    d["findings"][0]["evidence"]["worker_blkio_pct"] = 12.5
    doc = render_report(run, d)
    first = doc[doc.index('id="finding-0"') : doc.index('id="finding-1"')]
    assert "<b>pack the dataset with <code>stallscope pack</code>" in first
    assert "`" not in first
    assert '<td title="worker_blkio_pct">worker blkio %</td>' in first
    assert "<h3>Evidence for the verdict: Input-bound: storage cannot feed the trainer" in first
    # what a machine said stays escaped: a backtick from a file is no markup either
    evil = render_report(run, diagnosis(run, evil=True))
    assert "<script>" not in evil.split("<script>", 1)[0]
