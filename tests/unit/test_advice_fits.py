"""Advice that fits the run (issue 49): each fix's numbers and reasons come from this run's own
evidence, on runs built from recorded-shape series (tests/diagnose_inputs.py)."""

from __future__ import annotations

from diagnose_inputs import T0, WORKERS, N, procs, run, ser, steps

from stallscope.analysis.diagnose import diagnose
from stallscope.store import Series


def _at(name: str, ent: str, values: list[float], start: float) -> Series:
    return Series(
        name, ent, [T0 + start + i for i in range(len(values))], [float(v) for v in values]
    )


def test_a_non_persistent_loader_counts_the_workers_alive_at_once() -> None:
    """`--workers 1` over 2 epochs without persistent workers: a new worker each epoch (two
    pids, never together). They were counted as 2, so a 2-core run was told "num_workers (2)
    already matches the 2 physical cores" and never offered 1 → 2."""
    data = run(
        [
            ser("host.cpu_pct", "", [65] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("procs.cpu_pct", "100", [30] * N),
            _at("procs.cpu_pct", "101", [99] * 15, 0),
            _at("procs.cpu_pct", "102", [99] * 15, 15),
            _at("procs.d_state", "101", [0] * 15, 0),
            _at("procs.d_state", "102", [0] * 15, 15),
        ],
        entities=procs({"100": "main", "101": "worker", "102": "worker"}),
        physical_cores=2,
        logical_cores=2,
    )
    doc = diagnose(data)
    assert doc["signals"]["workers"] == 1 and doc["signals"]["workers_source"] == "processes"
    f = doc["findings"][0]
    assert f["kind"] == "input_bound.prep"
    assert f["fixes"][0]["action"].startswith("num_workers 1 → 2"), f["fixes"]
    assert not any("already matches" in x["why"] for x in f["fixes"])


def test_the_loaders_own_num_workers_wins_over_the_processes() -> None:
    data = run(
        [
            ser("host.cpu_pct", "", [35] * N),
            ser("procs.cpu_pct", "100", [20] * N),
            ser("procs.cpu_pct", "101", [99] * N),
            ser("procs.cpu_pct", "102", [97] * N),
        ],
        steps=steps(200, wait=0.030, host=0.020),
        entities=WORKERS,
        config={"num_workers": 3, "physical_cores": 8},
    )
    sig = diagnose(data)["signals"]
    assert sig["workers"] == 3 and sig["workers_source"] == "config"


def test_a_trainer_without_workers_is_never_told_its_workers_are_saturated() -> None:
    """num_workers=0 without a core count: the fix said "workers are CPU-saturated"."""
    data = run(
        [
            ser("host.cpu_pct", "", [60] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("procs.cpu_pct", "100", [97] * N),
            ser("procs.d_state", "100", [0] * N),
        ],
        steps=steps(200, wait=0.030, host=0.010),
        entities=procs({"100": "main"}),
        config={},
        physical_cores=None,
    )
    doc = diagnose(data)
    whys = [x["why"] for f in doc["findings"] for x in f["fixes"]]
    assert not any("saturated" in w for w in whys), whys
    raise_fix = [
        x
        for f in doc["findings"]
        for x in f["fixes"]
        if x["action"].startswith("raise num_workers")
    ]
    assert raise_fix and "loads its own data" in raise_fix[0]["why"], raise_fix


def test_a_trainer_waiting_for_a_cpu_is_not_called_waiting_on_something_else() -> None:
    """num_workers=0 on a busy host: the trainer waited for a CPU 62% of the time, its own CPU
    low; input_bound.wait ("waits on something other than the CPU or the disk") read the
    workers' run-queue figure, empty without workers."""
    data = run(
        [
            ser("host.cpu_pct", "", [100] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("procs.cpu_pct", "100", [30] * N),
            ser("procs.d_state", "100", [0] * N),
            ser("procs.runq_wait_pct", "100", [62] * N),
        ],
        steps=steps(200, wait=0.030, host=0.010),
        entities=procs({"100": "main"}),
        config={"num_workers": 0, "physical_cores": 2},
        logical_cores=2,
    )
    kinds = [f["kind"] for f in diagnose(data)["findings"]]
    assert "input_bound.wait" not in kinds, kinds


def test_the_ceiling_counts_the_cpu_loading_takes_from_compute_on_shared_cores() -> None:
    """One worker decoding beside the trainer on 2 cores: "up to 1.9-2.1×" where removing the
    loading measured 5.2×. The trainer waited for a CPU while it computed; that goes with the
    loading, and the finding says what it assumed."""
    data = run(
        [
            ser("host.cpu_pct", "", [98] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("procs.cpu_pct", "100", [60] * N),
            ser("procs.cpu_pct", "101", [99] * N),
            ser("procs.d_state", "101", [0] * N),
            ser("procs.runq_wait_pct", "100", [30] * N),
        ],
        steps=steps(200, wait=0.050, host=0.050),
        entities=procs({"100": "main", "101": "worker"}),
        config={"num_workers": 1, "physical_cores": 2},
        logical_cores=2,
    )
    f = diagnose(data)["findings"][0]
    assert f["kind"] == "input_bound.prep", f
    # stall 50%: compute unchanged ×2.0; with the 30% run-queue wait gone too: 1/(1-.5-.3)
    assert f["est_speedup"] == 5.0, f
    assert "shares the cores" in f["evidence"]["ceiling_assumes"]
    assert "ceiling ×5.00" in f["rule"]


def test_the_ceiling_stays_the_stalls_own_when_others_take_the_cores() -> None:
    data = run(
        [
            ser("host.cpu_pct", "", [100] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("procs.cpu_pct", "100", [40] * N),
            ser("procs.cpu_pct", "101", [60] * N),
            ser("procs.d_state", "101", [0] * N),
            ser("procs.runq_wait_pct", "100", [30] * N),
        ],
        steps=steps(200, wait=0.050, host=0.050),
        entities=procs({"100": "main", "101": "worker"}),
        config={"num_workers": 1, "physical_cores": 2},
        logical_cores=4,
    )
    f = next(f for f in diagnose(data)["findings"] if f["kind"].startswith("input_bound"))
    assert f["est_speedup"] <= 2.0 and "ceiling_assumes" not in f["evidence"], f


def _exited(meta: dict) -> dict:
    """A run whose training (probe steps) ended 20 s before its process did, no exit stacks."""
    data = run(
        [ser("host.cpu_pct", "", [30] * 60)],
        steps=steps(200, wait=0.001, host=0.1),
        config={"num_workers": 2},
        meta=meta,
    )
    return diagnose(data)


def test_an_interrupted_runs_exit_is_no_finding_and_no_finding_speaks_of_nothing() -> None:
    """Ctrl-C: slow_exit said "the exit's heaviest stack ends in nothing sampled"."""
    end = T0 + 20.1 + 20
    kinds = [f["kind"] for f in _exited({"end": end, "exit_code": -2})["findings"]]
    assert "slow_exit" not in kinds and "command_failed" not in kinds, kinds
    kinds = [
        f["kind"]
        for f in _exited({"end": end, "exit_code": 0, "signals_forwarded": ["SIGTERM"]})["findings"]
    ]
    assert "slow_exit" not in kinds, kinds
    doc = _exited({"end": end, "exit_code": 0})
    slow = next(f for f in doc["findings"] if f["kind"] == "slow_exit")
    assert "nothing sampled" not in slow["summary"]
    assert "no stack of the exit was sampled" in slow["summary"]
    assert "`stallscope report`" not in slow["fixes"][0]["action"]


def test_the_exit_code_reads_as_the_shell_shows_it() -> None:
    from stallscope.analysis.facts.build import exit_status

    assert exit_status({"exit_code": -2}) == (130, "SIGINT", True)
    assert exit_status({"exit_code": -9}) == (137, "SIGKILL", False)
    assert exit_status({"exit_code": 1}) == (1, None, False)
    assert exit_status({"exit_code": 0, "signals_forwarded": ["SIGINT"]}) == (0, "SIGINT", True)
    assert exit_status({"exit_code": None}) == (None, None, False)


def test_a_command_that_failed_before_training_is_said_so() -> None:
    data = run(
        [ser("host.cpu_pct", "", [20] * 3), ser("procs.cpu_pct", "100", [5] * 3)],
        entities=procs({"100": "main"}),
        meta={"exit_code": 1},
    )
    data.errors.append(
        {"ts": T0 + 2.0, "pid": 100, "error": "ModuleNotFoundError: No module named 'torch'"}
    )
    doc = diagnose(data)
    assert doc["verdict"] == "command_failed", doc["findings"]
    f = doc["findings"][0]
    assert "exit code 1, 2 s into the run" in f["summary"]
    assert "ModuleNotFoundError: No module named 'torch'" in f["summary"]
    assert len(doc["findings"]) == 1  # no "run longer", no "nothing looks like a training"
    assert not any("stallscope run --" in x["action"] for x in f["fixes"])


def test_the_stacks_listed_are_the_trainings_the_sampled_seconds_count() -> None:
    """The report said "97.1 s sampled" over rows adding up to 104.6 s: 9.17 s of the exit's
    `rmtree` were listed among the training's stacks."""
    from stallscope.analysis.stacks import top_stacks, trainer_phases

    recs = [
        {
            "ts": T0 + 10,
            "pid": 7,
            "rank": None,
            "sampler": "inproc",
            "n": 400,
            "s": {"data": 6.0, "compute": 4.0, "exit": 9.17},
            "stacks": {"train;next": 6.0, "train;forward": 4.0, "main;rmtree": 9.17},
            "stack_phase": {
                "train;next": "data",
                "train;forward": "compute",
                "main;rmtree": "exit",
            },
        }
    ]
    [p] = trainer_phases(recs)
    rows = top_stacks(recs, 7, 12)
    assert [r[0] for r in rows] == ["train;next", "train;forward"]
    assert sum(r[2] for r in rows) <= p.total_s == 10.0


def test_a_move_within_the_metrics_own_noise_and_scale_is_no_change() -> None:
    """`change:` called a disk's r_await moving from 0.25 ms to 0 ms a shift."""
    from stallscope.analysis.diagnose import changes

    # (the detector's reference is the first 50 samples: each level lasts 80)
    quiet = [0.25, 0.3] * 40 + [0.0] * 80
    data = run([ser("disk.r_await_ms", "vda", quiet)])
    assert changes(data) == []
    real = [0.5, 0.6] * 40 + [12.0, 12.5] * 40  # a real slowdown of the disk: still told
    data = run([ser("disk.r_await_ms", "vda", real)])
    assert [c["metric"] for c in changes(data)] == ["disk.r_await_ms"]
    noisy = [4.0, 9.0] * 40 + [7.0, 12.0] * 40  # a 3-ms move inside a 5-ms swing
    assert changes(run([ser("disk.r_await_ms", "vda", noisy)])) == []


def test_loading_on_the_training_thread_is_data_without_a_dataloader() -> None:
    """Issue 52: nanoGPT's `get_batch` slicing an np.memmap, a loop decoding or tokenizing
    inline, were "other": a loop whose own loading dominates read as compute_bound at 0%. A
    DataLoader's stack stays the DataLoader's whatever decoder runs inside it."""
    from stallscope.sources.stacks.phases import Frame, classify

    sp = "/venv/lib/python3.11/site-packages/"
    memmap = [
        Frame(sp + "numpy/_core/memmap.py", "__new__", 270),
        Frame("/home/u/nanoGPT/train.py", "get_batch", 118),
        Frame("/home/u/nanoGPT/train.py", "<module>", 290),
    ]
    assert classify(memmap) == ("data", "io")
    in_get_batch = [
        Frame("/home/u/nanoGPT/train.py", "get_batch", 121),
        Frame("/home/u/nanoGPT/train.py", "<module>", 290),
    ]
    assert classify(in_get_batch) == ("data", "io")
    tokenize = [
        Frame(sp + "tiktoken/core.py", "encode_ordinary", 80),
        Frame("/home/u/train.py", "prepare", 12),
        Frame("/home/u/train.py", "main", 40),
    ]
    assert classify(tokenize)[0] == "data"
    in_loader = [
        Frame(sp + "PIL/JpegImagePlugin.py", "load_read", 400),
        Frame("/home/u/data.py", "__getitem__", 20),
        Frame(sp + "torch/utils/data/_utils/fetch.py", "fetch", 52),
        Frame(sp + "torch/utils/data/dataloader.py", "__next__", 700),
        Frame("/home/u/train.py", "main", 40),
    ]
    assert classify(in_loader) == ("data", "pytorch")
    forward = [
        Frame(sp + "torch/nn/modules/linear.py", "forward", 125),
        Frame("/home/u/nanoGPT/model.py", "forward", 60),
        Frame("/home/u/nanoGPT/train.py", "<module>", 300),
    ]
    assert classify(forward) == ("compute", "pytorch")


def test_loading_known_by_its_frames_never_starts_training() -> None:
    """A script writing its dataset with PIL before its loop (tests/trainings/torch_jpeg.py)
    began its training window there, and the setup read as the loop's `other`."""
    from stallscope.sources.stacks.phases import Frame, classify, starts_training

    sp = "/venv/lib/python3.11/site-packages/"
    writing = [
        Frame(sp + "PIL/Image.py", "save", 2400),
        Frame("/home/u/train.py", "write_photos", 30),
        Frame("/home/u/train.py", "main", 80),
    ]
    phase, fw = classify(writing)
    assert (phase, fw) == ("data", "io") and not starts_training(writing, phase, fw)


def test_a_trainer_whose_loading_sleeps_on_a_busy_host_still_waits_on_something_else() -> None:
    """The other side of the line above: its loading sleeps (a remote store), and the busy host
    added a 25% run-queue wait that does not explain a 75% stall (a CI run said fetch)."""
    data = run(
        [
            ser("host.cpu_pct", "", [90] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("procs.cpu_pct", "100", [20] * N),
            ser("procs.d_state", "100", [0] * N),
            ser("procs.runq_wait_pct", "100", [25] * N),
        ],
        steps=steps(200, wait=0.030, host=0.010),
        entities=procs({"100": "main"}),
        config={"num_workers": 0, "physical_cores": 2},
        logical_cores=2,
    )
    kinds = [f["kind"] for f in diagnose(data)["findings"]]
    assert kinds[0] == "input_bound.wait", kinds
