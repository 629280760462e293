"""The ``stallscope top`` loop: sources -> :class:`~stallscope.collect.Collector` (its own
thread, every ``interval``) -> :class:`LiveSink` -> :func:`render` on the main thread.

On a terminal: a full screen (rich ``Live``, alternate screen) redrawn on every new sample, on
a key and on a resize; keys read in cbreak mode. The main thread only ``select``s on the
terminal and the sink's wake-up pipe, so a key is handled at once whatever the sampling does.
Otherwise (stdout a pipe or a file): one plain frame per sample, no escape codes.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from stallscope.collect.collector import Collector
from stallscope.errors import StallscopeError
from stallscope.live.agent_feed import agent_sources
from stallscope.live.sink import LiveSink
from stallscope.live.term import Terminated, cbreak, read_keys, signals_raise
from stallscope.live.training import TrainingWatch
from stallscope.live.view import ViewState, move_selection, render
from stallscope.sources import SOURCE_NAMES, Source, open_sources

__all__ = ["ProcessNotReadable", "open_top_sources", "run_top"]

_SORT_KEYS = {"c": "cpu", "m": "mem", "r": "read"}


class ProcessNotReadable(StallscopeError):
    """``--pid`` names a process that does not exist or cannot be read."""

    exit_code = 1


def open_top_sources(
    pid: int | None, agent: str | None = None
) -> tuple[list[Source], dict[str, str]]:
    """The machine-wide sources (read from the agent at ``agent`` when given), plus the process
    tree of ``pid`` when given (an unreadable ``pid`` raises :class:`ProcessNotReadable`;
    nothing is left open)."""
    procs: list[Source] = []
    if pid is not None:
        procs, bad = open_sources(("procs",), root_pid=pid)
        if bad:
            raise ProcessNotReadable(f"cannot watch --pid {pid}: {bad['procs']}")
    if agent is not None:
        sources, unavailable = agent_sources(agent, SOURCE_NAMES)
    else:
        sources, unavailable = open_sources(SOURCE_NAMES)
    return sources + procs, unavailable


def run_top(
    *,
    interval: float,
    pid: int | None,
    count: int | None,
    console: Console | None = None,
    agent: str | None = None,
) -> int:
    """Run the view until ``q``, Ctrl-C, SIGTERM/SIGHUP or ``count`` frames; the exit code."""
    console = console or Console(highlight=False)
    sources, unavailable = open_top_sources(pid, agent)
    sink = LiveSink()
    collector = Collector(sources, [sink], interval=interval, unavailable=unavailable)
    state = ViewState(
        interval=interval,
        root_pid=pid,
        unavailable=unavailable,
        unicode=(console.encoding or "").lower().startswith("utf"),
    )
    state.follow = TrainingWatch(pid)
    state.via = agent.split("://", 1)[-1].rstrip("/") if agent else None
    try:
        with signals_raise(on_winch=sink.wake):
            collector.start()
            first = sink.get()[0]  # the priming sample (no rates yet) is not shown
            if console.is_terminal:
                _screen(console, sink, state, first, count)
            else:
                _plain(console, sink, state, first, count)
    except KeyboardInterrupt:
        return 0
    except Terminated as exc:
        return 128 + exc.signum
    finally:
        collector.stop(final_sample=False)
        sink.release()
        if state.follow is not None:
            state.follow.stop()
    return 0


def _wait(fds: Sequence[int], timeout: float | None) -> list[int]:
    ready, _, _ = select.select(list(fds), [], [], timeout)
    return ready


#: the width plain frames are laid out for: lines are never cut for a terminal that is not
#: there (the 80 columns a console assumes for a pipe cut process command lines)
PIPED_WIDTH = 1000


def _plain(
    console: Console, sink: LiveSink, state: ViewState, first: int, count: int | None
) -> None:
    """One plain frame per new sample (no height limit: every disk and process; full lines, for
    files and logs)."""
    state.keys = False
    state.piped = True
    frames, shown = 0, first
    while count is None or frames < count:
        _wait([sink.fd], None)
        sink.drain()
        seq, sample = sink.get()
        if seq == shown or sample is None:
            continue
        shown = seq
        state.events = list(sink.events)
        state.training = state.follow.view(wait=True) if state.follow is not None else None
        if frames:
            console.print()
        for line in render(sample, state, PIPED_WIDTH, None):
            line.rstrip()  # section headers are padded across the width
            console.print(line, soft_wrap=True)
        console.file.flush()
        frames += 1


def _screen(
    console: Console, sink: LiveSink, state: ViewState, first: int, count: int | None
) -> None:
    """The full-screen view with keys (when stdin is a terminal too)."""
    stdin_fd: int | None = None
    try:
        if os.isatty(sys.stdin.fileno()):
            stdin_fd = sys.stdin.fileno()
    except (OSError, ValueError, AttributeError):
        stdin_fd = None
    state.keys = stdin_fd is not None
    terminal = cbreak(stdin_fd) if stdin_fd is not None else nullcontext()
    live_screen = Live(
        console=console,
        screen=True,
        auto_refresh=False,
        redirect_stdout=False,
        redirect_stderr=False,
    )
    with terminal, live_screen as live:
        shown_seq, shown = first, None
        frames = 0

        def draw() -> None:
            c0 = time.thread_time()
            size = console.size
            lines = render(shown, state, size.width, size.height)
            live.update(Group(*lines), refresh=True)
            state.draw_cpu_s = time.thread_time() - c0

        draw()
        while count is None or frames < count:
            fds = [sink.fd] if stdin_fd is None else [sink.fd, stdin_fd]
            ready = _wait(fds, None)
            redraw = False
            if stdin_fd is not None and stdin_fd in ready:
                keys = read_keys(stdin_fd)
                if not keys:  # end of input: the terminal went away
                    return
                for k in split_keys(keys):
                    if k in ("q", "Q"):
                        return
                    redraw = True
                    if state.help:  # any key closes the help
                        state.help = False
                    elif k in ("h", "?"):
                        state.help = True
                    elif k in _SORT_KEYS:
                        state.sort = _SORT_KEYS[k]
                    elif k in ("p", "P", " "):
                        state.paused = not state.paused
                    elif k in (DOWN, "j"):
                        move_selection(state, 1)
                    elif k in (UP, "k"):
                        move_selection(state, -1)
                    elif k == ESC:
                        state.selected = None
                    elif k in ("\r", "\n") and state.selected is not None:
                        _follow(state, int(state.selected))
                    else:
                        redraw = False
            if sink.fd in ready:
                sink.drain()
                seq, sample = sink.get()
                state.events = list(sink.events)
                if seq != shown_seq and not state.paused:
                    shown_seq, shown = seq, sample
                    state.training = state.follow.view() if state.follow is not None else None
                    frames += 1
                redraw = True  # new sample, an event or a resize
            if redraw:
                draw()


#: the escape sequences of the arrow keys (normal and application cursor mode), and Esc
UP, DOWN, ESC = "\x1b[A", "\x1b[B", "\x1b"
_ARROWS = {"\x1b[A": UP, "\x1bOA": UP, "\x1b[B": DOWN, "\x1bOB": DOWN}


def split_keys(text: str) -> list[str]:
    """What one read of the terminal holds, as keys: an arrow's escape sequence is one key; a
    lone Esc is Esc; any other escape sequence is skipped whole."""
    out: list[str] = []
    i = 0
    while i < len(text):
        seq = text[i : i + 3]
        if seq in _ARROWS:
            out.append(_ARROWS[seq])
            i += 3
        elif text[i] == "\x1b":
            j = i + 1
            if j < len(text) and text[j] in "[O":  # some other sequence: up to its final byte
                j += 1
                while j < len(text) and not ("@" <= text[j] <= "~"):
                    j += 1
                i = j + 1
            else:
                out.append(ESC)
                i += 1
        else:
            out.append(text[i])
            i += 1
    return out


def _follow(state: ViewState, pid: int) -> None:
    """The TRAINING panel follows the training of ``pid`` from now on."""
    if state.follow is not None:
        state.follow.stop()
    state.follow = TrainingWatch(pid)
    state.followed = pid
    state.training = state.follow.view()


def frame_text(lines: Sequence[Text]) -> str:
    """The frame's lines as plain text (for tests and benchmarks)."""
    return "\n".join(t.plain for t in lines)
