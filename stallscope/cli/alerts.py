"""``stallscope alerts check FILE`` / ``stallscope alerts replay FILE RUN [--json]``.

``check`` validates a rules file (one line per problem, naming the key). ``replay`` runs the
same engine as ``stallscope run --alerts`` over a stored run and prints what would have fired
and cleared, and when: how thresholds are tuned without waiting for a real incident. Replay
runs no action."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any

from stallscope.alerts import AlertEngine, load_rules, parse_rules
from stallscope.alerts.rulefile import FINDING_PREFIX, finding_metric
from stallscope.analysis.rundata import load_run
from stallscope.cli._common import RUN_HELP, add_out_option, out_console, resolve_run, safe
from stallscope.errors import UsageError
from stallscope.metrics import Point
from stallscope.textsafe import error_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "alerts",
        help="check an alert rules file, or replay it over a run",
        description="Alert rules ([[alerts]] tables in a TOML file; see "
        "docs/alerts.md): validate a file, or replay it over a stored run.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    c = verbs.add_parser(
        "check",
        help="validate a rules file",
        description="Validate FILE: every problem on its own line, naming "
        "the key; exit 1 when there is any.",
    )
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=check)
    r = verbs.add_parser(
        "replay",
        help="what the rules would have done over a stored run",
        description="Evaluate FILE's rules (with the shipped defaults) over a "
        "stored run and print when each alert would have fired and cleared. "
        "No action is run.",
    )
    r.add_argument("file", metavar="FILE", help="rules file ('-' for the defaults only)")
    r.add_argument("run", metavar="RUN", help=RUN_HELP)
    r.add_argument("--json", action="store_true", help="print JSON")
    add_out_option(r)
    r.set_defaults(func=replay)
    pr = verbs.add_parser(
        "prometheus",
        help="the shipped defaults as Prometheus alerting rules for your fleet",
        description="Print the shipped defaults as Prometheus alerting rules "
        "(YAML) over the agents' metrics, with a label selector for your "
        "fleet's series and runbook links where your copy of docs/alerts.md "
        "is served. deploy/prometheus/stallscope-alerts.yml is this with the "
        "defaults.",
    )
    pr.add_argument(
        "--selector",
        default="",
        metavar="MATCHERS",
        help="label matchers for the agents' series, e.g. 'job=\"gpu-nodes\"' "
        '(default: none; the agent-down rule uses job="stallscope")',
    )
    pr.add_argument(
        "--runbook-url",
        default=None,
        metavar="URL",
        help="where docs/alerts.md is served (each alert links to its anchor "
        "there; default: docs/alerts.md)",
    )
    pr.set_defaults(func=prometheus_rules)
    m = verbs.add_parser(
        "metrics",
        help="the metrics a rule can read",
        description="List the metrics alert rules can read (stallscope's "
        "vocabulary: name, unit, what it is), and the finding kinds a "
        "'finding' rule can name.",
    )
    m.add_argument("--source", default=None, help="only this source's (gpu, disk, host, ...)")
    m.set_defaults(func=list_metrics)
    p.set_defaults(func=lambda _a: _no_verb(p))


def list_metrics(args: argparse.Namespace) -> int:
    """``stallscope alerts metrics``: the vocabulary a rule's ``metric`` may name."""
    from stallscope.analysis.diagnose.model import KINDS
    from stallscope.metrics import METRICS

    rows = [
        m
        for m in METRICS
        if m.kind != "counter" and (args.source is None or m.source == args.source)
    ]
    if not rows:
        sources = sorted({m.source for m in METRICS})
        raise UsageError(f"--source {args.source}: no such source (one of {', '.join(sources)})")
    width = max(len(f"{m.source}.{m.key}") for m in rows)
    for m in rows:
        print(f"{m.source}.{m.key:<{width - len(m.source) - 1}}  {m.unit or '-':<6} {m.help}")
    if args.source is None:
        print(f'\nfinding kinds (finding = "..."): {", ".join(KINDS)}')
    return 0


def _no_verb(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return 2


def check(args: argparse.Namespace) -> int:
    try:
        rf = load_rules(args.file)
    except UsageError as exc:
        for line in str(exc).splitlines():
            sys.stderr.write(f"stallscope: {error_text(line)}\n")
        return 1
    out_console.print(
        f"{safe(args.file)}: {len(rf.rules)} rules OK (with the shipped defaults)", highlight=False
    )
    for rule in rf.rules:
        acts = ", ".join(a.kind for a in rule.actions)
        out_console.print(
            f"  {safe(rule.name)}: {safe(rule.describe())} → {acts}",
            highlight=False,
            soft_wrap=True,
        )
    return 0


def replay(args: argparse.Namespace) -> int:
    rf = parse_rules({}, "defaults") if args.file == "-" else load_rules(args.file)
    data = load_run(resolve_run(args.run, args.out))
    engine = AlertEngine(rf.rules)
    wanted = engine.metrics
    by_ts: dict[float, list[Point]] = defaultdict(list)
    for (name, entity), s in data.series.items():
        if name in wanted:
            for when, v in zip(s.ts, s.v, strict=True):
                by_ts[when].append(Point(name, entity, v))
    kinds = sorted({m[len(FINDING_PREFIX) :] for m in wanted if m.startswith(FINDING_PREFIX)})
    if kinds and by_ts:
        # `finding` rules: the whole run's diagnosis, at its last sample (a replay has no
        # "diagnosis so far" at each moment)
        from stallscope.analysis.diagnose import diagnose

        found: dict[str, float] = {}
        for f in diagnose(data)["findings"]:
            found[f["kind"]] = max(found.get(f["kind"], 0.0), float(f["confidence"]))
        last = max(by_ts)
        by_ts[last] += [Point(finding_metric(k), "", found.get(k, 0.0)) for k in kinds]
    t0 = data.t0
    rows: list[dict[str, Any]] = []
    for ts in sorted(by_ts):
        for t in engine.evaluate(ts, by_ts[ts]):
            rows.append(
                {
                    "t_s": round(ts - t0, 1),
                    "ts": ts,
                    "alert": t.rule.name,
                    "entity": t.entity,
                    "state": t.state,
                    "value": t.value,
                    "severity": t.rule.severity,
                    "notify": t.notify,
                    "summary": t.summary(),
                }
            )
    still = sorted(f"{n}" + (f" on {e}" if e else "") for n, e in engine.firing())
    if args.json:
        print(
            json.dumps(
                {
                    "run": str(data.run_dir),
                    "rules": [r.name for r in rf.rules],
                    "transitions": rows,
                    "firing_at_end": still,
                },
                indent=2,
            )
        )
        return 0
    out_console.print(
        f"replayed {len(rf.rules)} rules over {safe(str(data.run_dir))} ({len(by_ts)} samples)",
        highlight=False,
        soft_wrap=True,
    )
    if not rows:
        out_console.print("  nothing would have fired")
    for r in rows:
        note = "" if r["notify"] else "  (not notified: within cooldown)"
        out_console.print(
            f"  +{r['t_s']:>8.1f} s  {r['state']:<7}  {safe(r['summary'])}{note}",
            highlight=False,
            soft_wrap=True,
        )
    if still:
        out_console.print(f"  still firing at the end: {safe(', '.join(still))}", highlight=False)
    return 0


def prometheus_rules(args: argparse.Namespace) -> int:
    from stallscope.alerts.promrules import DEFAULT_RUNBOOK, render

    try:
        text = render(args.selector, args.runbook_url or DEFAULT_RUNBOOK)
    except ValueError as exc:
        raise UsageError(f"alerts prometheus: {exc}") from None
    sys.stdout.write(text)
    return 0
