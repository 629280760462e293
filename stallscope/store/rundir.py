"""Run directories: where runs go, their ``meta.json``, and finding a run by name."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Literal

from stallscope.errors import RunNotFound, UsageError
from stallscope.store.paths import DEFAULT_OUT, default_out

__all__ = [
    "DEFAULT_OUT",
    "RunState",
    "base_meta",
    "find_run",
    "known_runs",
    "list_runs",
    "monitor_alive",
    "new_run_dir",
    "read_meta",
    "run_state",
    "write_meta",
    "writer_stamp",
]


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def new_run_dir(out: str | os.PathLike[str], label: str, now: float | None = None) -> Path:
    """Create ``<out>/<YYYYmmdd-HHMMSS>-<label>`` (suffixed when taken) and return it."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    safe = _SAFE.sub("-", label).strip("-.")[:40] or "run"
    root = Path(out)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output directory {root}: {exc.strerror}") from exc
    for n in range(1000):
        name = f"{stamp}-{safe}" + (f"-{n}" if n else "")
        path = root / name
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError(f"cannot create run directory {path}: {exc.strerror}") from exc
        return path
    raise UsageError(f"too many runs named {stamp}-{safe} in {root}")


def base_meta(
    command: list[str], *, start: float, interval_s: float, **extra: Any
) -> dict[str, Any]:
    """The ``meta.json`` fields every run starts with (``stallscope run`` and the standalone
    probe, through :class:`~stallscope.collect.session.Session`): command, host, start,
    versions, cores, RAM; ``extra`` adds or overrides fields."""
    import platform
    import socket
    import sys

    from stallscope.version import __version__

    versions: dict[str, Any] = {
        "stallscope": __version__,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(getattr(torch, "__version__", None))
    meta: dict[str, Any] = {
        "command": list(command),
        "host": socket.gethostname(),
        "start": start,
        "end": None,
        "exit_code": None,
        "interval_s": interval_s,
        "cwd": os.getcwd(),
        "data": None,
        "data_devices": [],
        "versions": versions,
        "logical_cores": os.cpu_count(),
    }
    try:
        import psutil

        meta["physical_cores"] = psutil.cpu_count(logical=False)
        meta["mem_total_mib"] = round(psutil.virtual_memory().total / 1048576, 1)
    except ImportError:
        meta["physical_cores"] = None
        meta["mem_total_mib"] = None
    meta.update(extra)
    return meta


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically (temp file + rename), so readers never see half of it."""
    tmp = run_dir / "meta.json.tmp"
    try:
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, run_dir / "meta.json")
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written temp file behind
        raise


#: the most of a meta.json read (stallscope writes a few kB; a bigger one is not ours)
MAX_META_BYTES = 16 << 20


def read_meta(run_dir: Path, *, owner: int | None = None) -> dict[str, Any]:
    """The run's meta.json, checked. ``owner``: read it only when it is a file, not a link,
    of this uid (the agent reading a user's run)."""
    from stallscope.safefile import NotOwned, NotRegular, read_bounded

    try:
        raw, more = read_bounded(run_dir / "meta.json", MAX_META_BYTES, owner=owner)
        if more:
            raise RunNotFound(
                f"{run_dir}/meta.json is unreadable: larger than {MAX_META_BYTES >> 20} MiB"
            )
        meta: dict[str, Any] = json.loads(raw.decode("utf-8"))
    except FileNotFoundError as exc:
        raise RunNotFound(f"{run_dir} is not a stallscope run (no meta.json)") from exc
    except NotRegular:
        raise RunNotFound(f"{run_dir}/meta.json is not a regular file") from None
    except NotOwned:
        raise RunNotFound(f"{run_dir}/meta.json is a link or another user's file") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise RunNotFound(f"{run_dir}/meta.json is unreadable: {str(exc)[:200]}") from exc
    except RecursionError:
        raise RunNotFound(f"{run_dir}/meta.json is unreadable: nested too deep") from None
    if not isinstance(meta, dict):
        raise RunNotFound(f"{run_dir}/meta.json is not a JSON object")
    _check_meta(run_dir, meta)
    return meta


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e15


#: meta.json keys readers rely on, and what they must hold (None always allowed)
_META_TYPES: dict[str, tuple[str, Any]] = {
    "command": (
        "a list of strings",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    ),
    "start": ("a number (Unix time)", _is_num),
    "end": ("a number (Unix time)", _is_num),
    "exit_code": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "monitor_pid": ("a process id", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "interval_s": ("a number of seconds", _is_num),
    "data_devices": (
        "a list of device names",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    ),
    "unavailable": ("an object", lambda v: isinstance(v, dict)),
    "disk_health": (
        "a list of drives",
        lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    ),
    "physical_cores": ("a number of cores", lambda v: _is_count(v)),
    "logical_cores": ("a number of cores", lambda v: _is_count(v)),
    "warmup_interval_s": ("a number of seconds", _is_num),
    "warmup_s": ("a number of seconds", _is_num),
    "training": ("a run id", lambda v: isinstance(v, str)),
    "trainings": ("an object of run ids", lambda v: isinstance(v, dict)),
    "verdict": ("a finding kind", lambda v: isinstance(v, str)),
    "busy_others": (
        "a list of processes",
        lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    ),
}


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 20


def _check_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Reject a meta.json whose keys have the wrong types, naming the key (a hand-edited or
    foreign file must give one clear line, not a TypeError deep in a command)."""
    for key, (what, ok) in _META_TYPES.items():
        v = meta.get(key)
        if v is not None and not ok(v):
            raise RunNotFound(f"{run_dir}/meta.json: {key!r} should be {what}, got {v!r:.60}")


RunState = Literal["running", "finished", "interrupted"]

#: the largest process id Linux can hand out (``/proc/sys/kernel/pid_max`` is at most 2^22)
_PID_MAX = 2**22


#: how much later than the run's start its writer may have started (slow starts) before a live
#: process under that pid is taken for another one that reused the pid; only for runs recorded
#: without the writer's start ticks (their check is exact)
_REUSE_SLACK_S = 120.0


def boot_id(proc_root: str = "/proc") -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), or None."""
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "random", "boot_id")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22):
    with the boot id, it names one process whatever the wall clock does. None if unreadable."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat")) as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_started_at(pid: int, proc_root: str = "/proc") -> float | None:
    """Unix time process ``pid`` started (its start ticks after the boot time of
    ``/proc/stat``, on today's clock), or None when it cannot be read."""
    ticks = start_ticks(pid, proc_root)
    if ticks is None:
        return None
    try:
        with open(os.path.join(proc_root, "stat")) as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def writer_stamp(pid: int) -> dict[str, Any]:
    """What ``meta.json`` keeps of a process that writes a run, to know it again:
    ``{"boot_id": ..., "start_ticks": ...}`` (values None when unreadable)."""
    return {"boot_id": boot_id(), "start_ticks": start_ticks(pid)}


def monitor_alive(pid: object, since: object = None, stamp: object = None) -> bool:
    """Whether the stallscope process that writes a run (``monitor_pid``) is still there.

    None (unknown: an older run, or a standalone probe) is taken as alive; a value that cannot
    be a process id (not an integer, zero, negative, past the kernel's maximum) as gone.
    ``stamp`` (:func:`writer_stamp` of the writer when the run began): a process under that pid
    with other start ticks, or after a reboot, is another one that reused the pid. Without it,
    ``since`` (the run's start, Unix time): a process that started well after it is another."""
    if pid is None:
        return True
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= _PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    except (OSError, OverflowError, ValueError):
        return False
    if (
        isinstance(stamp, dict)
        and isinstance(stamp.get("start_ticks"), int)
        and isinstance(stamp.get("boot_id"), str)
    ):
        now_boot, now_ticks = boot_id(), start_ticks(pid)
        if now_boot is not None and now_boot != stamp["boot_id"]:
            return False  # the machine rebooted since: not the same process
        if now_ticks is not None:
            return now_ticks == stamp["start_ticks"]
    if isinstance(since, (int, float)) and not isinstance(since, bool):
        started = process_started_at(pid)
        if started is not None and started > since + _REUSE_SLACK_S:
            return False
    return True


def run_state(meta: dict[str, Any]) -> RunState:
    """The one answer to "is this run going on?", for ``runs`` and ``show`` alike: "finished"
    once ``end`` is recorded, else "running" while the monitor that writes it is alive, else
    "interrupted" (it was killed, e.g. ``kill -9``, or the machine went down)."""
    if meta.get("end") is not None:
        return "finished"
    return (
        "running"
        if monitor_alive(meta.get("monitor_pid"), meta.get("start"), meta.get("monitor_stamp"))
        else "interrupted"
    )


def _root(out: str | os.PathLike[str]) -> Path:
    """The runs folder a command looks in: ``--out`` when given, else ``$STALLSCOPE_OUT``,
    else ``./stallscope-runs``."""
    if str(out) == DEFAULT_OUT:
        return Path(default_out())
    return Path(out)


def known_runs(out: str | os.PathLike[str] = DEFAULT_OUT) -> list[Path]:
    """Every run this user can find: those under ``out`` and those in the per-user index
    (:mod:`stallscope.store.index`), each once, oldest first (run ids start with their time)."""
    from stallscope.store.index import indexed_runs

    seen: dict[str, Path] = {}
    for d in [*list_runs(_root(out)), *indexed_runs()]:
        try:
            key = str(d.resolve())
        except OSError:
            continue
        seen.setdefault(key, d)
    return sorted(seen.values(), key=lambda d: (d.name, str(d)))


def find_run(ref: str, out: str | os.PathLike[str] = DEFAULT_OUT) -> Path:
    """Resolve RUN as given on the command line: a run directory path, a run id (under
    ``out`` first, then anywhere in the per-user index), a unique prefix of one, or
    ``latest`` (the newest under ``out``; without any there, the newest in the index)."""
    if not ref.strip():
        raise RunNotFound("no run given: name a run directory, a run id, or 'latest'")
    p = Path(ref)
    if _is_run(p):
        return p
    root = _root(out)
    if ref == "latest":
        # this folder's newest run first: on a shared account the index's newest may be
        # another program's; the index is the fallback for a folder without runs
        here = list_runs(root)
        if here:
            return here[-1]
        runs = known_runs(out)
        if not runs:
            raise RunNotFound(f"no runs in {root} or in the run index")
        return runs[-1]
    if _is_run(root / ref):
        return root / ref
    matches = [r for r in known_runs(out) if r.name.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        names = ", ".join(m.name for m in matches[:5])
        raise RunNotFound(f"run {ref!r} is ambiguous: {names}")
    if _exists(p):
        raise RunNotFound(f"{ref} is not a stallscope run directory (no meta.json or run.db)")
    raise RunNotFound(
        f"unknown run {ref!r} (not a directory, not a run in {root}/ nor in the run index)"
    )


def _exists(p: Path) -> bool:
    """``p.exists()`` that says False for a name the system refuses (too long, a NUL)."""
    try:
        return p.exists()
    except (OSError, ValueError):
        return False


def _is_run(p: Path) -> bool:
    return _exists(p / "meta.json") or _exists(p / "run.db")


def list_runs(out: str | os.PathLike[str] = DEFAULT_OUT) -> list[Path]:
    """Run directories under ``out``, oldest first."""
    root = Path(out)
    try:  # an overlong or undecodable name is no folder of runs, never a traceback
        if not root.is_dir():
            return []
        return sorted(d for d in root.iterdir() if d.is_dir() and (d / "meta.json").exists())
    except (OSError, ValueError):
        return []
