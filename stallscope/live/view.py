"""Drawing one frame of ``stallscope top``: a pure function of a sample, the view's state and
the screen's size, returning one rich ``Text`` per screen line.

Every line is laid out here to fit the width (no wrapping: long names are cut with an
ellipsis) and the lines are shared out to fit the height: the header, GPUs, host and footer
first, then the disks and the processes share what is left (a cut list ends with "… N more").
At 110 columns and more, extra columns appear (iostat's w_await and request sizes, threads,
write rate, run-queue wait and the command line). Text from the machine (process names,
command lines, device and GPU names, reasons) goes through :func:`stallscope.textsafe.plain`,
the project's escaper for rich ``Text``: control characters are shown as ``\\x1b``, so no
terminal escape sequence gets through.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from stallscope import units
from stallscope.analysis.diagnose.model import Kind
from stallscope.collect.collector import Event, Sample
from stallscope.live.training import WINDOW_S, TrainingView, TrainingWatch
from stallscope.sources.gpu import health_parts
from stallscope.sources.roles import infer_roles
from stallscope.textsafe import plain

__all__ = ["SORTS", "WIDE", "ViewState", "render"]

#: key -> (procs payload field, column label) of each process sort order
SORTS: dict[str, tuple[str, str]] = {
    "cpu": ("cpu_pct", "CPU%"),
    "mem": ("rss_mib", "RSS MiB"),
    "read": ("read_kb_s", "READ kB/s"),
}
#: from this many columns on, the wide layout (more columns per table)
WIDE = 110

_HEAD = "reverse bold"
_WARN = "yellow"
_BAD = "bold red"


@dataclass
class ViewState:
    """What the keys change, and what the frame says about itself."""

    interval: float = 1.0
    sort: str = "cpu"
    paused: bool = False
    root_pid: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    events: Sequence[Event] = ()
    draw_cpu_s: float | None = None  #: CPU seconds the previous frame took to draw
    keys: bool = True  #: keys are read (a terminal on stdin): say so in the footer
    #: frames go to a pipe or a file (``top | tee``): full lines, no key hints
    piped: bool = False
    unicode: bool = True
    #: what a probe in the watched training reports (None: no training with a probe found)
    training: TrainingView | None = None
    #: where ``training`` comes from (set by the app; the view only reads ``training``)
    follow: TrainingWatch | None = None
    #: the agent the machine-wide readings come from ("127.0.0.1:10127"), None: sampled here
    via: str | None = None
    host: str = field(default_factory=lambda: plain(os.uname().nodename, 40))
    help: bool = False  #: the help overlay is shown (h or ?)
    #: the process picked in the PROCESSES list (arrows or j/k): it stays picked, whatever the
    #: sort, until it exits; Enter makes the TRAINING panel follow its training
    selected: str | None = None
    #: the processes' order in the last frame drawn (what the arrows move through)
    order: list[str] = field(default_factory=list)
    followed: int | None = None  #: the pid the TRAINING panel follows after Enter


#: the help overlay: (keys, what they do)
HELP: tuple[tuple[str, str], ...] = (
    ("q", "quit"),
    ("h  ?", "this help (any key closes it)"),
    ("c  m  r", "sort processes by CPU, memory, disk reads"),
    ("↓ ↑  j k", "pick a process in the list (it stays picked whatever the sort)"),
    ("Enter", "the TRAINING panel follows the picked process's training"),
    ("Esc", "drop the pick"),
    ("p  space", "pause / resume the display (sampling goes on)"),
)


def move_selection(state: ViewState, step: int) -> None:
    """Pick the next (``step`` 1) or previous (-1) process of the last frame's order."""
    if not state.order:
        return
    if state.selected not in state.order:
        state.selected = state.order[0 if step > 0 else -1]
        return
    i = state.order.index(state.selected) + step
    state.selected = state.order[max(0, min(len(state.order) - 1, i))]


def _help_lines(width: int) -> list[Text]:
    out = [_line(("KEYS", "bold"), width=width)]
    for keys, what in HELP:
        out.append(_line((f"  {keys:<10}", "bold"), what, width=width))
    return out


# --- number formatting ------------------------------------------------------------------------
def _num(v: Any, width: int, digits: int = 1) -> str:
    """A number right-aligned in ``width``; '-' when missing; thousands without decimals."""
    if not isinstance(v, (int, float)) or v != v:
        return "-".rjust(width)
    if abs(v) >= 1000 or digits == 0:
        s = f"{v:,.0f}"
        if len(s) > width:
            s = f"{v:.0f}"
    else:
        s = f"{v:.{digits}f}"
    return s.rjust(width)


def _rate(kb_s: Any) -> str:
    """A ``*_kb_s`` metric (KiB/s) as a short SI rate: 812 kB/s, 12 MB/s, 1.2 GB/s."""
    if not isinstance(kb_s, (int, float)) or kb_s != kb_s:
        return "-"
    return units.rate(units.kib(kb_s))


def _pct_style(v: Any, warn: float, bad: float) -> str:
    if not isinstance(v, (int, float)):
        return ""
    return _BAD if v >= bad else _WARN if v >= warn else ""


def _cell(text: str, width: int, left: bool = False) -> str:
    """``text`` in exactly ``width`` columns, cut with an ellipsis."""
    if len(text) > width:
        text = text[: max(width - 1, 0)] + "…"
    return text.ljust(width) if left else text.rjust(width)


def _line(*parts: tuple[str, str] | str, width: int) -> Text:
    """One screen line from (text, style) parts, cut to ``width``."""
    t = Text(no_wrap=True, overflow="ellipsis")
    for p in parts:
        if isinstance(p, str):
            t.append(p)
        else:
            t.append(p[0], style=p[1] or None)
    t.truncate(width, overflow="ellipsis")
    return t


def _head(text: str, width: int) -> Text:
    """A section's header line, reverse video across the whole width."""
    return _line((_cell(text, width, left=True), _HEAD), width=width)


# --- sections ---------------------------------------------------------------------------------
def _gpu_lines(sample: Sample, state: ViewState, width: int) -> list[list[Text]]:
    """One entry per GPU (two lines each), or one line saying why there is none."""
    if "gpu" in state.unavailable:
        return [
            [
                _line(
                    ("gpu  ", "bold"),
                    ("unavailable: ", _WARN),
                    plain(state.unavailable["gpu"]),
                    width=width,
                )
            ]
        ]
    reading = sample.readings.get("gpu")
    gpus = reading.payload if reading is not None else None
    if not gpus:
        why = "no GPU found" if reading is not None else "no reading yet"
        return [[_line(("gpu  ", "bold"), why, width=width)]]
    out = []
    name_w = max(6, min(28, width - 70))
    deg = "°C" if state.unicode else "C"
    for g in gpus:
        lines = [_gpu_use_line(g, width, name_w, deg), _gpu_link_line(g, width)]
        if g.get("health_problem"):  # a GPU that needs a person: said on a line of its own
            what = health_parts(g) if isinstance(g, dict) else []
            mem_t = g.get("mem_temp_c")
            lines.append(
                _line(
                    "     health ",
                    (plain("; ".join(what)) or "problem", _BAD),
                    f"  HBM {_num(mem_t, 3, 0).strip()}{deg}"
                    if isinstance(mem_t, (int, float))
                    else "",
                    width=width,
                )
            )
        out.append(lines)
    return out


def _gpu_use_line(g: dict[str, Any], width: int, name_w: int, deg: str) -> Text:
    """A GPU's first line: its name, utilization, memory, temperature, power against its
    limit and SM clock."""
    total = g.get("mem_total_mib")
    used = g.get("mem_used_mib")
    mem = (
        units.memory(used, total)
        if isinstance(used, (int, float)) and isinstance(total, (int, float))
        else "-"
    )
    power = g.get("power_w")
    limit = g.get("power_limit_w")
    power_s = f"{_num(power, 4, 0).strip()}/{_num(limit, 3, 0).strip()} W"
    util = g.get("util_pct")
    temp = g.get("temp_c")
    l1 = _line(
        (f"gpu{g.get('index')} ", "bold"),
        _cell(plain(g.get("name", "?"), 80), name_w, left=True),
        "  util ",
        (_num(util, 3, 0) + "%", ""),
        "  mem ",
        mem,
        "  ",
        (f"{_num(temp, 3, 0)}{deg}", _pct_style(temp, 80, 87)),
        "  ",
        (
            power_s,
            _pct_style(
                power / limit * 100
                if isinstance(power, (int, float)) and isinstance(limit, (int, float)) and limit
                else None,
                95,
                101,
            ),
        ),
        f"  SM {_num(g.get('sm_clock_mhz'), 4, 0).strip()} MHz",
        width=width,
    )
    return l1


def _gpu_link_line(g: dict[str, Any], width: int) -> Text:
    """A GPU's second line: its throttle reasons (the serious ones in red) and its PCIe link,
    against its maximum, and traffic."""
    throttle = [plain(t, 40) for t in (g.get("throttle") or []) if t != "gpu_idle"]
    serious = any(t.startswith(("hw_", "sw_thermal")) for t in throttle)
    gen, gen_max = g.get("pcie_gen"), g.get("pcie_gen_max")
    wid, wid_max = g.get("pcie_width"), g.get("pcie_width_max")
    degraded = (isinstance(gen, int) and isinstance(gen_max, int) and gen < gen_max) or (
        isinstance(wid, int) and isinstance(wid_max, int) and wid < wid_max
    )
    l2 = _line(
        "     throttle ",
        (", ".join(throttle) or "none", _BAD if serious else _WARN if throttle else ""),
        "  PCIe ",
        (f"Gen{gen or '-'} x{wid or '-'}", _WARN if degraded else ""),
        f" (max Gen{gen_max or '-'} x{wid_max or '-'})",
        f"  rx {_rate(g.get('pcie_rx_kb_s'))} tx {_rate(g.get('pcie_tx_kb_s'))}",
        width=width,
    )
    return l2


def _cores(per_core: Sequence[Any], room: int, unicode: bool) -> list[str]:
    """Per-core busy %: numbers when they fit on one line, else one bar glyph per core,
    folded into lines of ``room`` columns."""
    nums = " ".join(_num(v, 3, 0) for v in per_core)
    if len(nums) <= room:
        return [nums]
    glyphs = " ▁▂▃▄▅▆▇█" if unicode else " .:-=+*#%@"
    bar = "".join(
        "?"
        if not isinstance(v, (int, float))
        else glyphs[min(len(glyphs) - 1, int(v / 100 * (len(glyphs) - 1) + 0.5))]
        for v in per_core
    )
    room = max(room, 8)
    return [bar[i : i + room] for i in range(0, len(bar), room)]


def _host_lines(sample: Sample, state: ViewState, width: int, core_lines: int) -> list[Text]:
    if "host" in state.unavailable:
        return [
            _line(
                ("host ", "bold"),
                ("unavailable: ", _WARN),
                plain(state.unavailable["host"]),
                width=width,
            )
        ]
    reading = sample.readings.get("host")
    if reading is None:
        return [_line(("host ", "bold"), "no reading yet", width=width)]
    h = reading.payload
    cpu, iowait = h.get("cpu_pct"), h.get("iowait_pct")
    summary: list[tuple[str, str] | str] = [
        ("cpu ", "bold"),
        (_num(cpu, 5) + "%", _pct_style(cpu, 80, 95)),
        "  iowait ",
        (_num(iowait, 4) + "%", _pct_style(iowait, 10, 25)),
        f"  load {_num(h.get('load1'), 4, 2).strip()}",
    ]
    per_core = h.get("cpu_per_core_pct") or []
    used = sum(len(p if isinstance(p, str) else p[0]) for p in summary)
    label = f"  {len(per_core)} cores: "
    lines: list[Text] = []
    fit = _cores(per_core, width - used - len(label), state.unicode)
    if len(fit) == 1:
        lines.append(_line(*summary, label, fit[0], width=width))
    else:
        lines.append(_line(*summary, width=width))
        folded = _cores(per_core, width - 6, state.unicode)
        if len(folded) > core_lines:
            folded = folded[:core_lines]
            folded[-1] = folded[-1][:-1] + "…"
        lines.extend(
            _line(("core " if i == 0 else "     ", "dim"), f, width=width)
            for i, f in enumerate(folded)
        )
    lines.append(_mem_line(h, width))
    psi = _psi_line(h, width)
    if psi is not None:
        lines.append(psi)
    return lines


def _psi_line(h: dict[str, Any], width: int) -> Text | None:
    """Pressure stall information: some for CPU, IO and memory, and IO full; None when the
    host has none."""
    psi: list[tuple[str, str] | str] = [("psi ", "bold"), "some: "]
    for label_, key in (
        ("cpu", "psi_cpu_some_pct"),
        ("io", "psi_io_some_pct"),
        ("mem", "psi_mem_some_pct"),
    ):
        v = h.get(key)
        psi += [f"{label_} ", (_num(v, 1).strip() + "%", _pct_style(v, 10, 40)), "  "]
    if h.get("psi_io_full_pct") is not None:
        psi += [
            "io full ",
            (
                _num(h.get("psi_io_full_pct"), 1).strip() + "%",
                _pct_style(h.get("psi_io_full_pct"), 5, 20),
            ),
        ]
    if any(k.startswith("psi_") for k in h):
        return _line(*psi, width=width)
    return None


def _mem_line(h: dict[str, Any], width: int) -> Text:
    """The host's memory line: used of total and available, swap in and out, /dev/shm."""
    total, used_m = h.get("mem_total_mib"), h.get("mem_used_mib")
    mem = (
        units.memory(used_m, total)
        if isinstance(total, (int, float)) and isinstance(used_m, (int, float))
        else "-"
    )
    swap_in, swap_out = h.get("swap_in_kb_s"), h.get("swap_out_kb_s")
    swapping = any(isinstance(v, (int, float)) and v > 0 for v in (swap_in, swap_out))
    shm_u, shm_t = h.get("shm_used_mib"), h.get("shm_total_mib")
    shm_pct = (
        shm_u / shm_t * 100
        if isinstance(shm_u, (int, float)) and isinstance(shm_t, (int, float)) and shm_t
        else None
    )
    return _line(
        ("mem ", "bold"),
        mem,
        f" (avail {units.size(units.mib(h.get('mem_available_mib') or 0))})",
        "  swap in/out ",
        (
            f"{_num(swap_in, 1, 0).strip()}/{_num(swap_out, 1, 0).strip()} kB/s",
            _WARN if swapping else "",
        ),
        "  shm ",
        (
            f"{_num(shm_u, 1, 0).strip()}/{_num(shm_t, 1, 0).strip()} MiB",
            _pct_style(shm_pct, 80, 95),
        ),
        width=width,
    )


#: (payload key, label, width): the disk columns, then those added in the wide layout
_DISK_COLS = (
    ("r_s", "r/s", 8),
    ("rkb_s", "rkB/s", 10),
    ("r_await_ms", "r_await", 8),
    ("w_s", "w/s", 8),
    ("wkb_s", "wkB/s", 10),
    ("aqu_sz", "aqu-sz", 7),
    ("util_pct", "%util", 6),
)
_DISK_WIDE = (
    ("w_await_ms", "w_await", 8),
    ("rareq_kb", "rareq-sz", 9),
    ("wareq_kb", "wareq-sz", 9),
)


def _busy(f: dict[str, Any]) -> tuple[float, float, float]:
    def n(k: str) -> float:
        v = f.get(k)
        return float(v) if isinstance(v, (int, float)) else 0.0

    return (n("util_pct"), n("rkb_s") + n("wkb_s"), n("r_s") + n("w_s"))


def _disk_lines(sample: Sample, state: ViewState, width: int) -> tuple[Text, list[Text]]:
    cols = _DISK_COLS + (_DISK_WIDE if width >= WIDE else ())
    dev_w = 12
    header = _head("DISK".ljust(dev_w) + "".join(" " + _cell(lbl, w) for _, lbl, w in cols), width)
    if "disk" in state.unavailable:
        return header, [
            _line(("unavailable: ", _WARN), plain(state.unavailable["disk"]), width=width)
        ]
    reading = sample.readings.get("disk")
    if reading is None:
        return header, [_line("no reading yet", width=width)]
    rows = []
    for dev, f in sorted(reading.payload.items(), key=lambda kv: _busy(kv[1]), reverse=True):
        parts: list[tuple[str, str] | str] = [_cell(plain(dev, 60), dev_w, left=True)]
        for key, _, w in cols:
            v = f.get(key)
            style = _pct_style(v, 60, 90) if key == "util_pct" else ""
            parts += [" ", (_num(v, w), style)]
        rows.append(_line(*parts, width=width))
    return header, rows


#: (label, width, payload key) of the process columns; wide adds threads, write, run-queue wait
_PROC_COLS = (("PID", 8), ("ROLE", 8), ("S", 1), ("CPU%", 6), ("RSS MiB", 8), ("READ kB/s", 10))
_PROC_WIDE = (("THR", 4), ("WRITE kB/s", 10), ("RUNQ%", 6))


def _proc_lines(sample: Sample, state: ViewState, width: int) -> tuple[list[Text], list[Text]]:
    wide = width >= WIDE
    key, label = SORTS[state.sort]
    arrow = "▼" if state.unicode else "v"
    cols = _PROC_COLS + (_PROC_WIDE if wide else ())
    head = ""
    for lbl, w in cols:
        shown = lbl + arrow if lbl == label else lbl
        head += (_cell(shown, w, left=True) if lbl in ("ROLE", "S") else _cell(shown, w)) + " "
    head += "NAME" + ("             CMDLINE" if wide else "")
    reading = sample.readings.get("procs")
    payload: dict[str, Any] = reading.payload if reading is not None else {}
    title = (
        f"PROCESSES of {state.root_pid}: {len(payload)} · sort: {state.sort} {arrow} "
        f"(c cpu · m mem · r read)"
    )
    headers = [_line((title, "bold"), width=width), _head(head, width)]
    if not payload:
        why = f"process {state.root_pid} has exited" if reading is not None else "no reading yet"
        return headers, [_line((why, _WARN), width=width)]
    attrs = reading.entities if reading is not None else {}
    roles = infer_roles(
        [{"entity": pid, "attrs": attrs.get(pid) or rec} for pid, rec in payload.items()]
    )

    def order(item: tuple[str, dict[str, Any]]) -> tuple[float, int]:
        v = item[1].get(key)
        return (-(float(v) if isinstance(v, (int, float)) else -1.0), int(item[0]))

    rows = []
    name_w = max(8, width - 48 - (23 if wide else 0)) if not wide else 16
    ranked = sorted(payload.items(), key=order)
    state.order = [pid for pid, _rec in ranked]
    if state.selected is not None and state.selected not in payload:
        state.selected = None  # the picked process exited
    for pid, rec in ranked:
        state_ = str(rec.get("state", "?"))[:1]
        cpu = rec.get("cpu_pct")
        parts: list[tuple[str, str] | str] = [
            _cell(pid, 8),
            " ",
            _cell(roles.get(pid, str(rec.get("role", "?"))), 8, left=True),
            " ",
            (plain(state_, 1), _BAD if state_ == "D" else ""),
            " ",
            (_num(cpu, 6), _pct_style(cpu, 90, 99)),
            " ",
            _num(rec.get("rss_mib"), 8),
            " ",
            _num(rec.get("read_kb_s"), 10),
            " ",
        ]
        if wide:
            runq = rec.get("runq_wait_pct")
            parts += [
                _num(rec.get("threads"), 4, 0),
                " ",
                _num(rec.get("write_kb_s"), 10),
                " ",
                (_num(runq, 6), _pct_style(runq, 20, 50)),
                " ",
            ]
        parts.append(_cell(plain(rec.get("name", "?"), 60), name_w, left=True))
        if wide:
            cmd = _short_cmd((attrs.get(pid) or {}).get("cmdline") or "")
            parts += [" ", (plain(cmd, 300), "dim")]
        row = _line(*parts, width=width)
        if pid == state.selected:
            row.stylize("reverse")
        rows.append(row)
    return headers, rows


def _short_cmd(cmd: str) -> str:
    """The command line with its program's directory dropped (``/a/venv/bin/python -c`` →
    ``python -c``): the column is narrow, and the arguments say more than the path."""
    prog, sep, rest = cmd.partition(" ")
    if "/" in prog:
        prog = prog.rsplit("/", 1)[1] or prog
    return prog + sep + rest


def _phase_parts(t: Any) -> list[tuple[str, str] | str]:
    """ "data 83% · compute 12% · other 5%" of the sampled stacks, biggest first."""
    ph = t.phases or {}
    shown = sorted(((k, x) for k, x in ph.items() if x >= 0.005), key=lambda kx: -kx[1])
    out: list[tuple[str, str] | str] = []
    for i, (k, x) in enumerate(shown):
        out.append(" · " if i else "  ")
        style = _pct_style(100 * x, 10, 30) if k in ("data", "comm", "gpu_wait") else ""
        out += [f"{k} ", (f"{100 * x:.0f}%", style)]
    rank = f", rank {t.phase_rank}" if t.phase_rank is not None else ""
    out.append(f" (sampled stacks{rank}, last {WINDOW_S:g} s)")
    return out


def _training_lines(state: ViewState, width: int) -> list[Text]:
    """Two lines from the training's probe (or its sampled stacks): live data wait, rates;
    the verdict so far."""
    t = state.training
    if t is None:
        return []
    share = t.wait_share
    parts: list[tuple[str, str] | str] = [("TRAINING", "bold")]
    if t.stack_note is not None:
        return [
            _line(*parts, ("  stacks not sampled: ", _WARN), plain(t.stack_note, 300), width=width)
        ]
    if share is None and (t.phases or t.sampled_only):
        parts += _phase_parts(t) if t.phases else [("  sampling its stack…", "dim")]
        parts.append(f"  {plain(t.run_id, 60)}")
        lines = [_line(*parts, width=width)]
        if t.verdict is not None:
            lines.append(
                _line(
                    "verdict  ",
                    (plain(t.verdict, 40), "bold"),
                    f"  {plain(t.reason or '', 300)}",
                    width=width,
                )
            )
        return lines
    if share is not None:
        parts += [
            "  data wait ",
            (f"{100 * share:.0f}%", _pct_style(100 * share, 10, 30)),
            f" (last {WINDOW_S:g} s)",
        ]
        if t.steps_s is not None:
            parts.append(f"  {t.steps_s:.1f} steps/s")
        if t.samples_s is not None:
            parts.append(f"  {t.samples_s:,.0f} samples/s")
        if t.ranks > 1:
            parts.append(f"  {t.ranks} ranks")
    elif t.steps:
        parts.append((f"  no step in the last {WINDOW_S:g} s", _WARN))
    else:
        parts.append(("  waiting for the first step", "dim"))
    parts.append(f"  {t.steps:,} steps  run {plain(t.run_id, 60)}")
    lines = [_line(*parts, width=width)]
    for rank, gap in sorted((t.waited_for or {}).items()):
        lines.append(
            _line(
                ("straggler", _WARN),
                f"  rank {rank}: the other ranks wait for it "
                f"in the all-reduce, {100 * gap:.0f} points more of their step "
                "than it does",
                width=width,
            )
        )
    if t.verdict is not None:
        age = f" (as of {t.verdict_age_s:.0f} s ago)" if t.verdict_age_s is not None else ""
        known = Kind.lookup(t.verdict)  # calm or alarm: said once, on Kind
        style = "" if known is not None and known.calm else _WARN
        lines.append(
            _line(
                "verdict  ",
                (plain(t.verdict, 40), style or "bold"),
                f"  {plain(t.reason or '', 300)}",
                (age, "dim"),
                width=width,
            )
        )
    else:
        lines.append(_line(("verdict  diagnosing the run so far…", "dim"), width=width))
    return lines


def _cut(rows: list[Text], n: int, what: str, width: int) -> list[Text]:
    """The first ``n`` rows; the last one replaced by "… K more" when some are left out."""
    if n >= len(rows):
        return rows
    if n <= 0:
        return []
    return [*rows[: n - 1], _line((f"… {len(rows) - n + 1} more {what}", "dim"), width=width)]


def _footer(sample: Sample, state: ViewState, width: int) -> Text:
    keys = (
        "q quit  h help  c/m/r sort  ↓↑ pick  p " + ("resume" if state.paused else "pause")
        if state.keys
        else ""
        if state.piped
        else "Ctrl-C quits"
    )
    if state.keys and not state.unicode:
        keys = keys.replace("↓↑", "j/k")
    if state.followed is not None:
        keys += f"  training of pid {state.followed}"
    cost = f"sample {sample.cpu_s * 1e3:.1f} ms CPU"
    if state.draw_cpu_s is not None:
        cost += f", draw {state.draw_cpu_s * 1e3:.1f} ms"
    t = Text(no_wrap=True, overflow="ellipsis")
    if state.paused:
        t.append(" PAUSED ", style="bold reverse yellow")
        t.append(" ")
    t.append(keys, style=_HEAD)
    room = width - len(t.plain)
    tail = f" · {cost} "
    if state.piped:  # a log line: no padding to a width nobody sees
        t.append(cost if not t.plain else tail.rstrip(), style=_HEAD)
        return t
    t.append(tail.rjust(max(room, 0)) if room > len(tail) else tail, style=_HEAD)
    t.truncate(width, overflow="ellipsis")
    return t


def render(sample: Sample | None, state: ViewState, width: int, height: int | None) -> list[Text]:
    """The frame for ``sample`` as screen lines, each at most ``width`` columns; at most
    ``height`` lines (None: no limit, every disk and process: the plain frames)."""
    width = max(width, 20)
    when = time.strftime("%H:%M:%S", time.localtime(sample.ts if sample else time.time()))
    what = f"  tree of {state.root_pid}" if state.root_pid is not None else ""
    via = f"  via agent {plain(state.via, 60)}" if state.via else ""
    top = _line(
        ("stallscope top", "bold"),
        f"  {state.host}  {when}",
        f"  every {state.interval:g} s{what}{via}",
        width=width,
    )
    if sample is None:
        return [top, _line(f"collecting the first sample ({state.interval:g} s)…", width=width)]
    if state.help:
        lines = [top, *_help_lines(width)]
        if height is not None:
            lines += [Text("")] * max(0, height - len(lines) - 1)
        return [*lines, _footer(sample, state, width)]
    tall = height is None or height >= 40
    gpus = _gpu_lines(sample, state, width)
    host = _host_lines(sample, state, width, core_lines=4 if tall else 2)
    host += _training_lines(state, width)
    disk_head, disks = _disk_lines(sample, state, width)
    proc_head, procs = ([], []) if state.root_pid is None else _proc_lines(sample, state, width)
    notes = [ev for ev in state.events if ev.kind not in ("unavailable",)]
    note = (
        [
            _line(
                ("note ", "dim"),
                (plain(f"{notes[-1].source}: {notes[-1].message}"), "dim"),
                width=width,
            )
        ]
        if notes
        else []
    )
    footer = _footer(sample, state, width)

    if height is None:
        gpu_flat = [ln for g in gpus for ln in g]
        return [top, *gpu_flat, *host, disk_head, *disks, *proc_head, *procs, *note, footer]

    fixed = 1 + len(host) + 1 + len(proc_head) + len(note) + 1  # top, disk header, footer
    # GPUs: two lines each while they leave room for a few disks and processes, else one
    room = max(1, height - fixed - (4 if proc_head else 2))
    if sum(len(g) for g in gpus) <= room:
        gpu_flat = [ln for g in gpus for ln in g]
    else:
        gpu_flat = _cut([g[0] for g in gpus], room, "GPUs", width)
    left = max(0, height - fixed - len(gpu_flat))
    if proc_head:
        n_disk = min(len(disks), max(1, left // 3))
        n_proc = min(len(procs), left - n_disk)
        n_disk = min(len(disks), left - n_proc)
    else:
        n_disk, n_proc = min(len(disks), left), 0
    lines = [top, *gpu_flat, *host, disk_head, *_cut(disks, n_disk, "devices", width)]
    if proc_head:
        lines += [*proc_head, *_cut(procs, n_proc, "processes", width)]
    body = lines + note
    pad = height - len(body) - 1
    if pad > 0:
        body += [Text("")] * pad
    return [*body[: height - 1], footer]
