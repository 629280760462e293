"""``stallscope agent [--listen HOST:PORT] [--config FILE] [--interval S] [--store DIR]``

The node agent: samples GPU, disk and host continuously, serves ``/metrics`` to Prometheus and a
read-only JSON API, keeps a bounded local run store. Runs until SIGTERM or SIGINT, then stops
cleanly (exit 0). While it runs, what it says goes to stderr as logfmt lines
(``time=... level=INFO source=... msg=...``, :class:`~stallscope.errors.LogfmtFormatter`); a
start that fails is one plain line ``stallscope: ...``, as from any command. See
docs/agent.md."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from stallscope.cli._common import interval_type

log = logging.getLogger("stallscope.agent")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent",
        help="node agent: Prometheus /metrics and a read-only JSON API",
        description="Sample GPU, disk and host continuously; serve /metrics "
        "(Prometheus), /api/v1/snapshot, /api/v1/history and /api/v1/health; "
        "keep a bounded local run store. Binds 127.0.0.1 unless told otherwise. "
        "Flags override the config file.",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=None,
        help="address to serve on (default 127.0.0.1:10127; 0.0.0.0:10127 to let "
        "other machines scrape it)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="TOML file with listen, interval_s, store_dir, keep_full_s, gpus, devices",
    )
    p.add_argument(
        "--interval",
        type=interval_type,
        default=None,
        metavar="S",
        help="seconds between samples (default 5)",
    )
    p.add_argument(
        "--hostname",
        metavar="NAME",
        default=None,
        help="the host label's value (default: this machine's host name; in a "
        "Kubernetes pod give the node's name, --hostname $(NODE_NAME))",
    )
    p.add_argument(
        "--store",
        metavar="DIR",
        default=None,
        help="where the agent's run directories go (default "
        "$STALLSCOPE_STATE_DIR/agent, else ~/.local/state/stallscope/agent)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stallscope.agent.config import AgentConfig, check_value, load_config
    from stallscope.agent.node import Agent
    from stallscope.errors import LogfmtFormatter, StallscopeError, logging_to_stderr
    from stallscope.textsafe import error_text

    try:
        cfg = load_config(args.config) if args.config else AgentConfig()
        if args.listen is not None:
            try:
                cfg.listen = check_value("listen", args.listen)
            except ValueError as exc:
                raise StallscopeError(f"--{exc}") from None
        if args.interval is not None:
            cfg.interval_s = args.interval
        if args.store is not None:
            cfg.store_dir = args.store
        if args.hostname is not None:
            try:
                cfg.hostname = check_value("hostname", args.hostname)
            except ValueError as exc:
                raise StallscopeError(f"--{exc}") from None
        agent = Agent(cfg, argv=["stallscope", "agent", *sys.argv[2:]])
        stop = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            stop.set()

        # handlers before anything starts: a SIGTERM during start-up still stops cleanly
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            # from here the agent's log: logfmt lines with time and level (docs/agent.md)
            with logging_to_stderr(LogfmtFormatter(), logging.INFO):
                try:
                    agent.start()
                    unavailable = agent.prom.unavailable
                    note = "".join(f"; {k} unavailable: {v}" for k, v in unavailable.items())
                    log.info(
                        "serving http://%s/metrics every %g s; store %s%s",
                        agent.address,
                        cfg.interval_s,
                        agent.run_dir,
                        note,
                    )
                    while not stop.wait(0.5):
                        pass
                finally:
                    agent.stop()
                samples = agent.collector.samples if agent.collector is not None else 0
                log.info("stopped after %d samples; run directory %s", samples, agent.run_dir)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    except StallscopeError as exc:
        # one line, exit 2 for a bad config, 1 for an address that cannot be bound
        sys.stderr.write(f"stallscope: {error_text(exc)}\n")
        return exc.exit_code
    return 0
