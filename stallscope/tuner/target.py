"""What the tuner tunes: a Dataset, a DataLoader, or a factory taking DataLoader keyword arguments,
turned into one function ``make(**overrides) -> DataLoader`` plus the configuration as given.

Also resolves ``module:function`` and ``path/to/file.py:function`` for the command line, the way
``uvicorn`` and ``gunicorn`` name an application."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope.errors import UsageError

#: batch size used when the target is a bare Dataset and none is given
DEFAULT_BATCH_SIZE = 32

#: the DataLoader keyword arguments the tuner changes
TUNED = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "batch_size")


@dataclass
class Target:
    """A loader maker and the configuration as given (the baseline)."""

    make: Callable[..., Any]
    given: dict[str, Any]
    #: how to write the recommendation: ``DataLoader(dataset, ...)`` or ``factory(...)``
    call: str
    #: keyword arguments fixed by the target that the recommendation repeats (batch_size, shuffle)
    fixed: dict[str, Any] = field(default_factory=dict)


def check(spec: str) -> tuple[str, str]:
    """``spec``'s module (or file) and attribute, with the mistakes found without importing
    anything: no ``:``, a file that is not there, a top-level module that is not installed.
    The CLI calls it before it imports PyTorch (~2 s), so a typo is told at once."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise UsageError(f"expected MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if mod_name.endswith(".py") or "/" in mod_name:
        if not Path(mod_name).resolve().is_file():
            raise UsageError(f"{mod_name}: no such file")
    elif "." not in mod_name and mod_name not in sys.modules:
        # resolve() puts the working directory on sys.path: a module there is found then
        here = Path.cwd()
        if importlib.util.find_spec(mod_name) is None and not (
            (here / f"{mod_name}.py").exists() or (here / mod_name).is_dir()
        ):
            raise UsageError(f"cannot import {mod_name!r}: No module named {mod_name!r}")
    return mod_name, attr


def resolve(spec: str) -> Any:
    """Import ``module:attr`` or ``file.py:attr`` and return the attribute, called when it is a
    plain function of no required arguments (the function that returns the dataset)."""
    mod_name, attr = check(spec)
    if mod_name.endswith(".py") or "/" in mod_name:
        path = Path(mod_name).resolve()
        # importable by name, so that spawned workers can unpickle what it defines
        sys.path.insert(0, str(path.parent))
        mod_name = path.stem
    elif "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {mod_name!r}: {exc}") from None
    except Exception as exc:  # the user's module failed while importing (SyntaxError, ...)
        raise UsageError(f"importing {mod_name!r} failed: {type(exc).__name__}: {exc}") from None
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise UsageError(f"{mod_name!r} has no attribute {attr!r}") from None
    return obj


def load(spec: str) -> Any:
    """The object the CLI tunes: ``spec`` resolved, then called once when it is a function that
    needs no argument (it returns the Dataset, the DataLoader, or a factory)."""
    obj = resolve(spec)
    if _is_torch_data(obj) or not callable(obj):
        return obj
    try:
        required = [
            p
            for p in inspect.signature(obj).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        required = []
    if required:
        raise UsageError(
            f"{spec} takes arguments ({', '.join(p.name for p in required)}): "
            "name a function of no arguments that returns a Dataset, a DataLoader "
            "or a factory of DataLoaders"
        )
    return _call_user(obj, spec)


def _call_user(fn: Any, what: str, **kw: Any) -> Any:
    """Call the user's function; what it raises becomes one line naming it."""
    try:
        return fn(**kw)
    except Exception as exc:
        raise UsageError(f"{what} raised {type(exc).__name__}: {exc}") from None


class _Name:
    """A placeholder printed bare in the recommendation (``sampler=sampler``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _is_torch_data(obj: Any) -> bool:
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    return isinstance(obj, (DataLoader, Dataset, IterableDataset))


def _drop_worker_args(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` without the keywords DataLoader refuses when ``num_workers`` is 0."""
    if args.get("num_workers", 0) == 0:
        for k in ("prefetch_factor", "persistent_workers", "multiprocessing_context", "timeout"):
            args.pop(k, None)
    return args


def _given_of(loader: Any) -> dict[str, Any]:
    """The tuned settings a built DataLoader has: the baseline configuration."""
    given: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        given["prefetch_factor"] = loader.prefetch_factor
    return given


def target_of(obj: Any, *, batch_size: int | None = None) -> Target:
    """Wrap what the user gave into a :class:`Target`."""
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    if isinstance(obj, DataLoader):
        return _target_of_loader(obj, batch_size)
    if isinstance(obj, (Dataset, IterableDataset)):
        return _target_of_dataset(obj, batch_size)
    if callable(obj):
        return _target_of_factory(obj, batch_size)
    raise UsageError(
        f"cannot tune a {type(obj).__name__}: give a Dataset, a DataLoader, or a "
        "function that takes DataLoader keyword arguments and returns a DataLoader"
    )


def _loader_sampling(loader: Any, batch_size: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fixed, extra) of a DataLoader: what the recommendation repeats (batch size, shuffle, a
    placeholder for the user's sampler) and the keyword arguments every rebuild passes on."""
    from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler

    fixed: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if loader.batch_size is None and loader.batch_sampler is not None:
        # a batch_sampler of the user's: it decides batch size, order and drop_last
        extra["batch_sampler"] = loader.batch_sampler
        fixed["batch_sampler"] = _Name("batch_sampler")
    else:
        fixed["batch_size"] = batch_size or loader.batch_size
        if isinstance(loader.sampler, RandomSampler):
            fixed["shuffle"] = True
        elif not isinstance(loader.sampler, SequentialSampler) and not isinstance(
            loader.dataset, IterableDataset
        ):
            extra["sampler"] = loader.sampler  # weighted, distributed, ...: kept
            fixed["sampler"] = _Name("sampler")
    names = ["collate_fn", "worker_init_fn", "multiprocessing_context", "generator", "timeout"]
    if "batch_sampler" not in extra:
        names.append("drop_last")
    for name in names:
        extra[name] = getattr(loader, name)
    return fixed, extra


def _target_of_loader(loader: Any, batch_size: int | None) -> Target:
    """A DataLoader: rebuilt on its dataset with its own settings, tuned ones overridden."""
    from torch.utils.data import DataLoader

    fixed, extra = _loader_sampling(loader, batch_size)
    given = _given_of(loader)
    dataset = loader.dataset

    def make_from_loader(**kw: Any) -> Any:
        args = {**extra, **{k: v for k, v in fixed.items() if not isinstance(v, _Name)}, **given}
        args.update(kw)
        return DataLoader(dataset, **_drop_worker_args(args))

    return Target(make_from_loader, given, "DataLoader(dataset, ", fixed)


def _target_of_dataset(dataset: Any, batch_size: int | None) -> Target:
    """A bare Dataset: DataLoaders of the given (or default) batch size, no workers as given."""
    from torch.utils.data import DataLoader

    fixed = {"batch_size": batch_size or DEFAULT_BATCH_SIZE}

    def make_from_dataset(**kw: Any) -> Any:
        return DataLoader(dataset, **_drop_worker_args({**fixed, **kw}))

    return Target(make_from_dataset, {"num_workers": 0}, "DataLoader(dataset, ", fixed)


def _target_of_factory(factory: Any, batch_size: int | None) -> Target:
    """A factory of DataLoaders: called once with no tuned arguments for the baseline, then
    once per trial with the settings to try."""
    from torch.utils.data import DataLoader

    name = getattr(factory, "__name__", "make_loader")
    probe = _call_user(
        factory, f"{name}()", **({} if batch_size is None else {"batch_size": batch_size})
    )
    if not isinstance(probe, DataLoader):
        raise UsageError(
            f"{name}() returned {type(probe).__name__}, not a DataLoader: a "
            "factory must return a DataLoader built from its keyword arguments"
        )
    given = _given_of(probe)
    fixed = {} if batch_size is None else {"batch_size": batch_size}
    del probe

    def make_from_factory(**kw: Any) -> Any:
        loader = _call_user(factory, f"{name}(...)", **_drop_worker_args({**fixed, **kw}))
        if not isinstance(loader, DataLoader):
            raise UsageError(f"{name}(...) returned {type(loader).__name__}, not a DataLoader")
        return loader

    return Target(make_from_factory, given, f"{name}(", fixed)


def call_text(target: Target, config: dict[str, Any]) -> str:
    """The recommendation as code: ``DataLoader(dataset, batch_size=32, num_workers=6)``."""
    args = {**target.fixed, **config}
    if args.get("num_workers", 0) == 0:
        for k in ("prefetch_factor", "persistent_workers"):
            args.pop(k, None)
    order = ["batch_size", "batch_sampler", "shuffle", "sampler", *TUNED]
    keys = sorted(args, key=lambda k: order.index(k) if k in order else len(order))
    text = ", ".join(f"{k}={args[k]!r}" for k in keys if k != "timeout")
    return f"{target.call}{text})"


def batch_nbytes(batch: Any) -> int:
    """The bytes a batch holds in its tensors (dicts, lists and tuples of them walked)."""
    if hasattr(batch, "element_size") and hasattr(batch, "nelement"):
        return int(batch.element_size() * batch.nelement())
    if isinstance(batch, dict):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v) for v in batch)
    return 0


def is_iterable(target: Target) -> bool:
    """The target's loader reads an IterableDataset (its workers must split the stream)."""
    try:
        from torch.utils.data import IterableDataset

        loader = target.make(num_workers=0)
        return isinstance(loader.dataset, IterableDataset)
    except Exception:  # the baseline trial reports what is wrong with the target
        return False


def gpu_present() -> bool:
    """PyTorch sees a CUDA GPU (pin_memory is worth a trial)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
