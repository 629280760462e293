"""Where stallscope keeps things on disk, decided in one place.

* **Runs** go to ``--out`` when given, else ``$STALLSCOPE_OUT``, else ``./stallscope-runs``
  (:data:`DEFAULT_OUT`, :func:`default_out`).
* **Per-user state** (the run index ``runs.txt``, the SMART history ``smart.json``, the agent's
  store ``agent/``) lives in :func:`state_dir`: ``$STALLSCOPE_STATE_DIR``, else
  ``$XDG_STATE_HOME/stallscope``, else ``~/.local/state/stallscope``.

Pure: each function takes the environment as an argument (default: this process's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_OUT", "default_out", "state_dir"]

#: the runs folder when neither ``--out`` nor ``$STALLSCOPE_OUT`` says otherwise
DEFAULT_OUT = "stallscope-runs"


def default_out(env: Mapping[str, str] | None = None) -> str:
    """Where new runs go when ``--out`` is not given: ``$STALLSCOPE_OUT`` or
    ``./stallscope-runs``."""
    e = os.environ if env is None else env
    return e.get("STALLSCOPE_OUT") or DEFAULT_OUT


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """The per-user state directory: ``$STALLSCOPE_STATE_DIR``, else
    ``$XDG_STATE_HOME/stallscope``, else ``~/.local/state/stallscope``."""
    e = os.environ if env is None else env
    if e.get("STALLSCOPE_STATE_DIR"):
        return Path(e["STALLSCOPE_STATE_DIR"])
    base = Path(e["XDG_STATE_HOME"]) if e.get("XDG_STATE_HOME") else (
        Path(e.get("HOME") or Path.home()) / ".local" / "state")
    return base / "stallscope"
