"""The agent's HTTP server: ``/metrics`` for Prometheus and a small read-only JSON API.

Endpoints (GET and HEAD only; any other method is 405 and changes nothing; nothing changes
state):

``/metrics``
    the Prometheus text exposition (``generate_latest`` of the exporter's private registry).
``/api/v1/snapshot``
    the latest sample's payloads in the ``snapshot --json`` shape, with ``ts``.
``/api/v1/history?metric=host.cpu_pct&entity=&since=600``
    points of one metric from the local run store (every entity unless ``entity`` is given).
``/api/v1/health``
    each source up or down, and why.

An unknown path is 404 with a JSON error. The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import math
import re
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics_format

from stallscope.errors import StallscopeError
from stallscope.metrics import lookup
from stallscope.stats import json_finite

if TYPE_CHECKING:
    from stallscope.agent.node import Agent

__all__ = [
    "AgentHTTPServer",
    "ListenError",
    "choose_format",
    "gzip_wanted",
    "make_server",
    "port_holder",
]

log = logging.getLogger("stallscope.agent")

#: the longest history one request may ask for (a week)
#: gzip level of ``/metrics``: on an 8-GPU node's exposition (benchmarks/bench_exposition.py)
#: level 6 sends 0.074x the bytes for 1.17x the CPU of plain text; 9 saves 0.7% more for 1.31x
GZIP_LEVEL = 6
MAX_SINCE_S = 7 * 86400.0
DEFAULT_SINCE_S = 600.0
_ALLOW = "GET, HEAD"


class ListenError(StallscopeError):
    """The address cannot be bound (in use, not ours, no permission)."""

    exit_code = 1


class AgentHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a slow client never holds the agent's exit
    #: a burst of scrapes and API clients queues in the kernel instead of being refused and
    #: retried (socketserver's default is 5: 250 connections took ~20 s to be accepted)
    request_queue_size = 128
    agent: Agent | None = None
    #: ``/metrics`` answers by format and encoding (``"openmetrics,gzip": 12``), for health
    scrapes: dict[str, int] | None = None

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up early (reset, broken pipe, timeout) is no error of the
        agent's: nothing is said. Anything else is one warning in the agent's log, never a
        traceback; the agent keeps serving either way."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        log.warning(
            "a request from %s failed: %s: %s",
            client_address[0],
            type(exc).__name__,
            str(exc)[:200],
        )


class _V6Server(AgentHTTPServer):
    address_family = socket.AF_INET6


def make_server(host: str, port: int) -> AgentHTTPServer:
    """Bind (and listen on) ``host:port``; :class:`ListenError` in one line if it cannot."""
    cls = _V6Server if ":" in host else AgentHTTPServer
    try:
        return cls((host, port), Handler)
    except OSError as exc:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            holder = port_holder(port)
            why = (
                f"address already in use{f' by {holder}' if holder else ''} (dcgm-exporter "
                "listens on 9400, node_exporter on 9100); give another with --listen "
                "HOST:PORT or `listen` in the config"
            )
        elif exc.errno == errno.EACCES:
            why = "permission denied (ports below 1024 need root)"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = "no such address on this machine"
        elif isinstance(exc, socket.gaierror):
            why = f"unknown host ({exc.strerror})"
        else:
            why = (exc.strerror or str(exc)).lower()
        raise ListenError(f"cannot listen on {where}: {why}") from None


def port_holder(port: int) -> str | None:
    """``pid N (name)`` of the process listening on TCP ``port``, where this user may see it
    (psutil reads /proc/net/tcp and each process's sockets); None when it cannot tell."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            try:
                return f"pid {c.pid} ({psutil.Process(c.pid).name()})"
            except (psutil.Error, OSError):
                return f"pid {c.pid}"
    return None


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Handler(BaseHTTPRequestHandler):
    server: AgentHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive for Prometheus; every answer has a length

    def version_string(self) -> str:
        return "stallscope-agent"

    # --- methods --------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._respond(send_body=True)

    def do_HEAD(self) -> None:
        self._respond(send_body=False)

    def __getattr__(self, name: str) -> Any:
        # BaseHTTPRequestHandler looks up do_<METHOD>; every method but GET and HEAD is 405
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        # the request's body is not read: close the connection rather than parse it as the
        # next request
        self.close_connection = True
        self._send(
            405,
            "application/json",
            _json(
                {
                    "error": f"method {self.command} not allowed (only GET and HEAD; "
                    "this API changes nothing)"
                }
            ),
            extra={"Allow": _ALLOW, "Connection": "close"},
        )

    def log_message(self, format: str, *args: Any) -> None:
        return  # a scrape every 15 s is not news; errors are answered to the client

    # --- routing --------------------------------------------------------------------------------
    def _respond(self, send_body: bool) -> None:
        url = urlsplit(self.path)
        agent = self.server.agent
        try:
            if agent is None:
                raise _BadRequest(503, "the agent is starting")
            if url.path == "/metrics":
                self._metrics(agent, send_body)
                return
            query = parse_qs(url.query, keep_blank_values=True)
            if url.path == "/api/v1/snapshot":
                doc = agent.snapshot()
                if doc is None:
                    raise _BadRequest(503, "no sample yet; try again after one interval")
            elif url.path == "/api/v1/history":
                doc = self._history(agent, query)
            elif url.path == "/api/v1/health":
                doc = {**agent.health(), "scrapes": dict(self.server.scrapes or {})}
            elif url.path == "/":
                doc = {
                    "endpoints": [
                        "/metrics",
                        "/api/v1/snapshot",
                        "/api/v1/history",
                        "/api/v1/health",
                    ]
                }
            else:
                raise _BadRequest(404, f"no such endpoint: {url.path}")
        except _BadRequest as exc:
            self._send(exc.status, "application/json", _json({"error": str(exc)}), send_body)
            return
        self._send(200, "application/json", _json(doc), send_body)

    def _metrics(self, agent: Agent, send_body: bool) -> None:
        """The exposition as the scraper asks (:func:`choose_format`): OpenMetrics 1.0.0 when
        its ``Accept`` prefers it, else text 0.0.4 (prometheus_client's own encoders), gzipped
        when ``Accept-Encoding`` allows (:func:`gzip_wanted`; Prometheus always asks): an 8-GPU
        node's text is ~200 kB."""
        name = choose_format(self.headers.get("Accept") or "")
        encoder, ctype = FORMATS[name]
        body = encoder(agent.prom.registry)
        extra = {"Vary": "Accept, Accept-Encoding"}
        encoding = "identity"
        if gzip_wanted(self.headers.get("Accept-Encoding") or ""):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            extra["Content-Encoding"] = encoding = "gzip"
        key = f"{name},{encoding}"
        scrapes = self.server.scrapes
        if scrapes is None:
            scrapes = self.server.scrapes = {}
        scrapes[key] = scrapes.get(key, 0) + 1  # a lost increment under a race is harmless
        self._send(200, ctype, body, send_body, extra)

    def _history(self, agent: Agent, query: dict[str, list[str]]) -> dict[str, Any]:
        metric = (query.get("metric") or [""])[0]
        if not metric:
            raise _BadRequest(400, "metric is required, e.g. ?metric=host.cpu_pct")
        m = lookup(metric)
        if m is None:
            raise _BadRequest(
                400,
                f"unknown metric {metric!r} (names: stallscope/metrics/, "
                "e.g. host.cpu_pct, disk.r_await_ms)",
            )
        if m.kind == "counter":
            raise _BadRequest(
                400,
                f"{metric} is a raw counter, exported on /metrics only; the store keeps its rate",
            )
        entity = query["entity"][0] if "entity" in query else None
        since_text = (query.get("since") or [str(DEFAULT_SINCE_S)])[0]
        try:
            since = float(since_text)
        except ValueError:
            raise _BadRequest(400, f"since must be seconds, got {since_text!r}") from None
        if not math.isfinite(since) or not 0 < since <= MAX_SINCE_S:
            raise _BadRequest(
                400, f"since must be between 0 and {MAX_SINCE_S:g} seconds, got {since_text!r}"
            )
        series = agent.history(metric, entity, time.time() - since)
        return {
            "metric": metric,
            "unit": m.unit,
            "since_s": since,
            "series": [{"entity": ent, "points": pts} for ent, pts in series],
        }

    # --- output ---------------------------------------------------------------------------------
    def _send(
        self,
        status: int,
        ctype: str,
        body: bytes,
        send_body: bool = True,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if send_body and self.command != "HEAD":
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away


# --- negotiation (RFC 9110 §12.5) ----------------------------------------------------------------
#: the formats ``/metrics`` serves, by name: (encoder, the whole Content-Type). The Content-Type
#: is one of these constants, never built from the request: an ``Accept`` asking for a version
#: we do not serve (``version=abc``, ``2.0.0``) gets another format, not its version echoed.
FORMATS: dict[str, tuple[Any, str]] = {
    "text": (text_format.generate_latest, text_format.CONTENT_TYPE_PLAIN_0_0_4),
    "openmetrics": (openmetrics_format.generate_latest, openmetrics_format.CONTENT_TYPE_LATEST),
}
#: media type and version of each format; a range without ``version`` matches the one we serve
_MEDIA = {"text": ("text/plain", "0.0.4"), "openmetrics": ("application/openmetrics-text", "1.0.0")}
_QVALUE = re.compile(r"(?:0(?:\.\d{0,3})?|1(?:\.0{0,3})?)")


def _elements(header: str) -> list[tuple[str, dict[str, str], float]]:
    """``Accept`` / ``Accept-Encoding``'s list: (value, lower-cased parameters, q) per element.
    An element whose ``q`` is not a qvalue (``0`` to ``1``, three decimals at most) counts as
    ``q=0``: it is never chosen."""
    out = []
    for element in header.split(","):
        value, *params = (part.strip() for part in element.split(";"))
        if not value:
            continue
        named: dict[str, str] = {}
        for param in params:
            key, _, v = param.partition("=")
            named[key.strip().lower()] = v.strip().strip('"')
        q_text = named.pop("q", "1")
        q = float(q_text) if _QVALUE.fullmatch(q_text) else 0.0
        out.append((value.lower(), named, q))
    return out


def choose_format(accept: str) -> str:
    """``"openmetrics"`` or ``"text"`` for an ``Accept`` header. Each format takes the ``q`` of
    the most specific range that matches it (type with our version, type with no version,
    ``type/*``, ``*/*``); the higher ``q`` wins, then the more specific range, then the earlier
    one. A header that matches neither with ``q > 0`` (no header, ``application/json``, only
    versions we do not serve) gets text 0.0.4, as prometheus_client does: an answer, never 406
    nor a dropped connection."""
    best: dict[str, tuple[float, int, int]] = {}
    for position, (media, params, q) in enumerate(_elements(accept)):
        for name, (ours, version) in _MEDIA.items():
            if media == ours:
                if "version" not in params:
                    specificity = 2
                elif params["version"] == version:
                    specificity = 3
                else:
                    continue  # a version we do not serve
            elif media == ours.split("/")[0] + "/*":
                specificity = 1
            elif media == "*/*":
                specificity = 0
            else:
                continue
            got = best.get(name)
            if got is None or (specificity, -position) > (got[1], -got[2]):
                best[name] = (q, specificity, position)
    om, text = best.get("openmetrics"), best.get("text")
    if om is None or om[0] <= 0:
        return "text"
    if text is None or (om[0], om[1], -om[2]) > (text[0], text[1], -text[2]):
        return "openmetrics"
    return "text"


def gzip_wanted(accept_encoding: str) -> bool:
    """Whether ``Accept-Encoding`` lets ``/metrics`` be gzipped: ``gzip`` (or ``x-gzip``) with
    ``q > 0``, or not named and ``*`` with ``q > 0``; and ``identity`` not preferred over it.
    ``gzip;q=0`` forbids it (RFC 9110 §12.5.3)."""
    q_of: dict[str, float] = {}
    for coding, _params, q in _elements(accept_encoding):
        if coding == "x-gzip":
            coding = "gzip"
        q_of.setdefault(coding, q)
    gz = q_of.get("gzip", q_of.get("*", 0.0))
    return gz > 0 and gz >= q_of.get("identity", 0.0)


def _json(doc: Any) -> bytes:
    try:
        text = json.dumps(doc, default=str, allow_nan=False)
    except ValueError:  # a NaN somewhere in a payload: strict JSON says null
        text = json.dumps(json_finite(doc), default=str, allow_nan=False)
    return (text + "\n").encode()
