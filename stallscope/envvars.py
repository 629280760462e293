"""Values stallscope reads from the environment: numbers checked as the command-line options are
(finite, in range), and text made safe to print.

An environment can hold anything (``STALLSCOPE_INTERVAL=inf``, 100 kB of nines, an escape
sequence, bytes that are not UTF-8). A number that is not one, not finite or out of range is
said in one line naming the variable, and the default is used: what reads these is a trainer's
probe or a sampler inside it, which never stops the training. Any value that is printed goes
through :func:`shown` (:func:`stallscope.textsafe.plain`, clipped).

Light to import: the probe reads these at its start.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from stallscope.errors import LOGGER, warn
from stallscope.textsafe import plain

__all__ = ["SHOWN_LIMIT", "env_number", "shown"]

#: the most characters of one environment value quoted in a message
SHOWN_LIMIT = 100

N = TypeVar("N", int, float)

#: (name, value) pairs already said: a value read by every recorder is said once a process
_said: set[tuple[str, str]] = set()


def _num(x: float) -> str:
    return f"{int(x)}" if float(x).is_integer() else f"{x:g}"


def shown(name: str, value: str) -> str:
    """``NAME='value'`` for a message: control characters shown as ``\\x1b`` and the value
    clipped to :data:`SHOWN_LIMIT` characters."""
    return f"{name}='{plain(value, SHOWN_LIMIT)}'"


def env_number(
    name: str,
    cast: Callable[[str], N],
    lo: float,
    hi: float,
    default: N,
    *,
    kind: str = "",
    instead: str = "",
    env: Mapping[str, str] | None = None,
    logger: str = LOGGER,
) -> N:
    """``$name`` as ``cast`` (int or float), finite and between ``lo`` and ``hi``; ``default``
    when it is unset or empty. Anything else is one warning on ``logger``, as the command-line
    options word it (``STALLSCOPE_INTERVAL must be a number of seconds between 0.1 and 3600,
    got 'inf'; using 5``), and ``default``. ``kind``: what the number is (``seconds``);
    ``instead``: what the warning says is done instead (default ``using <default>``)."""
    e = os.environ if env is None else env
    text = e.get(name)
    if text is None or not text.strip():
        return default
    what = f"{'an integer' if cast is int else 'a number'}{f' of {kind}' if kind else ''}"
    try:
        v = cast(text)
        ok = (not isinstance(v, float) or math.isfinite(v)) and lo <= v <= hi
    except (ValueError, OverflowError):  # int() of 5,000 digits is a ValueError too
        ok = False
    if ok:
        return v
    if (name, text) not in _said:
        _said.add((name, text))
        warn(
            f"{name} must be {what} between {_num(lo)} and {_num(hi)}, got "
            f"'{plain(text, SHOWN_LIMIT)}'; {instead or f'using {_num(default)}'}",
            logger,
        )
    return default
