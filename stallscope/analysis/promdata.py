"""The run reader's second constructor: a :class:`~stallscope.analysis.rundata.RunData` filled
from a Prometheus server that scraped stallscope agents, so ``diagnose --prometheus`` runs the
same rules over cluster data.

Two ``query_range`` calls over the window: every ``stallscope_*`` series of the selected
targets (``job``/``instance``), and the step counters of the trainings
(:mod:`stallscope.agent.steps`). Series go back to the vocabulary's names, entities and units
(``stallscope/metrics/``: the exported value divided by ``prom_scale``; the GPU's index from
``gpu``, a disk's from ``device``...). Steps come back from the counters: between two points of
a rank, ``n`` new steps with ``w`` seconds of data wait and ``t`` seconds of step time become
``n`` step rows of ``t/n`` each, with the interval's data waits as the rank's wait histogram
gives them (scaled to ``w``; ``w/n`` each without it), so sums and shares are exact. One
:class:`RunData` per node (``instance``); the steps of a training are those of its ranks on that
node. A training job whose ranks are on several nodes (one ``train_job`` label under several
instances) also gets a RunData of its own with every rank's steps (:func:`load_fleet`), so
stragglers are found across nodes. The agent's histograms (the DataLoader workers' batch costs,
each step's data wait) and its loader-thread gauges come back as a run's files hold them
(:mod:`.promhist`).

What Prometheus does not hold is absent, and the rules that need it do not fire: the per-step
detail inside a scrape interval (epoch starts), the DataLoader's configuration, the trainer's
processes (the agent exports them only for runs under ``stallscope run`` on the same
process), each disk's sysfs facts, SMART.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from stallscope.analysis.promhist import (
    BATCH_BUCKETS,
    TIMED_BUCKETS,
    WAIT_BUCKETS,
    Columns,
    WaitSpread,
    attach_batch_times,
    batch_costs_of,
    threads_parts,
)
from stallscope.analysis.rundata import RunData
from stallscope.errors import StallscopeError
from stallscope.httpsafe import opener, redact, secrets_of, split_userinfo
from stallscope.labels import attrs_of, entity_of, host_of
from stallscope.metrics import METRICS, Metric
from stallscope.sources.owner import OWNER_KEYS
from stallscope.sources.stacks.phases import PHASES
from stallscope.store import Series, StepRow

__all__ = [
    "PromQuery",
    "PrometheusError",
    "load_fleet",
    "load_prometheus",
    "parse_duration",
    "shown_url",
]

_STEP_NAMES = {
    "stallscope_train_steps_total": "n",
    "stallscope_train_step_seconds_total": "step_s",
    "stallscope_train_data_wait_seconds_total": "wait_s",
    "stallscope_train_samples_total": "samples",
    "stallscope_train_comm_wait_seconds_total": "comm_s",
    "stallscope_train_first_step_timestamp_seconds": "first_ts",
}
_LABEL_VALUE = re.compile(r"^[^\"\\\n]*$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
#: Prometheus answers at most 11,000 points per series
_MAX_POINTS = 11000
#: each read of an answer may wait this long; the whole answer, PromQuery.timeout_s
READ_TIMEOUT_S = 30.0
#: the largest answer read (a week of every series of a big node at 15 s is far below)
MAX_ANSWER_BYTES = 512 << 20
#: more steps a second than any training makes: a counter that jumps by more is not read as
#: steps (one row is built per step)
MAX_STEPS_PER_S = 10_000


class PrometheusError(StallscopeError):
    """Prometheus cannot be reached, refuses the query, or holds no stallscope series."""

    exit_code = 1


def parse_duration(text: str) -> float:
    """``30m``, ``2h``, ``90s``, ``15`` (seconds) -> seconds; ValueError with the reason."""
    m = _DURATION.match(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"must be a duration such as 30m, 2h or 90s, got {text!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True)
class PromQuery:
    """Which targets and time window to read."""

    url: str
    job: str | None = None
    instance: str | None = None
    run: str | None = None
    since_s: float = 1800.0
    step_s: float | None = None  #: None: 15 s, or coarser when the window needs it
    end: float | None = None  #: None: now
    timeout_s: float = 60.0  #: the longest wait for one whole answer
    #: request headers to be let in (``Authorization``), and ``ca_file``: CAs to trust (https)
    auth: dict[str, str] = field(default_factory=dict)

    def selector(self) -> str:
        parts = []
        for label, value in (("job", self.job), ("instance", self.instance)):
            if value is not None:
                if not _LABEL_VALUE.match(value):
                    raise PrometheusError(
                        f"--{label} must not hold quotes, backslashes or newlines, got {value!r}"
                    )
                parts.append(f'{label}="{value}"')
        return ",".join(parts)

    def window(self) -> tuple[float, float, float]:
        end = self.end if self.end is not None else time.time()
        start = end - self.since_s
        step = self.step_s if self.step_s is not None else 15.0
        step = max(step, math.ceil(self.since_s / (_MAX_POINTS - 1)))
        return start, end, step


def shown_url(q: PromQuery) -> str:
    """The server's URL as messages and stored runs name it: no password, no token."""
    return redact(q.url.rstrip("/"), secrets_of(q.auth))


def _query_range(
    q: PromQuery, promql: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    headers = {"Accept": "application/json", **{k: v for k, v in q.auth.items() if k != "ca_file"}}
    url, user, pw = split_userinfo(q.url.rstrip("/"))
    if user is not None and pw is not None and "Authorization" not in headers:
        # urllib cannot send a URL's user:password@: it becomes a basic-auth header
        token = base64.b64encode(f"{user}:{pw}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    secrets = secrets_of(headers)
    base = redact(url, secrets)  # what messages name: never a password nor a token
    if not url.startswith(("http://", "https://")):
        raise PrometheusError(
            f"--prometheus must be an http:// or https:// URL, got {redact(q.url, secrets)!r}"
        )
    args = urllib.parse.urlencode(
        {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    try:
        req = urllib.request.Request(f"{url}/api/v1/query_range?{args}", headers=headers)
        body = _fetch(req, q.timeout_s, base, q.auth.get("ca_file"))
    except urllib.error.HTTPError as exc:
        try:
            why = json.loads(exc.read()).get("error") or exc.reason
        except (ValueError, OSError, AttributeError, http.client.HTTPException):
            why = exc.reason
        hint = (
            "; give --bearer-token-file, or --basic-auth-user with --basic-auth-password-file"
            if exc.code in (401, 403)
            else ""
        )
        raise PrometheusError(
            f"Prometheus at {base} refused the query ({exc.code}): "
            f"{redact(_one_line(why), secrets)}{hint}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, socket.timeout):
            reason = "timed out"
        elif isinstance(exc, http.client.IncompleteRead):
            reason = "the answer ended before its Content-Length"
        raise PrometheusError(
            f"cannot reach Prometheus at {base}: {redact(_one_line(reason), secrets)}"
        ) from None
    try:
        doc = json.loads(body)
        result = doc["data"]["result"] if doc.get("status") == "success" else None
    except (ValueError, KeyError, TypeError, AttributeError):
        result = None
    if not isinstance(result, list):
        raise PrometheusError(
            f"{base} did not answer as the Prometheus HTTP API does (/api/v1/query_range)"
        )
    return result


def _fetch(
    req: urllib.request.Request, timeout_s: float, base: str, ca_file: str | None = None
) -> bytes:
    """The whole answer to ``req`` within ``timeout_s``, reaching the server included: the
    request runs on a helper thread and is given up at the deadline, however slowly the server
    sends its headers or its body (a socket timeout bounds each read, not their sum)."""
    deadline = time.monotonic() + timeout_s
    box: list[Any] = []

    def work() -> None:
        try:
            # redirects keep credentials on the server they were given for (httpsafe)
            with opener(ca_file).open(req, timeout=min(READ_TIMEOUT_S, timeout_s)) as r:
                box.append(_read_all(r, deadline, base, timeout_s))
        except BaseException as exc:  # handed to the caller's thread as it is
            box.append(exc)

    t = threading.Thread(target=work, name="stallscope-prometheus", daemon=True)
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))
    if not box:
        raise PrometheusError(
            f"cannot reach Prometheus at {base}: no complete answer in {timeout_s:g} s (--timeout)"
        )
    if isinstance(box[0], BaseException):
        raise box[0]
    body: bytes = box[0]
    return body


def _read_all(r: Any, deadline: float, base: str, timeout_s: float) -> bytes:
    """The whole answer by ``deadline`` (the socket timeout bounds each read, so a server that
    trickles a byte every few seconds would otherwise never time out), at most
    :data:`MAX_ANSWER_BYTES`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise PrometheusError(
                f"cannot reach Prometheus at {base}: no complete answer in "
                f"{timeout_s:g} s (--timeout)"
            )
        # read1: what one receive brings (read(n) waits until n bytes came, however slowly)
        chunk = r.read1(1 << 16) if hasattr(r, "read1") else r.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise PrometheusError(
                f"{base} answered more than {MAX_ANSWER_BYTES >> 20} MiB: "
                "narrow the window (--since) or the targets (--instance)"
            )
        chunks.append(chunk)


def _one_line(why: object) -> str:
    """A server's reason as one short line (a redirect loop's reason has three)."""
    return "; ".join(ln.strip() for ln in str(why).splitlines() if ln.strip())[:200]


def _values(series: dict[str, Any]) -> tuple[list[float], list[float]]:
    ts: list[float] = []
    vs: list[float] = []
    values = series.get("values") if isinstance(series, dict) else None
    for pair in values if isinstance(values, list) else ():
        try:
            t, v = pair
            x, tt = float(v), float(t)
        except (TypeError, ValueError):
            continue  # not a [time, "value"] pair: skipped
        if math.isfinite(x) and math.isfinite(tt):
            ts.append(tt)
            vs.append(x)
    return ts, vs


def _one_run_of_procs(
    series: dict[tuple[str, str], Series],
    entities: dict[tuple[str, str], dict[str, Any]],
    run: str | None,
) -> str | None:
    """Keep the processes of one training (``run``; when no probe chose one, the run with the
    most process points) and give them back their parents: the agent's ``role`` and ``rank``
    labels say which worker belongs to which trainer (the tree the roles are inferred from,
    :func:`~stallscope.sources.roles.infer_roles`, needs ``ppid``)."""
    procs = {ent: a for (src, ent), a in entities.items() if src == "procs"}
    if not procs:
        return run
    if run is None or run not in {a.get("run") for a in procs.values()}:
        points: dict[str, int] = defaultdict(int)
        for (name, ent), ser in series.items():
            if name.startswith("procs.") and ent in procs:
                points[str(procs[ent].get("run"))] += len(ser.ts)
        run = max(points, key=lambda r: (points[r], r)) if points else None
    gone = {ent for ent, a in procs.items() if str(a.get("run")) != str(run)}
    for key in [k for k in series if k[0].startswith("procs.") and k[1] in gone]:
        del series[key]
    for ent in gone:
        del entities[("procs", ent)]
    kept = {ent: a for ent, a in procs.items() if ent not in gone}
    mains = {ent: a.get("rank") for ent, a in kept.items() if a.get("role") == "main"}
    launchers = [ent for ent, a in kept.items() if a.get("role") == "launcher"]
    for a in kept.values():
        if a.get("ppid") not in (None, ""):
            parent = a["ppid"]  # the agent says it (agents before the ppid label did not)
        elif a.get("role") == "worker":
            same = [m for m, rank in mains.items() if rank == a.get("rank")]
            parent = same[0] if len(same) == 1 else (next(iter(mains)) if len(mains) == 1 else None)
        elif a.get("role") == "main" and len(launchers) == 1:
            parent = launchers[0]
        else:
            parent = None
        a["ppid"] = parent
        # the sampler's role of a recorded run: "main" for the tree's root, else "worker"
        a["role"] = "main" if a.get("role") == "main" else "worker"
    return run


#: procs fields that an agent with ``worker_series = "rank"`` exports as the workers' mean
_MEAN_OVER_WORKERS = frozenset({"procs.main_thread_active_pct"})


def _split_worker_groups(
    series: dict[tuple[str, str], Series], entities: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """An agent with ``worker_series = "rank"`` sums each trainer's DataLoader workers into one
    series (``pid="<trainer>/workers"``, ``stallscope_proc_processes`` = how many). The
    diagnosis counts workers and reads the mean worker, so such a group comes back as that
    many equal workers (each the group's mean at each point); counters are left out (the
    rates beside them say the same)."""
    for (src, ent), attrs in list(entities.items()):
        count = series.get(("procs.processes", ent))
        if src != "procs" or count is None or not count.v:
            continue
        n_at = dict(zip(count.ts, count.v))
        n = max(1, round(sorted(count.v)[len(count.v) // 2]))
        mine = {
            name: ser for (name, e), ser in series.items() if e == ent and name.startswith("procs.")
        }
        for name in mine:
            del series[(name, ent)]
        for i in range(n):
            clone = ent if i == 0 else f"{ent}#{i + 1}"
            entities[("procs", clone)] = dict(attrs)
            for name, ser in mine.items():
                if name == "procs.processes" or name.endswith("_total"):
                    continue
                keep = name in _MEAN_OVER_WORKERS
                pts = [
                    (t, v if keep else v / n_at[t])
                    for t, v in zip(ser.ts, ser.v)
                    if keep or n_at.get(t)
                ]
                series[(name, clone)] = Series(
                    name, clone, [t for t, _ in pts], [v for _, v in pts]
                )


def _stack_records(
    series: dict[tuple[str, str], Series],
    entities: dict[tuple[str, str], dict[str, Any]],
    run: str | None,
) -> list[dict[str, Any]]:
    """The sampled stacks of one training's processes as the records a run directory holds
    (:mod:`stallscope.sources.stacks.aggregate`): at each point, each phase's seconds =
    its share × the seconds the interval's samples stood for."""
    out: list[dict[str, Any]] = []
    for (src, ent), attrs in entities.items():
        if src != "stacks" or (run is not None and str(attrs.get("run")) != str(run)):
            continue
        sampled = series.get(("stacks.sampled_s", ent))
        if sampled is None or not ent.isdigit():
            continue
        shares = {
            p: dict(zip(s.ts, s.v))
            for p in PHASES
            if (s := series.get((f"stacks.{p}_pct", ent))) is not None
        }
        rank_text = str(attrs.get("rank"))
        rank = int(rank_text) if rank_text.isdigit() else None
        threads = threads_parts(series, ent)  # its loader threads, where it has any
        for ts, secs in zip(sampled.ts, sampled.v):
            s_ = {p: v[ts] / 100.0 * secs for p, v in shares.items() if ts in v and v[ts] > 0}
            if s_:
                rec = {"ts": ts, "pid": int(ent), "sampler": "agent, via Prometheus"}
                out.append({**rec, "rank": rank, "s": s_})
                if ts in threads:
                    out[-1]["threads"] = threads[ts]
    out.sort(key=lambda r: r["ts"])
    return out


_StepCols = dict[str, tuple[list[float], list[float]]]


@dataclass
class _Scraped:
    """What one query_range answer holds, sorted by node (``instance``)."""

    series: dict[str, dict[tuple[str, str], Series]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    entities: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    hosts: dict[str, str] = field(default_factory=dict)
    #: instance -> run id -> its owner labels (namespace, pod, container, hpc_job) as its step
    #: series carry them
    owners: dict[str, dict[str, dict[str, str]]] = field(default_factory=lambda: defaultdict(dict))
    jobs: dict[str, str] = field(default_factory=dict)
    #: (instance, run id) -> the training job it is part of (``train_job``, the same on every
    #: node of a job)
    train_jobs: dict[tuple[str, str], str] = field(default_factory=dict)
    down: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    steps: dict[str, dict[tuple[str, int], _StepCols]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )
    #: instance -> (run id, rank) -> its steps' data-wait buckets
    waits: dict[str, dict[tuple[str, int], Columns]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )
    #: instance -> (run id, trainer pid) -> its DataLoader workers' batch-cost buckets
    batches: dict[str, dict[tuple[str, str], Columns]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )
    #: instance -> (run id, trainer pid) -> wait_b / step_b -> its timed batches' buckets
    timed: dict[str, dict[tuple[str, str], dict[str, Columns]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    )

    def instances(self) -> list[str]:
        return sorted(set(self.series) | set(self.steps))

    def add(self, s: dict[str, Any]) -> None:
        """File one series of the answer under its node: a vocabulary metric, a step counter
        or a source's up flag."""
        metric = s.get("metric") if isinstance(s, dict) else None
        if not isinstance(metric, dict):
            return  # not a series as the API gives them: skipped
        labels = {str(k): str(v) for k, v in metric.items()}
        name = labels.pop("__name__", "")
        inst = labels.get("instance", "")
        self.jobs.setdefault(inst, labels.get("job", ""))
        if host_of(labels):
            self.hosts.setdefault(inst, host_of(labels))
        if name == "stallscope_source_up":
            _ts, vs = _values(s)
            if vs and vs[-1] == 0 and labels.get("source"):
                self.down[inst][labels["source"]] = "down in Prometheus (stallscope_source_up 0)"
        elif name in _STEP_NAMES:
            try:
                key = (labels.get("run", ""), int(labels.get("rank", "")))
            except ValueError:
                return
            self.steps[inst][key][_STEP_NAMES[name]] = _values(s)
            if labels.get("train_job"):
                self.train_jobs[(inst, key[0])] = labels["train_job"]
            owner = {k: labels[k] for k in OWNER_KEYS if labels.get(k)}
            if owner:
                self.owners[inst][key[0]] = owner
        elif name in _BY_PROM:
            self._add_metric(_BY_PROM[name], inst, labels, *_values(s))
        elif name in (WAIT_BUCKETS, BATCH_BUCKETS) and labels.get("le"):
            self._add_buckets(name, inst, labels, s)
        elif name in TIMED_BUCKETS and labels.get("le") and labels.get("pid", "").isdigit():
            trainer = (labels.get("run", ""), labels["pid"])
            self.timed[inst][trainer][TIMED_BUCKETS[name]][labels["le"]] = _values(s)

    def _add_buckets(self, name: str, inst: str, labels: dict[str, str], s: Any) -> None:
        """One bucket of a rank's data-wait histogram or a trainer's batch-cost one."""
        run, le = labels.get("run", ""), labels["le"]
        if name == WAIT_BUCKETS:
            try:
                rank = int(labels.get("rank", ""))
            except ValueError:
                return
            self.waits[inst][(run, rank)][le] = _values(s)
        elif labels.get("pid", "").isdigit():
            self.batches[inst][(run, labels["pid"])][le] = _values(s)

    def _add_metric(
        self, m: Metric, inst: str, labels: dict[str, str], ts: list[float], vs: list[float]
    ) -> None:
        if not ts:
            return
        ent = entity_of(m, labels)
        scale = m.prom_scale or 1.0
        vs = [v / scale for v in vs]
        had = self.series[inst].get((m.name, ent))
        if had is not None:
            # the same entity under another label set (a process that got its rank label
            # once its probe reported): one series, in time order, each time once
            merged = dict(zip(had.ts, had.v))
            merged.update(zip(ts, vs))
            ts, vs = sorted(merged), [merged[t] for t in sorted(merged)]
        self.series[inst][(m.name, ent)] = Series(m.name, ent, ts, vs)
        attrs = attrs_of(m, labels)
        if ent or attrs:
            self.entities[inst].setdefault((m.source, ent), {}).update(attrs)


#: exported gauges and rates by their Prometheus name (counters are node_exporter-style extras
#: the rules do not read)
_BY_PROM = {m.prom: m for m in METRICS if m.prom and m.kind != "counter"}


def load_prometheus(q: PromQuery) -> list[RunData]:
    """One :class:`RunData` per node (``instance``) the selection holds, sorted by instance;
    :class:`PrometheusError` (one line) when Prometheus cannot be read or holds nothing."""
    return load_fleet(q)[0]


def load_fleet(q: PromQuery) -> tuple[list[RunData], list[RunData]]:
    """:func:`load_prometheus`'s nodes, and one :class:`RunData` per training job whose ranks
    are on two nodes or more (the same ``train_job`` under several instances): the steps of all
    its ranks, so the rules compare ranks across nodes (stragglers, who waits for whom)."""
    start, end, step = q.window()
    sel = q.selector()
    scraped = _Scraped()
    for s in _query_range(
        q, '{__name__=~"stallscope_.+"' + (f",{sel}" if sel else "") + "}", start, end, step
    ):
        scraped.add(s)
    instances = scraped.instances()
    if not instances:
        where = f" for {sel}" if sel else ""
        raise PrometheusError(
            f"Prometheus at {shown_url(q)} holds no stallscope series"
            f"{where} in the last {q.since_s:g} s (is it scraping "
            "`stallscope agent`?)"
        )
    nodes = [_node_run(q, scraped, inst, start, end, step) for inst in instances]
    return nodes, _job_runs(q, scraped, start, end, step)


def _job_runs(
    q: PromQuery, scraped: _Scraped, start: float, end: float, step: float
) -> list[RunData]:
    """A RunData per training job seen on two instances or more: its ranks' steps from every
    node (a rank number seen on two nodes is kept once, from the first), ``rank_hosts`` saying
    where each rank ran. It holds no node series: each node's own diagnosis has those."""
    members: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for (inst, run), job in sorted(scraped.train_jobs.items()):
        members[job].append((inst, run))
    out = []
    for job, where in sorted(members.items()):
        if len({inst for inst, _ in where}) < 2:
            continue
        rows: list[StepRow] = []
        rank_hosts: dict[str, str] = {}
        for inst, run in where:
            for (r_run, rank), cols in sorted(scraped.steps.get(inst, {}).items()):
                if r_run != run or str(rank) in rank_hosts:
                    continue
                if "n" not in cols or "step_s" not in cols or "wait_s" not in cols:
                    continue
                got = _rank_rows(rank, cols, start, step, scraped.waits[inst].get((run, rank)))
                if got:
                    rows.extend(got)
                    rank_hosts[str(rank)] = scraped.hosts.get(inst) or inst
        if len(rank_hosts) < 2:
            continue
        nodes = sorted(set(rank_hosts.values()))
        meta: dict[str, Any] = {
            "command": ["prometheus", shown_url(q)],
            "host": None,
            "start": start,
            "end": end,
            "exit_code": None,
            "interval_s": step,
            "data": None,
            "data_devices": [],
            "logical_cores": None,
            "physical_cores": None,
            "mem_total_mib": None,
            "unavailable": {},
            "samples": 0,
            "rank_hosts": rank_hosts,
            "run_dir": f"{shown_url(q)} train_job={job}",
            "prometheus": {
                "url": shown_url(q),
                "train_job": job,
                "nodes": nodes,
                "runs": sorted({run for _, run in where}),
                "step_s": step,
                "since_s": q.since_s,
            },
        }
        ts = [r.ts for r in rows]
        out.append(
            RunData(
                meta=meta,
                series={},
                steps=rows,
                entities=[],
                span=(min(ts), max(ts)) if ts else None,
                stacks=[],
            )
        )
    return out


def _node_run(
    q: PromQuery, scraped: _Scraped, inst: str, start: float, end: float, step: float
) -> RunData:
    """The RunData of one node: its series, its processes of the chosen run, that run's steps,
    and a meta.json-shaped description of where it all came from."""
    series = scraped.series.get(inst, {})
    entities = scraped.entities.get(inst, {})
    step_rows, runs = _steps(
        scraped.steps.get(inst, {}), q.run, start, step, scraped.waits.get(inst, {})
    )
    chosen = step_rows[0][0] if step_rows else None
    kept = _one_run_of_procs(series, entities, chosen or q.run)
    _split_worker_groups(series, entities)
    stacks = _stack_records(series, entities, kept)
    attach_batch_times(stacks, scraped.timed.get(inst, {}), kept, start, step)
    costs = batch_costs_of(scraped.batches.get(inst, {}), kept, entities, start, step)
    cores = [e for (n, e) in series if n == "host.cpu_core_pct"]
    mem = series.get(("host.mem_total_mib", ""))
    firsts = [s.ts[0] for s in series.values() if s.ts]
    meta: dict[str, Any] = {
        "command": ["prometheus", shown_url(q)],
        "host": scraped.hosts.get(inst) or inst,
        "start": start,
        "end": end,
        "exit_code": None,
        "interval_s": step,
        "data": None,
        "data_devices": [],
        "logical_cores": len(cores) or None,
        "physical_cores": None,
        "mem_total_mib": mem.v[-1] if mem and mem.v else None,
        "unavailable": scraped.down.get(inst, {}),
        "samples": len(firsts),
        "run_dir": f"{shown_url(q)} instance={inst}",
        "owner": scraped.owners.get(inst, {}).get(chosen or "") or None,
        "prometheus": {
            "url": shown_url(q),
            "instance": inst,
            "job": scraped.jobs.get(inst),
            "step_s": step,
            "since_s": q.since_s,
            "runs": runs,
            "run": chosen,
        },
    }
    ents = [
        {"source": src, "entity": ent, "attrs": attrs}
        for (src, ent), attrs in sorted(entities.items())
    ]
    rows = step_rows[0][1] if step_rows else []
    span = (min(firsts), max(s.ts[-1] for s in series.values() if s.ts)) if firsts else None
    return RunData(
        meta=meta,
        series=series,
        steps=rows,
        entities=ents,
        span=span,
        stacks=stacks,
        batch_costs=costs,
    )


def _steps(
    raw: dict[tuple[str, int], _StepCols],
    want: str | None,
    start: float,
    step: float,
    waits: dict[tuple[str, int], Columns],
) -> tuple[list[tuple[str, list[StepRow]]], dict[str, int]]:
    """Step rows of one run on one node, rebuilt from its counters (and its ranks' data-wait
    histograms); (the chosen run and its rows, or nothing), and every run seen with its step
    count in the window."""
    per_run: dict[str, list[StepRow]] = defaultdict(list)
    for (run, rank), cols in sorted(raw.items()):
        if want is not None and run != want:
            continue
        if "n" not in cols or "step_s" not in cols or "wait_s" not in cols:
            continue
        per_run[run].extend(_rank_rows(rank, cols, start, step, waits.get((run, rank))))
    counts = {run: len(rows) for run, rows in per_run.items()}
    if not per_run:
        return [], counts
    chosen = max(per_run, key=lambda r: (len(per_run[r]), r))
    return [(chosen, per_run[chosen])], counts


def _rank_rows(
    rank: int,
    cols: dict[str, tuple[list[float], list[float]]],
    start: float,
    step: float,
    waits: Columns | None = None,
) -> list[StepRow]:
    """A rank's step rows from its counters: between two points, ``n`` new steps of the
    interval's mean step time each, with the data waits its wait histogram gives them
    (:class:`~stallscope.analysis.promhist.WaitSpread`; else the mean wait each)."""
    spread = WaitSpread(waits) if waits else None
    ts = cols["n"][0]
    at = {name: dict(zip(*col)) for name, col in cols.items() if name != "first_ts"}
    # when the run's first step was handed over (an older agent does not export it)
    firsts = [v for v in cols.get("first_ts", ([], []))[1] if math.isfinite(v)]
    first_ts = min(firsts) if firsts else None
    rows: list[StepRow] = []
    counted = 0
    prev: dict[str, float] | None = None
    prev_t: float | None = None
    for t in ts:
        cur = {name: at[name].get(t, math.nan) for name in at}
        if prev is None:
            # the first point: the run began inside the window (its series starts after the
            # window's first step) -> all its steps count; else it is the baseline
            # (unless its first step came before the window: then the agent restarted and
            # read the run's steps anew, and the first point is a baseline too)
            began = t > start + 1.5 * step and (first_ts is None or first_ts >= start)
            base = {k: 0.0 for k in cur} if began else cur
            t_from = t - step
            if began and first_ts is not None and first_ts < t_from:
                # the steps before the first scrape ran from the run's first step on, not in
                # the last query step: spread them over that time (the first at first_ts)
                k = max(1, round(cur["n"]))
                t_from = first_ts - (t - first_ts) / max(1, k - 1)
        else:
            base, t_from = prev, prev_t if prev_t is not None else t - step
        d = {k: (cur[k] - base.get(k, 0.0)) for k in cur}
        # the point the histogram's buckets grew from (None: from nothing)
        t_base = None if prev is None else prev_t
        if d["n"] < 0:  # a counter reset (the agent restarted): the new totals are the delta
            d, t_base = dict(cur), None
        k = round(d["n"]) if math.isfinite(d["n"]) else 0
        if k > MAX_STEPS_PER_S * max(1.0, t - t_from):
            k = 0  # a counter no training reaches (garbage, a foreign series): not steps
        if (
            k > 0
            and math.isfinite(d["step_s"])
            and math.isfinite(d["wait_s"])
            and d["step_s"] >= 0
            and d["wait_s"] >= 0
        ):
            wait = d["wait_s"] / k
            host = max(0.0, d["step_s"] / k - wait)
            each = (spread.waits(t_base, t, k, d["wait_s"]) if spread else None) or [wait] * k
            batch = d.get("samples", math.nan) / k
            samples = round(batch) if math.isfinite(batch) and batch > 0 else None
            per_comm = d.get("comm_s", math.nan) / k
            comm = min(per_comm, host) if math.isfinite(per_comm) and per_comm >= 0 else None
            for i in range(k):
                rows.append(
                    StepRow(
                        rank=rank,
                        step=counted + i,
                        ts=t_from + (t - t_from) * (i + 1) / k,
                        wait_s=each[i],
                        host_s=host,
                        samples=samples,
                        comm_s=comm,
                    )
                )
            counted += k
        prev, prev_t = cur, t
    return rows
