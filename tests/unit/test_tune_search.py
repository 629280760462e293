"""The tuner's search on simulated trials (a ``measure`` that returns figures, no DataLoader run):
the recommendation is the configuration the search itself calls best, and what it says about
why it stopped agrees with it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from stallscope.loadermodel import KEEPS_UP_PACE
from stallscope.tuner.measure import Trial
from stallscope.tuner.search import Search

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch]


def _search(seen: dict[int, tuple[float, float, float, float, float, int]]) -> Search:
    """A search on 2 cores whose trials give ``seen[num_workers]``: (samples/s, data wait,
    CPU %, CPU ms per sample, step ms, bytes swapped in)."""
    from stallscope.tuner.target import target_of

    def measure(config: dict[str, Any], window_s: float, _best: float | None) -> Trial:
        rate, wait, cpu, cpu_ms, step_ms, swap = seen[int(config.get("num_workers", 0) or 0)]
        return Trial(
            config=config,
            samples_per_s=rate,
            data_wait_share=wait,
            cpu_pct=cpu,
            cpu_ms_per_sample=cpu_ms,
            step_ms=step_ms,
            samples=int(rate * window_s),
            batches=round(rate * window_s / 32),
            seconds=window_s,
            swap_in=swap,
        )

    data = torch.utils.data.TensorDataset(torch.zeros(64, 4))
    return Search(
        target_of(data),
        step_fn=None,
        budget_s=42,
        max_workers=None,
        start_method=None,
        gpu=False,
        cores=2,
        measure=measure,
        read_caps={},
    )


def test_the_configuration_the_input_keeps_up_at_is_the_one_recommended() -> None:
    """As seen on a busy 2-core machine: the baseline (no workers) ran 302 samples/s waiting
    31% of the time for data; two workers ran 294 with a 2.4% wait (the step slowed beside
    them), within the pace the search accepts as keeping up. The search stopped there, saying
    the input keeps up at num_workers=2, and recommended num_workers=0: the stopped line and the
    recommendation must name the same configuration."""
    s = _search(
        {
            0: (302.0, 0.31, 125.0, 4.1, 30.6, 0),
            1: (292.0, 0.36, 160.0, 3.2, 78.8, 0),
            2: (294.0, 0.024, 190.0, 3.2, 81.8, 0),
        }
    )
    result = s.run()
    assert [t.config.get("num_workers", 0) for t in result.trials] == [0, 1, 2]
    assert 294.0 >= KEEPS_UP_PACE * 302.0  # the case this test is about
    assert result.stopped.startswith(
        "the input keeps up with the training step at num_workers=2 (data wait 2.4%)"
    ), result.stopped
    assert result.best["num_workers"] == 2, (result.best, result.stopped)
    assert result.best_index == 2 and result.samples_per_s == 294.0
    assert "num_workers=2" in result.recommendation, result.recommendation
    assert result.to_json()["best"]["num_workers"] == 2
    # the bound speaks of the configuration recommended, and the notes say why it won over
    # the faster-measured baseline
    assert "num_workers=2" in result.bound, result.bound
    assert any("num_workers=0" in n and "302" in n and "keeps up" in n for n in result.notes), (
        result.notes
    )


def test_a_trial_that_swapped_does_not_stop_the_search_as_keeping_up() -> None:
    """A trial during which the machine swapped is never recommended: its low data wait does
    not end the search either (the stopped line would name a configuration the result
    refuses)."""
    s = _search(
        {
            0: (302.0, 0.31, 125.0, 4.1, 30.6, 0),
            1: (292.0, 0.36, 160.0, 3.2, 78.8, 0),
            2: (300.0, 0.024, 190.0, 3.2, 81.8, 1 << 20),
        }
    )
    result = s.run()
    assert "num_workers=2" not in result.stopped, result.stopped
    assert result.best.get("num_workers", 0) != 2, result.best


def test_a_keeping_up_trial_that_is_also_the_fastest_is_recommended_without_a_note() -> None:
    """The ordinary case: two workers keep up and are the fastest; no note about a faster
    configuration."""
    s = _search(
        {
            0: (302.0, 0.31, 125.0, 4.1, 30.6, 0),
            1: (292.0, 0.36, 160.0, 3.2, 78.8, 0),
            2: (368.0, 0.02, 190.0, 3.2, 81.8, 0),
        }
    )
    result = s.run()
    assert result.best["num_workers"] == 2
    assert result.stopped.startswith("the input keeps up with the training step at num_workers=2")
    assert not any("keeps up" in n for n in result.notes), result.notes


def test_a_wrong_target_is_told_before_anything_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stallscope tune` checks TARGET before it imports PyTorch (~2 s): a missing colon, a
    file that is not there, a module that is not installed; a module in the working directory
    (which resolve() puts on sys.path) is not refused."""
    from stallscope.errors import UsageError
    from stallscope.tuner.target import check

    monkeypatch.chdir(tmp_path)
    for spec, said in (
        ("data", "expected MODULE:FUNCTION"),
        ("/no/such/file.py:data", "no such file"),
        ("nosuchmodule_xyz:data", "cannot import 'nosuchmodule_xyz'"),
    ):
        with pytest.raises(UsageError, match=said):
            check(spec)
    (tmp_path / "mydata_here.py").write_text("def data():\n    return [1]\n")
    (tmp_path / "mypkg_here").mkdir()
    assert check("mydata_here:data") == ("mydata_here", "data")
    assert check("mypkg_here:data") == ("mypkg_here", "data")
    assert check("json:loads") == ("json", "loads")
    assert check("os.path:join") == ("os.path", "join")  # dotted: left to the import
    assert "mydata_here" not in sys.modules


def test_processes_at_a_lower_priority_do_not_count_as_a_trial_s_load() -> None:
    """A nice-19 job beside a trial yields its cores to it: it is not the load that lowers the
    trial's rate, so it is neither counted nor named; one at the trial's priority is."""
    from stallscope.tuner.measure import Trial, others_cores, taking_others

    own = os.getpriority(os.PRIO_PROCESS, 0)
    if own >= 19:
        pytest.skip("this test runs at nice 19: nothing runs at a lower priority")
    t = Trial({"num_workers": 2})
    t.busy_others = [
        {"pid": 10, "name": "batch", "cores": 1.5, "nice": 19},
        {"pid": 11, "name": "stress", "cores": 0.7},
        {"pid": 12, "name": "peer", "cores": 0.2, "nice": own},
    ]
    assert [b["pid"] for b in taking_others(t)] == [11, 12]
    assert others_cores(t) == pytest.approx(0.9)
