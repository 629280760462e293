"""``stallscope diagnose RUN [--json]``: findings for a run; ``stallscope diagnose --prometheus
URL [--job J | --instance I] [--run-id R] [--since 30m]``: the same rules over what a Prometheus
server scraped from stallscope agents, one diagnosis per node."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stallscope.analysis.diagnose import diagnose, diagnose_run, print_diagnosis
from stallscope.analysis.rundata import load_run
from stallscope.cli._common import RUN_HELP, add_out_option, out_console, resolve_run
from stallscope.errors import UsageError
from stallscope.textsafe import plain


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="name the bottleneck of a run",
        description="Findings for a run: the bottleneck, the evidence (numbers "
        "and the rule behind them), fixes, and an upper-bound speedup. With "
        "--prometheus, the same rules over the series a Prometheus server "
        "scraped from stallscope agents (docs/agent.md).",
    )
    p.add_argument("run", metavar="RUN", nargs="?", help=RUN_HELP)
    p.add_argument("--json", action="store_true", help="print JSON (keys: docs/architecture.md)")
    add_out_option(p)
    g = p.add_argument_group("cluster diagnosis (instead of RUN)")
    g.add_argument(
        "--prometheus", metavar="URL", help="read a Prometheus server, e.g. http://prometheus:9090"
    )
    g.add_argument("--job", help="only targets of this scrape job")
    g.add_argument("--instance", help="only this target (HOST:PORT as Prometheus names it)")
    p.add_argument(
        "--run-id",
        dest="run_id",
        metavar="RUN",
        help="the training to diagnose: in an agent's store (RUN), one of the "
        "trainings it followed (default: the one with the most process samples); "
        "with --prometheus, the run to take steps from (default: the one with most "
        "steps in the window)",
    )
    g.add_argument(
        "--since",
        default="30m",
        metavar="DURATION",
        help="window to read, e.g. 30m, 2h (default 30m)",
    )
    g.add_argument(
        "--step",
        metavar="DURATION",
        help="query resolution (default 15s, coarser for long windows)",
    )
    g.add_argument(
        "--timeout",
        metavar="DURATION",
        default="60s",
        help="longest wait for the server's answer, reaching it and reading it whole (default 60s)",
    )
    g.add_argument(
        "--bearer-token-file",
        metavar="FILE",
        help="send the token in FILE as 'Authorization: Bearer' (Thanos, Mimir, "
        "Grafana Cloud; a secret is never taken on the command line)",
    )
    g.add_argument(
        "--basic-auth-user",
        metavar="USER",
        help="HTTP basic auth user; its password from --basic-auth-password-file",
    )
    g.add_argument(
        "--basic-auth-password-file",
        metavar="FILE",
        help="the basic-auth password, first line of FILE",
    )
    g.add_argument(
        "--ca-file", metavar="FILE", help="CA certificates (PEM) to trust for an https:// server"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.prometheus is not None:
        return _from_prometheus(args)
    if args.run is None:
        raise UsageError(
            "diagnose needs RUN (a run directory, run id or 'latest') or --prometheus URL"
        )
    run_dir = resolve_run(args.run, args.out)
    data = load_run(run_dir, args.run_id)
    doc = diagnose_run(run_dir, data)
    note = data.skipped_note()
    if note:  # the diagnosis is of what could be read; say once what could not
        sys.stderr.write(f"stallscope: {run_dir.name}: {note}\n")
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        line = training_line(data.meta)
        if line:
            out_console.print(line, highlight=False, soft_wrap=True)
        print_diagnosis(doc, out_console)
    return 0


def training_line(meta: dict[str, Any]) -> str | None:
    """For an agent's store: which of the trainings it followed this is, and how to pick
    another (None for one training's own run)."""
    chosen, seen = meta.get("training"), meta.get("trainings") or {}
    if not chosen:
        return None
    others = [r for r in seen if r != chosen]
    text = f"agent store: training {plain(str(chosen))}" + (
        f" (of {len(seen)} it followed: the one with the most process samples; "
        f"another with --run-id {plain(str(others[0]))})"
        if others
        else ""
    )
    return text


def _secret(flag: str, path: str) -> str:
    """The first line of a secret file, or one line saying why not."""
    from stallscope.safefile import NotRegular, read_bounded

    try:
        raw, _more = read_bounded(path, 64 << 10)
    except NotRegular:
        raise UsageError(f"{flag} {path}: not a regular file") from None
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror or exc}") from None
    text = raw.decode("utf-8", "replace").strip().splitlines()
    if not text or not text[0].strip():
        raise UsageError(f"{flag} {path}: the file is empty")
    secret = text[0].strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in secret):
        raise UsageError(f"{flag} {path}: the secret holds control characters")
    return secret


def _auth(args: argparse.Namespace) -> dict[str, str]:
    """What --prometheus sends to be let in: headers, and a CA file to trust."""
    out: dict[str, str] = {}
    if args.bearer_token_file and args.basic_auth_user:
        raise UsageError("give --bearer-token-file or --basic-auth-user, not both")
    if args.bearer_token_file:
        out["Authorization"] = "Bearer " + _secret("--bearer-token-file", args.bearer_token_file)
    if args.basic_auth_user is not None:
        if not args.basic_auth_password_file:
            raise UsageError(
                "--basic-auth-user needs --basic-auth-password-file (a password "
                "is never taken on the command line)"
            )
        import base64

        pw = _secret("--basic-auth-password-file", args.basic_auth_password_file)
        token = base64.b64encode(f"{args.basic_auth_user}:{pw}".encode()).decode()
        out["Authorization"] = f"Basic {token}"
    elif args.basic_auth_password_file:
        raise UsageError("--basic-auth-password-file needs --basic-auth-user")
    if args.ca_file:
        if not args.prometheus.startswith("https://"):
            raise UsageError("--ca-file is for an https:// server")
        out["ca_file"] = args.ca_file
    return out


def _from_prometheus(args: argparse.Namespace) -> int:
    from stallscope.analysis.promdata import PromQuery, load_fleet, parse_duration, shown_url

    if args.run is not None:
        raise UsageError("give RUN or --prometheus, not both")
    try:
        since = parse_duration(args.since)
    except ValueError as exc:
        raise UsageError(f"--since {exc}") from None
    try:
        step = parse_duration(args.step) if args.step is not None else None
    except ValueError as exc:
        raise UsageError(f"--step {exc}") from None
    try:
        timeout = parse_duration(args.timeout)
    except ValueError as exc:
        raise UsageError(f"--timeout {exc}") from None
    q = PromQuery(
        url=args.prometheus,
        job=args.job,
        instance=args.instance,
        run=args.run_id,
        timeout_s=timeout,
        since_s=since,
        step_s=step,
        auth=_auth(args),
    )
    docs: list[dict[str, Any]] = []
    nodes, jobs = load_fleet(q)
    for data in nodes:
        doc = diagnose(data)
        doc["prometheus"] = data.meta["prometheus"]
        docs.append(doc)
    job_docs: list[dict[str, Any]] = []
    for data in jobs:
        doc = diagnose(data)
        p = data.meta["prometheus"]
        doc.update(
            prometheus=p,
            train_job=p["train_job"],
            nodes=p["nodes"],
            rank_hosts=data.meta["rank_hosts"],
        )
        job_docs.append(doc)
    if args.json:
        if len(docs) == 1 and not job_docs:
            print(json.dumps(docs[0], indent=2, default=str))
        else:
            out: dict[str, Any] = {"prometheus": shown_url(q), "nodes": docs}
            if job_docs:
                out["jobs"] = job_docs
            print(json.dumps(out, indent=2, default=str))
        return 0
    for doc in job_docs:
        # a job over several nodes first: who holds it back is the question across nodes
        head = (
            f"training job {plain(doc['train_job'], 120)} on {len(doc['nodes'])} nodes "
            f"({plain(', '.join(doc['nodes']), 200)}), {len(doc['rank_hosts'])} ranks"
        )
        out_console.print(plain(head, None), soft_wrap=True, markup=False, highlight=False)
        print_diagnosis(doc, out_console)
        out_console.print("")
    for i, doc in enumerate(docs):
        p = doc["prometheus"]
        runs = p.get("runs") or {}
        head = f"node {plain(p['instance'], 120)}" + (
            f" (job {plain(p['job'], 80)})" if p.get("job") else ""
        )
        if p.get("run"):
            head += f", steps of run {plain(p['run'], 80)}"
            if len(runs) > 1:
                # the machine's run ids are clipped, never the hint after them
                others = plain(", ".join(r for r in sorted(runs) if r != p["run"]), 160)
                head += f" (also seen: {others}; choose with --run-id)"
        out_console.print(
            ("\n" if i else "") + plain(head, None), soft_wrap=True, markup=False, highlight=False
        )
        print_diagnosis(doc, out_console)
    return 0
