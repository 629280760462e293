"""``stallscope compare RUN_A RUN_B [--json]``: before and after, side by side.

Throughput (samples/s from the probe's steps, else from the DataLoader batches `stallscope
run` counted inside the trainer), the data-wait share, the main resources and the
verdicts of two runs, with the ratio B/A, and which of run A's fixes run B applied (the loader
setting the fix names, as B's probe recorded it) with how much of that fix's expected speed-up
B delivered: how a fix is checked. When no fix matches, A's ceiling (the whole stall gone) is
set beside it instead, and said to be one."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stallscope.analysis.diagnose import diagnose_run
from stallscope.analysis.rundata import RunData, load_run
from stallscope.analysis.throughput import PROBE_STEPS, SOURCE_TEXT
from stallscope.cli._common import add_out_option, out_console, resolve_run, safe
from stallscope.loadermodel import stall_cap
from stallscope.units import pct
from stallscope.units import speedup as fmt_speedup
from stallscope.units import throughput as fmt_rate

#: (label, key in the signals, unit)
_ROWS = (
    ("samples/s", "samples_per_s", ""),
    ("data-wait share", "stall_fraction", ""),
    ("step ms (median)", "step_ms_median", "ms"),
    ("GPU util % (median)", "gpu_util_median_pct", "%"),
    ("trainer CPU % (mean)", "main_cpu_pct", "%"),
    ("worker CPU % (mean, each)", "worker_cpu_pct", "%"),
    ("workers", "workers", ""),
    ("host CPU % (median)", "host_cpu_median_pct", "%"),
    ("disk util % (median)", "disk_util_median_pct", "%"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="two runs side by side (before/after a fix)",
        description="Throughput, data-wait share, resources and verdicts of "
        "two runs side by side, and how much of run A's estimated speed-up "
        "run B delivered.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="the run before (path, id, prefix, latest)")
    p.add_argument("run_b", metavar="RUN_B", help="the run after")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_out_option(p)
    p.set_defaults(func=run)


def compare(
    doc_a: dict[str, Any], doc_b: dict[str, Any], data_a: RunData, data_b: RunData
) -> dict[str, Any]:
    # every figure is the runs' facts, as `diagnose` and `show` print them (never recomputed)
    sa, sb = doc_a.get("signals", {}), doc_b.get("signals", {})
    fa, fb = data_a.facts().steps, data_b.facts().steps
    (ta, src_a), (tb, src_b) = (
        (fa.samples_per_s, fa.throughput_source),
        (fb.samples_per_s, fb.throughput_source),
    )
    rows = []
    for label, key, unit in _ROWS:
        a = ta if key == "samples_per_s" else sa.get(key)
        b = tb if key == "samples_per_s" else sb.get(key)
        if a is None and b is None:
            continue
        ratio = (
            round(b / a, 3)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a
            else None
        )
        rows.append({"what": label, "key": key, "a": a, "b": b, "ratio": ratio, "unit": unit})
    out: dict[str, Any] = {
        "a": doc_a["run"],
        "b": doc_b["run"],
        "rows": rows,
        "verdict_a": doc_a["verdict"],
        "verdict_b": doc_b["verdict"],
    }
    if ta is not None or tb is not None:
        out["throughput_source"] = {"a": src_a, "b": src_b}
    conf_a, conf_b = dict(loader_config(data_a)), dict(loader_config(data_b))
    seen = []
    for conf, signals, name in ((conf_a, sa, "a"), (conf_b, sb, "b")):
        if "num_workers" not in conf and type(signals.get("workers")) is int:
            conf["num_workers"] = signals["workers"]  # no probe: the worker processes seen
            seen.append(name)
    applied = applied_fix(doc_a, conf_a, conf_b)
    if applied is not None and seen:
        out["num_workers_from_processes"] = seen
    if ta and tb:
        out["speedup"] = round(tb / ta, 3)
        if applied is not None:
            out["applied_fix"] = applied["action"]
            out["measured_against"] = f"the fix's own estimate ({applied['kind']})"
            est = applied.get("expected_speedup")
        else:
            # no fix of A's matches what changed: A's data-wait ceiling (the whole stall gone,
            # compute unchanged) is all there is to set beside it; never another finding's
            # (cpu_contention's run-queue estimate is not what a loader change can deliver)
            stall = fa.stall_fraction
            est = stall_cap(stall) if stall is not None else None
            out["ceiling"] = True
            out["stall_a"] = stall
            out["measured_against"] = "A's data-wait ceiling (the whole stall gone)"
        if isinstance(est, (int, float)) and est > 1.01:
            out["estimated_speedup"] = round(est, 2)
            out["delivered_share"] = no_negative_zero(round((tb / ta - 1) / (est - 1), 3))
            if out["delivered_share"] < SHORT_OF:
                out["shortfall"] = shortfall(doc_b)
    elif ta is None or tb is None:
        out["no_throughput"] = (
            "samples/s needs, in both runs, the probe's per-step records "
            "(wrap the loader with stallscope.watch(loader)) or the "
            "DataLoader batches `stallscope run` counts inside a PyTorch "
            "trainer (not with --pid or --no-stacks); "
            + (
                "neither run has them"
                if ta is None and tb is None
                else f"run {'A' if ta is None else 'B'} has none"
            )
        )
    return out


#: a fix that delivered less than this share of its expected gain gets the reasons run B shows
SHORT_OF = 0.7
#: host CPU (median %) from which run B's cores had no room left for more loading
HOST_FULL_PCT = 90.0


def shortfall(doc_b: dict[str, Any]) -> list[str]:
    """Why run B may have delivered less than the fix promised, from what B itself shows: its
    CPUs full, other processes taking its cores, or still waiting for data."""
    sb = doc_b.get("signals") or {}
    why: list[str] = []
    host = sb.get("host_cpu_median_pct")
    # the CPU processes at a lower priority used was the training's to take (the facts' one
    # definition, as spare_cores counts it)
    from stallscope.analysis.facts.machine import busy_for_training_pct

    niced, cpus = sb.get("niced_others_cpu_cores"), sb.get("logical_cores")
    taken = host
    if isinstance(host, (int, float)) and isinstance(cpus, int):
        taken = busy_for_training_pct(
            host, niced if isinstance(niced, (int, float)) else None, cpus
        )
    if (
        isinstance(host, (int, float))
        and isinstance(taken, (int, float))
        and taken >= HOST_FULL_PCT
    ):
        why.append(
            f"run B's host CPU was at {host:.1f}% (median): the cores had no room "
            "left for the loading the fix added"
        )
    kinds = [f.get("kind") for f in doc_b.get("findings") or [] if isinstance(f, dict)]
    if "cpu_contention" in kinds:
        why.append("in run B other processes took the training's cores (cpu_contention)")
    stall = sb.get("stall_fraction")
    if isinstance(stall, (int, float)) and str(doc_b.get("verdict", "")).startswith("input_bound"):
        why.append(
            f"run B still waited for data {stall:.0%} of the time "
            f"({doc_b.get('verdict')}): see its diagnosis"
        )
    return why


def loader_config(data: RunData) -> dict[str, Any]:
    """The DataLoader settings the run's probe recorded (rank 0's, else the first's)."""
    probes = sorted(data.probes, key=lambda p: (p.get("rank") != 0, p.get("rank") or 0))
    for p in probes:
        loader = (p.get("config") or {}).get("loader")
        if isinstance(loader, dict):
            return loader
    return {}


def applied_fix(
    doc_a: dict[str, Any], before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any] | None:
    """The fix of A's diagnosis that run B applied: the first whose loader settings B has and
    A had not (None when no fix says what it changes, or B changed something else)."""
    for f in doc_a.get("findings") or []:
        for fix in f.get("fixes") or []:
            change = fix.get("change")
            if not isinstance(change, dict) or not change:
                continue
            if all(after.get(k) == v for k, v in change.items()) and any(
                before.get(k) != v for k, v in change.items()
            ):
                return {**fix, "kind": f.get("kind")}
    return None


def no_negative_zero(x: float) -> float:
    """``x``, with -0.0 (and a share that rounds to zero) as 0.0: "-0%" is not a figure."""
    return 0.0 if abs(x) < 0.0005 else x


def run(args: argparse.Namespace) -> int:
    runs = [resolve_run(args.run_a, args.out), resolve_run(args.run_b, args.out)]
    datas = [load_run(r) for r in runs]
    docs = [diagnose_run(r, d) for r, d in zip(runs, datas, strict=True)]
    out = compare(docs[0], docs[1], datas[0], datas[1])
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    from rich.table import Table

    table = Table(show_edge=False, title="A → B", title_justify="left")
    for col, just in (("", "left"), ("A", "right"), ("B", "right"), ("B/A", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]

    def fmt(key: str, v: Any) -> str:
        if v is None:
            return "-"
        if key == "stall_fraction" and isinstance(v, (int, float)):
            return pct(v)
        if key == "samples_per_s" and isinstance(v, (int, float)):
            return fmt_rate(v).removesuffix(" samples/s")  # the row's label says the unit
        return f"{v:,.1f}" if isinstance(v, float) else str(v)

    for r in out["rows"]:
        table.add_row(
            r["what"],
            fmt(r["key"], r["a"]),
            fmt(r["key"], r["b"]),
            "-" if r["ratio"] is None else fmt_speedup(r["ratio"]),
        )
    table.add_row("verdict", safe(out["verdict_a"]), safe(out["verdict_b"]), "")
    out_console.print(f"A: {safe(out['a'])}", highlight=False, soft_wrap=True)
    out_console.print(f"B: {safe(out['b'])}", highlight=False, soft_wrap=True)
    out_console.print(table)
    src = out.get("throughput_source") or {}
    if any(v not in (None, PROBE_STEPS) for v in src.values()):
        line = (
            "samples/s of both runs from " + SOURCE_TEXT[src["b"]]
            if src.get("a") == src.get("b")
            else "samples/s from: "
            + "; ".join(f"{k.upper()} {SOURCE_TEXT[v]}" for k, v in src.items() if v)
        )
        out_console.print(line, highlight=False, soft_wrap=True)
    if "speedup" in out:
        line = f"B is {fmt_speedup(out['speedup'])} the throughput of A"
        if "applied_fix" in out:
            line += f'; B applied A\'s fix "{safe(out["applied_fix"])}"'
            if out.get("num_workers_from_processes"):
                line += " (num_workers read from the worker processes the runs had: no probe)"
            if "estimated_speedup" in out:
                line += (
                    f", expected {fmt_speedup(out['estimated_speedup'])}: "
                    f"{pct(out['delivered_share'])} of the expected gain delivered"
                )
        elif "estimated_speedup" in out:
            line += (
                f"; no fix of A's diagnosis matches what changed; A's data-wait ceiling "
                f"(the whole stall of {pct(out.get('stall_a'))} gone, compute "
                f"unchanged) was {fmt_speedup(out['estimated_speedup'])}: "
                f"{pct(out['delivered_share'])} of it"
            )
        out_console.print(line, highlight=False, soft_wrap=True)
        for why in out.get("shortfall") or ():
            out_console.print(f"  why less: {safe(why)}", highlight=False, soft_wrap=True)
    elif "no_throughput" in out:
        out_console.print(
            f"no samples/s: {safe(out['no_throughput'])}", highlight=False, soft_wrap=True
        )
    return 0
