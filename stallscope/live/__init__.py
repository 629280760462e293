"""The live terminal view, ``stallscope top``: the machine-wide sources (and, with ``--pid``, a
trainer's process tree) sampled by the ordinary :class:`~stallscope.collect.Collector` into a
:class:`LiveSink`, drawn by :func:`render` with rich (a full screen with keys on a terminal,
plain frames otherwise). See docs/top.md."""

from __future__ import annotations

from stallscope.live.sink import LiveSink
from stallscope.live.view import SORTS, ViewState, render

__all__ = ["SORTS", "LiveSink", "ViewState", "render"]
