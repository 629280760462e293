"""Diagnosis: name the bottleneck of a run with evidence, fixes and an estimated speedup.

``diagnose_run(run_dir)`` returns the ``diagnose --json`` document (docs/architecture.md). The
rules are pure functions (:mod:`stallscope.analysis.diagnose.rules`) over the signals computed
once from the run (:mod:`stallscope.analysis.facts`); this module shapes the document. Its
input is what the run recorded (:class:`~stallscope.analysis.rundata.RunData`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from stallscope.analysis.diagnose.model import KINDS, Finding, Fix, Kind, title_of
from stallscope.analysis.diagnose.rules import RULES, run_rules
from stallscope.analysis.facts import Facts, compute_facts
from stallscope.analysis.rundata import RunData, load_run
from stallscope.textsafe import split_commands
from stallscope.units import speedup

__all__ = [
    "KINDS",
    "RULES",
    "Facts",
    "Finding",
    "Fix",
    "Kind",
    "RunData",
    "compute_facts",
    "diagnose",
    "diagnose_run",
    "diagnosis_lines",
    "owner_lead",
    "print_diagnosis",
    "render_diagnosis",
    "title_of",
]


def diagnose(data: RunData) -> dict[str, Any]:
    """The diagnosis document for data already in memory (pure)."""
    fx = data.facts()
    findings = run_rules(data, fx)
    if not findings:
        findings = [
            Finding(
                kind=Kind.INSUFFICIENT_DATA,
                severity="info",
                confidence=0.5,
                summary="No bottleneck pattern in the system metrics"
                + (
                    ""
                    if fx.steps.stall_source == "probe"
                    else "; the per-step probe would show whether the trainer waits for data"
                )
                + ".",
                evidence=fx.evidence(
                    "samples",
                    "steps",
                    "gpu_util_median_pct",
                    "main_cpu_pct",
                    "worker_cpu_pct",
                    "disk_util_median_pct",
                ),
                fixes=[
                    Fix(
                        "wrap the loader with stallscope.watch(loader)",
                        "measures data wait vs compute per step",
                    )
                ]
                if fx.steps.stall_source != "probe"
                else [],
                est_speedup=1.0,
                rule="no rule fired",
            )
        ]
    verdict = findings[0].kind.value if findings else "insufficient_data"
    owner = data.meta.get("owner")
    return {
        "owner": owner if isinstance(owner, dict) and owner else None,
        "host": data.meta.get("host"),
        "ranks": fx.evidence("ranks_detail").get("ranks_detail", []),
        "changes": changes(data),
        "run": data.meta.get("run_dir", ""),
        "verdict": verdict,
        "stall_fraction": fx.steps.stall_fraction,
        "stall_source": fx.steps.stall_source,
        "findings": [f.as_dict() for f in findings],
        "signals": fx.flat(),
    }


#: a shift undone sooner than this (or 5 samples) is a blip, not a change of pace
MIN_LASTING_S = 10.0


def _known_causes(data: RunData) -> list[tuple[float, str]]:
    """(time, what) of the run's own turning points: autotune switches, epoch boundaries,
    alerts that fired (a change near one is named after it)."""
    out: list[tuple[float, str]] = []
    for ev in data.events:
        kind, ts = ev.get("kind"), ev.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        if kind == "autotune" and "→" in str(ev.get("message", "")):
            out.append((float(ts), "an autotune switch"))
        elif kind == "alert_firing":
            out.append((float(ts), "an alert: " + str(ev.get("message", ""))[:80]))
    last: dict[int, int | None] = {}
    for st in data.steps:
        prev = last.get(st.rank)
        if st.epoch is not None and prev is not None and st.epoch != prev:
            out.append((st.ts, f"the start of epoch {st.epoch}"))
        last[st.rank] = st.epoch
    return sorted(out)


def _level_end(
    ts: list[float], xs: list[float], start: float, before: float, after: float, k: int = 5
) -> float | None:
    """When the level a change reached ended: the first time from which ``k`` samples in a row
    have a median nearer the level before it than the new one (None: it lasted to the end)."""
    from stallscope.stats import median as med

    idx = [i for i, t in enumerate(ts) if t >= start and math.isfinite(xs[i])]
    for a in range(len(idx) - k + 1):
        window = [xs[i] for i in idx[a : a + k]]
        m = med(window)
        if abs(m - before) < abs(m - after):
            return ts[idx[a]]
    return None


def _cause_near(causes: list[tuple[float, str]], ts: float, within: float) -> str | None:
    near = [(abs(t - ts), what) for t, what in causes if abs(t - ts) <= within]
    return min(near)[1] if near else None


#: (what, unit, smallest relative shift worth telling, smallest absolute one) for the series
#: watched for changes: a disk's read latency moving from 0.25 ms to 0 ms is no change of pace
_WATCHED = (("disk.r_await_ms", "ms", 0.25, 2.0), ("gpu.temp_c", "°C", 0.05, 3.0))
#: a change must be this many times the series' own sample-to-sample noise
NOISE_TIMES = 3.0


def _noise(xs: list[float]) -> float:
    """The series' own noise: the median absolute first difference over √2 (a level shift
    moves one difference only, so it does not count as noise)."""
    from itertools import pairwise

    from stallscope.stats import median as med

    d = [abs(b - a) for a, b in pairwise(xs) if math.isfinite(a) and math.isfinite(b)]
    return med(d) / math.sqrt(2) if d else 0.0


def _lasting_changes(
    ts: list[float], xs: list[float], rel: float, least: float
) -> list[tuple[Any, float | None]]:
    """The changes of pace in ``xs`` large enough to say (``rel`` of the level before, and
    ``least``, and above the series' noise) that lasted, each with when it ended (None: it did
    not)."""
    from stallscope.analysis.changes import detect_changes

    floor = max(least, NOISE_TIMES * _noise(xs), 1e-9)
    found = [
        c
        for c in detect_changes(ts, xs)
        if abs(c.after - c.before) >= max(rel * abs(c.before), floor)
    ]
    # a real but small shift is not worth a line; a shift undone before it lasted
    # MIN_LASTING_S is a blip, not a change of pace (a 1.2-s stall once read as one)
    step = (ts[-1] - ts[0]) / max(1, len(ts) - 1) if len(ts) > 1 else 0.0
    lasting = max(MIN_LASTING_S, 5 * step)
    keep: list[tuple[Any, float | None]] = []
    for c in found:
        # scanned from the alarm on (the dated start can sit a little before the shift)
        ended = _level_end(ts, xs, c.detected_ts, c.before, c.after)
        if ended is not None and ended - c.start_ts < lasting:
            continue  # there and back again: a blip
        keep.append((c, ended))
    return keep


def changes(data: RunData) -> list[dict[str, Any]]:
    """When the run changed pace: shifts in step time and data-wait share (per rank, from the
    probe), disk read latency and GPU temperature, each with before/after values and when it
    started (:mod:`stallscope.analysis.changes`)."""
    t0 = data.t0
    # over Prometheus, t0 is the window's start, not the run's: say "into the window" there
    into = "into the window read from Prometheus" if "prometheus" in data.meta else "into the run"
    out: list[dict[str, Any]] = []

    causes = _known_causes(data)

    def add(
        what: str,
        entity: str,
        unit: str,
        ts: list[float],
        xs: list[float],
        rel: float,
        least: float = 0.0,
    ) -> None:
        step = (ts[-1] - ts[0]) / max(1, len(ts) - 1) if len(ts) > 1 else 0.0
        keep = _lasting_changes(ts, xs, rel, least)
        for c, ended in keep:
            cause = _cause_near(causes, c.start_ts, max(2.0, 2 * step))
            text = (
                f"{what}{f' [{entity}]' if entity else ''} {c.describe(unit)}, "
                f"{c.start_ts - t0:.0f} s {into}"
                + (f", back {ended - c.start_ts:.0f} s later" if ended else "")
                + (f" (at {cause})" if cause else "")
            )
            out.append(
                {
                    "metric": what,
                    "entity": entity,
                    "direction": c.direction,
                    "before": round(c.before, 4),
                    "after": round(c.after, 4),
                    "start_s": round(c.start_ts - t0, 1),
                    "detected_s": round(c.detected_ts - t0, 1),
                    "ended_s": None if ended is None else round(ended - t0, 1),
                    "cause": cause,
                    "summary": text,
                }
            )

    ranks = sorted({s.rank for s in data.steps})
    for rank in ranks:
        steps = [s for s in data.steps if s.rank == rank]
        ts = [s.ts for s in steps]
        add("step_ms", f"rank{rank}", "ms", ts, [s.step_s * 1000 for s in steps], 0.25)
        # a share moves by points: 0.40 → 0.50 is noise on a busy machine, 0.05 → 0.40 is not
        add(
            "data_wait_share",
            f"rank{rank}",
            "",
            ts,
            [
                s.wait_s / (s.wait_s + s.host_s) if s.wait_s + s.host_s > 0 else math.nan
                for s in steps
            ],
            0.0,
            0.2,
        )
    for name, unit, rel, least in _WATCHED:
        for s in data.all(name):
            add(name, s.entity, unit, s.ts, s.v, rel, least)
    out.sort(key=lambda c: c["start_s"])
    return out


def diagnose_run(run_dir: Path, data: RunData | None = None) -> dict[str, Any]:
    """Diagnose a run directory (``data``: the run already loaded by the caller, so one command
    reads ``run.db`` once). Uses only what the run recorded."""
    if data is None:
        data = load_run(Path(run_dir))
    data.meta["run_dir"] = str(run_dir)
    return diagnose(data)


def diagnosis_lines(doc: dict[str, Any], width: int = 100) -> list[Any]:
    """The diagnosis as lines of rich Text, verdict first, then each finding with its rule and
    fixes. Prose is wrapped to ``width`` with its indentation kept; a fix's action (often a
    command) is never wrapped, so it survives copy and paste: print with ``soft_wrap=True``
    (:func:`print_diagnosis`)."""
    import textwrap

    from rich.text import Text

    colors = {"critical": "bold red", "warning": "yellow", "info": "green"}
    w = max(40, width)
    lines: list[Any] = []

    def prose(text: str, indent: str, style: str = "", first: str | None = None) -> None:
        for ln in textwrap.wrap(
            text,
            w,
            initial_indent=first if first is not None else indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        ) or [indent]:
            lines.append(Text(ln, style=style))

    findings = doc["findings"]
    lead = owner_lead(doc)
    if lead:
        lines.append(Text(lead, style="bold"))
    if not findings:
        lines.append(Text("verdict: nothing to report"))
    for i, f in enumerate(findings):
        head = Text()
        head.append("verdict: " if i == 0 else "also: ", style="bold")
        head.append(f["kind"], style=colors.get(f["severity"], ""))
        head.append(
            f"  ({f['severity']}, confidence {f['confidence']:.2f}"
            + (f", up to {speedup(f['est_speedup'])} faster" if f["est_speedup"] > 1.01 else "")
            + ")"
        )
        lines.append(head)
        prose(f["summary"], "  ")
        if f.get("rule"):
            prose(f"rule: {f['rule']}", "        ", "dim", first="  ")
        for fix in f["fixes"]:
            # the sentence wrapped to the terminal; its commands each on a line of their own,
            # never folded (a command must survive copy and paste)
            text, commands = split_commands(str(fix["action"]))
            wrapped = textwrap.wrap(
                f"fix: {text}",
                w,
                initial_indent="  ",
                subsequent_indent="       ",
                break_on_hyphens=False,
            )
            for j, ln in enumerate(wrapped or ["  fix:"]):
                line = Text()
                if j == 0:
                    line.append("  ")
                    line.append("fix:", style="bold")
                    line.append(ln[len("  fix:") :])
                else:
                    line.append(ln)
                lines.append(line)
            for c in commands:
                lines.append(Text(f"           {c}"))
            if fix.get("why"):
                prose(f"why: {fix['why']}", "            ", "dim", first="       ")
    for r in doc.get("ranks") or []:
        lines.append(Text(_rank_line(r), style="dim"))
    for ch in doc.get("changes") or []:
        prose(f"change: {ch['summary']}", "        ", "cyan", first="")
    return lines


def _rank_line(r: dict[str, Any]) -> str:
    """One rank's line: its data wait, step, collectives, compute and workers, those it has."""
    bits = []
    if r.get("stall_fraction") is not None:
        bits.append(f"data wait {r['stall_fraction']:.0%}")
    if r.get("step_ms_median") is not None:
        bits.append(f"step {r['step_ms_median']:.0f} ms")
    if r.get("comm_share") is not None:
        bits.append(f"in collectives {r['comm_share']:.0%}")
    if r.get("compute_ms_median") is not None:
        bits.append(f"compute {r['compute_ms_median']:.0f} ms")
    if r.get("worker_cpu_pct") is not None:
        bits.append(f"{r.get('workers', 0)} worker(s) at {r['worker_cpu_pct']:.0f}% CPU")
    return f"  rank {r['rank']}: " + ", ".join(bits)


def owner_lead(doc: dict[str, Any]) -> str | None:
    """ "job 4242, rank 1 on node-a is input-bound (input_bound.prep)": whose run it is and
    what it is, for a shared fleet; None when the run recorded no owner."""
    from stallscope.sources.owner import describe

    who = describe(doc.get("owner"))
    if not who:
        return None
    focus = (doc.get("signals") or {}).get("focus_rank")
    if focus is not None:
        who += f", rank {focus}"
    if doc.get("host"):
        who += f" on {doc['host']}"
    kind = str(doc.get("verdict") or "insufficient_data")
    known = Kind.lookup(kind)  # a kind's wording lives on Kind
    words = known.verdict if known is not None else f"diagnosed {kind}"
    return f"{who} is {words}" + (f" ({kind})" if "." in kind else "")


def print_diagnosis(doc: dict[str, Any], console: Any) -> None:
    """Print the diagnosis on a rich console: prose wrapped to the terminal, commands never."""
    for line in diagnosis_lines(doc, console.width - 1):
        console.print(line, soft_wrap=True, highlight=False)


def render_diagnosis(doc: dict[str, Any]) -> Any:
    """The diagnosis as one rich renderable (for embedding; terminals use
    :func:`print_diagnosis`, which never folds a command)."""
    from rich.console import Group

    return Group(*diagnosis_lines(doc))
