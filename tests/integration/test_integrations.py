"""Framework callbacks (stallscope.integrations) against the real PyTorch Lightning and Hugging Face
Trainer, on the CPU: one line of user code gives the same step records as ``watch()``."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stallscope import probe as probe_mod
from stallscope.integrations import StepHooks, safe_hook
from stallscope.store import RunStore, StepRow, new_run_dir

pytest.importorskip("torch")
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

LOAD_S = 0.002  # per sample, in the main process (num_workers=0): shows as data wait
STEP_S = 0.04  # per training step: shows as host time


@pytest.fixture()
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for k in ("STALLSCOPE_OUT", "STALLSCOPE_PROBE", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    d = new_run_dir(tmp_path / "runs", "test")
    RunStore(d / "run.db").close()
    monkeypatch.setenv("STALLSCOPE_RUN_DIR", str(d))
    yield d
    probe_mod.reset()


def finish(run_dir: Path) -> tuple[list[StepRow], list[dict[str, Any]]]:
    probe_mod.reset()  # closes the probe: everything is written
    store = RunStore(run_dir / "run.db", readonly=True)
    try:
        return store.steps(), store.probes()
    finally:
        store.close()


class SlowData(Dataset[Any]):
    def __init__(self, n: int, as_dict: bool) -> None:
        self.n = n
        self.as_dict = as_dict

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(LOAD_S)
        x = torch.full((4,), float(i % 3))
        y = torch.tensor(i % 2)
        return {"x": x, "labels": y} if self.as_dict else (x, y)


def check_steps(steps: list[StepRow], n: int, batch: int, epochs: int) -> None:
    assert len(steps) == n * epochs
    assert [s.step for s in steps] == list(range(n * epochs))
    assert {s.epoch for s in steps} == set(range(epochs))
    assert all(s.samples == batch for s in steps)
    waits = [s.wait_s for s in steps]
    hosts = [s.host_s for s in steps]
    # the batches were loaded in the gaps before the steps; the frameworks fetch one batch ahead
    # (Lightning's prefetcher, accelerate's DataLoaderShard), so a load may show one step early
    assert sum(waits) >= len(steps) * batch * LOAD_S * 0.9
    assert statistics.median(waits) >= batch * LOAD_S * 0.9
    assert statistics.median(waits) < STEP_S  # ... and the step's own work is not in the wait
    assert min(hosts) >= STEP_S * 0.95  # host time holds the step (plus framework overhead,
    assert statistics.median(hosts) < STEP_S + 0.5  # which a loaded CI box makes vary)


# --- PyTorch Lightning ---------------------------------------------------------------------------
def lightning_tiny(pl: Any) -> Any:
    """A linear model whose training step takes STEP_S (the host time the callbacks time)."""

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(STEP_S)
            x, y = batch
            return nn.functional.cross_entropy(self.lin(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny()


def test_lightning_callback(run_dir: Path) -> None:
    pl: Any = pytest.importorskip("lightning.pytorch")
    from stallscope.integrations.lightning import StallscopeCallback

    loader = DataLoader(SlowData(24, as_dict=False), batch_size=4, num_workers=0)
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StallscopeCallback()],
    )
    trainer.fit(lightning_tiny(pl), loader)
    steps, probes = finish(run_dir)
    check_steps(steps, n=6, batch=4, epochs=2)
    (p,) = probes
    assert p["rank"] == 0 and p["steps"] == 12
    cfg = p["config"]["loader"]
    assert cfg["num_workers"] == 0 and cfg["batch_size"] == 4 and cfg["dataset_len"] == 24
    assert cfg["dataset_type"].endswith("SlowData")


# --- Hugging Face transformers -------------------------------------------------------------------
class HFTiny(nn.Module):
    """A linear model in the Trainer's shape (a dict with the loss) whose step takes STEP_S."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        time.sleep(STEP_S)
        logits = self.lin(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_hf_trainer_callback(run_dir: Path, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from stallscope.integrations.hf import StallscopeCallback

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        per_device_train_batch_size=4,
        num_train_epochs=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        learning_rate=0.1,
    )
    trainer = transformers.Trainer(
        model=HFTiny(),
        args=args,
        train_dataset=SlowData(24, as_dict=True),
        callbacks=[StallscopeCallback()],
    )
    trainer.train()
    steps, probes = finish(run_dir)
    check_steps(steps, n=6, batch=4, epochs=2)
    (p,) = probes
    cfg = p["config"]["loader"]
    assert cfg["num_workers"] == 0 and cfg["dataset_len"] == 24


# --- the probe's figures in the framework's own logger --------------------------------------------
@pytest.fixture()
def offline_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """W&B in offline mode, writing under tmp_path/wandb only (nothing leaves the machine). W&B
    reads its settings once per process: torn down before and after, so each test gets its own."""
    wandb = pytest.importorskip("wandb")
    d = tmp_path / "wandb"
    d.mkdir()
    for k, v in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(d),
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(d / "config"),
        "WANDB_CACHE_DIR": str(d / "cache"),
        "WANDB_PROJECT": "stallscope-test",
    }.items():
        monkeypatch.setenv(k, v)
    wandb.teardown()
    yield d
    wandb.finish()
    wandb.teardown()


def test_lightning_logs_the_data_wait_share_through_its_logger(
    run_dir: Path, tmp_path: Path, offline_wandb: Path
) -> None:
    """With a real CSVLogger, TensorBoardLogger and an offline WandbLogger: at every
    log_every_n_steps, stallscope/data_wait_share and stallscope/step_ms of the steps since the
    last log, as the probe measured them; read back from the CSV, from TensorBoard's event files
    with TensorBoard's reader, and from W&B's offline record log."""
    import csv

    pl: Any = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
    from logreaders import tb_scalars, wandb_history

    from stallscope.integrations.lightning import StallscopeCallback

    wandb_dir = offline_wandb
    loader = DataLoader(SlowData(24, as_dict=False), batch_size=4, num_workers=0)
    logger = CSVLogger(str(tmp_path / "logs"), name="t")
    tb = TensorBoardLogger(str(tmp_path / "tb"), name="t")
    wb = WandbLogger(offline=True, save_dir=str(wandb_dir))
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=[logger, tb, wb],
        log_every_n_steps=3,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StallscopeCallback()],
    )
    trainer.fit(lightning_tiny(pl), loader)
    wb.experiment.finish()
    steps, _ = finish(run_dir)
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    shares = [
        float(r["stallscope/data_wait_share"]) for r in rows if r.get("stallscope/data_wait_share")
    ]
    assert len(shares) == 4, rows  # batches 3 and 6 of each epoch
    measured = sum(s.wait_s for s in steps) / sum(s.wait_s + s.host_s for s in steps)
    assert abs(statistics.mean(shares) - measured) < 0.1, (shares, measured)
    step_ms = [float(r["stallscope/step_ms"]) for r in rows if r.get("stallscope/step_ms")]
    assert all(ms >= STEP_S * 1000 for ms in step_ms), step_ms

    scalars = tb_scalars(tmp_path / "tb")
    assert scalars["stallscope/data_wait_share"] == pytest.approx(shares), scalars
    assert scalars["stallscope/step_ms"] == pytest.approx(step_ms), scalars
    history = [r for r in wandb_history(wandb_dir) if "stallscope/data_wait_share" in r]
    assert [r["stallscope/data_wait_share"] for r in history] == pytest.approx(shares), history


def test_hf_logs_reach_the_reporting_callbacks(
    run_dir: Path, tmp_path: Path, offline_wandb: Path
) -> None:
    """The Trainer's logs at each logging step carry stallscope/data_wait_share, also for the
    callbacks that `report_to` puts before stallscope's (TensorBoard's and W&B's here, real and
    offline): the stallscope callback moves itself first. Read back from TensorBoard's event
    files with TensorBoard's reader and from W&B's offline record log."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    pytest.importorskip("tensorboard")
    from logreaders import tb_scalars, wandb_history

    from stallscope.integrations.hf import StallscopeCallback

    wandb_dir = offline_wandb
    out_dir = tmp_path / "hf"  # TensorBoard's event files go under it by default
    args = transformers.TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=4,
        num_train_epochs=2,
        report_to=["tensorboard", "wandb"],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=3,
        dataloader_num_workers=0,
        disable_tqdm=True,
        learning_rate=0.1,
    )
    trainer = transformers.Trainer(
        model=HFTiny(),
        args=args,
        train_dataset=SlowData(24, as_dict=True),
        callbacks=[StallscopeCallback()],
    )
    names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert names.index("TensorBoardCallback") < names.index("StallscopeCallback"), names
    trainer.train()
    import wandb

    wandb.finish()
    finish(run_dir)
    scalars = tb_scalars(out_dir)
    shares = scalars.get("train/stallscope/data_wait_share", [])
    assert len(shares) == 4 and all(0 < x < 1 for x in shares), scalars
    assert len(scalars["train/stallscope/step_ms"]) == 4, scalars
    assert all(ms >= STEP_S * 1000 for ms in scalars["train/stallscope/step_ms"]), scalars
    history = [r for r in wandb_history(wandb_dir) if "train/stallscope/data_wait_share" in r]
    assert [r["train/stallscope/data_wait_share"] for r in history] == pytest.approx(shares)


# --- framework-free pieces -----------------------------------------------------------------------
def test_step_hooks_exclude_announced_work_from_data_wait(run_dir: Path) -> None:
    hooks = StepHooks()
    hooks.start(0)
    hooks.begin_epoch([1, 2, 3])
    for i in range(4):
        time.sleep(0.03 if i == 2 else 0.0)  # evaluation the framework announces ...
        if i == 2:
            hooks.idle()  # ... so it is not data wait
        time.sleep(0.005)  # fetching the batch: data wait
        hooks.begin_step(8)
        time.sleep(0.01)
        hooks.end_step()
    hooks.finish()
    steps, _ = finish(run_dir)
    assert len(steps) == 4 and all(s.samples == 8 and s.epoch == 0 for s in steps)
    assert 0.0045 <= steps[2].wait_s < 0.03  # the 30 ms evaluation is left out (5 + 30 ms)
    assert all(s.host_s >= 0.0095 for s in steps)


def test_failing_hook_is_said_once_and_training_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    class Cb:
        _broken = False
        calls = 0

        @safe_hook
        def on_step(self) -> None:
            self.calls += 1
            raise RuntimeError("odd trainer")

    cb = Cb()
    for _ in range(3):
        cb.on_step()
    assert cb.calls == 1 and cb._broken
    assert capsys.readouterr().err.count("odd trainer") == 1


# --- autotune through the callbacks --------------------------------------------------------------
class PidData(SlowData):
    """SlowData that notes which process loaded each sample (one line per sample)."""

    def __init__(self, n: int, as_dict: bool, log: Path) -> None:
        super().__init__(n, as_dict)
        self.log = log

    def __getitem__(self, i: int) -> Any:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return super().__getitem__(i)


def _loaded_by_workers(log: Path) -> int:
    """Samples loaded in another process than this one (DataLoader workers)."""
    return sum(1 for line in log.read_text().split() if int(line) != os.getpid())


def _autotune_of(probes: list[dict[str, Any]]) -> dict[str, Any]:
    (p,) = probes
    at = p["config"].get("autotune")
    assert isinstance(at, dict), p["config"].keys()
    return at


def test_lightning_callback_autotunes_the_loader_between_epochs(run_dir: Path) -> None:
    """A loader at num_workers=0 whose batches take 8 ms to load in the trainer: after the
    first epoch the callback gives it a worker, and the next epochs run with it."""
    pl: Any = pytest.importorskip("lightning.pytorch")
    from stallscope.integrations.lightning import StallscopeCallback

    log = run_dir / "pids.txt"
    loader = DataLoader(PidData(40, as_dict=False, log=log), batch_size=4, num_workers=0)
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StallscopeCallback(autotune=True)],
    )
    trainer.fit(lightning_tiny(pl), loader)
    steps, probes = finish(run_dir)
    assert len(steps) == 30
    at = _autotune_of(probes)
    first = at["changes"][0]
    assert first["from"]["num_workers"] == 0 and first["config"]["num_workers"] >= 1
    assert first["epoch"] == 1
    assert [t["num_workers"] for t in at["trials"]][:2] == [0, first["config"]["num_workers"]]
    # and the workers really loaded: the epochs after the first were loaded in other processes
    assert _loaded_by_workers(log) >= 40, at["trials"]
    # the user's own loader object, changed in place: it holds the last change applied (with a
    # CPU hog beside the suite the worker epoch once measured slower and the tuner went back to
    # num_workers=0, rightly: `decide` returns to the best measured configuration)
    assert loader.num_workers == at["changes"][-1]["config"]["num_workers"], at["changes"]


def test_hf_callback_autotunes_the_loader_between_epochs(run_dir: Path, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from stallscope.integrations.hf import StallscopeCallback

    log = tmp_path / "pids.txt"
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        per_device_train_batch_size=4,
        num_train_epochs=3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        learning_rate=0.1,
    )
    trainer = transformers.Trainer(
        model=HFTiny(),
        args=args,
        train_dataset=PidData(40, as_dict=True, log=log),
        callbacks=[StallscopeCallback(autotune=True)],
    )
    trainer.train()
    steps, probes = finish(run_dir)
    assert len(steps) == 30
    at = _autotune_of(probes)
    first = at["changes"][0]
    assert first["from"]["num_workers"] == 0 and first["config"]["num_workers"] >= 1
    assert [t["num_workers"] for t in at["trials"]][:2] == [0, first["config"]["num_workers"]]
    # and the workers really loaded: the epochs after the first were loaded in other processes
    assert _loaded_by_workers(log) >= 40, at["trials"]
