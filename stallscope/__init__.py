"""stallscope: tells deep-learning engineers why their GPU is waiting."""

from __future__ import annotations

from stallscope.errors import (
    ParseError,
    RunNotFound,
    SourceUnavailable,
    StallscopeError,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "ParseError",
    "RunNotFound",
    "SourceUnavailable",
    "StallscopeError",
    "UsageError",
    "__version__",
]
