"""Per-rank diagnosis on real DDP runs: two ranks under `torchrun` (gloo, CPU), rank 1 slowed in
three ways: a starving input pipeline, a heavier forward pass, a CPU quota on its process (a
real cgroup). The all-reduce makes both ranks' steps equally long; the diagnosis must still name
rank 1, with rank 1's own figures and its cause, and say that rank 0 waits for it in the
collective (the probe's communication time, sources/comm.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    cli_json,
    demo_dataset,
    rediagnosed,
    stallscope_argv,
    training_finding,
)

from stallscope.analysis.facts.build import OTHERS_BUSY_CORES, RUNQ_BUSY_PCT

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.torchrun, pytest.mark.exclusive]


STARVED_GAP = 0.05  #: the starved-rank scenario's peer-wait gap floor (measured: see the test)


def ddp_data() -> Path:
    """examples/train_ddp.py's dataset (2000 files of 64 px, 10 classes: its defaults, written
    by train_cpu.py's make_files on rank 0), made once per pytest process: each run wrote its
    own while the other ranks waited at a barrier."""
    return demo_dataset(2000, 64, 10)


def test_a_slow_rank_is_named_with_its_own_evidence(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.fail("torchrun is not installed beside this Python (it comes with torch)")
    out = tmp_path / "runs"
    r = subprocess.run(
        stallscope_argv(
            "run",
            "--interval",
            "1",
            "--out",
            str(out),
            "--",
            str(torchrun),
            "--nproc-per-node",
            "2",
            str(ROOT / "examples" / "train_ddp.py"),
            "--slow-rank",
            "1",
            "--max-seconds",
            "6",
            "--data-dir",
            str(ddp_data()),
        ),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    own = {
        int(m.group(1)): float(m.group(2)) / 100
        for m in re.finditer(r"rank (\d+): data wait: ([0-9.]+)% of", r.stdout)
    }
    assert set(own) == {0, 1}, r.stdout
    [run_dir] = list(out.iterdir())
    doc = cli_json("diagnose", str(run_dir), "--json")
    ranks = {x["rank"]: x for x in doc["ranks"]}
    assert set(ranks) == {0, 1}
    for rank, share in own.items():  # each rank's figure is its own
        assert abs(ranks[rank]["stall_fraction"] - share) <= 0.1, (rank, ranks[rank], share)
        assert ranks[rank]["workers"] == 1
    kinds = [f["kind"] for f in doc["findings"]]
    assert "straggler_rank" in kinds, kinds
    strag = next(f for f in doc["findings"] if f["kind"] == "straggler_rank")
    assert strag["evidence"]["rank"] == 1 and strag["evidence"]["best_rank"] == 0
    assert "Rank 1 holds the job back" in strag["summary"]
    assert any(f["action"].startswith("on rank 1:") for f in strag["fixes"])
    # the run's stall is the slow rank's, not the mean of a starved and a fed rank
    assert abs(doc["stall_fraction"] - own[1]) <= 0.1
    assert doc["verdict"] in ("input_bound.prep", "straggler_rank")
    top = doc["findings"][0]
    if top["kind"] == "input_bound.prep":
        assert top["evidence"]["rank"] == 1 and "rank 1" in top["summary"]
    # rank 0 waits in the all-reduce for rank 1's data: its communication wait, not compute.
    # Rank 1's prep takes a whole core of the two, so rank 0 computes beside the loaders and
    # is now and then slowed enough that rank 1 waits for it too: 15 runs measured gaps of
    # 0.40-0.55, two others 0.06 (probe) and 0.12 (stacks, CI). The rule's own claim
    # (rank 0 listed as waiting) holds in all; the gap is held to 0.05 here.
    assert_peer_waits(doc, slow=1, fast=0, gap=STARVED_GAP)
    # without the probe: the stacks say rank 1 starves and rank 0 waits in the collective
    doc["run"] = str(run_dir)
    bare = without_probe(doc)
    assert bare["signals"]["focus_rank"] == 1, bare["ranks"]
    assert bare["verdict"] in ("input_bound.prep", "straggler_rank"), bare["findings"][0]
    assert_peer_waits(bare, slow=1, fast=0, gap=STARVED_GAP)


def assert_peer_waits(doc: dict[str, Any], slow: int, fast: int, gap: float = 0.15) -> None:
    """The rule's claim (`waiting_for_peers` lists ``fast``, at ≥ COMM_GAP of its step) and the
    test's own: ``fast`` waits in collectives ``gap`` more of its step than ``slow``."""
    ranks = {x["rank"]: x for x in doc["ranks"]}
    assert ranks[fast]["comm_share"] - ranks[slow]["comm_share"] >= gap, ranks
    peers = [f for f in doc["findings"] if f["kind"] == "waiting_for_peers"]
    assert len(peers) == 1, [f["kind"] for f in doc["findings"]]
    assert peers[0]["evidence"]["rank"] == slow
    assert peers[0]["evidence"]["waiting_ranks"] == [fast]
    assert f"Rank {fast} waits for rank {slow} in the all-reduce" in peers[0]["summary"]


def without_probe(doc: dict[str, Any]) -> dict[str, Any]:
    """The same run diagnosed from what a trainer without the probe leaves: its sampled stacks
    (stallscope run samples every trainer's stacks; the probe's steps are set aside)."""
    out = rediagnosed(doc, stacks=True)
    assert out["stall_source"] == "stacks", out["stall_source"]
    out["said"] = doc.get("said")
    return out


def ddp_run(tmp_path: Path, *args: str, during: Any = None, ranks: int = 2) -> dict[str, Any]:
    """``ranks`` ranks of examples/train_ddp.py under `stallscope run` + torchrun; its
    diagnosis."""
    torchrun = Path(sys.executable).with_name("torchrun")
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "runs"
    proc = subprocess.Popen(
        stallscope_argv(
            "run",
            "--interval",
            "1",
            "--out",
            str(out),
            "--",
            str(torchrun),
            "--nproc-per-node",
            str(ranks),
            str(ROOT / "examples" / "train_ddp.py"),
            "--data-dir",
            str(ddp_data()),
            *args,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    side = threading.Thread(target=during, daemon=True) if during is not None else None
    if side is not None:
        side.start()
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    [run_dir] = list(out.iterdir())
    doc: dict[str, Any] = cli_json("diagnose", str(run_dir), "--json")
    # what stallscope said on the trainers' stderr (a stack sampler that stopped says why)
    doc["said"] = [ln for ln in err.splitlines() if ln.startswith("stallscope:")][-10:]
    return doc


HEAVY = ("--heavy-rank", "1", "--heavy-extra", "4")


def test_a_rank_that_computes_more_is_the_straggler_by_compute(tmp_path: Path) -> None:
    """Rank 1 runs four extra forward passes per step: no data wait anywhere, equal step times,
    and yet rank 0 waits for rank 1 in the all-reduce; the cause is rank 1's compute. (With two
    extra passes rank 1 computed only 1.2-1.7x rank 0 on this 2-core box, where rank 0 shares
    its core with the loader workers: the peers' gap fell to 0.14 in 1 of 5 runs. With four,
    2.0-3.9x and gaps of 0.43-0.69 over 4 runs.)"""
    doc = ddp_run(tmp_path / "probe", *HEAVY, "--max-seconds", "6")
    strag = straggler_unless_busy(doc)
    if strag is not None:
        ev = strag["evidence"]
        assert ev["rank"] == 1 and ev["cause"] == "compute", ev
        assert ev["compute_ms_median"] >= 1.3 * ev["peers_compute_ms_median"], ev
        said = "Rank 1 holds the job back: rank 0 waits for it in the all-reduce"
        assert said in strag["summary"], strag["summary"]
        assert_peer_waits(doc, slow=1, fast=0)
    # a trainer without the probe: stallscope run's stack sampler installs the same timing
    # once the process group exists, and the all-reduce wait moves from compute to comm
    bare = ddp_run(tmp_path / "bare", *HEAVY, "--max-seconds", "8", "--no-probe")
    assert bare["stall_source"] == "stacks" and not bare["signals"].get("steps")
    strag = straggler_unless_busy(bare)
    if strag is not None:
        assert strag["evidence"]["rank"] == 1 and strag["evidence"]["cause"] == "compute", strag
        assert_peer_waits(bare, slow=1, fast=0)


def test_four_ranks_wait_for_the_one_that_computes_more(tmp_path: Path) -> None:
    """Four ranks on this 2-core box, rank 3 with three extra forward passes per step: rank 3
    is the straggler by compute, and the other three wait for it in the all-reduce (measured
    with two extra passes: all-reduce shares 0.28-0.51 on ranks 0-2, 0.12-0.20 on rank 3 over
    11 runs, but twice in the full suite on 2026-11-28 ranks 0-2 at 0.24-0.31 and rank 3 at
    0.14-0.16, a mean gap of 0.118; with three: 0.30-0.43 and 0.055-0.09 over 3 runs)."""
    doc = ddp_run(
        tmp_path, "--heavy-rank", "3", "--heavy-extra", "3", "--max-seconds", "6", ranks=4
    )
    ev = straggler_finding(doc)["evidence"]
    assert ev["rank"] == 3 and ev["cause"] == "compute", ev
    shares = {x["rank"]: x["comm_share"] for x in doc["ranks"]}
    assert set(shares) == {0, 1, 2, 3}, doc["ranks"]
    # each waiting rank waits longer than the straggler, and together by a clear gap. Four ranks
    # share 2 cores, so a waiting rank's own compute stretches too and one of them may wait
    # little more than rank 3: over 11 runs the least single gap was 0.11 and the least mean
    # gap 0.17 (CI's failed run of the former ≥ 0.15-each check: 0.12 and 0.21)
    gaps = [shares[r] - shares[3] for r in (0, 1, 2)]
    assert min(gaps) >= 0.05 and sum(gaps) / 3 >= 0.12, shares
    [peers] = [f for f in doc["findings"] if f["kind"] == "waiting_for_peers"]
    assert peers["evidence"]["rank"] == 3 and peers["evidence"]["waiting_ranks"] == [0, 1, 2]


def kinds(doc: dict[str, Any]) -> list[str]:
    return [f["kind"] for f in doc["findings"]]


def assert_busy_host(doc: dict[str, Any]) -> None:
    """The run's measurements show a host short of CPU: every rank waited for a core ≥ 20% of
    the time while other processes kept ≥ 0.5 core busy (`cpu_contention`'s own rule)."""
    detail = doc["signals"].get("ranks_detail", [])
    assert detail and all((r.get("runq_wait_pct") or 0) >= RUNQ_BUSY_PCT for r in detail), detail
    assert doc["signals"]["others_cpu_cores"] >= OTHERS_BUSY_CORES, doc["signals"]


def straggler_finding(doc: dict[str, Any], *context: Any) -> dict[str, Any]:
    """The straggler_rank finding: the verdict, or second to `cpu_contention` on a host whose
    measurements show it busy (a CPU hog beside the suite): both are then real, and the busy
    host's larger estimated gain puts it first (`training_finding`). A failure carries what the
    run measured per rank and how busy the host was."""
    found = training_finding(doc)
    assert found["kind"] == "straggler_rank", (kinds(doc), measured(doc), *context)
    return found


def measured(doc: dict[str, Any]) -> dict[str, Any]:
    """Per rank (comm share, compute share, run-queue wait %), the CPU other processes used and
    the stack samples and whose they are, what stallscope said on stderr: what a failed straggler
    check needs to be understood."""
    sig = doc["signals"]
    return {
        "ranks": [
            (r.get("rank"), r.get("comm_share"), r.get("compute_share"), r.get("runq_wait_pct"))
            for r in sig.get("ranks_detail", [])
        ],
        "others_cpu_cores": sig.get("others_cpu_cores"),
        "stack_samples": sig.get("stack_samples"),
        "stack_pids": sorted({str(p.stem) for p in (Path(doc["run"]) / "stacks").glob("*.jsonl")})
        if doc.get("run")
        else None,
        "said": doc.get("said"),
    }


def straggler_unless_busy(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The straggler_rank finding, or None on a host the run itself measured busy: there the
    waiting rank's core goes to another process, its wait in the all-reduce shrinks, and no
    straggler can be told (a CPU hog beside the suite measured both ranks 23-30% in the run
    queue). Then, and only on that evidence, the verdict must be `cpu_contention`, saying so."""
    if doc["verdict"] == "cpu_contention" and "straggler_rank" not in kinds(doc):
        assert_busy_host(doc)
        assert "cannot show which rank the others wait for" in doc["findings"][0]["summary"], (
            doc["findings"][0]["summary"],
            measured(doc),
        )
        return None
    return straggler_finding(doc)


CPU_V1 = Path("/sys/fs/cgroup/cpu")


def test_a_rank_under_a_cpu_quota_is_the_straggler_short_of_cpu(tmp_path: Path) -> None:
    """Rank 1's process is moved into a real cgroup with a CPU quota of 0.3 cores once it
    starts: it is the straggler, short of CPU (its run-queue wait), and rank 0 waits for it."""
    if os.geteuid() != 0 or not (CPU_V1 / "cgroup.procs").exists():
        pytest.skip("a CPU quota on one process needs root and a cgroup v1 cpu hierarchy")
    cg = CPU_V1 / f"stallscope-test-quota-{os.getpid()}"
    cg.mkdir()
    (cg / "cpu.cfs_period_us").write_text("100000")
    (cg / "cpu.cfs_quota_us").write_text("30000")
    moved: list[int] = []

    def quota_rank_1() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not moved:
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"train_ddp.py" in cmd and b"torchrun" not in cmd and b"RANK=1" in env:
                    (cg / "cgroup.procs").write_text(str(pid))
                    moved.append(pid)
                    return
            time.sleep(0.1)

    try:
        doc = ddp_run(tmp_path, "--max-seconds", "6", during=quota_rank_1)
    finally:
        for pid in (cg / "cgroup.procs").read_text().split():
            (CPU_V1 / "cgroup.procs").write_text(pid)
        cg.rmdir()
    assert moved, "rank 1 never started"
    ev = straggler_finding(doc)["evidence"]
    assert ev["rank"] == 1 and ev["cause"] == "cpu", ev
    assert ev["runq_wait_pct"] >= 20 + ev["peers_runq_wait_pct"], ev
    assert_peer_waits(doc, slow=1, fast=0)
    bare = without_probe(doc)  # the same run from its stacks alone
    ev = straggler_finding(bare)["evidence"]
    assert ev["rank"] == 1 and ev["cause"] == "cpu", ev
    assert_peer_waits(bare, slow=1, fast=0)
