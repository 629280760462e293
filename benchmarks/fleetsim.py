"""Simulated DDP jobs for ``bench_fleet.py``: step records of many ranks on many nodes, replayed
from real ones, with slowdowns injected on known ranks at known times.

Every rank of a job draws its own time per step (data wait + compute, without the all-reduce)
from one of the two ranks of a real gloo run here (``tests/fixtures/ddp-steps``, 908 steps
each), at an offset of its own, detrended (its seconds-long slow stretches taken out, the
step-to-step jitter kept: ``load_recording``) and scaled to the recording's common median so
that no rank is slower than another by nature. A step lasts as long as its slowest rank's own
time plus the all-reduce itself (the least communication time of the recorded step); every rank's
communication wait is the step minus its own time, as the probe measures it
(``sources/comm.py``).

A :class:`Fault` makes ranks slower by a factor ``1 + x`` from ``start`` to ``end``: by more
compute per step (cause ``compute``: the host part grows) or by more data wait (cause
``input``), on one rank or on every rank of one node (scope ``node``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

FIXTURE = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "fixtures"
    / "ddp-steps"
    / "gloo-2rank-cpu.json"
)

__all__ = ["FIXTURE", "Fault", "Job", "Recording", "load_recording"]


@dataclass(frozen=True)
class Recording:
    """Per recorded rank: (data wait, own time) per step, scaled to one median own time;
    per step, the all-reduce's own cost (the least communication time of the step)."""

    own: tuple[tuple[tuple[float, float], ...], ...]
    comm: tuple[float, ...]
    median_own_s: float


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


#: steps of the moving mean each rank's recording is divided by (about 4 s of steps)
DETREND_STEPS = 101


def _detrended(
    waits: list[float], owns: list[float], steps: int
) -> tuple[list[float], list[float]]:
    """Each step's (wait, own time) divided by the moving mean of own times around it (a
    circular window of ``steps``: the replay loops), times the rank's overall mean: the step's
    jitter stays, stretches of the recording where the rank ran slower for seconds go."""
    n = len(owns)
    if steps <= 1 or n < steps:
        return waits, owns
    half = steps // 2
    overall = sum(owns) / n
    window = sum(owns[(i - half) % n] for i in range(steps))
    out_w, out_o = [], []
    for i in range(n):
        f = overall / (window / steps)
        out_w.append(waits[i] * f)
        out_o.append(owns[i] * f)
        window += owns[(i + half + 1) % n] - owns[(i - half) % n]
    return out_w, out_o


def load_recording(path: Path = FIXTURE, detrend_steps: int = DETREND_STEPS) -> Recording:
    """The recording, each rank detrended (``detrend_steps``; 0: as recorded) and scaled to
    the ranks' common median own time.

    Detrended because in 20-s windows (what the straggler rules look at) a recorded rank's own
    time drifts by ±5% around its mean (this VM's noise): replayed from different offsets, two
    ranks then differ by up to 10% for tens of seconds with no cause anyone injected, and the
    benchmark could not tell an alarm on them from a false one. ``--raw-recording`` of
    bench_fleet.py replays them as recorded."""
    doc = json.loads(path.read_text())
    ranks = [doc["ranks"][k] for k in sorted(doc["ranks"], key=int)]
    n = min(len(r) for r in ranks)
    pairs = [
        _detrended([w for w, _h, _c in r[:n]], [w + h - c for w, h, c in r[:n]], detrend_steps)
        for r in ranks
    ]
    common = _median([_median(o) for _w, o in pairs])
    scaled = []
    for waits, o in pairs:
        f = common / _median(o)
        scaled.append(tuple((waits[i] * f, o[i] * f) for i in range(n)))
    comm = tuple(min(r[i][2] for r in ranks) for i in range(n))
    return Recording(tuple(scaled), comm, common)


@dataclass(frozen=True)
class Fault:
    job: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    start: float
    end: float
    x: float  #: 0.1 = 10% slower
    cause: str  #: "compute" or "input"
    scope: str  #: "rank" or "node"


@dataclass
class Job:
    """One DDP job over ``nodes`` (names), ``ranks_per_node`` ranks each (global rank =
    node index × ranks_per_node + local rank), stepping from ``t0`` on."""

    name: str
    nodes: list[str]
    ranks_per_node: int
    rec: Recording
    t0: float
    seed: int = 0
    faults: list[Fault] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        n = len(self.rec.comm)
        self.size = len(self.nodes) * self.ranks_per_node
        self._src = [r % len(self.rec.own) for r in range(self.size)]
        self._off = [rng.randrange(n) for _ in range(self.size)]
        self._comm_off = rng.randrange(n)
        self.k = 0
        self.t = self.t0

    def node_of(self, rank: int) -> str:
        return self.nodes[rank // self.ranks_per_node]

    def _active(self, t: float) -> list[Fault]:
        return [f for f in self.faults if f.start <= t < f.end]

    def steps_until(
        self, now: float
    ) -> dict[str, list[tuple[int, int, float, float, float, float]]]:
        """Steps that ended by ``now``, per node: (rank, step, ts, wait_s, host_s, comm_s)."""
        out: dict[str, list[tuple[int, int, float, float, float, float]]] = {
            n: [] for n in self.nodes
        }
        n = len(self.rec.comm)
        while True:
            slow: dict[int, tuple[float, str]] = {}
            for f in self._active(self.t):
                for r in f.ranks:
                    slow[r] = (f.x, f.cause)
            waits, owns = [], []
            for r in range(self.size):
                w, o = self.rec.own[self._src[r]][(self._off[r] + self.k) % n]
                if r in slow:
                    x, cause = slow[r]
                    if cause == "input":
                        w += x * o
                    o *= 1.0 + x
                waits.append(w)
                owns.append(o)
            step = max(owns) + self.rec.comm[(self._comm_off + self.k) % n]
            if self.t + step > now:
                return out
            self.t += step
            for r in range(self.size):
                out[self.node_of(r)].append(
                    (r, self.k, self.t, waits[r], step - waits[r], step - owns[r])
                )
            self.k += 1


def schedule(
    job: Job,
    rng: random.Random,
    start: float,
    end: float,
    xs: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5),
    length_s: tuple[float, float] = (60.0, 90.0),
    gap_s: tuple[float, float] = (60.0, 120.0),
    node_share: float = 0.25,
) -> list[Fault]:
    """Faults one after another on ``job`` between ``start`` and ``end`` (never two at once:
    a rank slower than another straggler holds no one back): random rank or node, size,
    cause, length and pause."""
    faults = []
    t = start + rng.uniform(*gap_s) / 2
    while True:
        length = rng.uniform(*length_s)
        if t + length > end:
            break
        cause = rng.choice(("compute", "input"))
        if rng.random() < node_share and len(job.nodes) > 1:
            ni = rng.randrange(len(job.nodes))
            ranks = tuple(range(ni * job.ranks_per_node, (ni + 1) * job.ranks_per_node))
            scope = "node"
        else:
            ranks = (rng.randrange(job.size),)
            scope = "rank"
        faults.append(
            Fault(
                job.name,
                ranks,
                tuple(sorted({job.node_of(r) for r in ranks})),
                t,
                t + length,
                rng.choice(xs),
                cause,
                scope,
            )
        )
        t += length + rng.uniform(*gap_s)
    job.faults.extend(faults)
    return faults
