"""Device (GPU) step timing as the recorder sees it: events an adapter lends, never a device.

An adapter supplies a :class:`DeviceTimer` (PyTorch: CUDA events); :class:`DeviceClock` is how
the recorder uses it: ready once the timer says so (off for good once it fails), events made by
the timer and pooled for reuse (making one can cost a driver call). The training thread takes
events and records them; the writer thread reads them once they completed and gives them back.
Nothing here knows which device or framework it times.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "DEVICE_TIMING_SHARE",
    "EVENT_RECORD_S",
    "MAX_FREE_EVENTS",
    "TIMED_STEP_S",
    "DeviceClock",
    "DeviceMarks",
    "DeviceTimer",
    "EventLike",
    "EventTimer",
    "Pairs",
    "timing_every",
]

#: device events kept for reuse (making one can cost a driver call)
MAX_FREE_EVENTS = 4096
#: what recording one device event costs the training thread (``torch.cuda.Event.record()``:
#: 6.1-7.2 µs on an H200, torch 2.11; tests/fixtures/gpu-h200/nvml-and-cuda-event-costs.txt)
EVENT_RECORD_S = 7e-6
#: what one device-timed step costs the trainer, both threads together (the training thread's two
#: records, the writer's ``query()`` and ``elapsed_time()`` calls under the trainer's interpreter
#: lock): 53 us on an H200, where timing every 3.3-ms step took it to 3.359 ms from 3.306 ms
#: (tests/fixtures/gpu-h200/session3/probe-cuda.log); four records alone would say 28 us
TIMED_STEP_S = 55e-6
#: the share of a step the probe's device timing may cost on average (a fifth of the probe's
#: 1%: its host side takes up to 0.65% of a 50-us step, benchmarks/bench_probe_cuda.py)
DEVICE_TIMING_SHARE = 0.002
#: at most one timed pair of steps in this many
MAX_TIMING_EVERY = 2000


def timing_every(step_s: float) -> int:
    """Time the device on a pair of consecutive steps once every this many steps, so that a
    pair (two :data:`TIMED_STEP_S`) costs at most :data:`DEVICE_TIMING_SHARE` of the steps'
    time: every step from 55 ms up, one pair in 550 for a 0.1-ms step. The second step of a
    pair gives the GPU's gap between steps; a regular subsample keeps both shares unbiased."""
    if not step_s > 0:
        return 1
    k = math.ceil(2 * TIMED_STEP_S / (DEVICE_TIMING_SHARE * step_s))
    return max(1, min(MAX_TIMING_EVERY, k))


class EventLike(Protocol):
    """A marker in the device's work stream (``torch.cuda.Event(enable_timing=True)`` obeys it).

    ``record()`` only enqueues it (never waits); ``query()`` says whether the device got there;
    ``elapsed_time`` is only asked once both events completed."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds from this event to ``end_event``."""
        ...


class DeviceTimer(Protocol):
    """How an adapter lends the recorder its device clock, so the recorder never knows which
    device (or framework) it times."""

    #: what the device is called in messages ("CUDA")
    name: str

    def ready(self) -> bool:
        """True once timing can be used. May stay False for a while (CUDA: until the trainer
        initializes it; the probe must never initialize a device itself); raising turns device
        timing off for good."""
        ...

    def event(self) -> EventLike:
        """A new, unrecorded event (the recorder pools and reuses them)."""
        ...


class EventTimer:
    """A :class:`DeviceTimer` from a bare event factory, always ready: for tests (fake events)
    and for frameworks whose device is ready as soon as events can be made."""

    __slots__ = ("event", "name")

    def __init__(self, events: Callable[[], EventLike], name: str = "device") -> None:
        self.event = events
        self.name = name

    def ready(self) -> bool:
        return True


#: device markers of one step: (start event, end event, ((h2d start, h2d end), ...) or None)
DeviceMarks = tuple[EventLike, EventLike, "tuple[tuple[EventLike, EventLike], ...] | None"]


class DeviceClock:
    """A recorder's device timing: the adapter's ``timer`` (None: no device timing), ``timing``
    once it said it is ready, and a pool of events for reuse. Hot loops may test ``timing`` and
    ``timer`` themselves before calling :meth:`ready` (cheaper than a call per step)."""

    __slots__ = ("_free", "_say", "timer", "timing")

    def __init__(self, timer: DeviceTimer | None, say: Callable[[str, str], None]) -> None:
        self.timer = timer
        self.timing = False
        self._free: list[EventLike] = []
        self._say = say

    @property
    def name(self) -> str:
        """The device's name in messages ("CUDA"; "device" without a timer)."""
        t = self.timer
        return t.name if t is not None else "device"

    def ready(self) -> bool:
        """True once device step timing can be used (the adapter's timer says so)."""
        if self.timing:
            return True
        timer = self.timer
        if timer is None:
            return False
        try:
            self.timing = bool(timer.ready())
        except Exception as exc:
            self.timer = None
            self._say("cuda", f"{timer.name} step timing off: {exc}")
            return False
        return self.timing

    def event(self) -> EventLike:
        """An unrecorded event: a pooled one, else a new one from the timer (training
        thread)."""
        free = self._free
        if free:
            return free.pop()
        assert self.timer is not None
        return self.timer.event()

    def release(self, ev: EventLike | None) -> None:
        """Give an event back once it was read (writer thread)."""
        if ev is not None and len(self._free) < MAX_FREE_EVENTS:
            self._free.append(ev)

    def record_failed(self, exc: Exception) -> None:
        """Recording an event failed (a CUDA error is sticky: the context is lost): device
        timing off for good, said once (a hot loop also drops its own copy of ``timing``)."""
        self._say("cuda", f"{self.name} event record failed, GPU step timing off: {exc}")
        self.timing, self.timer = False, None


class Pairs:
    """Which steps the probe times on the device (a watched loop's, or those timed by hand):
    pairs of consecutive steps (the second gives the GPU's gap between steps), one pair in
    :func:`timing_every` of the mean step since the last pair: every step from 55 ms up, so
    the events' cost stays under a fifth of a percent of a step at any step length (on an H200
    timing every step took a 50.5-us launch-bound step to 97.7 us)."""

    __slots__ = ("left", "n_mark", "paired", "t_mark")

    def __init__(self, t: float, step: int) -> None:
        self.left = self.paired = 0
        self.t_mark, self.n_mark = t, step

    def due(self) -> bool:
        """Whether this step is timed (one call per step)."""
        if self.left > 0:
            self.left -= 1
            return False
        return True

    def timed(self, t: float, step: int) -> None:
        """A timed step ended at ``t``: after a pair, when the next one is due."""
        self.paired += 1
        if self.paired == 2:
            self.paired = 0
            self.left = timing_every((t - self.t_mark) / max(1, step - self.n_mark)) - 2
            self.t_mark, self.n_mark = t, step

    @staticmethod
    def drop_copies(evs: Any, dev: Any) -> None:
        """Untimed steps' device-timed copies (``stallscope.h2d``): give their events back."""
        for a, b in evs:
            dev.release(a)
            dev.release(b)
