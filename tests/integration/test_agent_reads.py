"""What the agent reads on users' behalf (issue 50): run indexes and run folders that other users
control. An index that is a FIFO or a link to /dev/zero never stops nor grows the agent; a root
agent reads a run's files only as the user who listed them (files of theirs, never a link), so
nobody makes it read a file they could not read themselves (docs/agent.md, "What the agent
reads, and as whom")."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import terminate
from test_agent import start_agent
from test_agent_steps import add_steps, make_run

from stallscope.agent.steps import StepFollower, runs_of_indexes
from stallscope.agent.trainstacks import TrainerStacks
from stallscope.sources.stacks.aggregate import append_record

NOBODY = 65534


def _scrape(url: str) -> tuple[float, str]:
    t0 = time.monotonic()
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        body = r.read().decode()
    return time.monotonic() - t0, body


def test_an_index_that_is_a_fifo_or_dev_zero_never_stops_the_agent(tmp_path: Path) -> None:
    """Before: a FIFO index blocked the agent's scan for ever (no /metrics); a link to /dev/zero
    grew it to 4.9 GB in 6 s. Now both are skipped (not regular files) and a good index beside
    them is followed."""
    homes = tmp_path / "home"
    for user in ("fifo", "zero", "good"):
        (homes / user).mkdir(parents=True)
    os.mkfifo(homes / "fifo" / "runs.txt")
    (homes / "zero" / "runs.txt").symlink_to("/dev/zero")
    run = make_run(tmp_path / "good-runs")
    add_steps(run, 0, 0, 9, 0.1, 0.3)
    (homes / "good" / "runs.txt").write_text(f"{run}\n")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'run_indexes = ["{homes}/*/runs.txt"]\n')
    agent = start_agent(tmp_path, "--config", str(cfg))
    try:
        proc = psutil.Process(agent.proc.pid)
        for _ in range(8):
            took, body = _scrape(agent.url)
            assert took < 1.0, took
            time.sleep(0.25)
        assert f'run="{run.name}"' in body and "stallscope_train_steps_total{" in body, body[-800:]
        assert proc.memory_info().rss < 400 << 20, proc.memory_info().rss
    finally:
        terminate(agent.proc)


@pytest.mark.root
def test_a_root_agent_reads_a_users_runs_only_as_that_user(tmp_path: Path) -> None:
    """A user (uid 65534 here) lists in their index: their own run (followed); a run folder of
    another user (root); a link to that folder; a folder of theirs whose meta.json, run.db and
    stacks files are links to root's files. Only their own run is read."""
    if os.geteuid() != 0:
        pytest.skip("files of another user need root to make")
    os.chmod(tmp_path, 0o755)
    secret = make_run(tmp_path / "root-runs")  # root's run: not the user's to show
    add_steps(secret, 0, 0, 50, 0.5, 0.5)
    append_record(
        secret / "stacks",
        {
            "ts": time.time(),
            "pid": 77,
            "rank": 0,
            "sampler": "inproc",
            "n": 50,
            "rate_hz": 50,
            "s": {"data": 0.5, "compute": 0.5},
        },
    )
    home = tmp_path / "alice"
    home.mkdir()
    own = make_run(home / "runs")
    add_steps(own, 0, 0, 4, 0.1, 0.1)
    append_record(
        own / "stacks",
        {
            "ts": time.time(),
            "pid": 78,
            "rank": 0,
            "sampler": "inproc",
            "n": 50,
            "rate_hz": 50,
            "s": {"data": 0.2, "compute": 0.8},
        },
    )
    linked = home / "runs" / "linked"
    linked.symlink_to(secret)
    forged = home / "runs" / "forged"
    forged.mkdir()
    for name in ("meta.json", "run.db"):
        (forged / name).symlink_to(secret / name)
    stolen_stacks = own.parent / "stolen"
    stolen_stacks.mkdir()
    (stolen_stacks / "meta.json").write_bytes((own / "meta.json").read_bytes())
    add_steps(stolen_stacks, 0, 0, 2, 0.1, 0.1)
    (stolen_stacks / "stacks").mkdir()
    (stolen_stacks / "stacks" / "77.jsonl").symlink_to(secret / "stacks" / "77.jsonl")
    index = home / "runs.txt"
    index.write_text("".join(f"{p}\n" for p in (own, secret, linked, forged, stolen_stacks)))
    for dirpath, dirnames, filenames in os.walk(home):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, NOBODY, NOBODY)

    follower = StepFollower(runs_of_indexes([str(index)]), rescan_s=0)
    try:
        totals = follower.poll()
        assert set(totals) == {own.name, stolen_stacks.name}, totals
        assert totals[own.name][0].steps == 4
        stacks = TrainerStacks(follower).sample(time.time())
        assert set(stacks) == {"78"}, stacks  # root's pid 77 never read through the link
    finally:
        follower.close()
    # the same index when it is itself a link (to root's own index-like file): not read
    link_index = tmp_path / "bob-runs.txt"
    (tmp_path / "root-index.txt").write_text(f"{secret}\n")
    link_index.symlink_to(tmp_path / "root-index.txt")
    os.lchown(link_index, NOBODY, NOBODY)
    follower = StepFollower(runs_of_indexes([str(link_index)]), rescan_s=0)
    try:
        assert secret.name not in follower.poll()
    finally:
        follower.close()
