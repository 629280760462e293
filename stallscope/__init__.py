"""stallscope: tells deep-learning engineers why their GPU is waiting."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from stallscope.errors import (
    FallbackHandler,
    ParseError,
    RunNotFound,
    SourceUnavailable,
    StallscopeError,
    UsageError,
)
from stallscope.version import __version__

# A library's logger: a NullHandler, so that Python's last resort never prints for it, and the
# fallback that prints warnings as `stallscope: ...` on stderr only while the program has set
# up no logging of its own (stallscope/errors.py says how; docs/probe.md "Warnings and logging")
_logger = logging.getLogger("stallscope")
if not any(isinstance(h, logging.NullHandler) for h in _logger.handlers):
    _logger.addHandler(logging.NullHandler())
if not any(isinstance(h, FallbackHandler) for h in _logger.handlers):
    _logger.addHandler(FallbackHandler())
del _logger

__all__ = [
    "ParseError",
    "RunNotFound",
    "SourceUnavailable",
    "StallscopeError",
    "UsageError",
    "__version__",
    "alerts_firing",
    "h2d",
    "on_alert",
    "step",
    "tune",
    "watch",
]

if TYPE_CHECKING:
    from stallscope.probe.callbacks import firing as alerts_firing
    from stallscope.probe.callbacks import on_alert
    from stallscope.probe.pytorch import h2d
    from stallscope.probe.watch import step, watch
    from stallscope.tuner import tune

_PROBE_NAMES = ("h2d", "step", "watch")


def __getattr__(name: str) -> Any:
    # the probe is imported on first use, so `import stallscope` stays light (no torch, no sqlite)
    if name in ("on_alert", "alerts_firing"):
        from stallscope.probe import callbacks

        return callbacks.on_alert if name == "on_alert" else callbacks.firing
    if name in _PROBE_NAMES:
        from stallscope import probe

        return getattr(probe, name)
    if name == "tune":
        from stallscope.tuner import tune

        return tune
    raise AttributeError(f"module 'stallscope' has no attribute {name!r}")
