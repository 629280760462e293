"""Samples of one process's training thread, summed into windows and written as JSON lines.

Both samplers feed a :class:`Tally`: the one inside the trainer that ``stallscope run``
injects (:mod:`stallscope.sources.stacks.inproc`) and py-spy attached from outside
(:mod:`stallscope.sources.stacks.pyspy`). Each sample carries the seconds it stands for (the
time since the previous one), so a sample that came late is not under-counted. Once per
flush the tally becomes one record, appended to ``<run>/stacks/<pid>.jsonl``::

    {"ts": 1764060000.0, "pid": 4242, "rank": 1, "sampler": "inproc", "rate_hz": 50,
     "s": {"data": 0.82, "compute": 0.16, "other": 0.02}, "n": 50,
     "stacks": {"<module> (train.py);__next__ (torch/utils/data/dataloader.py)": 0.8, ...},
     "stack_phase": {"<module> (train.py);...": "data"}}

``s`` holds seconds per phase (:data:`~stallscope.sources.stacks.phases.PHASES`, plus
``startup`` and, in the last record, ``tail``: what followed the last training sample, and
``exit``: the part of the tail spent shutting down);
``stacks`` the seconds of each folded stack of the window (at most :data:`MAX_STACKS`, the
rest under ``(other stacks)``); ``batches`` and ``samples``, where there were any, what the
trainer took from its DataLoaders in the window (the in-trainer sampler only:
:mod:`.batches`), and ``wait_b`` / ``step_b``: those batches' waits and step times, bucket ->
batches (:func:`~stallscope.sources.stacks.fetches.bucket`). :func:`read_records` reads them back,
skipping what it cannot parse (a line cut by a crash).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stallscope.sources.stacks.fetches import add_counts
from stallscope.sources.stacks.phases import (
    TRAINING,
    Frame,
    classify,
    fold,
    folded_exiting,
    idle_process,
    starts_training,
)

__all__ = [
    "MAX_STACKS",
    "STACKS_DIR",
    "RecordTail",
    "Tally",
    "append_record",
    "phase_seconds",
    "rank_from_env",
    "ranked_pids",
    "read_records",
    "stacks_dir",
]

#: bytes read from one file per look at most (a runaway writer cannot stall the reader)
MAX_READ = 4 << 20
#: the most of one stacks file a run's reader takes: a sampler writes ~1-5 kB a second, so
#: 256 MiB is days of one process; anything bigger is not ours (a link to /dev/zero)
MAX_FILE = 256 << 20

#: the run directory's folder of sampled stacks, one file per sampled process
STACKS_DIR = "stacks"
#: distinct folded stacks one record keeps
MAX_STACKS = 40
#: seconds outside training held back at most before they count (see :attr:`Tally.pending`)
MAX_PENDING_S = 30.0
#: distinct stacks a tally remembers the phase of
MEMO_SIZE = 20_000
#: seconds one sample may stand for at most (a sampler that stalled does not invent time)
MAX_WEIGHT_S = 1.0


def stacks_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / STACKS_DIR


class Tally:
    """One process's samples since the last record. ``started`` turns True at the first
    training-phase sample; until then every sample is ``startup``. ``idle`` turns True when the
    process shows it is no trainer (a launcher, a multiprocessing child): the sampler stops."""

    def __init__(self, pid: int, rank: int | None, sampler: str, rate_hz: float) -> None:
        self.pid = pid
        self.rank = rank
        self.sampler = sampler
        self.rate_hz = rate_hz
        self.started = False
        self.idle = False
        self.seconds: dict[str, float] = {}
        #: seconds outside training since the last training sample: counted once training
        #: resumes, so the clean-up after the loop (saving, removing files) counts nowhere
        self.pending: dict[str, float] = {}
        self.stacks: dict[str, float] = {}
        self.stack_phase: dict[str, str] = {}
        self.n = 0
        self.total_n = 0
        #: batches and samples the trainer took from its DataLoaders in this window
        #: (:mod:`.batches`; 0 where nothing counts them)
        self.batches = 0
        self.samples = 0
        #: their waits and step times, bucket -> batches (:mod:`.batches`)
        self.wait_b: dict[int, int] = {}
        self.step_b: dict[int, int] = {}
        self.loader_wait = False  #: the last sample waited on loader threads (:meth:`add`)
        #: stack key -> (phase, folded stack, not a trainer's, starts training): a loop
        #: repeats a few stacks
        self._memo: dict[Any, tuple[str, str, bool, bool]] = {}

    def _info(self, frames: Sequence[Frame], key: Any) -> tuple[str, str, bool, bool]:
        info = self._memo.get(key) if key is not None else None
        if info is None:
            phase, framework = classify(frames)
            info = (
                phase,
                fold(frames),
                idle_process(frames),
                starts_training(frames, phase, framework),
            )
            if key is not None and len(self._memo) < MEMO_SIZE:
                self._memo[key] = info
        return info

    def add(
        self,
        frames: Sequence[Frame],
        weight_s: float,
        key: Any = None,
        *,
        loader_wait: bool = False,
    ) -> str:
        """Count one sample (frames innermost first) standing for ``weight_s`` seconds; returns
        its phase. ``key``: a hashable identity of the stack (its code objects and innermost
        line) under which its phase and folded form are remembered; None: work them out.
        ``loader_wait``: the sample waits on another thread while loader threads work
        (:mod:`.threads`): ``data`` where no table knew it (never starting training)."""
        if not frames:
            return "other"
        weight_s = min(max(weight_s, 0.0), MAX_WEIGHT_S)
        phase, folded, not_trainer, starts = self._info(frames, key)
        # a wait on loader threads: data, where no table knew the frames (a queue of the
        # loop's own) or where one knew them as a loader's (torchdata's nodes on threads)
        waits = loader_wait and phase in ("other", "data")
        if waits:
            phase = "data"
        if not self.started and not_trainer:
            self.idle = True
        if not self.started:
            if starts:
                self.started = True
            else:
                phase = "startup"
        elif phase == "setup":
            phase = "other"
        #: this sample was a wait on loader threads, counted as data (a DataLoader's own frames
        #: are never one: :func:`~stallscope.sources.stacks.threads.waits_on_thread`)
        self.loader_wait = waits and phase == "data"
        if phase in TRAINING:
            for k, v in self.pending.items():
                # a loader shut down mid-run (its workers joined at an epoch's end) is part
                # of the run: "other", as every pause the training came back from
                k = "other" if k == "exit" else k
                self.seconds[k] = self.seconds.get(k, 0.0) + v
            self.pending = {}
            self.seconds[phase] = self.seconds.get(phase, 0.0) + weight_s
        elif phase == "startup":
            self.seconds[phase] = self.seconds.get(phase, 0.0) + weight_s
        else:
            self.pending[phase] = self.pending.get(phase, 0.0) + weight_s
            # a long pause is part of the run; a long exit (PyTorch joining pinned persistent
            # workers, 5 s each) is not, however long
            if sum(v for k, v in self.pending.items() if k != "exit") > MAX_PENDING_S:
                for k in [k for k in self.pending if k != "exit"]:
                    self.seconds[k] = self.seconds.get(k, 0.0) + self.pending.pop(k)
        if folded in self.stacks or len(self.stacks) < MAX_STACKS:
            self.stacks[folded] = self.stacks.get(folded, 0.0) + weight_s
            self.stack_phase[folded] = phase
        else:
            self.stacks["(other stacks)"] = self.stacks.get("(other stacks)", 0.0) + weight_s
            self.stack_phase["(other stacks)"] = "other"
        self.n += 1
        self.total_n += 1
        return phase

    def reassign(self, src: str, dst: str, seconds: float) -> float:
        """Move up to ``seconds`` of this window from phase ``src`` to ``dst`` (time measured
        otherwise to be ``dst`` although the stacks said ``src``: DDP's all-reduce wait inside
        the backward's C++ frames); returns the seconds moved."""
        moved = min(max(seconds, 0.0), self.seconds.get(src, 0.0))
        if moved > 0:
            self.seconds[src] -= moved
            self.seconds[dst] = self.seconds.get(dst, 0.0) + moved
        return moved

    def count(self, batches: int, samples: int) -> None:
        """Add batches and samples taken since the last call to this window."""
        self.batches += max(0, batches)
        self.samples += max(0, samples)

    def time_batches(self, waits: Mapping[int, int], steps: Mapping[int, int]) -> None:
        """Add the batches' waits and step times taken since the last call (bucket ->
        batches) to this window."""
        add_counts(self.wait_b, waits)
        add_counts(self.step_b, steps)

    def record(self, ts: float, final: bool = False) -> dict[str, Any] | None:
        """The window as a record (None when empty), and a fresh window. ``final``: the last
        one; what is still pending is written as ``tail`` (counted in no share)."""
        if final and self.pending:
            self.seconds["tail"] = sum(self.pending.values())
            if self.pending.get("exit"):
                self.seconds["exit"] = self.pending["exit"]  # part of the tail
            self.pending = {}
        if not self.n:
            return None
        if not self.started:  # only start-up so far: nothing worth a line on disk (batches
            # counted before the first training sample go into the first record)
            self.seconds, self.stacks, self.stack_phase, self.n = {}, {}, {}, 0
            return None
        rec: dict[str, Any] = {
            "ts": round(ts, 3),
            "pid": self.pid,
            "rank": self.rank,
            "sampler": self.sampler,
            "rate_hz": self.rate_hz,
            "n": self.n,
            "s": {k: round(v, 4) for k, v in self.seconds.items()},
            "stacks": {k: round(v, 4) for k, v in self.stacks.items()},
            "stack_phase": dict(self.stack_phase),
        }
        if self.batches:
            rec["batches"], rec["samples"] = self.batches, self.samples
        if self.wait_b:
            rec["wait_b"] = {str(k): c for k, c in sorted(self.wait_b.items())}
            rec["step_b"] = {str(k): c for k, c in sorted(self.step_b.items())}
        self.seconds, self.stacks, self.stack_phase, self.n = {}, {}, {}, 0
        self.batches = self.samples = 0
        self.wait_b, self.step_b = {}, {}
        return rec


def append_record(folder: Path, rec: dict[str, Any]) -> None:
    """Append one record to ``folder/<pid>.jsonl`` as one line (one ``write`` of the whole
    line, so a reader never sees half of one unless the writer dies mid-write)."""
    folder.mkdir(parents=True, exist_ok=True)
    line = json.dumps(rec, separators=(",", ":")) + "\n"
    with open(folder / f"{rec['pid']}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(line)


def _valid(rec: Any) -> bool:
    ts = rec.get("ts") if isinstance(rec, dict) else None
    return (
        isinstance(rec, dict)
        and isinstance(rec.get("pid"), int)
        and not isinstance(rec.get("pid"), bool)
        and isinstance(ts, (int, float))
        and not isinstance(ts, bool)
        and math.isfinite(ts)
        and isinstance(rec.get("s"), dict)
    )


def rank_from_env(env: Mapping[str, str]) -> int | None:
    """A process's rank as its launcher set it in its environment (torchrun, accelerate,
    Lightning: ``RANK``; Slurm: ``SLURM_PROCID``), None when none did."""
    for key in ("RANK", "SLURM_PROCID"):
        v = env.get(key, "")
        if v.isdigit():
            return int(v)
    return None


def ranked_pids(records: Iterable[Mapping[str, Any]]) -> set[str]:
    """The pids whose sampler read a rank: trainers, whatever their process tree looks like."""
    return {str(r["pid"]) for r in records if isinstance(r.get("rank"), int)}


def parse_lines(lines: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The valid records among ``lines`` (anything else is skipped)."""
    for line in lines:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: a line nested far too deep
            continue
        if _valid(rec):
            yield rec


class RecordTail:
    """The records appended to a stacks folder since the last look (per file, from the offset
    reached; a line cut short is left for the next look)."""

    def __init__(self, folder: Path, *, owner: int | None = None) -> None:
        self.folder = folder
        self.owner = owner  #: read only files of this uid, never a link (safefile)
        self._offsets: dict[Path, int] = {}

    def _file(self, path: Path) -> list[dict[str, Any]]:
        from stallscope.safefile import read_bounded

        off = self._offsets.get(path, 0)
        try:  # regular files only: a FIFO must not hold us, /dev/zero not fill us
            chunk, _more = read_bounded(path, MAX_READ, owner=self.owner, offset=off)
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._offsets[path] = off + end + 1
        return list(parse_lines(chunk[:end].decode("utf-8", "replace").splitlines()))

    def read_new(self) -> dict[Path, list[dict[str, Any]]]:
        """New records by file."""
        from stallscope.safefile import owned_dir

        if self.owner is not None and not owned_dir(self.folder, self.owner):
            return {}  # a link, or another user's folder
        try:
            files = sorted(self.folder.glob("*.jsonl"))
        except OSError:
            return {}
        return {path: self._file(path) for path in files}


def read_records(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a run, by time (a missing folder: none)."""
    out: list[dict[str, Any]] = []
    folder = stacks_dir(run_dir)
    try:
        files = sorted(folder.glob("*.jsonl"))
    except OSError:
        return out
    from stallscope.safefile import read_bounded

    for path in files:
        try:  # regular files only (a FIFO, /dev/zero), and at most MAX_FILE of each
            raw, _more = read_bounded(path, MAX_FILE)
        except OSError:
            continue
        out.extend(parse_lines(raw.decode("utf-8", "replace").splitlines()))
    out.sort(key=lambda r: r["ts"])
    return out


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and 0 <= v < 1e7


def phase_seconds(rec: Mapping[str, Any]) -> dict[str, float]:
    """A record's seconds per phase, numbers only (a hand-edited file can hold anything).

    Stacks of a process shutting down that the sampler counted in a training phase (recorded
    before the ``exit`` phase existed: PyTorch's exit joining pinned persistent workers was
    ``data``) are moved to ``exit``, which no share counts."""
    out = {}
    for k, v in rec.get("s", {}).items():
        if isinstance(k, str) and _num(v):
            out[k] = float(v)
    stacks, phases = rec.get("stacks"), rec.get("stack_phase")
    if isinstance(stacks, dict) and isinstance(phases, dict):
        for k, v in stacks.items():
            ph = phases.get(k)
            if ph in TRAINING and out.get(ph) and _num(v) and folded_exiting(str(k)):
                moved = min(float(v), out[ph])
                out[ph] -= moved
                out["exit"] = out.get("exit", 0.0) + moved
    return out
