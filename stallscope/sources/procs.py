"""Procs source: the trainer's process tree (the child of ``stallscope run`` and all its
descendants, DataLoader workers included).

Per process and interval: CPU % (100 = one core; ``htop`` CPU%), resident memory, bytes read
from storage (``/proc/PID/io`` ``read_bytes``, what ``iotop`` shows) and including page cache
(``rchar``), whether it was in state D (uninterruptible: waiting on I/O) when sampled, the share of
the interval it was runnable but waiting for a CPU (``/proc/PID/schedstat``), the share it was
blocked on block I/O (``delayacct_blkio_ticks``, stat field 42, when ``kernel.task_delayacct``
is on), threads, and its role: ``main`` (the trainer) or ``worker`` (its descendants).

Every interval growth goes through :func:`~stallscope.sources.base.counter_delta` (64-bit
counters): a counter that went down leaves its rate out for that interval instead of reporting
0; a pid reused by a new process (another start time) starts over, it is not a reset. Rates
divide by the monotonic time taken right after the process's ``stat`` read, not the collector's
``now``. The reads of one process are a :class:`ProcCounters`; the rates are the pure
:func:`proc_rates` of two of them. :meth:`ProcsSource.counters` gives each process's raw CPU
seconds, read/write bytes and rchar of the latest read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from typing import Any, NamedTuple, TypedDict, cast

from stallscope.errors import ParseError, SourceUnavailable
from stallscope.metrics import Point
from stallscope.sources.base import (
    Counter,
    ProcFile,
    Source,
    close_all,
    counter_delta,
    numeric_points,
)

__all__ = [
    "ProcCounters",
    "ProcIo",
    "ProcRates",
    "ProcRecord",
    "ProcStat",
    "ProcsPayload",
    "ProcsSource",
    "parse_pid_io",
    "parse_pid_stat",
    "parse_schedstat",
    "proc_counters",
    "proc_rates",
]

#: process names that start the trainer rather than being it (their children are the trainers)
LAUNCHERS = frozenset(
    {
        "sh",
        "bash",
        "dash",
        "zsh",
        "fish",
        "env",
        "timeout",
        "nice",
        "ionice",
        "taskset",
        "numactl",
        "torchrun",
        "accelerate",
        "deepspeed",
        "uv",
        "srun",
        "mpirun",
        "mpiexec",
        "horovodrun",
        "stdbuf",
        "time",
        "xargs",
    }
)
#: the name PyTorch gives its DataLoader worker processes (prctl PR_SET_NAME)
TORCH_WORKER = "pt_data_worker"

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SETTLE = 5  #: samples without a new process before discovery reads only known parents
#: a trainer's threads are listed again (``/proc/PID/task``) at least this often, in samples,
#: and whenever its thread count changed or a thread's file could not be read
RELIST_EVERY = 10
#: threads of one process whose ``stat`` is read through a kept descriptor; past this (a
#: process with thousands of threads) each read opens and closes its file
MAX_KEPT_TASKS = 256


class ProcStat(NamedTuple):
    """The fields of ``/proc/PID/stat`` stallscope uses (times in clock ticks)."""

    pid: int
    comm: str
    state: str
    ppid: int
    utime: int
    stime: int
    threads: int
    nice: int  #: field 19: -20 (highest priority) to 19 (lowest)
    starttime: int
    rss_pages: int
    blkio_ticks: int | None  #: field 42, None on kernels that lack it


class ProcRates(TypedDict, total=False):
    """A process's rates over one interval (:func:`proc_rates`); each is left out when a
    counter it needs is missing or went down. Every key is the metric ``procs.<key>``."""

    cpu_pct: float
    main_thread_active_pct: float
    read_kb_s: float
    write_kb_s: float
    rchar_kb_s: float
    runq_wait_pct: float
    blkio_wait_pct: float


class ProcRecord(ProcRates, total=False):
    """One process of a procs payload, the ``snapshot --json`` shape. Its numbers are the
    metrics ``procs.<key>`` of the vocabulary (a test holds the two together); ``name``,
    ``role`` and ``state`` are text, ``ppid`` an id."""

    name: str
    role: str
    ppid: int
    state: str
    d_state: int
    rss_mib: float
    threads: int
    d_threads: int  #: the trainer's threads in D (multi-threaded main process only)
    tf_threads: int  #: the trainer's threads TensorFlow named
    processes: int  #: the processes a record sums (the agent's by-rank worker series)


#: a procs payload: pid (text) -> its record
ProcsPayload = dict[str, ProcRecord]


class ProcIo(NamedTuple):
    """``/proc/PID/io`` (bytes)."""

    rchar: int
    read_bytes: int
    write_bytes: int


def parse_pid_stat(text: str) -> ProcStat:
    """Parse ``/proc/PID/stat``. ``comm`` may hold spaces and parentheses: it runs from the
    first ``(`` to the last ``)``."""
    lp, rp = text.find("("), text.rfind(")")
    if lp < 0 or rp < lp:
        raise ParseError(f"unexpected /proc/PID/stat: {text[:80]!r}")
    rest = text[rp + 2 :].split()
    try:
        # rest[i] is field i+3 of proc(5)
        return ProcStat(
            pid=int(text[:lp]),
            comm=text[lp + 1 : rp],
            state=rest[0],
            ppid=int(rest[1]),
            utime=int(rest[11]),
            stime=int(rest[12]),
            threads=int(rest[17]),
            nice=int(rest[16]),
            starttime=int(rest[19]),
            rss_pages=int(rest[21]),
            blkio_ticks=int(rest[39]) if len(rest) > 39 else None,
        )
    except (IndexError, ValueError) as exc:
        raise ParseError(f"unexpected /proc/PID/stat: {text[:80]!r}") from exc


def _ppid_of(path: str) -> int | None:
    """The parent pid in a ``/proc/PID/stat`` file, None when it cannot be read or parsed as
    :func:`parse_pid_stat` would. The full scan reads every process of the host this way:
    bytes, one ``os.open``/``os.read``/``os.close`` and no text layer (a third of the scan's
    CPU through ``open()`` and a whole parse)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    lp, rp = data.find(b"("), data.rfind(b")")
    if lp < 0 or rp < lp:
        return None
    rest = data[rp + 2 :].split()
    if len(rest) < 22:  # parse_pid_stat reads up to field 24 (rss)
        return None
    try:
        int(data[:lp])  # the pid, as parse_pid_stat checks it
        return int(rest[1])
    except ValueError:
        return None


class ThreadStates(NamedTuple):
    """A process's threads at one sample."""

    d: int  #: threads in state D (waiting on I/O)
    tf: int  #: threads TensorFlow named (``tf_Compute``, ``tf_graph_runner``...)


def thread_states(stats: list[str]) -> ThreadStates:
    """Count the threads in D and TensorFlow's threads from ``/proc/PID/task/*/stat`` texts
    (state is the field after the last ``)``, comm what the parentheses hold). Unparsable
    texts are skipped."""
    d = tf = 0
    for text in stats:
        lp, rp = text.find("("), text.rfind(")")
        if lp < 0 or rp < lp:
            continue
        if text[rp + 2 : rp + 3] == "D":
            d += 1
        if text[lp + 1 : rp].startswith("tf_"):
            tf += 1
    return ThreadStates(d, tf)


def parse_pid_io(text: str) -> ProcIo:
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, val = line.partition(":")
        try:
            fields[key.strip()] = int(val)
        except ValueError as exc:
            raise ParseError(f"unexpected /proc/PID/io line: {line!r}") from exc
    try:
        return ProcIo(fields["rchar"], fields["read_bytes"], fields["write_bytes"])
    except KeyError as exc:
        raise ParseError(f"/proc/PID/io lacks {exc.args[0]}") from exc


def parse_schedstat(text: str) -> tuple[int, int]:
    """``/proc/PID/schedstat`` -> (ns on CPU, ns runnable waiting for a CPU)."""
    parts = text.split()
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError) as exc:
        raise ParseError(f"unexpected /proc/PID/schedstat: {text!r}") from exc


def _grown(prev: int, cur: int) -> int | None:
    """:func:`~stallscope.sources.base.counter_delta` for the u64 counters of /proc/PID
    (utime+stime, io bytes, schedstat, blkio ticks), with the common growing case answered
    inline: six of these per process per sample."""
    return cur - prev if cur >= prev else counter_delta(prev, cur, 64)


class ProcCounters(NamedTuple):
    """One process's cumulative counters at one read: what :func:`proc_rates` differences."""

    starttime: int  #: clock ticks after boot: tells a reused pid from its old process
    cpu_ticks: int  #: utime + stime
    main_ns: int | None  #: the main thread's ns on a CPU or waiting for one (schedstat)
    io: ProcIo | None  #: None when /proc/PID/io is not readable
    sched_wait_ns: int | None  #: ns runnable but waiting for a CPU (schedstat)
    blkio_ticks: int | None  #: stat field 42, None on kernels that lack it


def proc_rates(prev: ProcCounters | None, cur: ProcCounters, dt: float) -> ProcRates:
    """The rates of one process over ``dt`` seconds between two reads of its counters.

    Nothing for a new process (``prev`` None), a pid reused by another process (another start
    time: a new baseline, not a reset) or ``dt`` ≤ 0. Each rate is left out when its counter
    is missing at either read or went down (:func:`_grown` is
    :func:`~stallscope.sources.base.counter_delta`, 64-bit)."""
    out: ProcRates = {}
    if prev is None or prev.starttime != cur.starttime or dt <= 0:
        return out
    d = _grown(prev.cpu_ticks, cur.cpu_ticks)
    if d is not None:
        out["cpu_pct"] = round(100.0 * d / _CLK_TCK / dt, 2)
    if cur.main_ns is not None and prev.main_ns is not None:
        d = _grown(prev.main_ns, cur.main_ns)
        if d is not None:
            out["main_thread_active_pct"] = round(min(100.0, 100.0 * d / 1e9 / dt), 2)
    if cur.io is not None and prev.io is not None:
        d = _grown(prev.io.read_bytes, cur.io.read_bytes)
        if d is not None:
            out["read_kb_s"] = round(d / 1024 / dt, 2)
        d = _grown(prev.io.write_bytes, cur.io.write_bytes)
        if d is not None:
            out["write_kb_s"] = round(d / 1024 / dt, 2)
        d = _grown(prev.io.rchar, cur.io.rchar)
        if d is not None:
            out["rchar_kb_s"] = round(d / 1024 / dt, 2)
    if cur.sched_wait_ns is not None and prev.sched_wait_ns is not None:
        d = _grown(prev.sched_wait_ns, cur.sched_wait_ns)
        if d is not None:
            out["runq_wait_pct"] = round(min(100.0, 100.0 * d / 1e9 / dt), 2)
    if cur.blkio_ticks is not None and prev.blkio_ticks is not None:
        d = _grown(prev.blkio_ticks, cur.blkio_ticks)
        if d is not None:
            out["blkio_wait_pct"] = round(min(100.0, 100.0 * d / _CLK_TCK / dt), 2)
    return out


_NO_PREV: tuple[float, ProcCounters | None] = (0.0, None)  #: a process not seen before
#: the record fields :func:`proc_rates` gives: zero for a process that did not run
RATES = tuple(ProcRates.__annotations__)


class ProcsSource(Source):
    """The process tree rooted at ``root_pid``, less the ``exclude`` pids and everything under
    them (``run --pid`` of the shell that started it: stallscope itself and its py-spy)."""

    name = "procs"
    transient_entities = True

    def __init__(
        self,
        root_pid: int,
        proc_root: str = "/proc",
        rescan_every: int = 60,
        clock: Callable[[], float] = time.monotonic,
        exclude: Collection[int] = (),
    ) -> None:
        self.root_pid = root_pid
        #: processes never entered by the tree walk: neither they nor their descendants
        self.exclude = frozenset(exclude) - {root_pid}
        self._clock = clock  #: read right after each process's stat: its rates' time base
        self.proc_root = proc_root
        self.rescan_every = rescan_every
        #: pid -> (monotonic time of its latest stat read, its counters then)
        self._prev: dict[int, tuple[float, ProcCounters]] = {}
        self._n = 0
        self._tree: set[int] = {root_pid}
        self._parents: set[int] = {root_pid}
        self._settling = _SETTLE  #: samples left in which every process's children are read
        self._children_file = True
        self._io_denied = False
        self.known: dict[int, dict[str, Any]] = {}  #: pid -> attrs, for the store's entities
        self._files: dict[tuple[int, str], ProcFile] = {}
        #: pid -> (the thread count stat gave, its thread ids) as last listed, and when
        self._tids: dict[int, tuple[int, list[str], int]] = {}
        #: pid -> its schedstat text at the last full read
        self._sched_text: dict[int, str] = {}
        #: pid -> (stat text, schedstat text, its record with every rate zero): a
        #: single-threaded process that reads the same again has not run (:meth:`_sample_one`)
        self._idle: dict[int, tuple[str, str, ProcRecord]] = {}
        #: this sample's records served from ``_idle`` (pid text -> (the record, its template)),
        #: and each template's points, made once: an idle process's points are those of its
        #: last sample (:meth:`points`)
        self._served: dict[str, tuple[ProcRecord, ProcRecord]] = {}
        self._idle_points: dict[str, tuple[ProcRecord, list[Point]]] = {}

    def _read(self, *parts: str) -> str:
        with open(os.path.join(self.proc_root, *parts)) as f:
            return f.read()

    def _pread(self, pid: int, name: str) -> str:
        """Read /proc/PID/<name> through a descriptor kept while the process lives."""
        f = self._files.get((pid, name))
        if f is None:
            f = self._files[(pid, name)] = ProcFile(
                os.path.join(self.proc_root, str(pid), *name.split("/")), 4096
            )
        try:
            return f.read().decode("utf-8", "replace")
        except OSError:
            f.close()
            del self._files[(pid, name)]
            raise

    def _forget(self, pid: int) -> None:
        for key in [k for k in self._files if k[0] == pid]:
            self._files.pop(key).close()
        self._tids.pop(pid, None)
        self._idle.pop(pid, None)
        self._sched_text.pop(pid, None)

    def close(self) -> None:
        close_all(self._files)

    def open(self) -> None:
        try:
            self._read(str(self.root_pid), "stat")
        except OSError as exc:
            raise SourceUnavailable(
                f"process {self.root_pid} is not readable in {self.proc_root}: {exc.strerror}"
            ) from exc
        if not os.path.exists(
            os.path.join(self.proc_root, str(self.root_pid), "task", str(self.root_pid), "children")
        ):
            self._children_file = False

    # --- tree discovery --------------------------------------------------------------------------
    def _children(self, pid: int) -> list[int]:
        try:
            return [int(x) for x in self._pread(pid, f"task/{pid}/children").split()]
        except OSError:
            return []

    def _full_scan(self) -> tuple[set[int], set[int]]:
        """(tree, the tree's processes that have children) from every /proc/PID/stat."""
        parent: dict[int, int] = {}
        for d in os.listdir(self.proc_root):
            if d.isdigit():
                ppid = _ppid_of(os.path.join(self.proc_root, d, "stat"))
                if ppid is not None:
                    parent[int(d)] = ppid
        tree = {self.root_pid}
        grew = True
        while grew:
            new = {
                p
                for p, pp in parent.items()
                if pp in tree and p not in tree and p not in self.exclude
            }
            tree |= new
            grew = bool(new)
        parents = {pp for p, pp in parent.items() if p in tree and pp in tree}
        return tree, parents | {self.root_pid}

    def _discover(self) -> set[int]:
        # While the tree is changing (start-up: a launcher starts the trainer, which starts its
        # DataLoader workers), every known process's children file is re-read, so a launcher's
        # grandchildren appear at the next sample. Once the tree has been stable for a few
        # samples, only the processes that have children are re-read (a pread on a kept
        # descriptor each), those that ran since the last sample (a process forks only when it
        # runs: a torchrun rank that starts its DataLoader workers after a long set-up, when
        # the tree has long been stable), and every process's every RELIST_EVERY samples; a
        # new process's children are read at once. A process served from its last record
        # (``_served``: its schedstat had not moved) did not run, so it forked nothing.
        # Children forked from threads other than the main one only show in their own task's
        # file; the periodic full /proc scan catches those.
        if not self._children_file or self._n % self.rescan_every == 0:
            tree, self._parents = self._full_scan()
        else:
            known = self._tree
            tree = {self.root_pid}
            every = self._settling or self._n % RELIST_EVERY == 0
            if every:
                todo = [self.root_pid, *known]
            else:  # the last sample's records: ran unless served as idle
                idle = self._served
                ran = [p for p in known if str(p) not in idle]
                todo = [self.root_pid, *self._parents, *ran]
            read: set[int] = set()
            while todo:
                pid = todo.pop()
                if pid in read:
                    continue
                read.add(pid)
                kids = self._children(pid)
                if kids:
                    self._parents.add(pid)
                for c in kids:
                    if c not in tree and c not in self.exclude:
                        tree.add(c)
                        if c not in known:
                            todo.append(c)
                tree.add(pid)
            tree |= known
        self._settling = _SETTLE if tree - self._tree else max(0, self._settling - 1)
        return tree

    def pids(self) -> set[int]:
        return set(self._tree)

    # --- sampling --------------------------------------------------------------------------------
    def points(self, payload: ProcsPayload) -> list[Point]:
        """:func:`procs_points`; the points of a process that did not run since the last
        sample (its record served from ``_idle``) are made once and handed out again."""
        served, made = self._served, self._idle_points
        out: list[Point] = []
        for pid, fields in payload.items():
            hit = served.get(pid)
            if hit is not None and hit[0] is fields:
                pts = made.get(pid)
                if pts is None or pts[0] is not hit[1]:
                    pts = made[pid] = (hit[1], numeric_points("procs", pid, fields))
                out += pts[1]
            else:
                out += numeric_points("procs", pid, fields)
        return out

    def entities(self, payload: ProcsPayload) -> dict[str, dict[str, Any]]:
        """Each process with its name, command line, parent and the sampler's role."""
        known = self.known
        return {pid: known[int(pid)] for pid in payload if int(pid) in known}

    def sample(self, now: float) -> ProcsPayload | None:
        before = self._tree
        self._tree = self._discover()
        self._served = {}
        self._n += 1
        out: ProcsPayload = {}
        seen: set[int] = set()
        for pid in sorted(self._tree):
            rec = self._sample_one(pid)
            if rec is not None:
                out[str(pid)] = rec
                seen.add(pid)
        if seen != before or len(seen) != len(self._tree):
            # a process came, went or could not be read: forget what is kept of the gone ones
            # (with the same processes read as at the last sample, nothing is)
            self._drop_gone(seen)
        self._tree = seen or {self.root_pid}
        return out

    def _drop_gone(self, seen: set[int]) -> None:
        for gone in set(self._prev) - seen:
            del self._prev[gone]
            self._idle.pop(gone, None)
            self._idle_points.pop(str(gone), None)
            self._sched_text.pop(gone, None)
        for gone in {k[0] for k in self._files} - seen:
            self._forget(gone)
        for gone in set(self.known) - seen:
            del self.known[gone]  # a pid the kernel hands out again is a new process

    def _role(self, pid: int) -> str:
        return "main" if pid == self.root_pid else "worker"

    def _threads(self, pid: int, count: int) -> ThreadStates | None:
        """The trainer's threads (``/proc/PID/task/*/stat``): how many are in D and how many
        TensorFlow named (``tf_*``). ``count``: the thread count its stat gave. The thread ids
        are listed again only when that count changed, a thread's file failed, or every
        :data:`RELIST_EVERY` samples; each thread's stat is read through a kept descriptor (a
        trainer's 40 threads: 1.15 ms a sample with an open, read and close each). A thread
        that exits between listing and reading is skipped."""
        known = self._tids.get(pid)
        if known is None or known[0] != count or self._n - known[2] >= RELIST_EVERY:
            try:
                tids = os.listdir(os.path.join(self.proc_root, str(pid), "task"))
            except OSError:
                return None
            self._drop_tasks(pid, set(tids))
            self._tids[pid] = (count, tids, self._n)
        else:
            tids = known[1]
        stats, lost = self._task_stats(pid, tids)
        if lost:
            self._tids.pop(pid, None)  # list them again at the next sample
        return thread_states(stats)

    def _drop_tasks(self, pid: int, alive: set[str]) -> None:
        """Close the kept descriptors of ``pid``'s threads that are no longer listed."""
        for key in [
            k
            for k in self._files
            if k[0] == pid
            and k[1].startswith("task/")
            and k[1].endswith("/stat")
            and k[1].split("/")[1] not in alive
        ]:
            self._files.pop(key).close()

    def _task_stats(self, pid: int, tids: list[str]) -> tuple[list[str], bool]:
        """Each thread's stat, and whether one could not be read (it exited)."""
        out = []
        lost = False
        for i, tid in enumerate(tids):
            try:
                out.append(
                    self._pread(pid, f"task/{tid}/stat")
                    if i < MAX_KEPT_TASKS
                    else self._read(str(pid), "task", tid, "stat")
                )
            except OSError:
                lost = True
        return out, lost

    def _sample_one(self, pid: int) -> ProcRecord | None:
        """One process's record: what it is, its state, and its rates since the last sample;
        None when it exited.

        A single-threaded process whose schedstat reads exactly as at the last sample neither
        ran nor waited for a CPU in between (schedstat counts nanoseconds), so its counters and
        state are those of the last sample: its record is the last one with every rate zero,
        and neither its stat nor its io file is read (an idle DataLoader worker: two reads and
        their parsing saved per sample). Its stat is still read every :data:`RELIST_EVERY`
        samples: memory the kernel reclaims from a process that does not run changes it."""
        idle = self._idle.get(pid)
        sched: str | None = None
        if idle is not None:
            try:
                sched = self._pread(pid, "schedstat")
            except OSError:
                return None  # exited between discovery and read
            if sched == idle[1] and self._n % RELIST_EVERY:
                return self._serve_idle(pid, idle[2], self._clock())
        try:
            text = self._pread(pid, "stat")
            t = self._clock()
        except OSError:
            return None  # exited between discovery and read
        if idle is not None and idle[0] == text and sched == idle[1]:
            return self._serve_idle(pid, idle[2], t)
        read = self._parse_stat(text, t)
        if read is None:
            return None
        t, st = read
        cur = self._read_counters(pid, st, sched)
        prev_t, prev = self._prev.get(pid, _NO_PREV)
        if prev is not None and prev.starttime != st.starttime:
            self.known.pop(pid, None)  # the pid was handed to a new process between samples
        known = self.known.get(pid)
        # new, or renamed since (a DataLoader worker names itself pt_data_worker after its
        # fork: first seen before that, under a CPU quota, it kept its parent's name), or
        # reniced (a worker_init_fn calling os.nice)
        if known is None or known["name"] != st.comm or known["nice"] != st.nice:
            self.known[pid] = self._identity(pid, st)
        self._prev[pid] = (t, cur)
        rec = self._state(pid, st)
        if prev is not None:
            rec.update(proc_rates(prev, cur, t - prev_t))
            sched = self._sched_text.get(pid)
            if st.threads == 1 and sched is not None:
                zero = cast(ProcRates, {k: 0.0 for k in RATES if k in rec})
                self._idle[pid] = (text, sched, {**rec, **zero})
            else:
                self._idle.pop(pid, None)
        return rec

    def _serve_idle(self, pid: int, template: ProcRecord, t: float) -> ProcRecord:
        """The record of a process that did not run since the last sample: its last one,
        every rate zero (``template``); its counters stand, read at ``t``."""
        self._prev[pid] = (t, self._prev[pid][1])
        rec = template.copy()
        self._served[str(pid)] = (rec, template)
        return rec

    def _parse_stat(self, text: str, t: float) -> tuple[float, ProcStat] | None:
        """(monotonic time of the read, /proc/PID/stat parsed); None for a zombie not yet
        reaped or an unparsable text (nothing left to measure)."""
        try:
            st = parse_pid_stat(text)
        except ParseError:
            return None
        if st.state in ("Z", "X"):
            return None
        return t, st

    def _read_counters(self, pid: int, st: ProcStat, sched: str | None = None) -> ProcCounters:
        """The process's counters: stat's, plus /proc/PID/io, schedstat (``sched``: its text
        when already read) and its main thread's schedstat; each missing one is None."""
        io = self._read_io(pid)
        sched_run: int | None = None
        sched_wait: int | None = None
        self._sched_text.pop(pid, None)
        try:
            if sched is None:
                sched = self._pread(pid, "schedstat")
            sched_run, sched_wait = parse_schedstat(sched)
            self._sched_text[pid] = sched
        except (OSError, ParseError):
            pass
        # the main thread's time on a CPU or waiting for one (ns): single-threaded, the
        # process's own schedstat is its main thread's
        main_ns: int | None = None
        if st.threads > 1:
            try:
                main_ns = sum(parse_schedstat(self._pread(pid, f"task/{pid}/schedstat")))
            except (OSError, ParseError):
                pass
        elif sched_run is not None and sched_wait is not None:
            main_ns = sched_run + sched_wait
        return ProcCounters(
            st.starttime, st.utime + st.stime, main_ns, io, sched_wait, st.blkio_ticks
        )

    def _read_io(self, pid: int) -> ProcIo | None:
        """/proc/PID/io; None when unreadable (a note, once, when permission is denied)."""
        if self._io_denied:
            return None
        try:
            return parse_pid_io(self._pread(pid, "io"))
        except PermissionError:
            self._io_denied = True
            self.emit(
                "note",
                "/proc/PID/io not readable (needs the same user or "
                "CAP_SYS_PTRACE): per-process read bytes not reported",
            )
        except (OSError, ParseError):
            pass
        return None

    def _identity(self, pid: int, st: ProcStat) -> dict[str, Any]:
        """What the store keeps of a process: name, command line, parent, role, nice value."""
        try:
            cmd = self._read(str(pid), "cmdline").replace("\0", " ").strip()
        except OSError:
            cmd = ""
        return {
            "name": st.comm,
            "cmdline": cmd[:300],
            "ppid": st.ppid,
            "role": self._role(pid),
            "nice": st.nice,
        }

    def _state(self, pid: int, st: ProcStat) -> ProcRecord:
        """The record's fields of one read, no rates: name, role, state, memory, threads (and,
        for a multi-threaded trainer, how many threads are in D and how many are TensorFlow's)."""
        rec: ProcRecord = {
            "name": st.comm,
            "role": self._role(pid),
            "ppid": st.ppid,
            "state": st.state,
            "d_state": 1 if st.state == "D" else 0,
            "rss_mib": round(st.rss_pages * _PAGE / 1048576, 1),
            "threads": st.threads,
        }
        if st.threads > 1 and rec["role"] == "main":
            ts = self._threads(pid, st.threads)
            if ts is not None:
                rec["d_threads"] = ts.d
                rec["tf_threads"] = ts.tf
        return rec

    def counters(self) -> list[Counter]:
        """Per process of the latest ``sample()`` (entity = pid, as in the payload): CPU
        seconds (utime+stime), and read_bytes, write_bytes, rchar when ``/proc/PID/io`` is
        readable; see :func:`proc_counters`."""
        out: list[Counter] = []
        for pid, (_, c) in self._prev.items():
            out.extend(proc_counters(str(pid), c.cpu_ticks, c.io))
        return out


def procs_points(payload: ProcsPayload) -> list[Point]:
    """The numbers of a procs payload (pid -> fields) as points, entity = pid."""
    out: list[Point] = []
    for pid, fields in payload.items():
        out.extend(numeric_points("procs", pid, fields))
    return out


def proc_counters(entity: str, cpu_ticks: int, io: ProcIo | None) -> list[Counter]:
    """One process's raw counters in base units (clock ticks -> seconds, bytes as is)."""
    out: list[Counter] = [("procs.cpu_seconds_total", entity, cpu_ticks / _CLK_TCK)]
    if io is not None:
        out += [
            ("procs.read_bytes_total", entity, float(io.read_bytes)),
            ("procs.write_bytes_total", entity, float(io.write_bytes)),
            ("procs.rchar_bytes_total", entity, float(io.rchar)),
        ]
    return out


def tree_summary(payload: ProcsPayload) -> dict[str, float]:
    """Totals by role over one procs payload: cpu %, read kB/s, processes in D."""
    out: dict[str, float] = {}
    for rec in payload.values():
        role = rec.get("role", "worker")
        out[f"{role}_cpu_pct"] = out.get(f"{role}_cpu_pct", 0.0) + (rec.get("cpu_pct") or 0.0)
        out[f"{role}_read_kb_s"] = out.get(f"{role}_read_kb_s", 0.0) + (rec.get("read_kb_s") or 0.0)
        out[f"{role}_count"] = out.get(f"{role}_count", 0.0) + 1
        out[f"{role}_d_state"] = out.get(f"{role}_d_state", 0.0) + rec.get("d_state", 0)
    return out
