"""The hand-over of steps from the training thread to the writer thread, and the training
thread's own state.

An adapter measures steps on the training thread and hands each one over as a bare tuple laid
out like :class:`StepRecord` (building a tuple is ~4x cheaper than building a NamedTuple, and the
training thread is where cost matters) into a :class:`StepBuffer`: bounded, a full one drops
the newest step and counts it, never waits. The writer thread takes what it holds and makes the
typed records. :class:`StepState` is what only the training thread touches (the step counter,
the epoch, when the last step ended, the copies noted for the current step).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from stallscope.store.db import StepTuple

if TYPE_CHECKING:
    from stallscope.probe.device import DeviceMarks, EventLike

__all__ = [
    "DEFAULT_CAPACITY",
    "GROUP_S",
    "SAMPLED_STEP_S",
    "SAMPLE_EVERY",
    "SIZE_EVERY",
    "RawStep",
    "StepBuffer",
    "StepRecord",
    "StepState",
]

#: step records the buffer holds between flushes before records are dropped (about 1 min at
#: 1 kHz)
DEFAULT_CAPACITY = 65536
#: steps shorter than this are summed, consecutive ones, into records that span at least it
#: (a step this long or longer is a record of its own): the writer's cost per record (6-16 us
#: on the 2-core VM, most of it in SQLite, counted as if all of it were the trainer's) then
#: stays under 0.1% of any step (benchmarks/bench_probe_cuda.py; at 4 ms it was 0.4%).
#: ``$STALLSCOPE_GROUP_MS`` changes it; 0: a record a step
GROUP_S = 16e-3
#: steps shorter than this (on average over a record) are timed on a sample: one in
#: SAMPLE_EVERY, at random gaps, is timed in full (data wait apart), the others only counted,
#: and a record's data wait is its steps times those steps' mean wait; timing every step (two
#: clock reads of ~85 ns each and the bookkeeping) costs ~0.5 us, 1% of a 50-us step
#: (benchmarks/bench_probe_cuda.py)
SAMPLED_STEP_S = 200e-6
#: one step in this many (on average) is timed in full in a sampled record
SAMPLE_EVERY = 16
#: in a record of several steps, one batch in this many is counted (dim 0 of its first tensor
#: costs ~0.3 us, 0.6% of a 50-us step) and the others taken at the counted ones' mean; the
#: record's first batch and the epoch's last are always counted
SIZE_EVERY = 8


class StepRecord(NamedTuple):
    """One step as an adapter measured it, or ``n`` consecutive short steps summed (then
    ``step`` is the last one's number, ``t_got`` the first one's request plus their waits, and
    ``wait_s``, ``host_s``, ``samples`` and ``h2d_host_s`` their sums). Hot paths hand over a
    :data:`RawStep` tuple in this field order instead (cheaper to build); the writer thread
    makes the typed record."""

    step: int  #: step number within this recorder (0, 1, ...)
    t_got: float  #: ``time.perf_counter()`` when the batch was handed to the step
    wait_s: float  #: host time blocked waiting for the batch (data wait)
    host_s: float  #: host time of the step itself
    samples: int | None  #: batch size, when known
    epoch: int  #: which pass over the data
    h2d_host_s: float | None  #: host-timed copy to the device, when the adapter timed one
    gpu: DeviceMarks | None  #: device markers, opaque to the adapter (read by the writer)
    n: int = 1  #: steps the record covers (device-timed steps are always alone)


#: what the training thread hands over: a bare tuple in :class:`StepRecord`'s field order,
#: the layout the store takes whole (one declaration: :data:`stallscope.store.db.StepTuple`)
RawStep = StepTuple


class StepBuffer:
    """Bounded steps from the training thread to the writer thread: ``queue``, a deque
    (appending on one thread and popping from the left on another needs no lock).

    :meth:`push` appends a step (to ``timed`` when it carries device marks), or counts it in
    ``dropped`` when ``capacity`` steps wait already. A hot loop may do the same inline, without
    a call per step: bind ``queue``, ``timed`` and ``capacity`` once, append while
    ``len(queue) < capacity``, else add one to ``dropped``. The writer pops what each holds
    from the left at each flush."""

    __slots__ = ("capacity", "dropped", "queue", "timed")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = max(1, int(capacity))
        self.dropped = 0  #: steps not kept because the buffer was full (training thread)
        self.queue: deque[RawStep] = deque()
        #: the steps with device marks, apart: the writer hands the plain ones to the store as
        #: they are, with no look at each (it shares the trainer's interpreter lock)
        self.timed: deque[RawStep] = deque()

    def push(self, rec: RawStep) -> None:
        """Hand one step over (training thread); never waits."""
        if len(self.queue) < self.capacity:
            (self.queue if rec[7] is None else self.timed).append(rec)
        else:
            self.dropped += 1

    def __len__(self) -> int:
        return len(self.queue)


class StepState:
    """What only the training thread writes: the last step's number (``step``, -1 before the
    first), the ``epoch`` (-1 before the first), when the last step ended (``last_end``,
    ``perf_counter`` scale) and the copies to the device noted for the step under way
    (``h2d_s`` seconds timed on the host, ``h2d_events`` pairs of device events). Hot loops read
    and write these attributes directly."""

    __slots__ = ("epoch", "h2d_events", "h2d_s", "last_end", "step")

    def __init__(self) -> None:
        self.step = -1
        self.epoch = -1
        self.last_end: float | None = None
        self.h2d_s: float | None = None
        self.h2d_events: list[tuple[EventLike, EventLike]] | None = None

    def take_h2d(self) -> tuple[float | None, tuple[tuple[EventLike, EventLike], ...] | None]:
        """The copies noted since the last step ended (and forget them): host seconds and
        device event pairs, each None when there were none."""
        h, evs = self.h2d_s, self.h2d_events
        if h is not None:
            self.h2d_s = None
        if evs is not None:
            self.h2d_events = None
            return h, tuple(evs)
        return h, None
