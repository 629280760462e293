"""``stallscope show RUN [--json]``: summary of one stored run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from stallscope.analysis.rundata import RunData, load_run
from stallscope.analysis.summary import render_summary, summarize
from stallscope.cli._common import RUN_HELP, add_out_option, out_console, resolve_run, safe
from stallscope.store.rundir import run_state


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show",
        help="summary of one run",
        description="Summary of a stored run: per resource median/p95/max, the "
        "GPU's idle share, what monitoring cost, and the diagnosis.",
    )
    p.add_argument("run", metavar="RUN", help=RUN_HELP)
    add_out_option(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--run-id",
        dest="run_id",
        metavar="RUN",
        help="in an agent's store: which of the trainings it followed (default: "
        "the one with the most process samples)",
    )
    p.set_defaults(func=run)


def load_summary(run_dir: Path, data: RunData | None = None) -> dict[str, Any]:
    if data is None:
        data = load_run(run_dir)
    return {
        "run": str(run_dir),
        "meta": data.meta,
        "state": run_state(data.meta),
        "duration_s": duration(data),
        "summary": summarize(data),
        "events": data.events,
        "skipped": data.skipped,
        "unreadable": data.unreadable,
    }


def duration(data: RunData) -> float | None:
    """Seconds the run lasted, as the facts hold it (:func:`~stallscope.analysis.facts.build.
    run_duration`: the same figure ``runs`` and the report show)."""
    from stallscope.analysis.facts.build import run_duration

    return run_duration(data.meta, data.span[1] if data.span else None)


def _interval(meta: dict[str, Any]) -> str:
    """How often the run was sampled, in words."""
    from stallscope.analysis.summary import sampling_text

    return sampling_text(meta)


#: alert transitions listed by show before "… N more"
MAX_ALERT_LINES = 20


def _print_alerts(events: list[dict[str, Any]], run_dir: Path, console: Console) -> None:
    """Every alert that fired or cleared during the run, in order (docs/alerts.md)."""
    fired = [
        ev
        for ev in events
        if ev.get("source") == "alerts" and ev.get("kind") in ("alert_firing", "alert_cleared")
    ]
    if not fired:
        return
    console.print("  alerts:", highlight=False)
    for ev in fired[:MAX_ALERT_LINES]:
        word = "fired" if ev.get("kind") == "alert_firing" else "cleared"
        console.print(
            f"    {word}: {safe(str(ev.get('message', '')))}", highlight=False, soft_wrap=True
        )
    if len(fired) > MAX_ALERT_LINES:
        console.print(
            f"    … {len(fired) - MAX_ALERT_LINES} more (stallscope report "
            f"{safe(str(run_dir))} lists every event)",
            highlight=False,
        )


def _print_gpu_events(data: RunData, console: Console) -> None:
    """The run's XIDs and other GPU health events, each with its time and step."""
    from stallscope.analysis.gpuevents import event_line, health_events

    told = health_events(data)
    if told:
        console.print("  GPU health events:", highlight=False)
        for ev in told[:MAX_ALERT_LINES]:
            console.print(f"    [red]{safe(event_line(ev))}[/]", highlight=False, soft_wrap=True)


def _print_gpu_energy_health(summary: dict[str, Any], console: Console) -> None:
    """Each GPU's energy over the run, and any GPU that needs a person."""
    from stallscope.analysis.summary import energy_text, health_text

    for ent, e in sorted((summary.get("gpu_energy") or {}).items()):
        console.print("  " + energy_text(ent, e), highlight=False)
    for ent, h in sorted((summary.get("gpu_health") or {}).items()):
        console.print("  [red]" + safe(health_text(ent, h)) + "[/]", highlight=False)


def _state_text(state: str, data: RunData) -> str:
    """ "exit code 130 (SIGINT)": the exit as `run` returned it (never -2), from the facts."""
    if state == "finished":
        fx = data.facts().run
        if fx.exit_code is None:
            return f"attached, {data.meta.get('ended') or 'ended'}"
        return f"exit code {fx.exit_code}" + (f" ({fx.exit_signal})" if fx.exit_signal else "")
    if state == "interrupted":  # stallscope was killed: no end, the duration ends at the data
        return "interrupted (to the last sample)"
    return state


def print_run(
    run_dir: Path, console: Console, with_diagnosis: bool = True, training: str | None = None
) -> str | None:
    """The run's summary (and its diagnosis); returns the verdict when it was diagnosed."""
    data = load_run(run_dir, training)
    doc = load_summary(run_dir, data)
    meta, summary = doc["meta"], doc["summary"]
    cmd = " ".join(meta.get("command") or [])
    dur = doc["duration_s"]
    state = doc["state"]
    state = _state_text(state, data)
    # the header's lines are never folded into a word alone on a line (piped, rich folded at
    # 80 columns): the terminal wraps them, a file keeps them whole
    console.print(f"[bold]{safe(run_dir.name)}[/]  {safe(cmd)}", highlight=False, soft_wrap=True)
    console.print(
        f"  {safe(str(meta.get('host')))} · "
        f"{'?' if dur is None else f'{dur:.0f}'} s · {state} · {_interval(meta)} · "
        f"{summary.get('samples', 0)} samples",
        highlight=False,
        soft_wrap=True,
    )
    _print_notes(data, meta, console)
    _print_alerts(data.events, run_dir, console)
    _print_gpu_events(data, console)
    tuned = [ev for ev in data.events if ev.get("kind") == "autotune"]
    if tuned:  # what stallscope.watch(loader, autotune=True) changed, in order
        console.print("  loader autotune:", highlight=False)
        for ev in tuned:
            console.print(
                f"    {safe(str(ev.get('message', '')))}", highlight=False, soft_wrap=True
            )
    if summary["rows"]:
        console.print(render_summary(summary))
    else:
        console.print("  no samples stored (the run ended before the first interval)")
    phases = summary.get("phases")
    if phases:
        from stallscope.analysis.summary import phases_text

        console.print("  " + phases_text(phases), highlight=False)
    if summary.get("samples_per_s") is not None:
        from stallscope.analysis.throughput import SOURCE_TEXT
        from stallscope.units import throughput as fmt_rate

        console.print(
            f"  throughput: {fmt_rate(summary['samples_per_s'])} (from "
            f"{SOURCE_TEXT.get(summary.get('throughput_source') or '', '?')})",
            highlight=False,
            soft_wrap=True,
        )
    during = summary.get("gpu_idle_share_training") or {}
    for ent, share in sorted(summary.get("gpu_idle_share", {}).items()):
        inside = during.get(ent)
        more = f", {inside:.0%} of the training" if inside is not None else ""
        console.print(f"  {ent} idle {share:.0%} of the run{more}")
    _print_gpu_energy_health(summary, console)
    _print_cost(summary, meta, console)
    if with_diagnosis:
        try:
            from stallscope.analysis.diagnose import diagnose_run, print_diagnosis
        except ImportError:
            return None
        doc = diagnose_run(run_dir, data)
        print_diagnosis(doc, console)
        verdict: str | None = doc.get("verdict")
        return verdict
    return None


def _print_notes(data: RunData, meta: dict[str, Any], console: Console) -> None:
    """What the header adds: the training it watched, what was skipped, unreadable or
    unavailable."""
    from stallscope.cli.diagnose import training_line

    about = training_line(meta)
    if about:
        console.print(f"  {safe(about)}", highlight=False)
    line = data.skipped_note()
    if line:
        console.print(f"  [yellow]{line}[/]", highlight=False)
    for what in data.unreadable:
        console.print(f"  [yellow]could not read {safe(what)}[/]", highlight=False)
    for name, reason in (meta.get("unavailable") or {}).items():
        console.print(f"  [yellow]{safe(name)}[/]: {safe(str(reason))}", highlight=False)


def _print_cost(summary: dict[str, Any], meta: dict[str, Any], console: Console) -> None:
    """The monitor's own CPU (its collector thread: the sources, the store, the alerts, its
    wake-ups; what benchmarks/bench_run_cost.py measures from outside): per sample, and its
    share of one core over the run (none when the run did not measure it). A stack sampler is
    said apart: it runs in the trainer (in-process) or as py-spy, not in this process."""
    if "collector_cpu_s_per_sample" not in summary:
        return
    cost = summary["collector_cpu_s_per_sample"]
    # per second of the run: the interval changes after the warm-up
    span = summary.get("duration_s") or 0
    rate = summary.get("samples", 0) / span if span else 1 / (meta.get("interval_s") or 1)
    stacks = meta.get("stacks") or {}
    apart = ""
    if stacks.get("sampler") == "inproc":
        apart = "; the stack sampler runs in the trainer, not counted here"
    elif stacks.get("sampler"):
        apart = f"; the stack sampler ({safe(str(stacks['sampler']))}) is not counted here"
    console.print(
        f"  monitoring cost: {cost * 1000:.2f} ms CPU per sample "
        f"({cost * rate:.3%} of one core over the run{apart})",
        highlight=False,
    )


def run(args: argparse.Namespace) -> int:
    run_dir = resolve_run(args.run, args.out)
    if args.json:
        print(
            json.dumps(load_summary(run_dir, load_run(run_dir, args.run_id)), indent=2, default=str)
        )
    else:
        print_run(run_dir, out_console, with_diagnosis=True, training=args.run_id)
    return 0
