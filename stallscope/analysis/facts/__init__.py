"""Facts: every figure of a run, computed once, immutable, split by what they are about.

The walk from a stored run to what a user reads is a pipeline::

    store (run.db, meta.json, stacks/)  ->  RunData  ->  Facts  ->  findings  ->  renderers

:func:`compute_facts` turns a run (:class:`~stallscope.analysis.rundata.RunData`) into a
:class:`Facts`: the training window and its phases, the throughput, the stall share and where it
came from, each process's CPU (each figure named with its statistic), the dataset device, the
host, the ranks, the loader's configuration and the exit. The diagnosis rules read facts (never
the store again for a figure a fact holds); ``show``, ``compare``, ``diagnose``, ``report``,
``runs``, ``run``'s end summary and ``top``'s last line render them. No surface computes a
figure of its own, so one run shows one set of numbers everywhere
(``tests/integration/test_one_set_of_numbers.py`` holds every surface to it).

Each domain is a frozen dataclass; a mapping or list inside one is read-only
(:class:`types.MappingProxyType`, tuples). ``diagnose --json`` prints them flat under
``signals`` (:meth:`Facts.flat`), one key per fact, as it always has.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "DOMAINS",
    "WHERE",
    "CommFacts",
    "DiskFacts",
    "Facts",
    "GpuFacts",
    "HostFacts",
    "LoaderFacts",
    "ProcessFacts",
    "RunFacts",
    "StepFacts",
    "compute_facts",
    "frozen",
    "thawed",
]

_EMPTY: Mapping[str, Any] = types.MappingProxyType({})
_NO_COUNTS: Mapping[int, int] = types.MappingProxyType({})


def frozen(v: Any) -> Any:
    """A read-only copy of ``v``: dicts become mapping proxies, lists tuples (deeply)."""
    if isinstance(v, Mapping):
        return types.MappingProxyType({k: frozen(x) for k, x in v.items()})
    if isinstance(v, (list, tuple)):
        return tuple(frozen(x) for x in v)
    return v


def thawed(v: Any) -> Any:
    """Plain dicts and lists again (for JSON)."""
    if isinstance(v, Mapping):
        return {k: thawed(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [thawed(x) for x in v]
    return copy.copy(v)


@dataclass(frozen=True)
class RunFacts:
    """The run around the training: its length, samples, window and phases, and its exit."""

    duration_s: float = 0.0
    samples: int = 0  #: machine samples stored
    #: the training window (analysis/window.py): where it came from, its length, and the
    #: process's start-up before it and exit after it (seconds; None when unknown)
    window_source: str | None = None
    window_s: float | None = None
    startup_s: float | None = None
    exit_s: float | None = None
    #: what the exit was spent on: the heaviest folded stacks after the window, with seconds
    exit_stacks: tuple[tuple[str, float], ...] = ()
    #: the trainer's exit status as a shell shows it (a signal N as 128 + N), None while running
    exit_code: int | None = None
    #: the signal that ended it ("SIGINT") or that `run` forwarded to it; None for a plain exit
    exit_signal: str | None = None
    #: the user stopped it (Ctrl-C, SIGTERM forwarded by `run`): its exit is not a finding
    interrupted: bool = False
    #: the last uncaught exception of the trainer's Python processes ("ModuleNotFoundError: No
    #: module named 'torch'", ``<run>/errors.jsonl``) and when, in seconds into the run
    error: str | None = None
    error_at_s: float | None = None
    #: whether the run trained: True with any evidence of it (steps, training frames in its
    #: stacks, DataLoader workers, GPU work), False when its stacks were sampled and show none,
    #: None when nothing can tell (no stacks, no probe, no workers, no GPU)
    trained: bool | None = None


@dataclass(frozen=True)
class StepFacts:
    """The training's steps: from the probe, else from the training thread's sampled stacks."""

    steps: int = 0
    ranks: int = 0
    #: data wait / step wall time over every step of the window, as the trainer's own timer
    #: sees it (probe); or the sampled or estimated share (``stall_source``)
    stall_fraction: float | None = None
    #: the probe's share with each rank's first step left out (warm-up: worker start,
    #: cuDNN autotuning): the steady state, labelled as such wherever it is shown
    steady_stall_fraction: float | None = None
    #: "probe", "stacks" (sampled stacks), "gpu_idle", "main_thread" or None
    stall_source: str | None = None
    #: the training thread's share of time per phase, from its sampled stacks (the focus rank's)
    phase_shares: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    stack_sampler: str | None = None  #: "inproc" (injected by `run`) or "py-spy" (attached)
    stack_samples: int = 0
    wait_ms_median: float | None = None
    step_ms_median: float | None = None
    #: how the probe's data wait is spread over the steps (the focus rank's, each rank's first
    #: step left out): the share of it in the longest-waiting 10% of the steps (burst: a few
    #: long waits, none on the rest), and the 99th percentile of one step's wait
    wait_top_share: float | None = None
    wait_ms_p99: float | None = None
    #: where ``wait_ms_median``, ``step_ms_median``, ``wait_top_share`` and ``wait_ms_p99``
    #: came from: "probe" (its steps), "counted_batches" (no probe: the batches the in-trainer
    #: sampler timed, :mod:`stallscope.sources.stacks.batches`, bucket middles: ±10%), None
    step_timing_source: str | None = None
    h2d_share: float | None = None
    epochs: int = 0
    epoch_start_wait_s: float | None = None  #: median wait of the first step of epochs >= 1
    #: what each epoch start cost beyond an ordinary step's wait (s), and all of them together
    epoch_start_cost_s: float | None = None
    epoch_start_total_s: float | None = None
    #: the run's throughput (:mod:`stallscope.analysis.throughput`: the one definition) and
    #: where it came from ("probe", "counted_batches")
    samples_per_s: float | None = None
    throughput_source: str | None = None


@dataclass(frozen=True)
class GpuFacts:
    gpus: int = 0
    #: NVML utilization over the window's steady state (after the GPU's warm-up)
    gpu_util_median_pct: float | None = None
    gpu_idle_share: float | None = None
    #: seconds at the window's start before the GPU reached its working level (cuDNN
    #: autotuning, kernel compilation, lazy loading); left out of the two figures above
    gpu_warmup_s: float | None = None
    #: the GPU's busy share between the steps' CUDA events (probe): 1 less the gaps between
    #: steps on the GPU's timeline
    gpu_busy_share: float | None = None


@dataclass(frozen=True)
class LoaderFacts:
    """The input pipeline: the loader's own configuration and its worker processes."""

    #: the loader's knobs and the machine's, as the probe recorded them (empty without a probe)
    config: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    #: DataLoader workers alive at one time (the most seen together in one sample: a loader
    #: without persistent workers starts new ones each epoch, never more at once)
    workers: int = 0
    #: where ``workers`` came from: "config" (the probe read the loader's num_workers) or
    #: "processes" (the most worker processes alive together)
    workers_source: str | None = None
    worker_cpu_pct: float | None = None  #: mean CPU of one worker (100 = one core)
    worker_d_share: float | None = None  #: share of worker samples in state D
    worker_blkio_pct: float | None = None
    worker_runq_pct: float | None = None
    worker_read_kb_s: float | None = None  #: all workers together, from storage
    worker_rchar_kb_s: float | None = None  #: all workers together, incl. page cache
    #: a thread loader (stallscope.analysis.threads): the trainer's other Python threads that
    #: fetched or prepared data (the most in one window; 0: none), their thread-seconds'
    #: shares fetching, preparing and idle, how many worked at once (mean over the training),
    #: the CPU they got (cores), and the training thread's share of time waiting on them
    loader_threads: int = 0
    thread_fetch_share: float | None = None
    thread_prep_share: float | None = None
    thread_idle_share: float | None = None
    thread_busy: float | None = None
    thread_cpu_cores: float | None = None
    thread_wait_share: float | None = None
    #: the sampler thread's mean wait for the GIL per wake (ms) while loader threads worked:
    #: a contended GIL (stallscope.sources.stacks.threads); None where schedstat is unreadable
    thread_gil_wait_ms: float | None = None
    #: what each batch cost a worker (fetch, transform, collate; timed inside the workers by the
    #: sampler ``run`` injects: sources/stacks/fetches.py): the histogram (bucket -> batches),
    #: how many, the median and 99th percentile (ms), and the share of all the loading time the
    #: slowest 5% of the batches took (a heavy tail holds most of it)
    batch_cost_hist: Mapping[int, int] = field(default_factory=lambda: _NO_COUNTS)
    batches_timed: int = 0
    batch_cost_p50_ms: float | None = None
    batch_cost_p99_ms: float | None = None
    batch_cost_tail_share: float | None = None


@dataclass(frozen=True)
class ProcessFacts:
    """The trainer's own (main) processes."""

    main_cpu_pct: float | None = None  #: mean CPU of the trainer's main process(es), summed
    main_runq_pct: float | None = None  #: the trainer's main process(es): run-queue wait
    #: share of the training time the trainer's main thread ran (no probe: the consumer's busy
    #: share; the rest it waited, for data above all)
    main_thread_busy_share: float | None = None
    main_d_share: float | None = None
    #: the trainer runs TensorFlow (threads named tf_*): tf.data works on its threads
    tf_trainer: bool = False
    main_read_kb_s: float | None = None
    #: the trainer's main process runs Python (its name or command line says so); None when
    #: no process was recorded
    main_python: bool | None = None
    #: every process of the training's tree, main first: ``pid``, ``role``, ``name``,
    #: ``cmdline``, ``cpu_mean_pct`` (mean over the training window, 100 = one core: the
    #: statistic ``compare``'s trainer CPU is for one trainer), ``rss_max_mib`` (over the run),
    #: ``first_ts``/``last_ts`` (when it was seen)
    processes: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class DiskFacts:
    device: str | None = None
    device_named: bool = False  #: from --data (True) or the busiest device (False)
    disk_util_median_pct: float | None = None
    disk_util_p95_pct: float | None = None
    disk_r_await_median_ms: float | None = None
    disk_r_await_p95_ms: float | None = None
    disk_rkb_s_median: float | None = None
    disk_rkb_s_p95: float | None = None
    disk_r_s_median: float | None = None
    disk_rareq_kb_median: float | None = None
    disk_rkb_s_cv: float | None = None  #: variation of read throughput while reading
    disk_aqu_sz_median: float | None = None
    #: the read limit of the trainer's cgroup on that device, kB/s (meta ``read_limits``)
    read_limit_kb_s: float | None = None


@dataclass(frozen=True)
class HostFacts:
    host_cpu_median_pct: float | None = None
    host_max_core_median_pct: float | None = None
    #: cores the host's other processes kept busy (median over samples: the host's busy cores
    #: less the training's own processes' CPU)
    others_cpu_cores: float | None = None
    #: of those, the cores processes at a lower priority than the trainer kept busy (the host's
    #: niced CPU less the training's own niced processes'): new workers of a trainer at nice
    #: <= 0 take these first. 0 for a niced trainer; None when a run did not record it
    niced_others_cpu_cores: float | None = None
    iowait_median_pct: float | None = None
    psi_io_median_pct: float | None = None
    mem_available_min_mib: float | None = None
    physical_cores: int | None = None
    logical_cores: int | None = None


@dataclass(frozen=True)
class CommFacts:
    """The ranks (DDP): each rank's own picture; the job goes at the pace of the worst."""

    ranks_detail: tuple[Mapping[str, Any], ...] = ()
    focus_rank: int | None = None  #: the rank whose input holds the job back (its evidence)
    #: the rank its peers wait for in collectives, whatever its cause
    comm_straggler: int | None = None
    #: the collective's own cost as a share of the step (None when not timed per step)
    comm_transfer_share: float | None = None


DOMAINS: tuple[tuple[str, type], ...] = (
    ("run", RunFacts),
    ("steps", StepFacts),
    ("gpu", GpuFacts),
    ("loader", LoaderFacts),
    ("procs", ProcessFacts),
    ("disk", DiskFacts),
    ("host", HostFacts),
    ("comm", CommFacts),
)
#: fact name -> its domain (names are unique across domains: ``diagnose --json`` is flat)
WHERE: dict[str, str] = {f.name: dom for dom, cls in DOMAINS for f in fields(cls)}
assert len(WHERE) == sum(len(fields(cls)) for _d, cls in DOMAINS), "a fact named twice"


@dataclass(frozen=True)
class Facts:
    """Every fact of one run, by domain."""

    run: RunFacts = field(default_factory=RunFacts)
    steps: StepFacts = field(default_factory=StepFacts)
    gpu: GpuFacts = field(default_factory=GpuFacts)
    loader: LoaderFacts = field(default_factory=LoaderFacts)
    procs: ProcessFacts = field(default_factory=ProcessFacts)
    disk: DiskFacts = field(default_factory=DiskFacts)
    host: HostFacts = field(default_factory=HostFacts)
    comm: CommFacts = field(default_factory=CommFacts)

    def get(self, name: str) -> Any:
        """One fact by its flat name; a name that is no fact raises (a misspelt key must not
        drop evidence silently)."""
        dom = WHERE.get(name)
        if dom is None:
            raise KeyError(f"no fact named {name!r}")
        return getattr(getattr(self, dom), name)

    def evidence(self, *keys: str) -> dict[str, Any]:
        """The named facts that have a value, for a finding's evidence (plain copies)."""
        out: dict[str, Any] = {}
        for k in keys:
            v = self.get(k)
            if v is not None:
                out[k] = thawed(v)
        return out

    def flat(self) -> dict[str, Any]:
        """Every fact with a value, one key each (``diagnose --json``'s ``signals``)."""
        out: dict[str, Any] = {}
        for dom, _cls in DOMAINS:
            part = getattr(self, dom)
            for f in fields(part):
                v = getattr(part, f.name)
                if v is None or (isinstance(v, Mapping) and not v):
                    continue
                out[f.name] = thawed(v)
        return out

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Facts:
        """Facts from flat values (every name a fact; read-only copies made)."""
        parts: dict[str, dict[str, Any]] = {dom: {} for dom, _c in DOMAINS}
        for k, v in values.items():
            dom = WHERE.get(k)
            if dom is None:
                raise KeyError(f"no fact named {k!r}")
            parts[dom][k] = frozen(v)
        return cls(**{dom: c(**parts[dom]) for dom, c in DOMAINS})


def compute_facts(data: Any) -> Facts:
    """The facts of a run (see the module docstring)."""
    from stallscope.analysis.facts.build import build

    return build(data)
