"""Per-rank diagnosis on a real DDP run: two ranks under `torchrun` (gloo, CPU), rank 1's
input pipeline slow. The all-reduce makes both ranks' steps equally long; the diagnosis must
still name rank 1, with rank 1's own figures, not an average of the two."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, stallscope_argv

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.torchrun, pytest.mark.exclusive]


def test_a_slow_rank_is_named_with_its_own_evidence(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.fail("torchrun is not installed beside this Python (it comes with torch)")
    out = tmp_path / "runs"
    r = subprocess.run(stallscope_argv("run", "--interval", "1", "--out", str(out), "--",
                                       str(torchrun), "--nproc-per-node", "2",
                                       str(ROOT / "examples" / "train_ddp.py"),
                                       "--slow-rank", "1", "--max-seconds", "12",
                                       "--data-dir", str(tmp_path / "data")),
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    own = {int(m.group(1)): float(m.group(2))
           for m in re.finditer(r"rank (\d+): data wait: ([0-9.]+) of", r.stdout)}
    assert set(own) == {0, 1}, r.stdout
    [run_dir] = list(out.iterdir())
    d = subprocess.run(stallscope_argv("diagnose", str(run_dir), "--json"), capture_output=True,
                       text=True, timeout=120, check=True)
    doc = json.loads(d.stdout)
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
