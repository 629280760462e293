"""The one-command GPU check: on a machine with an NVIDIA GPU, in one run of under 8 minutes,

1. record NVML fixtures at idle and under load (tests/fixtures/record_nvml.py), and time every
   NVML call the gpu source makes or could make (tests/fixtures/nvml_call_costs.py);
2. time a whole GPU reading (stallscope's gpu source) against an ``nvidia-smi`` spawn for the
   same fields (medians; the goal: a reading costs at most 1/30 of a spawn);
3. time the probe's CUDA-event device timing at two step lengths (benchmarks/
   bench_probe_cuda.py --cuda, its own time and whole loops by the wall clock: the goal is
   < 1% of a step);
4. run three GPU trainings with their own truth (benchmarks/gpu_trainer.py: input-bound,
   compute-bound, host-bound) under ``stallscope run`` without and with the probe, and under
   ``stallscope run --pid`` (py-spy attached);
5. print one table of verdicts and data-wait shares against the trainers' own;
6. check ``gpu_slowdown`` live: a compute-bound training (with the probe) under ``stallscope
   run``, whose GPU is slowed mid-run: its power limit lowered to the least allowed
   (``nvmlDeviceSetPowerManagementLimit``) where permitted, else its clocks locked at about
   half their maximum (``nvmlDeviceSetGpuLockedClocks``); both are put back after. The run must
   get a ``gpu_slowdown`` finding dated within 20 s of the moment, naming the power cap or the
   locked clocks. Where neither is permitted (not root) it says so and checks that no
   ``gpu_slowdown`` is found. ``slowdown.txt`` holds the outcome.

    python benchmarks/gpu_check.py [--out DIR] [--seconds 15]
    python benchmarks/gpu_check.py --only-slowdown [--slowdown-seconds 60]
    python benchmarks/gpu_check.py --dry-run-cpu --only-slowdown   # this script, on the CPU

Everything it writes goes under ``--out`` (default ``./gpu-check-<time>``): the NVML
recordings, each run's folder and ``diagnose --json``, the logs and ``table.txt``. Works with
torchvision (ResNet-18) and without it (a plain convolutional network). Exits 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: training kind -> the verdict its trainer's truth supports
TRUTH = {"input": "input_bound.prep", "compute": "compute_bound", "host": "host_bound"}
_WAIT = re.compile(r"data wait: ([0-9.]+)% of ([0-9.]+) s")
SMI_FIELDS = (
    "index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,memory.used,"
    "memory.total,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.sm,"
    "clocks_event_reasons.active,pcie.link.gen.current,pcie.link.width.current,"
    "pcie.link.gen.max,ecc.errors.uncorrected.volatile.total"
)


def stallscope_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "stallscope", *args]


def log_run(argv: list[str], out: Path, name: str, timeout: float) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=out)
    (out / f"{name}.log").write_text(f"$ {' '.join(argv)}\n{r.stdout}\n--- stderr\n{r.stderr}")
    return r


def nvml_costs(out: Path, n: int = 30) -> str:
    """Median wall time of a whole gpu-source reading and of an nvidia-smi spawn."""
    from stallscope.sources.gpu import GpuSource

    src = GpuSource()
    src.open()
    reads = []
    for _ in range(n):
        t = time.perf_counter()
        src.sample(time.time())
        reads.append(time.perf_counter() - t)
    src.close()
    spawns = []
    smi = shutil.which("nvidia-smi")
    for _ in range(n if smi else 0):
        t = time.perf_counter()
        subprocess.run(
            [smi or "nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"],
            capture_output=True,
            check=False,
        )
        spawns.append(time.perf_counter() - t)
    read, spawn = statistics.median(reads), statistics.median(spawns) if spawns else None
    line = f"gpu reading: median {read * 1e3:.2f} ms over {n}"
    if spawn:
        line += (
            f"; nvidia-smi spawn {spawn * 1e3:.2f} ms; ratio 1/{spawn / read:.1f} "
            f"(goal 1/30) -> {'OK' if spawn / read >= 30 else 'OVER'}"
        )
    (out / "nvml-costs.txt").write_text(line + "\n")
    return line


def diagnose(run_dir: Path) -> dict[str, Any]:
    d = subprocess.run(
        stallscope_argv("diagnose", str(run_dir), "--json"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        doc: dict[str, Any] = json.loads(d.stdout)
    except ValueError:
        return {"verdict": f"(diagnose failed: {d.stderr.strip()[-200:]})"}
    (run_dir.parent / f"{run_dir.name}.diagnose.json").write_text(d.stdout)
    return doc


def one_training(
    kind: str, mode: str, out: Path, seconds: float, device: str = "cuda"
) -> dict[str, Any]:
    """``mode``: "run" (stacks), "probe" (stallscope.watch) or "pid" (run --pid)."""
    runs = out / "runs" / f"{kind}-{mode}"
    train = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_trainer.py"),
        kind,
        "--seconds",
        str(seconds),
        "--device",
        device,
        *(["--probe"] if mode == "probe" else []),
    ]
    if mode == "pid":
        child = subprocess.Popen(
            train, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out
        )
        time.sleep(2.0)
        att = log_run(
            stallscope_argv("run", "--pid", str(child.pid), "--interval", "1", "--out", str(runs)),
            out,
            f"{kind}-{mode}",
            seconds + 120,
        )
        text = (child.communicate(timeout=60)[0] or "") + att.stdout
    else:
        r = log_run(
            [*stallscope_argv("run", "--interval", "1", "--out", str(runs)), "--", *train],
            out,
            f"{kind}-{mode}",
            seconds + 180,
        )
        text = r.stdout
    m = _WAIT.search(text)
    truth = float(m.group(1)) / 100 if m else None
    dirs = sorted(runs.iterdir()) if runs.exists() else []
    doc = diagnose(dirs[-1]) if dirs else {"verdict": "(no run folder)"}
    return {
        "kind": kind,
        "mode": mode,
        "truth_verdict": TRUTH[kind],
        "truth_share": truth,
        "verdict": doc.get("verdict"),
        "share": doc.get("stall_fraction"),
        "source": doc.get("stall_source"),
        "exit_s": (doc.get("signals") or {}).get("exit_s"),
    }


#: how near the finding's start must be to the moment the GPU was slowed (the change detector
#: dates a shift to a sample or two; the trainer's steps lag the clocks by a step)
SLOWDOWN_WITHIN_S = 20.0


def lower_gpu(index: int = 0) -> tuple[str, Any] | None:
    """Slow GPU ``index`` down now: its power limit to the least NVML allows, else its clocks
    locked at about half their maximum. Returns (what was done, a function that puts it back),
    or None when neither is permitted (both need root)."""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    try:
        lo, _hi = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        was = pynvml.nvmlDeviceGetPowerManagementLimit(h)
        pynvml.nvmlDeviceSetPowerManagementLimit(h, lo)

        def put_back_power() -> None:
            pynvml.nvmlDeviceSetPowerManagementLimit(h, was)

        return (
            f"power limit lowered from {was / 1000:.0f} to {lo / 1000:.0f} W "
            "(nvmlDeviceSetPowerManagementLimit)",
            put_back_power,
        )
    except pynvml.NVMLError as exc:
        power_error = str(exc)
    try:
        top = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
        target = max(300, top // 2)
        pynvml.nvmlDeviceSetGpuLockedClocks(h, target, target)

        def put_back_clocks() -> None:
            pynvml.nvmlDeviceResetGpuLockedClocks(h)

        return (
            f"SM clocks locked at {target} MHz of {top} (nvmlDeviceSetGpuLockedClocks; "
            f"the power limit could not be set: {power_error})",
            put_back_clocks,
        )
    except pynvml.NVMLError as exc:
        print(
            f"  slowdown: cannot slow the GPU (power limit: {power_error}; locked clocks: {exc})",
            flush=True,
        )
        return None


def slowdown_case(out: Path, seconds: float, device: str = "cuda") -> dict[str, Any]:
    """The live gpu_slowdown check (item 6 above). On the CPU (``--dry-run-cpu``) the GPU is not
    touched and the launch-bound trainer runs: the script's own path, and no gpu_slowdown."""
    runs = out / "runs" / "slowdown"
    kind = "compute" if device == "cuda" else "host"
    train = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_trainer.py"),
        kind,
        "--probe",
        "--seconds",
        str(seconds),
        "--device",
        device,
    ]
    argv = [*stallscope_argv("run", "--interval", "1", "--out", str(runs)), "--", *train]
    log = (out / "slowdown.log").open("w")
    child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=out)
    done: tuple[str, Any] | None = None
    at: float | None = None
    try:
        # start-up (imports, workers, cuDNN autotuning) takes about 12 s, then the loop: slow
        # the GPU 45% into the loop, so the detector has steps on both sides
        time.sleep(12.0 + 0.45 * seconds)
        if device == "cuda":
            done = lower_gpu(0)
        at = time.time()
        child.wait(timeout=seconds + 180)
    finally:
        if done is not None:
            try:
                done[1]()
            except Exception as exc:  # said: the machine is left as it was only if this works
                print(f"  slowdown: COULD NOT PUT THE GPU BACK: {exc}", flush=True)
        if child.poll() is None:
            child.kill()
        log.close()
    dirs = sorted(runs.iterdir()) if runs.exists() else []
    doc = diagnose(dirs[-1]) if dirs else {"verdict": "(no run folder)", "findings": []}
    found = [f for f in doc.get("findings") or [] if f.get("kind") == "gpu_slowdown"]
    row: dict[str, Any] = {"slowed": done[0] if done else None, "found": bool(found)}
    if found:
        ev = found[0].get("evidence") or {}
        reasons = sorted({r for c in ev.get("causes") or [] for r in c.get("reasons") or ()})
        row.update(start_ts=ev.get("start_ts"), reasons=reasons, summary=found[0]["summary"])
    if done is None:  # nothing slowed the GPU: nothing may be told
        row["ok"] = not found
    else:
        near = (
            bool(found)
            and at is not None
            and row.get("start_ts") is not None
            and abs(row["start_ts"] - at) <= SLOWDOWN_WITHIN_S
        )
        row["ok"] = near and bool(
            {"sw_power_cap", "applications_clocks"} & set(row.get("reasons") or ())
        )
        row["off_by_s"] = (
            None
            if not found or at is None or row.get("start_ts") is None
            else round(row["start_ts"] - at, 1)
        )
    text = (
        f"slowdown: {row['slowed'] or 'the GPU was not slowed'}; gpu_slowdown "
        f"{'found' if found else 'not found'}"
        + (
            f" ({row['off_by_s']:+.1f} s from the moment; reasons "
            f"{', '.join(row['reasons']) or 'none'})"
            if found and done
            else ""
        )
        + f" -> {'OK' if row['ok'] else 'NO'}"
        + (f"\n  {row['summary']}" if found else "")
    )
    (out / "slowdown.txt").write_text(text + "\n")
    row["text"] = text
    return row


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'training':<9} {'mode':<6} {'truth':<17} {'own':>6} {'stallscope':<22} "
        f"{'share':>6} {'by':<7} {'exit':>5}  ok"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = r["verdict"] == r["truth_verdict"] and (
            r["truth_share"] is None
            or r["share"] is None
            or abs(r["share"] - r["truth_share"]) <= 0.05
        )
        lines.append(
            f"{r['kind']:<9} {r['mode']:<6} {r['truth_verdict']:<17} "
            f"{_f(r['truth_share']):>6} {r['verdict']!s:<22} {_f(r['share']):>6} "
            f"{r['source']!s:<7} {'-' if r['exit_s'] is None else r['exit_s']:>5}"
            f"  {'yes' if ok else 'NO'}"
        )
    return "\n".join(lines)


def _fail(why: str) -> int:
    """One line on stderr, exit status 2, as the CLI does."""
    sys.stderr.write(f"gpu_check: error: {why}\n")
    return 2


def _make_out(path: Path) -> Path | None:
    """``--out`` made (with its parents) and resolved; None, said in one line, when it cannot be
    a folder (a file there, a path under ``/dev/null``, no permission)."""
    try:
        out = path.resolve()
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(
            f"--out {str(path)[:200]}: cannot make the folder: {(exc.strerror or str(exc)).lower()}"
        )
        return None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}"))
    ap.add_argument("--seconds", type=float, default=15.0, help="each training's loop")
    ap.add_argument(
        "--probe-seconds",
        type=float,
        default=2.0,
        help="each arm's pass in the probe's CUDA A/B (long enough for the probe's "
        "writer to flush in it: it shares the trainer's interpreter)",
    )
    ap.add_argument("--skip-trainings", action="store_true")
    ap.add_argument(
        "--kinds", default=",".join(TRUTH), help="trainings to run (default: input,compute,host)"
    )
    ap.add_argument(
        "--modes", default="run,probe,pid", help="how each is watched (default: run,probe,pid)"
    )
    ap.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="only the trainings, on the CPU: a check of this script itself, "
        "whose verdicts mean nothing",
    )
    ap.add_argument(
        "--slowdown-seconds",
        type=float,
        default=60.0,
        help="the gpu_slowdown case's training loop (default 60)",
    )
    ap.add_argument(
        "--only-slowdown", action="store_true", help="only the gpu_slowdown case (item 6)"
    )
    ap.add_argument("--skip-slowdown", action="store_true")
    args = ap.parse_args()
    for flag, v in (
        ("--seconds", args.seconds),
        ("--probe-seconds", args.probe_seconds),
        ("--slowdown-seconds", args.slowdown_seconds),
    ):
        if not (math.isfinite(v) and 0 < v <= 3600):
            return _fail(f"{flag} must be above 0 and at most 3600, got {v:g}")
    if args.dry_run_cpu:
        out = _make_out(args.out)
        if out is None:
            return 2
        if not args.only_slowdown:
            rows = [
                one_training(kind, mode, out, args.seconds, "cpu")
                for kind in TRUTH
                for mode in ("run", "probe", "pid")
            ]
            print(table(rows))
        if args.only_slowdown or not args.skip_slowdown:
            case = slowdown_case(out, args.slowdown_seconds, "cpu")
            print(case["text"])
            return 0 if case["ok"] else 1
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return _fail(f"no NVIDIA GPU here ({str(exc)[:200]})")
    out = _make_out(args.out)
    if out is None:
        return 2
    if args.only_slowdown:
        case = slowdown_case(out, args.slowdown_seconds)
        print(case["text"])
        return 0 if case["ok"] else 1
    t0 = time.monotonic()
    rec = [
        sys.executable,
        str(ROOT / "tests" / "fixtures" / "record_nvml.py"),
        "--out",
        str(out),
        "--keep-uuids",
    ]
    log_run([*rec, "--label", "idle"], out, "nvml-idle", 60)
    calls = log_run(
        [
            sys.executable,
            str(ROOT / "tests" / "fixtures" / "nvml_call_costs.py"),
            "--out",
            str(out),
        ],
        out,
        "nvml-call-costs",
        120,
    )
    print(calls.stdout.strip(), flush=True)
    print(nvml_costs(out), flush=True)
    bench = log_run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_probe_cuda.py"),
            "--cuda",
            "--steps-us",
            "50,3300",
            "--reps",
            "3",
            "--seconds",
            str(args.probe_seconds),
        ],
        out,
        "probe-cuda",
        240,
    )
    print(bench.stdout.strip(), flush=True)
    wall = log_run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_probe_cuda.py"),
            "--cuda",
            "--method",
            "wall",
            "--steps-us",
            "50,3300",
            "--reps",
            "3",
            "--seconds",
            str(args.probe_seconds / 2),
        ],
        out,
        "probe-cuda-wall",
        240,
    )
    print(wall.stdout.strip(), flush=True)
    rows: list[dict[str, Any]] = []
    if not args.skip_trainings:
        load = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "gpu_trainer.py"),
                "compute",
                "--seconds",
                "12",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(8.0)
        log_run([*rec, "--label", "load"], out, "nvml-load", 60)
        load.send_signal(signal.SIGTERM)
        load.wait(timeout=30)
        for kind in args.kinds.split(","):
            for mode in args.modes.split(","):
                rows.append(one_training(kind, mode, out, args.seconds))
                print(
                    f"  {kind}/{mode}: {rows[-1]['verdict']} ({time.monotonic() - t0:.0f} s)",
                    flush=True,
                )
    text = table(rows) if rows else "(trainings skipped)"
    (out / "table.txt").write_text(text + "\n")
    print(text)
    slow_ok = True
    if not args.skip_slowdown:
        case = slowdown_case(out, args.slowdown_seconds)
        print(case["text"], flush=True)
        slow_ok = case["ok"]
    print(f"everything is in {out} ({time.monotonic() - t0:.0f} s)")
    return 0 if slow_ok and all(r["verdict"] == r["truth_verdict"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
