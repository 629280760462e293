"""One training job over two nodes, read back from Prometheus' answer (`diagnose --prometheus`):
its ranks are compared across the nodes, and the straggler is named with its node and cause.
The same over a real Prometheus and real agents: benchmarks/bench_fleet.py."""

from __future__ import annotations

from stallscope.analysis.diagnose import diagnose
from stallscope.analysis.promdata import PromQuery, _job_runs, _node_run, _Scraped

T0 = 1_700_000_000.0


def _scraped(comm: dict[tuple[str, int], float], job: str = "torchrun:j1") -> _Scraped:
    """Counters every 15 s for 40 points: 10 steps of 0.1 s each per interval, 2% data wait,
    ``comm`` of each step in collectives, per (node, rank)."""
    scraped = _Scraped()
    for (node, rank), share in comm.items():
        base = {
            "instance": node,
            "job": "stallscope",
            "run": f"run-{node}",
            "rank": str(rank),
            "Hostname": node,
            "train_job": job,
        }
        cols = {
            "stallscope_train_steps_total": [i * 10 for i in range(40)],
            "stallscope_train_step_seconds_total": [i * 1.0 for i in range(40)],
            "stallscope_train_data_wait_seconds_total": [i * 0.02 for i in range(40)],
            "stallscope_train_comm_wait_seconds_total": [i * share for i in range(40)],
        }
        for name, vals in cols.items():
            scraped.add(
                {
                    "metric": {"__name__": name, **base},
                    "values": [[T0 + 15 * i, str(v)] for i, v in enumerate(vals)],
                }
            )
    return scraped


def test_a_job_on_two_nodes_is_diagnosed_as_one_with_the_straggler_s_node() -> None:
    scraped = _scraped(
        {("node-a", 0): 0.40, ("node-a", 1): 0.42, ("node-b", 2): 0.41, ("node-b", 3): 0.03}
    )
    q = PromQuery(url="http://prometheus:9090", since_s=600, step_s=15)
    [job] = _job_runs(q, scraped, T0, T0 + 600, 15.0)
    assert job.meta["rank_hosts"] == {"0": "node-a", "1": "node-a", "2": "node-b", "3": "node-b"}
    assert job.meta["prometheus"]["nodes"] == ["node-a", "node-b"]
    doc = diagnose(job)
    assert doc["verdict"] == "straggler_rank", [f["kind"] for f in doc["findings"]]
    f = doc["findings"][0]
    assert f["evidence"]["rank"] == 3 and f["evidence"]["host"] == "node-b"
    assert f["evidence"]["cause"] == "compute"
    assert f["summary"].startswith("Rank 3 (on node-b) holds the job back: ranks 0, 1, 2 wait")
    peers = next(x for x in doc["findings"] if x["kind"] == "waiting_for_peers")
    assert peers["evidence"]["waiting_ranks"] == [0, 1, 2]
    # each node alone sees half the job: node-a's two ranks keep pace with each other
    node_a = diagnose(_node_run(q, scraped, "node-a", T0, T0 + 600, 15.0))
    assert "straggler_rank" not in [x["kind"] for x in node_a["findings"]]


def test_a_job_on_one_node_or_lone_runs_make_no_job_diagnosis() -> None:
    q = PromQuery(url="http://prometheus:9090", since_s=600, step_s=15)
    one_node = _scraped({("node-a", 0): 0.4, ("node-a", 1): 0.03})
    assert _job_runs(q, one_node, T0, T0 + 600, 15.0) == []
    lone = _scraped({("node-a", 0): 0.4}, job="run-node-a")
    lone_b = _scraped({("node-b", 0): 0.4}, job="run-node-b")
    lone.train_jobs.update(lone_b.train_jobs)
    for inst, cols in lone_b.steps.items():
        lone.steps[inst] = cols
    assert _job_runs(q, lone, T0, T0 + 600, 15.0) == []
