"""Sampling a process stallscope did not start: py-spy, attached from outside.

``run --pid`` (and ``top --pid``) cannot inject the in-process sampler into a trainer that is
already running, so they run py-spy (MIT licence, a maintained Rust sampler from PyPI) on it,
in short rounds: ``py-spy record --nonblocking --idle --threads --format raw --duration N``
writes each round's folded stacks, which become the same records the in-process sampler writes
(:mod:`~stallscope.sources.stacks.aggregate`). ``--nonblocking`` reads the target's memory
without stopping it, so sampling never pauses the training. The main thread (its thread id is
the pid) is the training thread; the process's other threads are read as loader threads
(:mod:`~stallscope.sources.stacks.threads`: fetch, prep or idle, each round's part of the
record as the in-process sampler writes it, without its GIL measure).

py-spy needs ptrace rights over the target: the same user with ``kernel.yama.ptrace_scope`` 0,
or ``CAP_SYS_PTRACE`` (root has it). :meth:`PySpySampler.start` tries once and raises
:class:`~stallscope.errors.SourceUnavailable` with one line that says why when it cannot.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from stallscope.errors import ParseError, SourceUnavailable
from stallscope.sources.owner import read_environ
from stallscope.sources.procs import parse_pid_stat
from stallscope.sources.stacks.aggregate import Tally, append_record, rank_from_env
from stallscope.sources.stacks.phases import TRAINING, Frame, classify
from stallscope.sources.stacks.threads import (
    LOADER_PHASES,
    loader_phase,
    threads_part,
    waits_on_thread,
)
from stallscope.store.rundir import monitor_alive

__all__ = [
    "DEFAULT_RATE_HZ",
    "PySpySampler",
    "parse_raw",
    "parse_raw_threads",
    "pyspy_path",
    "sample_weight",
]

#: samples per second (py-spy's CPU: ~17 ms to start a round, ~0.4 ms a sample: 1.06% of a
#: core at 15 Hz over 40 s, so 10 Hz by default; benchmarks/bench_stacks.py)
DEFAULT_RATE_HZ = 10.0
#: seconds of one py-spy round (the first is FIRST_ROUND_S: a first reading soon)
ROUND_S = 10.0
FIRST_ROUND_S = 2.0
#: seconds :meth:`PySpySampler.stop` gives the round in flight to end on SIGINT (py-spy writes
#: what it sampled and exits: 32-101 ms measured at 40 Hz, 2 cores busy) before killing what
#: is left
STOP_GRACE_S = 3.0

#: tries of the first ``py-spy dump`` before sampling is called impossible
DUMP_TRIES = 4

_FRAME = re.compile(r"^(.*) \((.*?):(\d+)\)$")
_THREAD = re.compile(r"^thread \((\d+|0x[0-9a-fA-F]+)\)")
RIGHTS = (
    "needs ptrace rights over it: run as the same user with kernel.yama.ptrace_scope=0, "
    "or with CAP_SYS_PTRACE (docs/diagnosis.md)"
)


def pyspy_path() -> str | None:
    """The py-spy executable: beside this Python (a virtualenv's bin), else on the PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def parse_raw(text: str, tid: int | None = None) -> Iterator[tuple[list[Frame], int]]:
    """(frames innermost first, count) of each line of py-spy's raw output; with ``--threads``
    lines start ``thread (TID): name``, and with ``tid`` only that thread's are kept."""
    for thread, frames, count in parse_raw_threads(text):
        if tid is None or thread is None or thread == tid:
            yield frames, count


def parse_raw_threads(text: str) -> Iterator[tuple[int | None, list[Frame], int]]:
    """(thread id, frames innermost first, count) of each line of py-spy's raw output (the id
    None on a line without ``thread (TID)``: py-spy run without ``--threads``)."""
    for line in text.splitlines():
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        parts = head.split(";")
        m = _THREAD.match(parts[0]) if parts else None
        thread = None
        if m is not None:
            thread = int(m.group(1), 0)
            parts = parts[1:]  # "thread (TID): name" is its own part
        frames = []
        for p in parts:
            fm = _FRAME.match(p)
            if fm is None:
                if p.startswith("process "):
                    continue
                frames.append(Frame("", p, 0))
            else:
                frames.append(Frame(fm.group(2), fm.group(1), int(fm.group(3))))
        if frames:
            yield thread, frames[::-1], int(count)


def _reason(stderr: str) -> str:
    """py-spy's one line of error ("Error: ..."), without its cause chain or backtrace."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    err = [ln.removeprefix("Error:").strip() for ln in lines if ln.startswith("Error:")]
    return (err or lines or ["no reason given"])[0][:200]


#: py-spy's environment: no Rust backtrace after its error line
_ENV = dict(os.environ, RUST_BACKTRACE="0")


class PySpySampler:
    """py-spy rounds on each of ``pids``, in a background thread, into ``folder``. The
    processes' ``/proc`` entries (their memory, their rank's environment) are read under
    ``proc_root``."""

    def __init__(
        self,
        folder: Path,
        pids: Sequence[int],
        rate_hz: float = DEFAULT_RATE_HZ,
        round_s: float = ROUND_S,
        *,
        proc_root: str = "/proc",
    ) -> None:
        self.folder = folder
        self.proc_root = proc_root
        self.pids = list(pids)
        self.rate_hz = rate_hz
        self.round_s = round_s
        self.exe = pyspy_path()
        self._stop = threading.Event()
        self._notes: list[tuple[str, str]] = []
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._thread: threading.Thread | None = None
        self._tallies = {
            pid: Tally(pid, _rank_of(pid, proc_root), "py-spy", rate_hz) for pid in self.pids
        }
        #: each process's loader threads (:class:`_AttachedLoaders`)
        self._loaders: dict[int, _AttachedLoaders] = {}

    def check(self, pid: int) -> None:
        """One ``py-spy dump`` of ``pid``: raises SourceUnavailable with py-spy's reason."""
        if self.exe is None:
            raise SourceUnavailable("py-spy is not installed (pip install py-spy)")
        try:  # the kernel's ptrace check, as py-spy's reads of the target's memory meet it
            with open(f"{self.proc_root}/{pid}/mem", "rb"):
                pass
        except PermissionError as exc:
            raise SourceUnavailable(
                f"cannot sample pid {pid}: reading its memory was refused "
                f"({exc.strerror}); py-spy {RIGHTS}"
            ) from exc
        except FileNotFoundError as exc:
            raise SourceUnavailable(f"cannot sample pid {pid}: no such process") from exc
        except OSError:
            pass  # let py-spy say
        for attempt in range(DUMP_TRIES):
            try:
                r = subprocess.run(
                    [self.exe, "dump", "--pid", str(pid), "--nonblocking"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    env=_ENV,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SourceUnavailable(f"py-spy could not run: {exc}") from exc
            if r.returncode == 0 or "failed to get stack traces" not in (r.stderr or "").lower():
                break
            # --nonblocking reads a process that keeps running: a read can meet its memory
            # mid-change (seen while it imports torch); a moment later it reads fine
            time.sleep(0.2 * (attempt + 1))
        if r.returncode != 0:
            why = _reason(r.stderr or r.stdout)
            low = why.lower()
            extra = (
                f"; it {RIGHTS}"
                if "permission" in low or "ptrace" in low or "not permitted" in low
                else "; is it a CPython process?"
                if "python version" in low
                else ""
            )
            raise SourceUnavailable(f"cannot sample pid {pid} with py-spy: {why}{extra}")

    def start(self) -> None:
        for pid in self.pids:
            self.check(pid)
        self._thread = threading.Thread(target=self._loop, name="stallscope-pyspy", daemon=True)
        self._thread.start()

    def drain_notes(self) -> list[tuple[str, str]]:
        notes, self._notes = self._notes, []
        return notes

    def _loop(self) -> None:
        seconds = min(FIRST_ROUND_S, self.round_s)
        with tempfile.TemporaryDirectory(prefix="stallscope-pyspy-") as tmp:
            while not self._stop.is_set() and self.pids:
                outs = {pid: Path(tmp) / f"{pid}.txt" for pid in self.pids}
                t0 = time.monotonic()
                for pid, out in outs.items():
                    self._procs[pid] = subprocess.Popen(
                        [
                            self.exe or "py-spy",
                            "record",
                            "--pid",
                            str(pid),
                            "--rate",
                            str(int(self.rate_hz)),
                            "--duration",
                            str(int(seconds)),
                            "--nonblocking",
                            "--idle",
                            "--threads",
                            "--format",
                            "raw",
                            "-o",
                            str(out),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        env=_ENV,
                    )
                if self._stop.is_set():  # stop() came while they started: end them as it does
                    _interrupt(self._procs.values())
                for pid, proc in list(self._procs.items()):
                    _out, err = proc.communicate()
                    self._finish_round(
                        pid,
                        outs[pid],
                        proc.returncode,
                        err.decode(errors="replace"),
                        time.monotonic() - t0,
                    )
                self._procs.clear()
                seconds = self.round_s

    def _finish_round(
        self, pid: int, out: Path, code: int, err: str, wall_s: float | None = None
    ) -> None:
        try:
            text = out.read_text(errors="replace")
            out.unlink()
        except OSError:
            text = ""
        if code != 0 and not text:
            self.pids.remove(pid)
            if monitor_alive(pid):
                self._notes.append(("stacks", f"py-spy stopped sampling pid {pid}: {_reason(err)}"))
            return
        tally = self._tallies[pid]
        # py-spy's raw output keeps no order within a round. Before training starts, what is
        # not training is start-up, so it goes first; in the round in which the trainer
        # ended, after training, it is most likely the end: tearing down the loader's workers,
        # saving (0.31-0.39 s of a 12-s attached run, measured; put first, it counted as
        # training time where the trainer's own clock had stopped)
        last = tally.started and _ended(pid)
        samples = sorted(
            parse_raw(text, tid=pid), key=lambda fc: (classify(fc[0])[0] in TRAINING) != last
        )
        weight = sample_weight(self.rate_hz, sum(c for _f, c in samples), wall_s)
        loaders = self._loaders.setdefault(pid, _AttachedLoaders(pid, self.proc_root))
        working = loaders.add(text, pid, weight) if tally.started else False
        for frames, count in samples:
            wait = working and waits_on_thread(frames)
            for _ in range(count):
                tally.add(frames, weight, loader_wait=wait)
                if tally.loader_wait:
                    loaders.wait_s += weight
        rec = tally.record(time.time(), final=last)
        threads = loaders.record()
        if rec is not None and threads is not None:
            rec["threads"] = threads
        if rec is not None:
            try:
                append_record(self.folder, rec)
            except OSError as exc:
                self._notes.append(("stacks", f"cannot write sampled stacks: {exc}"))

    def stop(self) -> None:
        """Stop sampling, keeping the round in flight: py-spy ends it on SIGINT and writes
        what it sampled, which is recorded as any round (SIGTERM lost it: the last round of
        a training attached to, up to ``round_s`` of its stacks, the whole run when it was
        shorter than one). A py-spy that has not ended :data:`STOP_GRACE_S` later is killed."""
        self._stop.set()
        _interrupt(self._procs.values())
        if self._thread is None:
            return
        self._thread.join(timeout=STOP_GRACE_S)
        if self._thread.is_alive():
            for proc in list(self._procs.values()):
                try:
                    proc.kill()
                except OSError:
                    pass
            self._thread.join(timeout=STOP_GRACE_S)


def _interrupt(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGINT to each py-spy still running: it stops sampling, writes its output, exits 0."""
    for proc in list(procs):
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
            except OSError:
                pass


def sample_weight(rate_hz: float, n: int, wall_s: float | None) -> float:
    """Seconds one of a round's ``n`` samples stands for. py-spy aims at ``rate_hz``, but on a
    machine whose cores the trainer and its workers keep busy it falls behind (168 samples in a
    10 s round at 20 Hz, measured): then each sample stood for the round's wall time over ``n``
    (behind by more than 5%: a round's start-up, ~17 ms, is not falling behind). Never less than
    the aimed interval, and at most 4 of them (a round that stalled for another reason says
    nothing about the rest)."""
    nominal = 1.0 / rate_hz
    if not wall_s or n <= 0 or wall_s / n <= 1.05 * nominal:
        return nominal
    return min(wall_s / n, 4 * nominal)


def _ended(pid: int) -> bool:
    """The process has exited (gone, or a zombie its parent has not reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _rank_of(pid: int, proc_root: str = "/proc") -> int | None:
    """The rank in the process's environment (readable with the same rights as its memory)."""
    env = read_environ(Path(proc_root, str(pid)))
    return None if env is None else rank_from_env(env)


class _AttachedLoaders:
    """A process's loader threads as py-spy sees them (:mod:`.threads`: each of its other
    threads' samples fetch, prep or idle), a round at a time, with their CPU from
    ``/proc/<pid>/task/<tid>/stat``. No GIL measure from outside: the record has no
    ``gil_s``."""

    def __init__(self, pid: int, proc_root: str) -> None:
        self.pid, self.proc_root = pid, proc_root
        self.seconds: dict[int, list[float]] = {}
        self.wait_s = 0.0  #: the training thread's seconds waiting on them this round
        self._cpu_seen: dict[int, float] = {}

    def add(self, text: str, pid: int, weight: float) -> bool:
        """Count a round's samples of the process's other threads; True when a loader thread
        worked in it (the training thread's waits on a queue are then waits for data)."""
        for thread, frames, count in parse_raw_threads(text):
            if thread is None or thread == pid:
                continue
            phase = loader_phase(frames)
            if phase is None:
                continue
            row = self.seconds.setdefault(thread, [0.0, 0.0, 0.0])
            row[LOADER_PHASES.index(phase)] += count * weight
        return any(v[0] + v[1] > 0 for v in self.seconds.values())

    def _cpu(self, tid: int) -> float | None:
        try:
            with open(f"{self.proc_root}/{self.pid}/task/{tid}/stat", "rb") as fh:
                st = parse_pid_stat(fh.read(4096).decode(errors="replace"))
        except (OSError, ParseError):
            return None
        return (st.utime + st.stime) / _TICKS

    def record(self) -> dict[str, Any] | None:
        """The round's ``threads`` part (the in-process sampler's, without ``gil_s``), None when
        no loader thread worked; and a fresh round."""
        busy = {t: v for t, v in self.seconds.items() if v[0] + v[1] > 0}
        cpu = 0.0
        for tid in self.seconds:
            now = self._cpu(tid)
            if now is None:
                continue
            if tid in busy and tid in self._cpu_seen:
                cpu += max(0.0, now - self._cpu_seen[tid])
            self._cpu_seen[tid] = now
        wait, self.wait_s, self.seconds = self.wait_s, 0.0, {}
        return threads_part(busy, cpu, wait)


#: clock ticks a second (utime and stime in /proc/<pid>/task/<tid>/stat)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
