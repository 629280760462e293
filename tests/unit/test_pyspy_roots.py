"""The py-spy sampler reads its targets' /proc entries under the root it is given: a fake tree
in ``tmp_path``, no process started (nothing here runs py-spy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.errors import SourceUnavailable
from stallscope.sources.stacks.pyspy import PySpySampler


def test_the_rank_and_the_memory_check_read_the_given_proc_root(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "901").mkdir(parents=True)
    (proc / "901" / "environ").write_bytes(b"PATH=/bin\0SLURM_PROCID=3\0")
    (proc / "901" / "mem").write_bytes(b"")
    sampler = PySpySampler(tmp_path / "stacks", [901, 902], proc_root=str(proc))
    assert sampler._tallies[901].rank == 3  # from the fake environ, not the machine's /proc
    assert sampler._tallies[902].rank is None  # no such entry there
    sampler.exe = sampler.exe or "py-spy"  # get past "not installed": only the check is tested
    with pytest.raises(SourceUnavailable, match="no such process"):
        sampler.check(902)
