"""The agent's series for head-of-line blocking and the GIL, and what ``diagnose --prometheus``
makes of them: the DataLoader workers' batch costs read from ``<run>/fetches/`` (written by the
real writer of :mod:`stallscope.sources.stacks.fetches`, and hostile files beside them), the
histogram the exposition writes, the loader-thread gauges, and the facts rebuilt from
Prometheus series giving the same findings as a run's own files."""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from stallscope.agent.exporter import PrometheusSink
from stallscope.agent.steps import WAIT_EDGES_S, wait_bucket
from stallscope.agent.trainfetches import MAX_READ, LoaderCosts, TrainerCosts
from stallscope.agent.trainstacks import loader_threads_part
from stallscope.analysis.promhist import WaitSpread, batch_costs_of, threads_parts
from stallscope.sources.stacks import fetches
from stallscope.sources.stacks.fetches import EDGES_S, K_HI, K_LO, bucket_of_le, cost_summary
from stallscope.store import Series

TRAINER = os.getppid()  # the records the test writes name it as their parent


def write_costs(run: Path, monkeypatch: pytest.MonkeyPatch, costs: list[float]) -> None:
    """``costs`` as this process's worker histogram, appended by the real recorder."""
    monkeypatch.setenv("STALLSCOPE_RUN_DIR", str(run))
    rec = fetches._Recorder()
    for c in costs:
        rec.add(c)
    rec.flush()


def heavy_tail(n: int = 400, seed: int = 3) -> list[float]:
    """2% of the batches 40× slower than the rest (the issue's scenario)."""
    r = random.Random(seed)
    return [0.05 * (40 if r.random() < 0.02 else 1) * r.uniform(0.9, 1.1) for _ in range(n)]


def update(lc: LoaderCosts, run: Path, root: int = TRAINER) -> list[str]:
    return lc.update({"r1": (run, os.getuid())}, {"r1": (root, {})})


def test_the_workers_costs_come_out_per_trainer_bucket_for_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    costs = heavy_tail()
    write_costs(tmp_path, monkeypatch, costs)
    lc = LoaderCosts()
    assert update(lc, tmp_path) == []
    (got,) = lc.snapshot()
    want = fetches.read_histograms(tmp_path)[os.getpid()]
    assert (got.run, got.pid, got.counts) == ("r1", TRAINER, want)
    assert got.sum_s == pytest.approx(sum(costs), rel=1e-4)
    # read incrementally: nothing twice, the next append added once
    assert update(lc, tmp_path) == [] and lc.snapshot()[0].counts == want
    write_costs(tmp_path, monkeypatch, [0.05] * 10)
    update(lc, tmp_path)
    assert sum(lc.snapshot()[0].counts.values()) == len(costs) + 10
    # the trainer's own batches (num_workers=0) are no worker's: not counted
    lc2 = LoaderCosts()
    update(lc2, tmp_path, root=os.getpid())
    assert lc2.snapshot() == []
    # a run no longer followed is read once more and kept a while (the next test)


def test_an_ended_run_is_read_once_more_and_kept_for_the_grace_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run no longer followed (it ended): what its workers wrote as they left is read, its
    totals stay exported GRACE_S, as the step totals do, then drop out."""
    from stallscope.agent.trainfetches import GRACE_S

    now = [1000.0]
    lc = LoaderCosts(clock=lambda: now[0])
    write_costs(tmp_path, monkeypatch, [0.05] * 10)
    update(lc, tmp_path)
    write_costs(tmp_path, monkeypatch, [0.05] * 5)  # a worker's last flush, as it exits
    lc.update({}, {})
    assert [sum(c.counts.values()) for c in lc.snapshot()] == [15]
    now[0] += GRACE_S - 1
    lc.update({}, {})
    assert [sum(c.counts.values()) for c in lc.snapshot()] == [15]
    now[0] += 2
    lc.update({}, {})
    assert lc.snapshot() == []


def test_exposition_is_a_histogram_whose_buckets_give_the_fetch_histogram_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_costs(tmp_path, monkeypatch, heavy_tail())
    lc = LoaderCosts()
    update(lc, tmp_path)
    sink = PrometheusSink([], hostname="node-1", loader=lc)
    text = generate_latest(sink.registry).decode()
    assert "# TYPE stallscope_loader_batch_seconds histogram" in text
    cols: dict[str, tuple[list[float], list[float]]] = {}
    for ln in text.splitlines():
        if ln.startswith("stallscope_loader_batch_seconds_bucket{"):
            labels = ln[ln.index("{") + 1 : ln.rindex("}")]
            assert f'pid="{TRAINER}"' in labels and 'role="main"' in labels, ln
            assert 'run="r1"' in labels and 'Hostname="node-1"' in labels, ln
            le = labels.split('le="')[1].split('"')[0]
            cols[le] = ([100.0], [float(ln.rsplit(" ", 1)[1])])
    assert len(cols) == len(EDGES_S) + 1 and "+Inf" in cols
    count = next(
        ln for ln in text.splitlines() if ln.startswith("stallscope_loader_batch_seconds_count")
    )
    assert float(count.rsplit(" ", 1)[1]) == 400
    # read back as diagnose --prometheus does: the same histogram, under the trainer's worker
    ents = {("procs", "77"): {"role": "worker", "ppid": str(TRAINER), "run": "r1"}}
    back = batch_costs_of({("r1", str(TRAINER)): cols}, "r1", ents, start=0.0, step=1.0)
    assert back == {77: fetches.read_histograms(tmp_path)[os.getpid()]}
    assert cost_summary(back.values()) == cost_summary(fetches.read_histograms(tmp_path).values())


def test_bounds_map_to_fetch_buckets() -> None:
    assert bucket_of_le("+Inf") == K_HI and bucket_of_le("nope") is None
    assert bucket_of_le(f"{EDGES_S[0]:.6g}") == K_LO - 1
    assert bucket_of_le(repr(EDGES_S[5])) == K_LO + 4  # spelled otherwise: read as a number
    assert bucket_of_le("0.5") is None
    # a cost lands under the bound just above it
    for cost in (0.0012, 0.048, 2.0):
        k = fetches.bucket(cost)
        le = TrainerCosts("r", 1, counts={k: 1}).buckets()
        first = next(b for b, n in le if n == 1)
        assert bucket_of_le(first) == k


def test_hostile_files_are_skipped_with_one_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_costs(tmp_path, monkeypatch, [0.05] * 50)
    folder = tmp_path / "fetches"
    os.mkfifo(folder / "fifo.jsonl")  # would hang a blocking open
    (folder / "link.jsonl").symlink_to(folder / f"{os.getpid()}.jsonl")
    (folder / "garbage.jsonl").write_text(
        "not json\n"
        + "[" * 100_000
        + "]" * 100_000
        + "\n"
        + json.dumps({"pid": 5, "b": {"x": 1}})
        + "\n"
        + json.dumps({"pid": 5, "ppid": TRAINER, "b": {"40": 3}})
        + "\n"
    )
    # a line longer than a whole read, then a good record
    good = json.dumps({"pid": 6, "ppid": TRAINER, "n": 2, "sum_s": 0.1, "b": {"40": 2}})
    (folder / "huge.jsonl").write_text("x" * (3 * MAX_READ) + "\n" + good + "\n")
    lc = LoaderCosts()
    notes: list[str] = []
    for _ in range(6):  # the huge line takes several reads to pass
        notes += update(lc, tmp_path)
    (got,) = lc.snapshot()
    assert got.counts[fetches.bucket(0.05)] == 50 and got.counts[40] == 3 + 2
    assert len(notes) == len(set(notes)) == 4, notes  # one line per file, said once
    assert any("fifo.jsonl" in n and "not a regular file" in n for n in notes), notes
    assert any("link.jsonl" in n for n in notes), notes
    assert any("garbage.jsonl" in n and "3 line(s)" in n for n in notes), notes
    assert any("huge.jsonl" in n and "longer than" in n for n in notes), notes
    # the folder itself a link: not read
    other = tmp_path / "other"
    other.mkdir()
    (other / "fetches").symlink_to(folder)
    lc2 = LoaderCosts()
    said = lc2.update({"r2": (other, os.getuid())}, {"r2": (TRAINER, {})})
    assert lc2.snapshot() == [] and len(said) == 1 and "a link" in said[0]


def test_a_worker_written_without_its_parent_is_its_run_s_one_trainer(tmp_path: Path) -> None:
    folder = tmp_path / "fetches"
    folder.mkdir()
    gone = 4_000_000  # no such process: its parent cannot be read from /proc
    (folder / "w.jsonl").write_text(json.dumps({"pid": gone, "b": {"40": 4}}) + "\n")
    lc = LoaderCosts()
    lc.update({"r1": (tmp_path, os.getuid())}, {"r1": (123, {124: 0})})
    (got,) = lc.snapshot()
    assert (got.pid, got.rank, got.counts) == (124, 0, {40: 4})
    # with two trainers it cannot be told whose it is: skipped, said once
    lc2 = LoaderCosts()
    notes = lc2.update({"r1": (tmp_path, os.getuid())}, {"r1": (123, {124: 0, 125: 1})})
    assert lc2.snapshot() == [] and len(notes) == 1


def test_threads_part_to_gauges_and_back() -> None:
    part = {
        "n": 4,
        "s": {"fetch": 0.1, "prep": 3.0, "idle": 0.5},
        "cpu_s": 0.9,
        "wait_s": 0.5,
        "gil_s": 0.4,
        "wakes": 50,
    }
    keys = loader_threads_part(part)
    assert keys is not None and keys["gil_wakes"] == 50 and keys["loader_prep_s"] == 3.0
    series = {
        (f"stacks.{k}", "11"): Series(f"stacks.{k}", "11", [10.0], [v]) for k, v in keys.items()
    }
    assert threads_parts(series, "11") == {10.0: part}
    # garbage is no part; a part without the GIL measure (py-spy's) has none back
    assert loader_threads_part({"n": True}) is None and loader_threads_part("x") is None
    pyspy = loader_threads_part({k: v for k, v in part.items() if k not in ("gil_s", "wakes")})
    assert pyspy is not None and "gil_wait_s" not in pyspy


def test_wait_histogram_spreads_an_interval_s_waits_as_they_came() -> None:
    # 100 steps: 90 without a wait, 10 waiting 0.5 s
    counts = [0] * (len(WAIT_EDGES_S) + 1)
    for w in [0.00002] * 90 + [0.5] * 10:
        counts[wait_bucket(w)] += 1
    cols: dict[str, tuple[list[float], list[float]]] = {}
    seen = 0
    for i, edge in enumerate([*WAIT_EDGES_S, math.inf]):
        seen += counts[i]
        cols["+Inf" if math.isinf(edge) else f"{edge:.6g}"] = ([1.0, 2.0], [0.0, float(seen)])
    waits = WaitSpread(cols).waits(1.0, 2.0, 100, 5.0)
    assert waits is not None and sum(waits) == pytest.approx(5.0)
    assert sum(waits[:10]) / 5.0 > 0.99  # the wait is on a tenth of the steps
    assert WaitSpread(cols).waits(1.0, 2.0, 99, 5.0) is None  # the buckets do not hold them


def _node() -> tuple[Any, Any, int]:
    """An empty query_range answer of one node (``_Scraped``), the function that adds a
    series of 60 points a second apart to it, and that count; the node's host (4 cores at 30%)
    and its training's process tree (trainer 10, workers 11 and 12 of run r1) added."""
    from stallscope.analysis.promdata import _Scraped

    t0, n = time.time() - 60, 60
    ts = [t0 + i for i in range(n)]
    sc = _Scraped()

    def add(name: str, labels: dict[str, str], vs: list[float]) -> None:
        sc.add(
            {
                "metric": {"__name__": name, "instance": "n1:1", "job": "a", **labels},
                "values": [[t, str(v)] for t, v in zip(ts, vs)],
            }
        )

    run = {"run": "r1", "Hostname": "n1"}
    for c in range(4):
        add("stallscope_host_cpu_core_busy_ratio", {"cpu": str(c)}, [0.3] * n)
    add("stallscope_host_cpu_busy_ratio", {}, [0.3] * n)
    add("stallscope_proc_cpu_ratio", {"pid": "10", "ppid": "1", "role": "main", **run}, [0.4] * n)
    for w in ("11", "12"):
        lab = {"pid": w, "ppid": "10", "role": "worker", **run}
        add("stallscope_proc_cpu_ratio", lab, [0.3] * n)
        add("stallscope_proc_io_wait_state", lab, [0.0] * n)  # never waiting on a read
    return sc, add, n


def _scraped_node(threads: dict[str, float] | None = None) -> Any:
    """A node as Prometheus holds it after the agent exported a bursty training whose two
    workers' batch costs have a heavy tail: the query_range answer, series by series."""
    sc, add, n = _node()
    run = {"run": "r1", "Hostname": "n1"}
    # 20 steps a second: one in ten waits 0.4 s, the rest none; each step computes 50 ms
    rank = {**run, "rank": "0", "train_job": "r1"}
    steps = [20.0 * i for i in range(n)]
    waits = [2 * 0.4 * i for i in range(n)]
    add("stallscope_train_steps_total", rank, steps)
    add("stallscope_train_data_wait_seconds_total", rank, waits)
    add("stallscope_train_step_seconds_total", rank, [w + 0.05 * s for w, s in zip(waits, steps)])
    per = [0] * (len(WAIT_EDGES_S) + 1)
    per[wait_bucket(0.0)] += 18
    per[wait_bucket(0.4)] += 2
    seen = 0
    for i, edge in enumerate([*WAIT_EDGES_S, math.inf]):
        seen += per[i]
        le = "+Inf" if math.isinf(edge) else f"{edge:.6g}"
        add(
            "stallscope_train_step_data_wait_seconds_bucket",
            {**rank, "le": le},
            [seen * i for i in range(n)],
        )
    # the workers' batches: 2% of them 40x slower, growing with the run
    tail = TrainerCosts("r1", 10)
    for c in heavy_tail(2000):
        k = fetches.bucket(c)
        tail.counts[k] = tail.counts.get(k, 0) + 1
    for le, cum in tail.buckets():
        lab = {"pid": "10", "role": "main", "rank": "0", **run, "le": le}
        add("stallscope_loader_batch_seconds_bucket", lab, [cum * i / (n - 1) for i in range(n)])
    if threads is not None:
        add("stallscope_stacks_sampled_seconds", {"pid": "10", "role": "main", **rank}, [10.0] * n)
        add("stallscope_stacks_data_ratio", {"pid": "10", "role": "main", **rank}, [0.05] * n)
        add("stallscope_stacks_compute_ratio", {"pid": "10", "role": "main", **rank}, [0.95] * n)
        for key, v in threads.items():
            from stallscope.metrics import lookup

            m = lookup(f"stacks.{key}")
            assert m is not None
            add(m.prom, {"pid": "10", "role": "main", **rank}, [v] * n)
    return sc, tail


def test_head_of_line_from_prometheus_series() -> None:
    """The agent's series of a bursty training with a heavy-tailed batch cost give the same
    facts, and the same rule fires, as the run's own files would."""
    from stallscope.analysis.diagnose import diagnose
    from stallscope.analysis.promdata import PromQuery, _node_run

    sc, tail = _scraped_node()
    q = PromQuery(url="http://p:9090", since_s=120, step_s=1.0, end=time.time())
    start, end, step = q.window()
    data = _node_run(q, sc, "n1:1", start, end, step)
    assert data.batch_costs == {11: tail.counts}
    doc = diagnose(data)
    kinds = [f["kind"] for f in doc["findings"]]
    assert "input_bound.head_of_line" in kinds, doc["findings"]
    sig = doc["signals"]
    want = cost_summary([tail.counts])
    assert want is not None
    assert sig["batch_cost_p50_ms"] == want["p50_ms"] and sig["batch_cost_p99_ms"] == want["p99_ms"]
    assert sig["wait_top_share"] > 0.9, sig["wait_top_share"]


def test_gil_from_prometheus_series() -> None:
    """The loader threads' gauges read back as the records' threads part: the GIL wait per
    wake is the run's own figure, and the training thread held back by the GIL is named."""
    from stallscope.analysis.diagnose import diagnose
    from stallscope.analysis.promdata import PromQuery, _node_run

    threads = {
        "loader_threads": 4.0,
        "loader_fetch_s": 0.2,
        "loader_prep_s": 25.0,
        "loader_idle_s": 5.0,
        "loader_cpu_s": 6.0,
        "loader_wait_s": 0.3,
        "gil_wait_s": 4.0,
        "gil_wakes": 500.0,
    }
    sc, _tail = _scraped_node(threads)
    q = PromQuery(url="http://p:9090", since_s=120, step_s=1.0, end=time.time())
    data = _node_run(q, sc, "n1:1", *q.window())
    assert all(r.get("threads") for r in data.stacks)
    doc = diagnose(data)
    sig = doc["signals"]
    assert sig["thread_gil_wait_ms"] == 8.0 and sig["loader_threads"] == 4, sig
    assert "input_bound.gil" in [f["kind"] for f in doc["findings"]], doc["findings"]


def _hist_of(values: list[float]) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in values:
        out[fetches.bucket(v)] = out.get(fetches.bucket(v), 0) + 1
    return out


def test_the_timed_batches_of_the_records_go_out_and_come_back(tmp_path: Path) -> None:
    """The stacks records' wait_b / step_b (an unmodified trainer's batches, timed by its
    in-trainer sampler) are summed per trainer by the agent's stacks source, exported as two
    histograms, and read back bucket for bucket onto its records by diagnose --prometheus."""
    from stallscope.agent.trainstacks import _ThreadsTail
    from stallscope.analysis.promhist import attach_batch_times

    waits = [0.3 if i % 10 == 5 else 0.001 for i in range(200)]
    steps = [w + 0.02 for w in waits]
    tail = _ThreadsTail(tmp_path, None)
    for part in (slice(0, 120), slice(120, 200)):
        rec = {"ts": 1.0, "pid": 42, "rank": 0, "wait_b": {}, "step_b": {}}
        rec["wait_b"] = {str(k): c for k, c in _hist_of(waits[part]).items()}
        rec["step_b"] = {str(k): c for k, c in _hist_of(steps[part]).items()}
        tail._add_timed(rec)
    tail._add_timed({"ts": 2.0, "pid": 42, "wait_b": {"x": 1}, "step_b": {}})  # garbage: none
    rank, w, st = tail.timed["42"]
    assert rank == 0 and w == _hist_of(waits) and st == _hist_of(steps)
    lc = LoaderCosts()
    lc.set_timed([(TrainerCosts("r1", 42, 0, w), TrainerCosts("r1", 42, 0, st))])
    text = generate_latest(PrometheusSink([], hostname="n1", loader=lc).registry).decode()
    cols: dict[str, Any] = {"wait_b": {}, "step_b": {}}
    for ln in text.splitlines():
        for name, key in (
            ("stallscope_stacks_batch_wait_seconds_bucket{", "wait_b"),
            ("stallscope_stacks_batch_step_seconds_bucket{", "step_b"),
        ):
            if ln.startswith(name):
                assert 'pid="42"' in ln and 'rank="0"' in ln and 'run="r1"' in ln, ln
                le = ln.split('le="')[1].split('"')[0]
                cols[key][le] = ([100.0], [float(ln.rsplit(" ", 1)[1])])
    assert len(cols["wait_b"]) == len(EDGES_S) + 1
    recs: list[dict[str, Any]] = [{"ts": 100.0, "pid": 42, "s": {"data": 1.0}}]
    attach_batch_times(recs, {("r1", "42"): cols}, "r1", start=0.0, step=1.0)
    back = {k: {int(b): c for b, c in recs[0][k].items()} for k in ("wait_b", "step_b")}
    assert back == {"wait_b": w, "step_b": st}


def test_head_of_line_of_an_unmodified_trainer_from_prometheus_series() -> None:
    """No probe: the stacks' data share, the trainer's timed batches (bursts) and its workers'
    batch costs (a tail) from Prometheus give head_of_line with the spread from the counted
    batches, as the run's own files do."""
    from stallscope.analysis.diagnose import diagnose
    from stallscope.analysis.promdata import PromQuery, _node_run

    sc, add, n = _node()
    run = {"run": "r1", "Hostname": "n1"}
    add("stallscope_collector_sample_cpu_seconds", {}, [0.001] * n)  # the agent sampled
    main = {"pid": "10", "role": "main", "rank": "0", **run}
    add("stallscope_stacks_sampled_seconds", main, [1.0] * n)
    add("stallscope_stacks_data_ratio", main, [0.6] * n)
    add("stallscope_stacks_compute_ratio", main, [0.4] * n)
    # 20 batches a second: two wait 0.3 s, the rest 1 ms; the workers' costs with a tail
    waits = [0.3 if i % 10 == 5 else 0.001 for i in range(20)]
    for spec, per_s in (
        ("stallscope_stacks_batch_wait_seconds", waits),
        ("stallscope_stacks_batch_step_seconds", [w + 0.02 for w in waits]),
        ("stallscope_loader_batch_seconds", heavy_tail(20)),
    ):
        c = TrainerCosts("r1", 10, counts=_hist_of(per_s))
        for le, cum in c.buckets():
            add(f"{spec}_bucket", {**main, "le": le}, [cum * i for i in range(n)])
    q = PromQuery(url="http://p:9090", since_s=120, step_s=1.0, end=time.time())
    data = _node_run(q, sc, "n1:1", *q.window())
    doc = diagnose(data)
    sig = doc["signals"]
    assert sig["stall_source"] == "stacks" and sig["step_timing_source"] == "counted_batches"
    assert sig["wait_top_share"] > 0.9, sig
    assert doc["findings"][0]["kind"] == "input_bound.head_of_line", doc["findings"][0]["summary"]
