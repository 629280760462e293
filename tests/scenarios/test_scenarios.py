"""The proof: shipped example trainers reproduce each bottleneck for real on the CPU, run under
`stallscope run`, and the diagnosis names it — within 12 s of training (15 s for several epochs,
and where a fix's speed-up is measured against a run of the same length). The fetch stall (cold
reads through a throttle, not CPU-bound) is in tests/scenarios/test_scenarios_fetch.py.

Verdicts and stall fractions are appended to artifacts/scenarios.json for the record.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cli_json, dataset_args, rediagnosed, stallscope_argv, training_finding

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

TRAIN = str(ROOT / "examples" / "train_cpu.py")
CONSTRAIN = str(ROOT / "examples" / "constrain.py")
ARTIFACTS = Path(os.environ.get("STALLSCOPE_ARTIFACTS", ROOT / "artifacts"))


#: seconds of training per run: enough for every verdict here (the TensorFlow scenarios need 10;
#: the zero-code scenarios name theirs within 0.05 in 12)
SECONDS = 12
#: the cold, throttled reads: the trainer's own wait share settles only after its first epoch
FETCH_SECONDS = 25
#: a run whose speed is compared with another's (a fix applied): two runs of this length
FIX_SECONDS = 15


def run_scenario(
    name: str,
    tmp_path: Path,
    train_args: list[str],
    *,
    before: list[str] = (),
    wrap: list[str] = (),
    data: Path | None = None,
    run_args: list[str] = (),
    may_crash: bool = False,
    seconds: int = SECONDS,
) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "runs"
    argv = [*before, *stallscope_argv("run", "--interval", "1", "--out", str(out), *run_args)]
    if data is not None:
        argv += ["--data", str(data)]
    # the trainer's own defaults are the README demo's (a slow transform): scenarios start
    # from a plain pipeline and set what they test
    argv += [
        "--",
        *wrap,
        sys.executable,
        TRAIN,
        "--max-seconds",
        str(seconds),
        "--epochs",
        "100",
        "--workers",
        "2",
        "--prep-cost",
        "0",
        *dataset_args(train_args),
        *train_args,
    ]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    # a trainer killed by the very bottleneck (shm exhausted) still gets its diagnosis
    assert r.returncode == 0 or may_crash, r.stderr[-3000:]
    assert "verdict:" in r.stderr  # the end of `run` prints the verdict
    [run_dir] = list(out.iterdir())
    doc: dict[str, Any] = cli_json("diagnose", str(run_dir), "--json")
    # the trainer's own measure of its data wait (it times next(loader) itself)
    m = re.search(r"data wait: ([0-9.]+)% of", r.stdout)
    doc["trainer_wait"] = float(m.group(1)) / 100 if m else None
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with (ARTIFACTS / "scenarios.jsonl").open("a") as f:
        top = doc["findings"][0]
        f.write(
            json.dumps(
                {
                    "scenario": name,
                    "verdict": doc["verdict"],
                    "stall_fraction": doc["stall_fraction"],
                    "stall_source": doc.get("stall_source"),
                    "trainer_wait": doc["trainer_wait"],
                    "confidence": top["confidence"],
                    "summary": top["summary"],
                    "fixes": [x["action"] for x in top["fixes"]],
                }
            )
            + "\n"
        )
    return doc


def compare_fix(
    scenario: str, a: dict[str, Any], b: dict[str, Any], est: float, **record: Any
) -> dict[str, Any]:
    """`stallscope compare A B --json` (B: A with a fix applied); its measured speed-up is
    appended to artifacts/scenarios.jsonl beside the estimate."""
    cmp: dict[str, Any] = cli_json("compare", a["run"], b["run"], "--json")
    with (ARTIFACTS / "scenarios.jsonl").open("a") as f:
        f.write(
            json.dumps(
                {"scenario": scenario, "estimated": est, "measured": cmp["speedup"], **record}
            )
            + "\n"
        )
    return cmp


PREP = ["--prep-cost", "40", "--workers", "1", "--model", "tiny"]
#: no probe and no sampled stacks: what the diagnosis makes of system metrics alone (when
#: sampling is refused or impossible); tests/scenarios/test_scenarios_zero_code.py has the same
#: trainings with their stacks sampled
SYSTEM_ONLY = ["--no-stacks"]


@pytest.fixture(scope="module")
def prep_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The prep stall, run once: named by test_prep_stall, fixed by the top-fix test (15 s, as
    the fixed run: the speed-up compares two runs of one length, warm-up a small share)."""
    return run_scenario("prep", tmp_path_factory.mktemp("prep"), PREP, seconds=FIX_SECONDS)


def test_prep_stall(prep_run: dict[str, Any]) -> None:
    """Heavy per-sample CPU transform with one worker: the worker is saturated, the disk idle."""
    doc = prep_run
    assert training_finding(doc)["kind"] == "input_bound.prep", doc["findings"]
    assert doc["stall_fraction"] >= 0.3
    # the first fix follows the CPU the run left idle: more workers where a quarter core or
    # more was idle (a quiet machine), cheaper per-sample work where the CPUs were busy (with a
    # CPU hog beside the suite the host ran at ~100%: workers would only share the same cores)
    sig = doc["signals"]
    cpus = sig.get("logical_cores") or sig["physical_cores"]
    # idle cores, and those processes at a lower priority used (they yield them to new workers)
    spare = (100.0 - sig["host_cpu_median_pct"]) / 100.0 * cpus + (
        sig.get("niced_others_cpu_cores") or 0.0
    )
    first = training_finding(doc)["fixes"][0]
    if spare >= 0.25:
        assert first["action"].startswith("num_workers 1 → "), (spare, first)
    else:
        assert first["action"].startswith("make per-sample work cheaper"), (spare, first)
        assert "already" in first["why"] and "busy" in first["why"]
    meta = json.loads(Path(doc["run"], "meta.json").read_text())
    # the probe's view of the loader is kept in meta.json
    assert meta["loader_config"]["0"]["loader"]["num_workers"] == 1


def system_only(doc: dict[str, Any]) -> dict[str, Any]:
    """The same run diagnosed from its system metrics alone, as if recorded by `stallscope run
    --no-stacks` for a trainer without the probe. `test_loading_in_the_trainer_without_probe_
    is_never_called_healthy` and the threads scenario record such runs for real."""
    return rediagnosed(doc, stacks=False)


def test_prep_stall_without_probe(prep_run: dict[str, Any]) -> None:
    """The same stall with system metrics only (no probe, no sampled stacks): still named, its
    data-wait share estimated from the trainer's main thread (within 0.15 of what the trainer
    measured itself), said to be an estimate, and the finding says the probe would sharpen
    it."""
    doc = system_only(prep_run)
    top = training_finding(doc)
    assert top["kind"] == "input_bound.prep", doc["findings"]
    assert doc["stall_source"] == "main_thread" and top["confidence"] <= 0.7
    assert "estimated" in top["summary"]
    assert abs(doc["stall_fraction"] - doc["trainer_wait"]) <= 0.15, doc["trainer_wait"]
    assert any("stallscope.watch" in f["action"] for f in top["fixes"])


@pytest.fixture(scope="module")
def compute_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Cheap data, heavy model, run once: read with its probe and from system metrics alone."""
    return run_scenario(
        "compute", tmp_path_factory.mktemp("compute"), ["--model", "heavy", "--workers", "1"]
    )


def test_compute_bound_without_probe(compute_run: dict[str, Any]) -> None:
    """An unmodified CPU trainer that computes: compute_bound, not insufficient_data."""
    doc = system_only(compute_run)
    assert training_finding(doc)["kind"] == "compute_bound", doc["findings"]
    assert doc["stall_source"] == "main_thread"
    assert abs(doc["stall_fraction"] - doc["trainer_wait"]) <= 0.15, doc["trainer_wait"]


def test_loading_in_the_trainer_without_probe_is_never_called_healthy(tmp_path: Path) -> None:
    """num_workers=0 with a heavy transform and no probe: the trainer loads on its own thread
    between steps (it waits ~90% of the time by its own measure), which system metrics cannot
    tell from compute. Never compute_bound; the finding says why and names the probe."""
    doc = run_scenario(
        "no-workers-no-probe",
        tmp_path,
        ["--prep-cost", "40", "--workers", "0", "--model", "tiny", "--no-probe"],
        run_args=SYSTEM_ONLY,
    )
    assert doc["trainer_wait"] >= 0.5  # the trainer did wait for its own loading
    assert training_finding(doc)["kind"] == "data_wait_unknown", doc["findings"]
    assert "compute_bound" not in [f["kind"] for f in doc["findings"]]
    top = training_finding(doc)
    assert "no DataLoader worker processes" in top["summary"]
    assert any("stallscope.watch" in f["action"] for f in top["fixes"])


def test_loading_on_threads_in_the_trainer(tmp_path: Path) -> None:
    """num_workers=0 with each batch decoded on a thread pool in the trainer's own process (a
    threaded decoder): the trainer runs at >100% CPU between steps, which no worker-process
    signal sees. Without the probe: never compute_bound. With it: input-bound on the CPU
    transform, with worker processes as the fix."""
    args = ["--prep-cost", "40", "--workers", "0", "--decode-threads", "2", "--model", "tiny"]
    # 8 s each: the verdicts stand from the first seconds (loading on the trainer's own threads
    # is 89% of its time)
    doc = run_scenario(
        "threads-no-probe", tmp_path / "a", [*args, "--no-probe"], run_args=SYSTEM_ONLY, seconds=8
    )
    assert doc["trainer_wait"] >= 0.5
    assert training_finding(doc)["kind"] == "data_wait_unknown", doc["findings"]
    assert "compute_bound" not in [f["kind"] for f in doc["findings"]]
    doc = run_scenario("threads-probe", tmp_path / "b", args, seconds=8)
    assert training_finding(doc)["kind"] == "input_bound.prep", doc["findings"]
    assert doc["stall_source"] == "probe"
    assert abs(doc["stall_fraction"] - doc["trainer_wait"]) <= 0.15, doc["trainer_wait"]
    # worker processes as the fix, unless the trainer's threads already kept every core busy
    # (on the 2-core CI VM the host read 88%): then cheaper per-sample work, and no advice for
    # more workers beside it to contradict it (issue 39)
    from stallscope.analysis.facts.build import BUSY_SPARE

    sig = doc["signals"]
    cpus = sig.get("logical_cores") or sig["physical_cores"]
    # idle cores, and those processes at a lower priority used (they yield them to new workers)
    spare = (100.0 - sig["host_cpu_median_pct"]) / 100.0 * cpus + (
        sig.get("niced_others_cpu_cores") or 0.0
    )
    fixes = training_finding(doc)["fixes"]
    more_workers = [f for f in fixes if f["action"].startswith("num_workers 0 → ")]
    if spare >= BUSY_SPARE:
        assert more_workers, (spare, fixes)
    else:
        assert fixes[0]["action"].startswith("make per-sample work cheaper"), (spare, fixes)
        assert "busy" in fixes[0]["why"] and not more_workers, (spare, fixes)


def test_compute_bound(compute_run: dict[str, Any]) -> None:
    """Cheap data, heavy model: the trainer computes, the loader keeps up."""
    doc = compute_run
    assert training_finding(doc)["kind"] == "compute_bound", doc["findings"]
    assert doc["stall_fraction"] < 0.15


# host_swap is not reproduced here: provoking swap means pushing a shared CI box into memory
# pressure (and it has no swap device); the rule is tested on fixed inputs in
# tests/unit/test_diagnose.py::test_host_swap_and_shm.


def test_the_top_fix_delivers_what_it_promised(tmp_path: Path, prep_run: dict[str, Any]) -> None:
    """Apply the prep stall's first fix (more workers) and run again: `stallscope compare`
    measures the speed-up and sets it beside the estimate. How close they come (the ±25% goal)
    is timing, measured by benchmarks/bench_fixes.py; here the fix must help and the numbers
    are recorded."""
    a = prep_run
    top = training_finding(a)
    assert top["kind"] == "input_bound.prep", top
    m = re.match(r"num_workers 1 → (\d+)", top["fixes"][0]["action"])
    if m is None:
        pytest.skip(f"this machine's first fix is not more workers: {top['fixes'][0]}")
    b = run_scenario(
        "fix-after",
        tmp_path / "b",
        ["--prep-cost", "40", "--workers", m.group(1), "--model", "tiny"],
        seconds=FIX_SECONDS,
    )
    fix = top["fixes"][0]
    assert fix["change"] == {"num_workers": int(m.group(1))}, fix
    est = fix["expected_speedup"]
    cmp = compare_fix("fix-delivery", a, b, est, workers=int(m.group(1)))
    got = cmp["speedup"]
    assert got >= 1.1, (est, got, cmp)  # the fix helps
    # compare checks the fix B applied, against that fix's own estimate
    assert cmp["applied_fix"] == fix["action"] and "ceiling" not in cmp, cmp
    assert cmp["estimated_speedup"] == est and cmp["delivered_share"] == pytest.approx(
        (got - 1) / (est - 1), abs=0.01
    )


def test_epoch_boundary_stall_and_its_fix(tmp_path: Path) -> None:
    """Workers restarted every epoch (no persistent_workers) with a costly start-up: the
    recurring wait at each epoch start is named with its cost per epoch; persistent workers
    remove it (how close the speed-up comes to the estimate: benchmarks/bench_fixes.py)."""
    base = ["--files", "400", "--workers", "2", "--worker-init-s", "1.5"]
    # several epochs (about 2 s each: 7 in 15 s), each with its restart of the workers
    a = run_scenario("epoch-start", tmp_path / "a", [*base, "--no-persistent"], seconds=15)
    top = training_finding(a)
    assert top["kind"] == "input_bound.epoch_start", top
    assert 1.3 <= top["evidence"]["epoch_start_cost_s"] <= 3.0
    assert top["fixes"][0]["action"] == "persistent_workers=True"
    # persistent workers start once: 10 s are enough to see no epoch-start wait and the gain
    b = run_scenario("epoch-start-fixed", tmp_path / "b", base, seconds=10)
    assert b["verdict"] != "input_bound.epoch_start"
    est = top["est_speedup"]
    got = compare_fix("fix-delivery-epoch", a, b, est)["speedup"]
    assert got >= 1.1, (est, got)
