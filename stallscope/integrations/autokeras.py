"""Zero-code Keras: under ``stallscope run``, ``model.fit`` records its steps with the probe.

Sampled stacks cannot see a Keras 3 input stall: ``fit`` runs each step as one compiled
TensorFlow function, and the tf.data ``get_next`` runs inside it on TensorFlow's own threads.
Measured on a prep-bound ``fit`` (TF 2.21, Keras 3.15): the training thread's Python frames
were the same as a compute-bound one's (``TensorFlowTrainer.fit`` → ``Function.__call__``), py-spy
``--native`` found no tf.data frame on the Python threads, and the threads that run the map
(``tf_Compute``) also run the step. So the injected start-up (:mod:`stallscope.inject`) calls
:func:`install`: when the trainer imports ``keras``, ``keras.Model.fit`` gets the probe's
:class:`~stallscope.integrations.keras.StallscopeCallback` added to its callbacks (unless one
is there already), which times each ``get_next`` inside the train function. Nothing else in the
training changes; any error leaves ``fit`` as it was.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

__all__ = ["add_callback", "install"]

#: ``keras.Model.fit``'s positional index of ``callbacks`` (after ``self``)
_CALLBACKS_AT = 5


def add_callback(
    args: tuple[Any, ...], kwargs: dict[str, Any], make: Any, kind: type
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``fit``'s arguments with one callback of ``kind`` (made by ``make()``) among its
    callbacks, wherever they were given; unchanged when one is there."""
    if len(args) > _CALLBACKS_AT:
        given = args[_CALLBACKS_AT]
    else:
        given = kwargs.get("callbacks")
    cbs = list(given) if isinstance(given, (list, tuple)) else ([] if given is None else None)
    if cbs is None or any(isinstance(c, kind) for c in cbs):
        return args, kwargs  # a CallbackList or such: leave it as given
    cbs.append(make())
    if len(args) > _CALLBACKS_AT:
        return (*args[:_CALLBACKS_AT], cbs, *args[_CALLBACKS_AT + 1 :]), kwargs
    return args, dict(kwargs, callbacks=cbs)


def _patch(keras: ModuleType) -> None:
    model = getattr(keras, "Model", None)
    fit = getattr(model, "fit", None)
    if model is None or fit is None or getattr(fit, "_stallscope", False):
        return

    @functools.wraps(fit)
    def timed_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            from stallscope.integrations.keras import StallscopeCallback

            os.environ.setdefault("STALLSCOPE_PROBE_ADDED", "stallscope run (model.fit)")
            args, kwargs = add_callback(args, kwargs, StallscopeCallback, StallscopeCallback)
        except Exception as exc:  # the probe is extra: fit runs as it would have
            from stallscope.errors import warn

            warn(f"model.fit without the probe: {exc}", "stallscope.probe")
        return fit(self, *args, **kwargs)

    timed_fit._stallscope = True  # type: ignore[attr-defined]
    model.fit = timed_fit


class _KerasHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``keras`` is imported, it patches the module the usual
    finder loads, right after it ran."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "keras":
            return None
        # asked every time (importlib.util.find_spec("keras") only checks that it exists):
        # the hook leaves once a loaded module was patched
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            try:
                _patch(module)
            except Exception:
                pass

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Patch ``keras.Model.fit`` when Keras is imported (now, if it already is)."""
    if "keras" in sys.modules:
        _patch(sys.modules["keras"])
    elif not any(isinstance(f, _KerasHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _KerasHook())
