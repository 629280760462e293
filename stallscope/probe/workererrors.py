"""An exception a dataset raises in a DataLoader worker keeps its type under autotune.

At ``num_workers=0`` the training's ``except SomeError`` catches what its dataset raises. In a
worker PyTorch ships the exception's type and traceback text to the main process and rebuilds
it there as ``type(message)`` (``torch._utils.ExceptionWrapper.reraise``); a class whose
constructor takes other arguments cannot be rebuilt so, and arrives as ``RuntimeError``, which
that ``except`` no longer catches. When autotune moved the loading into workers, the training
did not ask for that.

:func:`install` (done once autotune is on: :class:`~stallscope.probe.autotune.OnlineTuner`)
makes ``reraise`` raise an instance of the original class in that one case, made without its
constructor (``cls.__new__(cls)``) and carrying PyTorch's message (the worker's traceback) as
its only argument. Its type is the training's, so ``except SomeError`` catches it; attributes
its constructor would have set are not there. Where even that cannot be made (a class whose
``__new__`` needs arguments), PyTorch's ``RuntimeError`` stands. Everything else PyTorch does
is unchanged.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install", "installed", "uninstall"]

_original: list[Any] = []


def _rebuilt(exc_type: Any, message: str) -> BaseException | None:
    """An instance of ``exc_type`` made without its constructor, ``args == (message,)``."""
    if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
        return None
    try:
        exc = exc_type.__new__(exc_type)
        exc.args = (message,)
    except Exception:
        return None
    return exc if isinstance(exc, exc_type) else None


def install() -> bool:
    """Keep the type of worker exceptions in this process; True when installed (False without
    PyTorch, or where its ExceptionWrapper is not the one this was written for)."""
    if _original:
        return True
    try:
        from torch._utils import ExceptionWrapper
    except ImportError:
        return False
    reraise = getattr(ExceptionWrapper, "reraise", None)
    if reraise is None:
        return False

    def keep_type(self: Any) -> None:
        try:
            reraise(self)
        except RuntimeError as err:
            exc_type = getattr(self, "exc_type", None)
            if type(err) is not RuntimeError or exc_type is None or exc_type is RuntimeError:
                raise
            exc = _rebuilt(exc_type, str(err))
            if exc is None:
                raise
            raise exc from None

    keep_type.__doc__ = reraise.__doc__
    _original[:] = [ExceptionWrapper, reraise]
    ExceptionWrapper.reraise = keep_type  # type: ignore[method-assign]
    return True


def installed() -> bool:
    return bool(_original)


def uninstall() -> None:
    """Put PyTorch's own ``reraise`` back (tests)."""
    if _original:
        cls, reraise = _original
        cls.reraise = reraise
        _original.clear()
