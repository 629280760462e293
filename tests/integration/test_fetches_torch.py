"""Each batch's cost timed inside real DataLoader workers (sources/stacks/fetches.py): forked
workers inherit the timed fetchers, spawned ones time theirs under `stallscope run` (its
sampler, started in each interpreter, installs the timing as the worker imports the
DataLoader), each writes its histogram as it leaves, and every batch of every epoch is counted
once, by the worker that made it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import stallscope_argv

from stallscope.sources.stacks.fetches import cost_summary, read_histograms

pytest.importorskip("torch")

SCRIPT = """
import os, sys, time
import torch.utils.data as tud
from stallscope.sources.stacks import fetches

class Slow(tud.Dataset):
    def __len__(self):
        return 40
    def __getitem__(self, i):
        time.sleep(0.04 if i % 20 == 0 else 0.002)  # two slow samples an epoch
        return i

assert fetches.install()
loader = tud.DataLoader(Slow(), batch_size=4, num_workers=2, persistent_workers=False)
for epoch in range(2):
    for batch in loader:
        pass
print(os.getpid())
"""


def test_every_batch_of_every_epoch_is_timed_by_its_worker(tmp_path: Path) -> None:
    env = {**os.environ, "STALLSCOPE_RUN_DIR": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    main = int(r.stdout.split()[-1])
    hists = read_histograms(tmp_path)
    # two workers an epoch, started again each epoch: four processes, none the trainer
    assert len(hists) == 4 and main not in hists, hists
    assert sum(sum(h.values()) for h in hists.values()) == 20  # 10 batches x 2 epochs
    got = cost_summary(hists.values())
    assert got is not None
    # 2 batches of 10 an epoch hold a 40-ms sample: the 99th percentile is theirs
    assert got["p50_ms"] < 20 and got["p99_ms"] >= 40, got


SPAWNED = """
import os, sys, time
import torch.utils.data as tud

class Slow(tud.Dataset):
    def __len__(self):
        return 40
    def __getitem__(self, i):
        time.sleep(0.04 if i % 20 == 0 else 0.002)
        return i

if __name__ == "__main__":
    loader = tud.DataLoader(
        Slow(), batch_size=4, num_workers=2, persistent_workers=False,
        multiprocessing_context="spawn",
    )
    for epoch in range(2):
        for batch in loader:
            time.sleep(0.01)
"""


@pytest.mark.slow
def test_spawned_workers_time_every_batch_under_run(tmp_path: Path) -> None:
    """Workers started with ``spawn`` (a fresh interpreter each, nothing inherited), the
    trainer unmodified under ``stallscope run``: each of the 4 (2 an epoch) times its batches,
    all 20 of them."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    out = tmp_path / "runs"
    r = subprocess.run(
        stallscope_argv("run", "--quiet", "--out", str(out), "--", sys.executable, str(script)),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    [run] = list(out.iterdir())
    hists = read_histograms(run)
    assert len(hists) == 4, hists
    assert sum(sum(h.values()) for h in hists.values()) == 20
