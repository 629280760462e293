"""Issue 41: an exception a dataset raises in a DataLoader worker keeps its type under autotune
(stallscope/probe/workererrors.py): PyTorch rebuilt a class whose constructor takes two
arguments as RuntimeError, so the training's own ``except`` no longer caught it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stallscope.probe import workererrors

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Unreadable(Exception):
    """A dataset's own error, with a constructor of two arguments."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path


class FailsAt(Dataset):
    def __init__(self, exc: type[BaseException], at: int = 5) -> None:
        self.exc, self.at = exc, at

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at:
            raise (
                Unreadable("/data/x.jpg", "truncated")
                if self.exc is Unreadable
                else self.exc("bad sample")
            )
        return torch.tensor([float(i)])


def _error(exc: type[BaseException]) -> BaseException:
    """What iterating a one-worker loader over ``FailsAt(exc)`` raised; the workers shut down
    here (an iterator left in the traceback was joined at the test process's exit)."""
    it = iter(DataLoader(FailsAt(exc), batch_size=4, num_workers=1))
    try:
        for _ in it:
            pass
    except BaseException as err:
        err.__traceback__ = None
        return err
    finally:
        it._shutdown_workers()  # type: ignore[attr-defined]
    raise AssertionError("the loader raised nothing")


@pytest.fixture
def keeping() -> Iterator[None]:
    assert workererrors.install()
    try:
        yield
    finally:
        workererrors.uninstall()


def test_without_it_pytorch_turns_the_error_into_runtime_error() -> None:
    was = workererrors.installed()  # an online tuner made by another test of this process
    workererrors.uninstall()
    try:
        err = _error(Unreadable)
    finally:
        if was:
            workererrors.install()
    assert type(err) is RuntimeError and "Caught Unreadable" in str(err)


def test_the_training_catches_its_own_error_from_a_worker(keeping: None) -> None:
    err = _error(Unreadable)
    assert type(err) is Unreadable
    msg = str(err)
    assert "Caught Unreadable in DataLoader worker process 0" in msg
    assert "/data/x.jpg: truncated" in msg  # the worker's traceback, as PyTorch gives it


@pytest.mark.parametrize("exc", [ValueError, KeyError])
def test_what_pytorch_rebuilds_itself_is_unchanged(keeping: None, exc: type[BaseException]) -> None:
    assert type(_error(exc)) is exc


def test_a_runtime_error_stays_one(keeping: None) -> None:
    from torch._utils import ExceptionWrapper

    try:
        raise RuntimeError("bad sample")
    except RuntimeError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(RuntimeError) as info:
        wrapped.reraise()
    assert type(info.value) is RuntimeError and "bad sample" in str(info.value)


def test_autotune_keeps_worker_errors_typed(tmp_path: Path) -> None:
    from stallscope.probe.autotune import OnlineTuner

    try:
        OnlineTuner(
            DataLoader(FailsAt(Unreadable), batch_size=4),
            cores=2,
            state_path=tmp_path / "autotune.json",
        )
        assert workererrors.installed()
    finally:
        workererrors.uninstall()
