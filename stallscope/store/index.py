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

from stallscope.store.paths import default_out, index_line, state_dir

__all__ = [
    "MAX_INDEX_BYTES",
    "default_out",
    "index_path",
    "indexed_runs",
    "owned_runs",
    "record_run",
]

#: compact the index when it holds this many lines more than live runs
_COMPACT_SLACK = 200


def index_path(env: Mapping[str, str] | None = None) -> Path:
    return state_dir(env) / "runs.txt"


def record_run(run_dir: Path) -> None:
    """Add a run directory to the index (best effort: never raises)."""
    try:
        path = index_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        line = index_line(run_dir)
        if line is None:
            return  # a newline or a name that is not UTF-8 cannot be one line of the index
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except (OSError, UnicodeError):
        return


#: the most of an index read (a line per run: about 100 bytes; 160,000 runs)
MAX_INDEX_BYTES = 16 << 20


def indexed_runs(path: Path | None = None, *, as_owner: bool = False) -> list[Path]:
    """Run directories in the index that still exist, each once, in the order they were made.

    ``path``: another index than this user's (the node agent reads those of other users); it is
    only read, never compacted. ``as_owner``: read it as its owner (what a root agent does with
    indexes users control): the index is not a link, and a run directory counts only when it is
    a folder, not a link, owned by the index's owner (:func:`owned_runs`). Either way the index
    is read without waiting on it (a FIFO) and at most :data:`MAX_INDEX_BYTES` of it."""
    return owned_runs(path, as_owner=as_owner)[0]


def owned_runs(
    path: Path | None = None, *, as_owner: bool = False
) -> tuple[list[Path], int | None]:
    """(:func:`indexed_runs`, the uid whose runs they are: the index's owner when read
    ``as_owner``, else None)."""
    from stallscope.safefile import owned_dir, read_bounded, read_unfollowed

    own = path is None
    path = index_path() if path is None else path
    uid: int | None = None
    try:
        if as_owner:
            raw, more, uid = read_unfollowed(path, MAX_INDEX_BYTES)
        else:
            raw, more = read_bounded(path, MAX_INDEX_BYTES)
    except (OSError, ValueError):  # missing, a FIFO, a device, a link: no runs from it
        return [], uid
    lines = raw.decode("utf-8", errors="replace").splitlines()
    seen: set[str] = set()
    out: list[Path] = []
    for line in lines:
        if not line or line in seen:
            continue
        seen.add(line)
        p = Path(line)
        try:
            if uid is not None and not owned_dir(p, uid):
                continue  # another user's folder, or a link: not this user's run
            if (p / "meta.json").is_file():
                out.append(p)
        except (OSError, ValueError):
            continue  # a line no path can be (too long, a NUL byte): not a run, dropped

    if own and not as_owner and not more and len(lines) > len(out) + _COMPACT_SLACK:
        _rewrite(path, out)
    return out, uid


def _rewrite(path: Path, runs: list[Path]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text("".join(f"{p}\n" for p in runs), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
