"""Where runs went: a per-user index, so ``runs``, ``show latest`` and the rest find a run from
any folder, not only from the one it was started in.

Every run directory a :class:`~stallscope.collect.session.Session` creates is appended, as an
absolute path, to ``runs.txt`` in the user's state directory (``$STALLSCOPE_STATE_DIR``, else
``$XDG_STATE_HOME/stallscope``, else ``~/.local/state/stallscope``, the same place as the SMART
history). Reading skips lines whose directory is gone, so moved or deleted runs simply drop out;
the file is compacted when it holds many such lines. An index that cannot be written (read-only
home, full disk) never stops a run: the run is still found from its own folder or by path.

Where new runs go: ``--out`` when given, else ``$STALLSCOPE_OUT``, else ``./stallscope-runs``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from stallscope.store.paths import default_out, state_dir

__all__ = ["default_out", "index_path", "indexed_runs", "record_run"]

#: compact the index when it holds this many lines more than live runs
_COMPACT_SLACK = 200


def index_path(env: Mapping[str, str] | None = None) -> Path:
    return state_dir(env) / "runs.txt"


def record_run(run_dir: Path) -> None:
    """Add a run directory to the index (best effort: never raises)."""
    try:
        path = index_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        line = str(Path(run_dir).resolve())
        if "\n" in line:
            return  # a path with a newline cannot be one line of the index
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:
        return


def indexed_runs(path: Path | None = None) -> list[Path]:
    """Run directories in the index that still exist, each once, in the order they were made.

    ``path``: another index than this user's (the node agent reads those of other users); it is
    only read, never compacted."""
    own = path is None
    path = index_path() if path is None else path
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    seen: set[str] = set()
    out: list[Path] = []
    for line in lines:
        if not line or line in seen:
            continue
        seen.add(line)
        p = Path(line)
        try:
            if (p / "meta.json").is_file():
                out.append(p)
        except (OSError, ValueError):
            continue  # a line no path can be (too long, a NUL byte): not a run, dropped

    if own and len(lines) > len(out) + _COMPACT_SLACK:
        _rewrite(path, out)
    return out


def _rewrite(path: Path, runs: list[Path]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text("".join(f"{p}\n" for p in runs), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
