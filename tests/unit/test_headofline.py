"""input_bound.head_of_line (issue 52) on runs built by hand: the trainer's waits in bursts
while two workers sit idle part of the time; the same mean wait spread over every step is the
ordinary input_bound.prep."""

from __future__ import annotations

import pytest
from diagnose_inputs import WORKERS, N, run, ser

from stallscope.analysis.diagnose import RunData, diagnose
from stallscope.analysis.facts.steps import wait_spread
from stallscope.store import StepRow

T0 = 1_700_000_000.0


def _steps(waits: list[float], host: float = 0.020, n: int = 1) -> list[StepRow]:
    out, t = [], T0
    for i, w in enumerate(waits):
        out.append(StepRow(0, i * n, t, w, host * n, None, None, None, 4 * n, 0, None, n))
        t += w + host * n
    return out


#: 200 steps: 180 wait 1 ms, 20 wait 300 ms (a batch with a slow sample), and the same mean
#: wait on every step
BURSTS = [0.3 if i % 10 == 5 else 0.001 for i in range(200)]
FLAT = [sum(BURSTS) / len(BURSTS)] * 200


def _loader(
    waits: list[float],
    worker_cpu: float = 60,
    config: dict | None = None,
    cores: int = 8,
    host_pct: float | None = None,
) -> RunData:
    """Two workers at ``worker_cpu`` each, the trainer at 20%, on ``cores`` cores (the host as
    busy as they make it, or ``host_pct``), the disk idle."""
    cfg = {
        "num_workers": 2,
        "prefetch_factor": 2,
        "in_order": True,
        "torch": "2.13.0+cpu",
        "physical_cores": cores,
    }
    cfg.update(config or {})
    busy = (2 * worker_cpu + 20) / cores if host_pct is None else host_pct
    return run(
        [
            ser("host.cpu_pct", "", [busy] * N),
            ser("host.iowait_pct", "", [0] * N),
            ser("disk.util_pct", "vda", [1] * N),
            ser("disk.rkb_s", "vda", [10] * N),
            ser("procs.cpu_pct", "100", [20] * N),
            ser("procs.cpu_pct", "101", [worker_cpu] * N),
            ser("procs.cpu_pct", "102", [worker_cpu] * N),
            ser("procs.d_state", "101", [0] * N),
            ser("procs.d_state", "102", [0] * N),
        ],
        steps=_steps(waits),
        entities=WORKERS,
        config=cfg,
        meta={"data_devices": ["vda"], "logical_cores": cores},
    )


def test_waits_in_bursts_with_idle_workers_are_head_of_line() -> None:
    doc = diagnose(_loader(BURSTS))
    f = doc["findings"][0]
    assert doc["verdict"] == "input_bound.head_of_line", doc["findings"]
    # the ordinary prep finding is not said beside it: one wait, one explanation
    assert [x["kind"] for x in doc["findings"]].count("input_bound.prep") == 0
    assert f["title"] == "Slow samples hold up the batches"
    assert f["evidence"]["wait_top_share"] >= 0.95
    assert f["evidence"]["worker_idle_share"] == pytest.approx(0.4)
    # with no worker idle they use 2 cores, not 1.2: x1.67, under the stall's own ceiling
    assert f["est_speedup"] == pytest.approx(2 / 1.2, abs=0.01)
    assert doc["stall_fraction"] > 0.5 and f["est_speedup"] < 1 / (1 - doc["stall_fraction"])
    actions = [x["action"] for x in f["fixes"]]
    assert actions[0] == "DataLoader(in_order=False)"
    assert f["fixes"][0]["change"] == {"in_order": False}
    assert f["fixes"][0]["expected_speedup"] == f["est_speedup"]
    assert "order of batches changes" in f["fixes"][0]["why"]
    assert actions[1] == "prefetch_factor 2 → 4"
    assert actions[2].startswith("precompute the slow samples")
    assert actions[3].startswith("split the slow samples")
    assert "in bursts" in f["summary"] and "idle 40%" in f["summary"]


def test_the_same_mean_wait_on_every_step_is_prep() -> None:
    doc = diagnose(_loader(FLAT))
    kinds = [x["kind"] for x in doc["findings"]]
    assert doc["verdict"] == "input_bound.prep", kinds
    assert "input_bound.head_of_line" not in kinds
    assert doc["signals"]["wait_top_share"] == pytest.approx(0.1, abs=0.01)


@pytest.mark.parametrize("why", ["in_order_false", "one_worker", "no_spare_core", "busy_workers"])
def test_no_head_of_line_where_it_cannot_be(why: str) -> None:
    """Batches already out of order, one worker (its batches come in order anyway), no core
    for the idle workers to use (other processes hold them), workers already busy: no
    head-of-line finding; the wait is prep's."""
    data = {
        "in_order_false": lambda: _loader(BURSTS, config={"in_order": False}),
        "one_worker": lambda: _loader(BURSTS, config={"num_workers": 1}),
        # 2 cores, all busy: other processes hold the 0.6 core the trainer (0.2) and
        # the workers (1.2) leave
        "no_spare_core": lambda: _loader(BURSTS, cores=2, host_pct=100),
        "busy_workers": lambda: _loader(BURSTS, worker_cpu=98),
    }[why]()
    kinds = [x["kind"] for x in diagnose(data)["findings"]]
    assert "input_bound.head_of_line" not in kinds, kinds
    assert "input_bound.prep" in kinds or "input_bound.wait" in kinds, kinds


def test_an_old_pytorch_is_told_to_upgrade() -> None:
    f = diagnose(_loader(BURSTS, config={"torch": "2.4.1"}))["findings"][0]
    assert f["kind"] == "input_bound.head_of_line"
    assert f["fixes"][0]["action"].startswith("upgrade to PyTorch ≥ 2.6")
    assert "change" not in f["fixes"][0]


def test_wait_spread_counts_a_record_of_several_steps_at_their_mean() -> None:
    # 100 single steps, one waiting 1 s, the rest 10 ms: the top 10 steps hold 1.09 of 1.99 s
    one = _steps([1.0] + [0.01] * 99)
    share, p99 = wait_spread(one)
    assert share == pytest.approx(1.09 / 1.99, abs=0.001)
    assert p99 == pytest.approx(10.0)
    # the same waits summed into records of 4 steps: the burst spread over its record
    grouped = _steps([1.03] + [0.04] * 24, n=4)
    share4, _ = wait_spread(grouped)
    assert share4 is not None and share4 <= share
    assert wait_spread(_steps([0.01] * 50)) == (None, None)  # too few steps to tell


def _timed(data: RunData, costs_s: list[float]) -> RunData:
    """The two workers' own timing of their batches (sources/stacks/fetches.py), half each."""
    from stallscope.sources.stacks.fetches import bucket

    for pid, part in (("101", costs_s[::2]), ("102", costs_s[1::2])):
        hist: dict[int, int] = {}
        for c in part:
            hist[bucket(c)] = hist.get(bucket(c), 0) + 1
        data.batch_costs[int(pid)] = hist
    return data


#: batches of 4 with 2% of the samples 41x slower: 8% of the batches cost 11x the others
TAIL_COSTS = [0.53 if i % 25 == 3 else 0.048 for i in range(400)]


def test_the_workers_timing_of_a_heavy_tail_is_shown_and_simulated() -> None:
    doc = diagnose(_timed(_loader(BURSTS), TAIL_COSTS))
    f = doc["findings"][0]
    assert f["kind"] == "input_bound.head_of_line", doc["findings"]
    ev = f["evidence"]
    assert ev["batches_timed"] == 400
    assert ev["batch_cost_p99_ms"] / ev["batch_cost_p50_ms"] > 9
    assert "The workers timed each batch" in f["summary"] and "×5" in f["rule"]
    # the estimate is the smaller of the cores' bound (x1.67) and PyTorch's dispatch simulated
    # over these costs
    assert ev["cores_estimate"] == pytest.approx(2 / 1.2, abs=0.01)
    assert 1.05 <= ev["simulated_speedup"] < ev["cores_estimate"]
    assert f["est_speedup"] == ev["simulated_speedup"] == f["fixes"][0]["expected_speedup"]
    assert "simulated" in f["fixes"][0]["why"]
    assert (
        f["fixes"][1]["action"] == "prefetch_factor 2 → 4" and "simulated" in f["fixes"][1]["why"]
    )


def test_batches_timed_alike_are_no_head_of_line_whatever_the_waits() -> None:
    # the same waits in bursts, but the workers measured every batch within 20% of the others
    flat = [0.09 if i % 2 else 0.1 for i in range(400)]
    doc = diagnose(_timed(_loader(BURSTS), flat))
    kinds = [x["kind"] for x in doc["findings"]]
    assert "input_bound.head_of_line" not in kinds and "input_bound.prep" in kinds, kinds
    assert doc["signals"]["batch_cost_p99_ms"] < 5 * doc["signals"]["batch_cost_p50_ms"]


def test_too_few_batches_timed_leave_the_waits_to_tell() -> None:
    doc = diagnose(_timed(_loader(BURSTS), [0.09] * 30))
    f = doc["findings"][0]
    assert f["kind"] == "input_bound.head_of_line"
    assert f["evidence"]["simulated_speedup"] is None
    assert f["est_speedup"] == pytest.approx(2 / 1.2, abs=0.01)


def _hist(values: list[float]) -> dict[str, int]:
    """``values`` as a record's histogram (sources/stacks/batches.py: bucket -> batches)."""
    from stallscope.sources.stacks.fetches import bucket

    out: dict[str, int] = {}
    for v in values:
        out[str(bucket(v))] = out.get(str(bucket(v)), 0) + 1
    return out


def _unmodified(waits: list[float], host: float = 0.020) -> RunData:
    """The same loader with no probe: the trainer's training thread sampled in-process (a
    record of 30 s, its data share the waits'), and the batches it took timed by the sampler's
    hook on the DataLoader (``wait_b``, ``step_b``)."""
    data = _loader(waits)
    data.steps, data.probes = [], []
    wait = sum(waits)
    compute = host * len(waits)
    data.stacks = [
        {
            "ts": T0 + 30,
            "pid": 100,
            "rank": None,
            "sampler": "inproc",
            "rate_hz": 40.0,
            "n": 1200,
            "s": {"data": wait, "compute": compute},
            "stacks": {},
            "stack_phase": {},
            "batches": len(waits),
            "samples": 4 * len(waits),
            "wait_b": _hist(waits),
            "step_b": _hist([w + host for w in waits]),
        }
    ]
    return data


def test_an_unmodified_trainer_s_timed_batches_show_the_bursts() -> None:
    """No probe: the sampled stacks give the wait, the batches the sampler's hook timed show it
    comes in bursts, the workers' timing the tail: head_of_line, its spread read off the
    batches' histograms (bucket middles, ±10%)."""
    doc = diagnose(_timed(_unmodified(BURSTS), TAIL_COSTS))
    f = doc["findings"][0]
    assert f["kind"] == "input_bound.head_of_line", doc["findings"]
    ev = f["evidence"]
    assert ev["stall_source"] == "stacks" and ev["step_timing_source"] == "counted_batches"
    assert ev["wait_top_share"] >= 0.9
    assert ev["wait_ms_p99"] == pytest.approx(300, rel=0.1)
    assert ev["step_ms_median"] == pytest.approx(21, rel=0.1)
    assert ev["simulated_speedup"] is not None


def test_an_unmodified_trainer_needs_the_workers_timing_too() -> None:
    """No probe and the waits in bursts, but no batch timed in the workers (a loader the hook
    does not see): the bursts alone do not name the tail; the ordinary prep finding speaks."""
    doc = diagnose(_unmodified(BURSTS))
    kinds = [x["kind"] for x in doc["findings"]]
    assert doc["signals"]["step_timing_source"] == "counted_batches"
    assert "input_bound.head_of_line" not in kinds and "input_bound.prep" in kinds, kinds
