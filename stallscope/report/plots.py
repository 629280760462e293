"""The report's time-aligned plots: what to draw (pure, from :class:`RunData`) and drawing it.

Every plot shares one time axis, seconds since the run started, and the same figure width and
horizontal margins, so the panels line up under each other on the page and one cursor reads
them all. Drawing uses matplotlib's SVG backend: vector, a few tens of kB per plot, no script
library to embed (an HTML file with plotly.js weighs ~4.8 MB).

Long series are cut to at most :data:`MAX_POINTS` points per line by keeping each bucket's
minimum and maximum, so spikes survive the downsampling.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallscope import units
from stallscope.analysis.gpuevents import clock
from stallscope.analysis.rundata import RunData
from stallscope.analysis.stacks import phases_over_time, trainer_phases
from stallscope.sources.stacks.phases import PHASES
from stallscope.store import Series, StepRow

__all__ = [
    "AXES_LEFT",
    "AXES_RIGHT",
    "MAX_POINTS",
    "Line",
    "Panel",
    "Plot",
    "build_plots",
    "clock",
    "downsample",
    "finite_or_none",
    "render_svg",
    "time_step",
]

MAX_POINTS = 1200  #: per line; the plots are ~1100 px wide, more points add bytes, not detail
AXES_LEFT = 0.075  #: left edge of every axes, as a fraction of the figure width
AXES_RIGHT = 0.985
FIG_WIDTH_IN = 11.0
ROW_HEIGHT_IN = 1.75
_MIB_PER_GIB = 1024.0

_COLORS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)


@dataclass
class Line:
    """One line: times in seconds since the run's start, values in the panel's unit."""

    label: str  #: legend text; may hold machine data (device, GPU, process names)
    t: np.ndarray
    v: np.ndarray
    color: str = _COLORS[0]
    style: str = "-"  #: matplotlib linestyle, or "." for dots only
    width: float = 1.3
    alpha: float = 1.0


@dataclass
class Panel:
    """One axes of a plot."""

    ylabel: str
    lines: list[Line] = field(default_factory=list)
    ylim: tuple[float, float] | None = None


@dataclass
class Plot:
    """One figure of the report; ``note`` says why it is skipped when ``panels`` is empty,
    or adds a remark (which device, which rank) when it is not."""

    id: str  #: HTML id suffix: ``plot-<id>`` on the figure, ``svg-<id>`` on the svg
    title: str
    panels: list[Panel] = field(default_factory=list)
    note: str = ""


# --- downsampling --------------------------------------------------------------------------------
def downsample(
    t: np.ndarray, v: np.ndarray, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points: per bucket of consecutive samples, its min and max (in
    time order). NaN gap markers are kept so line breaks survive."""
    n = len(t)
    if n <= max_points:
        return t, v
    isnan = np.isnan(v)
    # two points per bucket, three where a bucket holds a gap marker
    buckets = max(1, max_points // (3 if isnan.any() else 2))
    k = math.ceil(n / buckets)  # samples per bucket
    rows = math.ceil(n / k)
    pad = rows * k - n
    grid = np.concatenate([v, np.full(pad, np.nan)]).reshape(rows, k)
    empty = np.isnan(grid)  # gap markers and the padding
    gap = np.concatenate([isnan, np.zeros(pad, dtype=bool)]).reshape(rows, k)
    base = np.arange(rows) * k
    lo = base + np.where(empty, np.inf, grid).argmin(axis=1)
    hi = base + np.where(empty, -np.inf, grid).argmax(axis=1)
    gaps = (base + gap.argmax(axis=1))[gap.any(axis=1)]
    idx = np.unique(np.concatenate([lo, hi, gaps]))
    idx = idx[idx < n]
    return t[idx], v[idx]


def _with_gaps(t: np.ndarray, v: np.ndarray, interval: float) -> tuple[np.ndarray, np.ndarray]:
    """Insert NaN where samples are missing (> 3 intervals apart), so the line breaks instead
    of drawing a straight line over a hole (a process gone, a source off)."""
    if len(t) < 2:
        return t, v
    gap = max(3.0 * interval, 1e-9)
    holes = np.flatnonzero(np.diff(t) > gap)
    if not len(holes):
        return t, v
    t = np.insert(t, holes + 1, t[holes] + interval)
    v = np.insert(v, holes + 1, np.nan)
    return t, v


def _line(data: RunData, s: Series, label: str, scale: float = 1.0, **kw: Any) -> Line:
    t = np.asarray(s.ts, dtype=float) - data.t0
    v = np.asarray(s.v, dtype=float) * scale
    t, v = _with_gaps(t, v, _interval(data))
    t, v = downsample(t, v)
    return Line(label, t, v, **kw)


def _interval(data: RunData) -> float:
    iv = data.meta.get("interval_s")
    if isinstance(iv, (int, float)) and iv > 0:
        return float(iv)
    return 1.0


def _sum_by_ts(series: Sequence[Series]) -> Series:
    acc: dict[float, float] = {}
    for s in series:
        for t, v in zip(s.ts, s.v, strict=True):
            acc[t] = acc.get(t, 0.0) + v
    ts = sorted(acc)
    return Series("sum", "", ts, [acc[t] for t in ts])


# --- what to draw --------------------------------------------------------------------------------
def build_plots(data: RunData, stall_fraction: float | None = None) -> list[Plot]:
    """The report's plots, in page order. Pure: no drawing, no I/O."""
    return [
        _gpu_plot(data),
        _wait_plot(data, stall_fraction),
        _phase_plot(data),
        _disk_plot(data),
        _cpu_plot(data),
        _mem_plot(data),
    ]


def _gpu_plot(data: RunData) -> Plot:
    plot = Plot("gpu", "GPU utilisation")
    util = data.metric("gpu.util_pct")
    sm = data.metric("gpu.sm_active_pct")
    panel = Panel("% of time", ylim=(0, 105))
    for i, ent in enumerate(sorted(set(util) | set(sm), key=_natural)):
        name = data.entity_attrs("gpu", ent).get("name")
        base = f"{ent} ({name})" if name else ent
        color = _COLORS[i % len(_COLORS)]
        if ent in util:
            panel.lines.append(_line(data, util[ent], f"{base} util", color=color))
        if ent in sm:
            panel.lines.append(_line(data, sm[ent], f"{base} SM active", color=color, style="--"))
    clocks = _gpu_health_marks(data, plot, panel)
    if panel.lines:
        plot.panels.append(panel)
        if clocks is not None:
            plot.panels.append(clocks)
        if not sm:
            plot.note = (
                "SM activity is not shown: it needs GPM metrics (Hopper or newer). "
                "Utilisation counts time any kernel ran, however few SMs it used. " + plot.note
            ).strip()
    else:
        why = (data.meta.get("unavailable") or {}).get("gpu")
        plot.note = "No GPU samples in this run" + (f": {why}" if why else ".")
    return plot


#: health events named in the GPU plot's note (the rest: ``show`` and the events table)
MAX_MARKED_EVENTS = 10


def _gpu_health_marks(data: RunData, plot: Plot, panel: Panel) -> Panel | None:
    """The run's GPU health events (XIDs, remapped rows, ECC errors, a link trained down) as
    marks at the top of the utilisation panel, each named in the note with its time and step;
    and, when a GPU had one or slowed its clocks for a reason that slows a training, a panel
    of the SM clocks below (the ``gpu_slowdown`` finding's evidence)."""
    from stallscope.analysis.diagnose.rules.slowdown import REASON_WORDS
    from stallscope.analysis.gpuevents import event_line, health_events
    from stallscope.sources.gpu import THROTTLE_REASONS

    told = health_events(data)
    bits = 0
    for bit, name in THROTTLE_REASONS:
        if name in REASON_WORDS and name != "sw_power_cap":  # a loaded GPU sits at its cap
            bits |= bit
    throttled = any(int(v) & bits for s in data.all("gpu.throttle_mask") for v in s.v)
    if told:
        t = np.asarray([e["at_s"] for e in told], dtype=float)
        panel.lines.append(
            Line("GPU health event", t, np.full(len(t), 102.0), color="#d62728", style=".")
        )
        plot.note = (
            "GPU health events: "
            + "; ".join(event_line(e) for e in told[:MAX_MARKED_EVENTS])
            + (f"; {len(told) - MAX_MARKED_EVENTS} more" if len(told) > MAX_MARKED_EVENTS else "")
            + "."
        )
    clocks = data.metric("gpu.sm_clock_mhz")
    if not (told or throttled) or not clocks:
        return None
    out = Panel("SM clock MHz")
    for i, ent in enumerate(sorted(clocks, key=_natural)):
        out.lines.append(
            _line(data, clocks[ent], f"{ent} SM clock", color=_COLORS[i % len(_COLORS)])
        )
    return out


def _wait_plot(data: RunData, stall_fraction: float | None) -> Plot:
    plot = Plot("wait", "Data wait per step")
    if not data.steps:
        plot.note = "No step timings: the in-trainer probe was not used" + (
            "; the sampled stacks below show where the training thread's time went."
            if data.stacks
            else ". Wrap the loader in stallscope.watch(loader) to measure data wait per step."
        )
        return plot
    by_rank: dict[int, list[StepRow]] = {}
    for s in data.steps:
        by_rank.setdefault(s.rank, []).append(s)
    span = data.t1 - data.t0
    # buckets hold a few steps each, so a slow step rate leaves no empty bucket (a gap)
    periods = [
        float(np.median(np.diff([r.ts for r in rows])))
        for rows in by_rank.values()
        if len(rows) > 1
    ]
    width = max(_interval(data), span / 400.0, 3.0 * max(periods, default=0.0))
    panel = Panel("% of step time", ylim=(0, 105))
    gpu_panel = Panel("GPU idle, % of step", ylim=(0, 105))
    for i, (rank, rows) in enumerate(sorted(by_rank.items())):
        color = _COLORS[i % len(_COLORS)]
        who = f"rank {rank} " if len(by_rank) > 1 else ""
        ts = np.fromiter((r.ts for r in rows), float, len(rows)) - data.t0
        wait = np.fromiter((r.wait_s for r in rows), float, len(rows))
        host = np.fromiter((r.host_s for r in rows), float, len(rows))
        if len(rows) <= MAX_POINTS:
            tot = wait + host
            share = np.divide(100.0 * wait, tot, out=np.zeros_like(wait), where=tot > 0)
            panel.lines.append(
                Line(f"{who}per step", ts, share, color=color, style=".", alpha=0.35)
            )
        bt, bshare = _bucket_share(ts, wait, host, width)
        panel.lines.append(
            Line(
                f"{who}data wait (mean over {units.duration(width)})",
                bt,
                bshare,
                color=color,
                width=1.8,
            )
        )
        busy = [
            (r.ts, r.gpu_idle_s, r.gpu_busy_s)
            for r in rows
            if r.gpu_idle_s is not None and r.gpu_busy_s is not None
        ]
        if busy:
            gt = np.array([b[0] for b in busy]) - data.t0
            gidle = np.array([b[1] for b in busy], dtype=float)
            gbusy = np.array([b[2] for b in busy], dtype=float)
            bt, bidle = _bucket_share(gt, gidle, gbusy, width)
            gpu_panel.lines.append(
                Line(f"{who}GPU idle (CUDA events)", bt, bidle, color=color, width=1.8)
            )
    if stall_fraction is None:
        wait_total = sum(r.wait_s for r in data.steps)
        total = wait_total + sum(r.host_s for r in data.steps)
        stall_fraction = wait_total / total if total > 0 else None
    if stall_fraction is not None:
        panel.lines.append(
            Line(
                f"whole run: {stall_fraction:.0%}",
                np.array([0.0, span]),
                np.array([stall_fraction * 100.0] * 2),
                color="#555555",
                style=":",
                width=1.0,
            )
        )
    plot.panels.append(panel)
    if gpu_panel.lines:
        plot.panels.append(gpu_panel)
    plot.note = (
        "Share of each step's wall time the trainer spent blocked waiting for the "
        "next batch: wait / (wait + host time)."
    )
    return plot


#: colour of each phase in the phases plot
_PHASE_COLORS = {
    "data": "#d62728",
    "h2d": "#ff7f0e",
    "compute": "#2ca02c",
    "gpu_wait": "#9467bd",
    "comm": "#1f77b4",
    "ckpt": "#8c564b",
    "other": "#7f7f7f",
}


def _phase_plot(data: RunData) -> Plot:
    """Per trainer process, each phase's share of the training thread's time over the run,
    from its sampled stacks."""
    plot = Plot("phases", "Where the training thread's time went (sampled stacks)")
    procs = trainer_phases(data.stacks, data.roles())
    if not procs:
        plot.note = (
            "No sampled stacks in this run (stallscope run samples the trainer's stack "
            "unless --no-stacks; run --pid needs py-spy and ptrace rights)."
        )
        return plot
    span = data.t1 - data.t0
    width = max(2.0, _interval(data), span / 200.0)
    for p in procs:
        who = f"rank {p.rank}, " if len(procs) > 1 else ""
        panel = Panel(f"{who}% of time", ylim=(0, 105))
        rows = phases_over_time(data.stacks, p.pid, data.t0, width)
        for phase in PHASES:
            if not p.seconds.get(phase):
                continue
            t = np.array([b + width / 2 for b, _ in rows])
            v = np.array(
                [
                    100.0 * d.get(phase, 0.0) / sum(d.values()) if sum(d.values()) > 0 else np.nan
                    for _, d in rows
                ]
            )
            panel.lines.append(
                Line(
                    f"{who}{phase} ({p.share(phase):.0%})",
                    t,
                    v,
                    color=_PHASE_COLORS.get(phase, "#333333"),
                    width=1.8 if phase == "data" else 1.2,
                )
            )
        plot.panels.append(panel)
    plot.note = (
        f"Share of each {units.duration(width)} the training thread spent per phase, from "
        f"{sum(p.samples for p in procs):,} samples of its stack "
        f"({procs[0].sampler}); the frames that decide each phase are listed in "
        "docs/diagnosis.md. Start-up (imports, building the model) is left out."
    )
    return plot


def _bucket_share(
    t: np.ndarray, part: np.ndarray, rest: np.ndarray, width: float
) -> tuple[np.ndarray, np.ndarray]:
    """Time-bucketed share part / (part + rest) in %, at each bucket's centre; empty buckets
    are NaN (a gap in the line)."""
    if not len(t):
        return t, t
    idx = np.maximum(0, (t // width).astype(np.int64))
    n = int(idx.max()) + 1
    p = np.bincount(idx, weights=part, minlength=n)
    tot = p + np.bincount(idx, weights=rest, minlength=n)
    share = np.full(n, np.nan)
    np.divide(100.0 * p, tot, out=share, where=tot > 0)
    return (np.arange(n) + 0.5) * width, share


def _disk_plot(data: RunData) -> Plot:
    plot = Plot("disk", "Dataset disk")
    util = data.metric("disk.util_pct")
    if not util:
        why = (data.meta.get("unavailable") or {}).get("disk")
        plot.note = "No disk samples in this run" + (f": {why}" if why else ".")
        return plot
    wanted = [d for d in (data.meta.get("data_devices") or []) if d in util]
    if wanted:
        devices = wanted
        where = data.meta.get("data")
        plot.note = (
            "Device(s) holding the dataset"
            + (f" ({where})" if where else "")
            + ": "
            + ", ".join(devices)
            + "."
        )
    else:
        busiest = max(util, key=lambda d: sum(util[d].v) / len(util[d].v))
        devices = [busiest]
        plot.note = (
            f"No dataset device was named (stallscope run --data PATH): showing the "
            f"busiest device, {busiest}."
        )
    rows = (
        ("disk.util_pct", "%util", 1.0, (0.0, 105.0)),
        ("disk.r_await_ms", "read await, ms", 1.0, None),
        ("disk.rkb_s", "read, MB/s", units.kib(1) / 1e6, None),
    )  # KiB/s -> MB/s (SI)
    for name, ylabel, scale, ylim in rows:
        found = data.metric(name)
        panel = Panel(ylabel, ylim=ylim)
        for i, dev in enumerate(devices):
            if dev in found:
                panel.lines.append(
                    _line(data, found[dev], dev, scale, color=_COLORS[i % len(_COLORS)])
                )
        if panel.lines:
            plot.panels.append(panel)
    return plot


def _cpu_plot(data: RunData) -> Plot:
    plot = Plot("cpu", "CPU: trainer and DataLoader workers")
    roles: dict[str, list[Series]] = {}
    role_of = data.roles()
    for ent, s in data.metric("procs.cpu_pct").items():
        role = role_of.get(ent, "worker")
        roles.setdefault(role, []).append(s)
    procs = Panel("% of one core")
    for i, role in enumerate(("main", "worker")):
        group = roles.get(role)
        if not group:
            continue
        label = "trainer (main process)" if role == "main" else f"workers ({len(group)} seen)"
        procs.lines.append(_line(data, _sum_by_ts(group), label, color=_COLORS[i]))
    host = Panel("host, % of all CPUs", ylim=(0, 105))
    for i, (name, label) in enumerate(
        (
            ("host.cpu_pct", "busy"),
            ("host.iowait_pct", "iowait"),
            ("host.cpu_max_core_pct", "busiest core"),
            ("host.cpu_nice_pct", "of it at a lower priority (nice > 0)"),
        )
    ):
        hs = data.series.get((name, ""))
        # the niced share only where some process ran niced: a line at 0 says nothing
        if hs is not None and hs.v and (name != "host.cpu_nice_pct" or max(hs.v) > 0):
            host.lines.append(
                _line(
                    data,
                    hs,
                    label,
                    color=_COLORS[i + 2],
                    style=":" if name == "host.cpu_max_core_pct" else "-",
                )
            )
    plot.panels = [p for p in (procs, host) if p.lines]
    if not plot.panels:
        why = (data.meta.get("unavailable") or {}).get("procs")
        plot.note = "No CPU samples in this run" + (f": {why}" if why else ".")
    elif not procs.lines:
        plot.note = "No per-process samples: trainer and workers cannot be told apart."
    return plot


def _mem_plot(data: RunData) -> Plot:
    plot = Plot("mem", "Memory, /dev/shm and swap")
    gib = units.mib(1) / 1e9  # MiB -> GB: sizes are SI everywhere (units.py)
    mem = Panel("host memory, GB")
    for name, label, color, style in (
        ("host.mem_used_mib", "used", _COLORS[0], "-"),
        ("host.page_cache_mib", "page cache", _COLORS[8], "-"),
        ("host.mem_total_mib", "total", "#555555", ":"),
    ):
        s = data.series.get((name, ""))
        if s is not None and s.v:
            mem.lines.append(_line(data, s, label, gib, color=color, style=style))
    shm = Panel("shm / swap, GB")
    for name, label, color, style in (
        ("host.shm_used_mib", "/dev/shm used", _COLORS[3], "-"),
        ("host.shm_total_mib", "/dev/shm size", _COLORS[3], ":"),
        ("host.swap_used_mib", "swap used", _COLORS[1], "-"),
    ):
        s = data.series.get((name, ""))
        if s is not None and s.v:
            shm.lines.append(_line(data, s, label, gib, color=color, style=style))
    plot.panels = [p for p in (mem, shm) if p.lines]
    if not plot.panels:
        why = (data.meta.get("unavailable") or {}).get("host")
        plot.note = "No memory samples in this run" + (f": {why}" if why else ".")
    return plot


def _natural(s: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


_NICE_STEPS_S = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
)


def time_step(span: float, ticks: int = 10) -> float:
    """A tick spacing people read as time (30 s, 5 min, 1 h...) giving at most ``ticks``."""
    for step in _NICE_STEPS_S:
        if span / step <= ticks:
            return float(step)
    return float(math.ceil(span / ticks / 86400) * 86400)


# --- drawing -------------------------------------------------------------------------------------
_SVG_OPEN = re.compile(r"<svg\b[^>]*>")
_COMMENT = re.compile(r"<!--.*?-->", re.S)


def render_svg(plot: Plot, span: float) -> str:
    """The plot as an inline ``<svg id="svg-<id>" class="plot-svg">`` element.

    Text is drawn as SVG ``<text>`` (not glyph outlines) and matplotlib escapes it, so machine
    data in legends stays text; math parsing is off, so a ``$`` in a device name is literal."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    rows = len(plot.panels)
    # legends sit above their axes (never over the data), with room for as many legend rows
    # as the longest labels need (8 GPUs with long names wrap)
    layouts = [_legend_layout([ln.label for ln in p.lines]) for p in plot.panels]
    legend_in = 0.08 + 0.18 * max((n for _c, n in layouts), default=1)
    height = 0.5 + (ROW_HEIGHT_IN + legend_in) * rows
    rc: dict[Any, Any] = {
        "svg.fonttype": "none",
        "text.parse_math": False,
        "svg.hashsalt": f"ss-{plot.id}",
        "font.size": 9.0,
        "axes.titlesize": 9.0,
        "legend.fontsize": 8.0,
        "path.simplify": True,
    }
    with matplotlib.rc_context(rc):
        fig = Figure(figsize=(FIG_WIDTH_IN, height))
        fig.subplots_adjust(
            left=AXES_LEFT,
            right=AXES_RIGHT,
            bottom=0.45 / height,
            top=1 - (legend_in + 0.02) / height,
            hspace=(legend_in + 0.12) / ROW_HEIGHT_IN,
        )
        axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
        previous: list[str] = []
        for ax, panel, layout in zip(axes, plot.panels, layouts, strict=True):
            previous = _draw_panel(ax, panel, layout[0], previous)
        axes[-1].set_xlim(0, span)
        axes[-1].xaxis.set_major_locator(MultipleLocator(time_step(span)))
        axes[-1].xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: clock(x)))
        axes[-1].set_xlabel("time since start (h:mm:ss or m:ss)")
        buf = io.StringIO()
        fig.savefig(
            buf,
            format="svg",
            metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
        )
    return _inline_svg(buf.getvalue(), plot.id)


def _draw_panel(ax: Any, panel: Panel, ncol: int, previous: list[str]) -> list[str]:
    """One panel's lines, axes and legend (``ncol`` columns; none when its lines are the
    ``previous`` panel's, labels alike); returns its labels."""
    from matplotlib.ticker import MaxNLocator

    for ln in panel.lines:
        if ln.style == ".":
            ax.plot(
                ln.t,
                ln.v,
                linestyle="none",
                marker=".",
                markersize=2.0,
                color=ln.color,
                alpha=ln.alpha,
                label=ln.label,
            )
        else:
            ax.plot(
                ln.t,
                ln.v,
                linestyle=ln.style,
                linewidth=ln.width,
                color=ln.color,
                alpha=ln.alpha,
                label=ln.label,
            )
    ax.set_ylabel(panel.ylabel)
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    else:
        ax.margins(y=0.12)
        ax.set_ylim(bottom=0)
    ax.grid(True, color="#e4e4e4", linewidth=0.6)
    ax.yaxis.set_major_locator(MaxNLocator(4))
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    labels = [ln.label for ln in panel.lines]
    if labels != previous:  # the same lines on the row above: one legend is enough
        ax.legend(
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            borderaxespad=0.1,
            ncol=ncol,
            frameon=False,
            handlelength=1.8,
            columnspacing=1.4,
        )
    return labels


def _inline_svg(svg: str, plot_id: str) -> str:
    """matplotlib's SVG document as the page's inline element: its own opening tag (the plot's
    id, the viewBox kept), comments dropped, ids scoped to the plot, path data on one line."""
    svg = svg[svg.index("<svg") :]
    svg = _COMMENT.sub("", svg)
    m = _SVG_OPEN.search(svg)
    if m is None:  # pragma: no cover - matplotlib always writes one
        raise RuntimeError("matplotlib wrote no <svg> element")
    view = re.search(r'viewBox="([^"]*)"', m.group(0))
    opening = (
        f'<svg id="svg-{plot_id}" class="plot-svg" xmlns="http://www.w3.org/2000/svg" '
        f'xmlns:xlink="http://www.w3.org/1999/xlink" version="1.1" '
        f'viewBox="{view.group(1) if view else ""}" role="img" '
        f'preserveAspectRatio="xMidYMid meet">'
    )
    svg = opening + _scope_ids(svg[m.end() :], plot_id)
    # path data: matplotlib writes one segment per line; spaces are enough
    svg = re.sub(r" ?\n(?=[LMCQz])", " ", svg)
    return svg.strip()


_ID = re.compile(r'\sid="([^"]*)"')
_REF = re.compile(r'(url\(#|href="#)([^")]*)')


def _scope_ids(body: str, prefix: str) -> str:
    """Make an SVG body's ids unique within the page: matplotlib names elements ``figure_1``,
    ``axes_1``... in every figure. Ids nothing refers to are dropped (bytes, and no
    duplicates); the referenced ones (clip paths, markers) get the plot's prefix."""
    used = {m.group(2) for m in _REF.finditer(body)}

    def rename_id(m: re.Match[str]) -> str:
        return f' id="{prefix}-{m.group(1)}"' if m.group(1) in used else ""

    body = _ID.sub(rename_id, body)
    return _REF.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", body)


def _legend_layout(labels: list[str]) -> tuple[int, int]:
    """(columns, rows) for a legend of ``labels`` across the axes' width at 8 pt."""
    if not labels:
        return 1, 1
    width_in = FIG_WIDTH_IN * (AXES_RIGHT - AXES_LEFT)
    entry_in = 0.45 + 0.062 * max(len(lb) for lb in labels)
    cols = max(1, min(len(labels), int(width_in // entry_in)))
    return cols, math.ceil(len(labels) / cols)


finite_or_none = units.finite_or_none  # the one check (units.py)
