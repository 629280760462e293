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

__all__ = [
    "DEFAULT_OUT",
    "NAME_MAX",
    "PATH_MAX",
    "default_out",
    "index_line",
    "out_problem",
    "state_dir",
]

#: the runs folder when neither ``--out`` nor ``$STALLSCOPE_OUT`` says otherwise
DEFAULT_OUT = "stallscope-runs"


def default_out(env: Mapping[str, str] | None = None) -> str:
    """Where new runs go when ``--out`` is not given: ``$STALLSCOPE_OUT`` or
    ``./stallscope-runs``."""
    e = os.environ if env is None else env
    return e.get("STALLSCOPE_OUT") or DEFAULT_OUT


#: the longest name of one folder, and the longest path, Linux takes (bytes)
NAME_MAX = 255
PATH_MAX = 4096


def out_problem(out: str) -> str | None:
    """Why ``out`` cannot be a runs folder, in a few words (``is not valid UTF-8``); None when
    its name can be one (whether it exists or may be made is found out when a run is made).
    Names the system refuses (longer than :data:`NAME_MAX` a folder or :data:`PATH_MAX` in
    all: ``ENAMETOOLONG`` from every ``stat``) and names that are not UTF-8 (an environment's
    bytes: no run index, ``meta.json`` or report could hold them) are refused."""
    try:
        raw = out.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if len(raw) >= PATH_MAX:
        return f"is {len(raw):,} bytes long (a path has at most {PATH_MAX - 1:,})"
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX:
        return f"has a name of {longest:,} bytes (a folder's name has at most {NAME_MAX})"
    return None


def index_line(run_dir: Path) -> str | None:
    """``run_dir`` as one line of the run index (``runs.txt``, UTF-8): its resolved path, or
    None when no line can hold it (a newline in it, a name that is not UTF-8: writing it raised
    ``UnicodeEncodeError``). ``OSError`` when it cannot be resolved."""
    line = str(Path(run_dir).resolve())
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return None if "\n" in line else line


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """The per-user state directory: ``$STALLSCOPE_STATE_DIR``, else
    ``$XDG_STATE_HOME/stallscope``, else ``~/.local/state/stallscope``."""
    e = os.environ if env is None else env
    if e.get("STALLSCOPE_STATE_DIR"):
        return Path(e["STALLSCOPE_STATE_DIR"])
    base = (
        Path(e["XDG_STATE_HOME"])
        if e.get("XDG_STATE_HOME")
        else (Path(e.get("HOME") or Path.home()) / ".local" / "state")
    )
    return base / "stallscope"
