"""The one loader model (stallscope/loadermodel.py) that the diagnosis's fixes, the offline
tuner and online autotune predict from, and a diagnosis that never advises what its own run
measured."""

from __future__ import annotations

import pytest
from diagnose_inputs import WORKERS, N, run, ser, steps

from stallscope import loadermodel as lm
from stallscope.analysis.diagnose import diagnose
from stallscope.probe.autotune import predict_rate


def test_each_bound_binds_in_turn() -> None:
    # 4 workers at 0.1 s a batch: 40/s; 8 cores at 0.1 s CPU each: 80/s; a 20-ms step: 50/s
    assert lm.rate(4, 0.1, cores=8, step_s=0.02) == pytest.approx(40.0)
    assert lm.rate(16, 0.1, cores=8, step_s=0.02) == pytest.approx(50.0)  # the step
    assert lm.rate(16, 0.1, cores=8) == pytest.approx(80.0)  # the cores
    assert lm.rate(16, 0.1, cores=8, storage=30.0) == pytest.approx(30.0)  # the storage
    # the trainer's own CPU beside the workers takes cores from them
    assert lm.rate(16, 0.1, cores=8, main_cpu_s=0.1) == pytest.approx(40.0)
    # workers that slow each other by 10% each: 4 / (0.1 × 1.3)
    assert lm.rate(4, 0.1, cores=8, contention=0.1) == pytest.approx(4 / 0.13)
    # no workers: loading and the step take turns
    assert lm.rate(0, 0.1, cores=8, step_s=0.02) == pytest.approx(1 / 0.12)
    assert lm.rate(0, 0.0, cores=8) == 0.0 and lm.rate(3, 0.0, cores=8) == 0.0


@pytest.mark.parametrize(
    "k,load,compute,cores,cpu",
    [
        (0, 0.05, 0.02, 4, 0.0),
        (1, 0.05, 0.02, 4, 0.0),
        (3, 0.05, 0.02, 4, 0.09),
        (8, 0.05, 0.02, 2, 0.3),
        (2, 0.0, 0.02, 4, 0.05),
        (2, 0.05, 0.0, 4, 0.0),
    ],
)
def test_autotune_predicts_what_it_predicted_before_from_the_one_model(
    k: int, load: float, compute: float, cores: int, cpu: float
) -> None:
    """autotune's own formula before the model was shared: cores over the larger of a step's
    wall and CPU time, k over the load, one over the compute."""
    if k == 0:
        before = 1.0 / (load + compute)
    else:
        bounds = [cores / max(load + compute, cpu)]
        bounds += [k / load] if load > 0 else []
        bounds += [1.0 / compute] if compute > 0 else []
        before = min(bounds)
    assert predict_rate(k, load, compute, cores, cpu) == pytest.approx(before)


def test_worker_gain_is_bounded_by_idle_cores_and_by_the_stall() -> None:
    # 2 workers at 98% of a core; 5 cores idle: 3 more workers add 3 cores -> ×2.53, but a 60%
    # wait can give at most ×2.5
    assert lm.worker_gain(2, 5, 0.98, 5.2, 0.6) == pytest.approx(2.5)
    assert lm.worker_gain(2, 5, 0.98, 0.04, 0.6) == pytest.approx(1.02)  # no idle CPU
    assert lm.worker_gain(2, 2, 0.98, 5.0, 0.6) is None  # no more workers
    assert lm.worker_gain(0, 2, 0.98, 5.0, 0.6) is None
    assert lm.stall_cap(0.99) == pytest.approx(20.0) and lm.stall_cap(None) == 1.0
    assert lm.workers_target(2, 0.6, 8) == 5 and lm.workers_target(2, 0.01, 8) == 3
    assert lm.workers_target(6, 0.9, 8) == 8


def test_thresholds_are_one_set() -> None:
    """Issue 51: this checked names, two of which (WORSE, KEEPS_UP_SHARE) existed nowhere. Now:
    every loader-model number the tuner, autotune and the diagnosis use is lm's, by value and by
    use: none keeps a constant of its own with one of lm's values, and none compares against
    one of lm's values written bare."""
    import ast
    import inspect

    from stallscope.analysis.diagnose.rules import fetch as rules_fetch
    from stallscope.analysis.diagnose.rules import input as rules_input
    from stallscope.analysis.diagnose.rules import prep as rules_prep
    from stallscope.analysis.facts import build
    from stallscope.probe import autotune
    from stallscope.tuner import outcome, search

    ours = {
        n: v
        for n, v in vars(lm).items()
        if n.isupper() and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    assert {
        "ALIKE",
        "KEEPS_UP",
        "MEM_SHARE",
        "MIN_GAIN",
        "NEAR_BEST",
        "KEEPS_UP_PACE",
        "OTHERS_BUSY_CORES",
        "BUSY_SPARE",
        "SHM_SHARE",
    } <= set(ours)
    for mod in (autotune, search, outcome, rules_input, rules_fetch, rules_prep, build):
        for name, v in vars(mod).items():
            if (
                name.isupper()
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
                and name in ours
            ):
                assert v is ours[name] or v == ours[name], (mod.__name__, name)
        if mod is rules_input:
            continue  # its bare 0.8s and 0.95s are confidences, not the loader model's
        # inside functions: a number with one of lm's values written bare is a copy
        bare = [
            (f.name, n.value)
            for f in ast.walk(ast.parse(inspect.getsource(mod)))
            if isinstance(f, ast.FunctionDef)
            for n in ast.walk(f)
            if isinstance(n, ast.Constant)
            and type(n.value) is float
            and n.value
            in {
                lm.NEAR_BEST,
                lm.KEEPS_UP_PACE,
                lm.AT_READ_LIMIT,
                lm.ALIKE,
                lm.MIN_GAIN,
                lm.SHM_SHARE,
                lm.CPU_BOUND_SHARE,
                lm.MEM_SHARE,
            }
        ]
        assert not bare, (mod.__name__, bare)
    assert lm.keeps_up(0.04) and not lm.keeps_up(0.05) and not lm.keeps_up(None)
    assert lm.gains(105.0, 100.0) and not lm.gains(104.0, 100.0)
    assert lm.alike(97.0, 100.0) and not lm.alike(96.0, 100.0)


def test_workers_measured_slower() -> None:
    trials = [(0, 10.0), (1, 20.0), (2, 19.0), (4, 30.0)]
    assert lm.workers_measured_slower(trials, 1) == 2
    assert lm.workers_measured_slower(trials, 2) is None  # 4 gained over 1 and 2
    assert lm.workers_measured_slower([(1, 20.0), (2, 20.9)], 1) == 2  # under ×1.05
    assert lm.workers_measured_slower([(2, 20.0)], 1) is None  # nothing at 1 or fewer
    assert lm.workers_measured_slower([], 1) is None


def _prep_run(config: dict, host_pct: float = 35) -> dict:
    data = run(
        [
            ser("host.cpu_pct", "", [host_pct] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("procs.cpu_pct", "100", [20] * N),
            ser("procs.cpu_pct", "101", [99] * N),
            ser("procs.cpu_pct", "102", [97] * N),
            ser("procs.d_state", "101", [0] * N),
            ser("procs.d_state", "102", [0] * N),
        ],
        steps=steps(200, wait=0.030, host=0.020),
        entities=WORKERS,
        config=config,
    )
    return diagnose(data)


def test_a_fix_never_advises_the_workers_the_runs_autotune_measured_slower() -> None:
    """A newcomer's run: autotune measured 2 workers slower than 1 (and 3 no faster), the run
    ended at 1 worker; the diagnosis advised "num_workers 1 → 2" all the same."""
    trials = [
        {"num_workers": 0, "steps_per_s": 9.0},
        {"num_workers": 1, "steps_per_s": 14.0},
        {"num_workers": 2, "steps_per_s": 12.5},
    ]
    base = {"num_workers": 1, "physical_cores": 8}
    plain = _prep_run(base)["findings"][0]
    assert plain["kind"] == "input_bound.prep"
    assert plain["fixes"][0]["action"].startswith("num_workers 1 → ")  # without autotune
    tuned = _prep_run({**base, "autotune": {"trials": trials, "done": True}})["findings"][0]
    assert tuned["kind"] == "input_bound.prep"
    assert not [x for x in tuned["fixes"] if x["action"].startswith("num_workers")], tuned["fixes"]
    assert "autotune measured num_workers=2 no faster than 1" in tuned["fixes"][0]["why"]
    # garbage in the stored trials is ignored, not a traceback
    odd = _prep_run({**base, "autotune": {"trials": [{"num_workers": "2"}, 5, None]}})
    assert odd["findings"][0]["fixes"][0]["action"].startswith("num_workers 1 → ")


def test_busy_cpus_never_get_more_workers_beside_cheaper_work() -> None:
    """ "make per-sample work cheaper: the CPUs are already 98% busy" followed by "num_workers
    1 → 2" contradicted itself; with the workers' CPU unknown the gain was not checked."""
    f = _prep_run({"num_workers": 1, "physical_cores": 8}, host_pct=98)["findings"][0]
    assert f["fixes"][0]["action"].startswith("make per-sample work cheaper")
    assert not [x for x in f["fixes"] if x["action"].startswith("num_workers")], f["fixes"]
