"""The report page: one HTML file, inline CSS, inline SVG, one small inline script.

Every string that came from the machine or the run (command, host, process/device/GPU names,
paths, event messages, finding text) goes through :func:`esc` (``html.escape`` with quotes)
before it reaches the page. A Content-Security-Policy allows no network at all and only the
page's own script (by hash), so even markup that slipped through could neither load nor run
anything.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import shlex
import time
from collections.abc import Iterable
from typing import Any

from stallscope import units
from stallscope.analysis.diagnose.model import Kind, title_of
from stallscope.analysis.rundata import RunData
from stallscope.analysis.stacks import top_stacks, trainer_phases
from stallscope.analysis.summary import sampling_text
from stallscope.analysis.throughput import SOURCE_TEXT
from stallscope.metrics import lookup
from stallscope.report.plots import AXES_LEFT, AXES_RIGHT, clock, finite_or_none
from stallscope.textsafe import html_text
from stallscope.units import speedup as fmt_speedup
from stallscope.units import throughput as fmt_rate
from stallscope.version import __version__

__all__ = ["KIND_TITLES", "esc", "fmt_num", "render_page"]

#: a plain-language title per finding kind (the diagnosis's Kind carries them); unknown kinds
#: show as-is
KIND_TITLES: dict[str, str] = {k.value: k.title for k in Kind}
_SEVERITIES = ("critical", "warning", "info")
MAX_EVENTS = 200

_CSS = """
:root{--fg:#1d2329;--mute:#5d6873;--line:#dde2e7;--bg:#f6f8fa;--crit:#c0262d;--warn:#b86e00;
--info:#2a64b3;--ok:#23803a}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
margin:0;background:#fff}
main{max-width:1180px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:21px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px;
border-bottom:1px solid var(--line);padding-bottom:4px}h3{font-size:15px;margin:0 0 4px}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.mute{color:var(--mute)}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0}
dl.meta dt{color:var(--mute)}dl.meta dd{margin:0;word-break:break-all}
.verdict{border-left:6px solid var(--info);background:var(--bg);padding:12px 16px;margin:14px 0;
border-radius:4px}
.verdict .big{font-size:20px;font-weight:650;margin:2px 0}
.verdict.sev-critical,.finding.sev-critical{border-left-color:var(--crit)}
.verdict.sev-warning,.finding.sev-warning{border-left-color:var(--warn)}
.verdict.sev-ok{border-left-color:var(--ok)}
.badge{display:inline-block;font-size:11.5px;font-weight:600;padding:1px 7px;border-radius:9px;
color:#fff;background:var(--info);text-transform:uppercase;letter-spacing:.03em}
.badge.critical{background:var(--crit)}.badge.warning{background:var(--warn)}
.badge.ok{background:var(--ok)}
.finding{border:1px solid var(--line);border-left:6px solid var(--info);border-radius:4px;
padding:10px 14px;margin:10px 0}
.finding header{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.finding .kind{color:var(--mute)}
.conf{display:inline-block;width:70px;height:7px;background:var(--line);border-radius:4px;
vertical-align:middle;overflow:hidden}.conf i{display:block;height:100%;background:var(--fg)}
.finding ol{margin:6px 0 6px 0;padding-left:22px}.finding li .why{color:var(--mute)}
.cols{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:16px}
@media(max-width:820px){.cols{grid-template-columns:1fr}}
table{border-collapse:collapse;font-size:13px}
th,td{padding:3px 9px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{font-weight:600;background:var(--bg)}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv td:first-child{color:var(--mute);white-space:nowrap}
ul.plain{margin:0;padding-left:16px}
figure.plot{margin:14px 0 4px;position:relative}
figure.plot figcaption{font-weight:600;margin-bottom:2px}
figure.plot .plotbox{position:relative}
svg.plot-svg{width:100%;height:auto;display:block}
.cursor{position:absolute;top:0;bottom:0;width:0;border-left:1px solid #b03060;display:none;
pointer-events:none}
.note{color:var(--mute);font-size:13px;margin:2px 0}
.skipped{border:1px dashed var(--line);padding:8px 12px;border-radius:4px;margin:12px 0}
#readout{position:sticky;top:0;background:#fffe;padding:2px 0;font-size:12.5px;
color:var(--mute);min-height:1.4em;z-index:2}
footer{margin-top:30px;color:var(--mute);font-size:12px}
"""

# Moves one cursor over every plot at the same time (all plots share the time axis and their
# horizontal margins); marks the page as ready, which the browser test checks.
_JS = """(function(){
var tl=document.getElementById('timeline');if(!tl){document.body.setAttribute('data-ready','1');
return;}
var l=+tl.dataset.left,r=+tl.dataset.right,span=+tl.dataset.span,ro=document.getElementById(
'readout');
function clock(s){s=Math.round(s);var h=Math.floor(s/3600),m=Math.floor(s%3600/60),x=s%60;
function p(n){return(n<10?'0':'')+n}return h?h+':'+p(m)+':'+p(x):m+':'+p(x)}
var boxes=tl.querySelectorAll('.plotbox');
function hide(){boxes.forEach(function(b){b.querySelector('.cursor').style.display='none'});
ro.textContent=''}
boxes.forEach(function(box){
box.addEventListener('mousemove',function(ev){var q=box.getBoundingClientRect();
var f=(ev.clientX-q.left)/q.width,t=(f-l)/(r-l)*span;if(t<0||t>span){hide();return}
boxes.forEach(function(b){var c=b.querySelector('.cursor');c.style.left=(f*100)+'%';
c.style.display='block'});ro.textContent='t = '+clock(t)+' since start'});
box.addEventListener('mouseleave',hide)});
document.body.setAttribute('data-ready','1');})();"""


def esc(v: Any) -> str:
    """HTML-escape anything (quotes too, so it is safe inside attribute values), control
    characters removed (:func:`stallscope.textsafe.html_text`)."""
    return html_text(v)


_CODE = re.compile(r"`([^`\n]+)`")


def prose(v: Any) -> str:
    """stallscope's own sentences (summaries, fixes, rules) as HTML: escaped, and their
    `code` spans as <code> rather than literal backticks."""
    return _CODE.sub(r"<code>\1</code>", esc(v))


#: an evidence key's unit suffix, said in words
_KEY_UNITS = (
    ("_pct", " %"),
    ("_ms", " ms"),
    ("_kb_s", " kB/s"),
    ("_mib", " MiB"),
    ("_s", " s"),
    ("_c", " °C"),
    ("_w", " W"),
)


def key_words(k: Any) -> str:
    """``worker_blkio_pct`` -> ``worker blkio %``: an evidence key for people (the raw key stays
    in the cell's title, as `diagnose --json` names it)."""
    text = str(k)
    for suffix, unit in _KEY_UNITS:
        if text.endswith(suffix) and len(text) > len(suffix):
            text = text[: -len(suffix)] + unit
            break
    return text.replace("_", " ")


def fmt_num(v: Any) -> str:
    """A number for people (:func:`stallscope.units.number`, the one number format)."""
    return units.number(v)


def _pct(v: Any) -> str:
    f = finite_or_none(v)
    return "-" if f is None else f"{f:.0%}"


def _kind_title(kind: str, has_gpu: bool = True) -> str:
    """The plain-language title of a finding kind (:meth:`Kind.title_for`: a run without a GPU
    is bound by its CPU, not by a GPU it does not have)."""
    return title_of(kind, has_gpu)


def _has_gpu(data: RunData) -> bool:
    return any(s.v for s in data.all("gpu.util_pct"))


#: keys whose numbers are identifiers or times, printed as they are (no 1,234 grouping)
_ID_KEY = re.compile(
    r"(^|_)(pids?|rank|ranks|ts|updated|start|end|seed|epoch|step|index|"
    r"uuid|id)($|_)"
)


def _severity(v: Any) -> str:
    s = str(v)
    return s if s in _SEVERITIES else "info"


# --- sections ------------------------------------------------------------------------------------
def _header(data: RunData) -> str:
    meta = data.meta
    cmd = meta.get("command")
    cmd_text = shlex.join(str(c) for c in cmd) if isinstance(cmd, list) else str(cmd or "-")
    start = finite_or_none(meta.get("start"))
    end = finite_or_none(meta.get("end"))
    fx = data.facts()
    dur = fx.run.duration_s if fx.run.duration_s else data.t1 - data.t0
    if end is None:
        state = "still running (or the monitor was killed)"
    elif fx.run.exit_code is None:
        state = "ended"
    else:  # the exit as `run` returned it and `show` prints it (130 (SIGINT), never -2)
        state = f"exit code {fx.run.exit_code}" + (
            f" ({fx.run.exit_signal})" if fx.run.exit_signal else ""
        )
    rows: list[tuple[str, str]] = [
        ("command", f"<code>{esc(cmd_text)}</code>"),
        ("host", esc(meta.get("host", "-"))),
        (
            "started",
            esc(time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(start)))
            if start is not None
            else "-",
        ),
        ("duration", esc(f"{clock(dur)} ({dur:,.0f} s)")),
        ("outcome", esc(state)),
        (
            "throughput",
            esc(
                f"{fmt_rate(fx.steps.samples_per_s)} (from "
                f"{SOURCE_TEXT.get(fx.steps.throughput_source or '', '?')})"
            )
            if fx.steps.samples_per_s is not None
            else "-",
        ),
        (
            "sampled",
            esc(sampling_text(meta))
            + (f" · {esc(meta['samples'])} samples" if "samples" in meta else ""),
        ),
    ]
    phases = data.summary().get("phases")
    if phases:  # start-up and exit are phases of their own, beside the training
        from stallscope.analysis.summary import phases_text

        rows.append(("phases", esc(phases_text(phases).removeprefix("phases: "))))
    if meta.get("data"):
        devs = ", ".join(str(d) for d in meta.get("data_devices") or []) or "unknown device"
        rows.append(("dataset", f"<code>{esc(meta['data'])}</code> on {esc(devs)}"))
    cores = [
        f"{meta[k]} {k.split('_')[0]}" for k in ("physical_cores", "logical_cores") if meta.get(k)
    ]
    if cores:
        rows.append(("cores", esc(", ".join(cores))))
    rows.append(("run directory", f"<code>{esc(data.run_dir)}</code>"))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return (
        f'<header id="run-header"><h1>stallscope report · {esc(data.run_dir.name)}</h1>'
        f'<dl class="meta">{dl}</dl></header>'
    )


def _verdict(diagnosis: dict[str, Any] | None, has_gpu: bool = True) -> str:
    if diagnosis is None:
        return (
            '<section id="verdict" class="verdict sev-info"><div class="big">'
            "No diagnosis</div><p>This stallscope has no diagnosis module; the plots and "
            "tables below still show the run.</p></section>"
        )
    findings = [f for f in diagnosis.get("findings") or [] if isinstance(f, dict)]
    kind = str(
        diagnosis.get("verdict")
        or (findings[0].get("kind") if findings else "")
        or "insufficient_data"
    )
    top = next((f for f in findings if f.get("kind") == kind), findings[0] if findings else {})
    known = Kind.lookup(kind)  # a kind's mood lives on Kind
    sev = "ok" if known is not None and known.healthy else _severity(top.get("severity", "info"))
    parts = [
        f'<section id="verdict" class="verdict sev-{sev}">',
        '<div class="mute">Verdict</div>',
        f'<div class="big" id="verdict-title">{esc(_kind_title(kind, has_gpu))}</div>',
        f'<div><code id="verdict-kind">{esc(kind)}</code></div>',
    ]
    if top.get("summary"):
        parts.append(f'<p id="verdict-summary">{prose(top["summary"])}</p>')
    sf = finite_or_none(diagnosis.get("stall_fraction"))
    facts = []
    if sf is not None:
        how = {
            "probe": " (measured per step by the probe)",
            "gpu_idle": " (estimated from the GPU's idle share, no probe)",
        }.get(str(diagnosis.get("stall_source")), "")
        facts.append(f"the trainer waited for data <b>{sf:.0%}</b> of the wall time{how}")
    if facts:
        text = "; ".join(facts)
        parts.append(f"<p>{text[0].upper()}{text[1:]}.</p>")
    sp = finite_or_none(top.get("est_speedup"))
    if sp is not None and sp > 1.0:
        # a sentence of its own, naming the finding whose estimate it is: beside the data-wait
        # fact it read as that finding's (a cpu_contention x1.63 next to a wait whose own
        # finding said x1.55)
        parts.append(
            f'<p id="verdict-speedup">Fixing this ({esc(kind)}) could make training '
            f"up to <b>{esc(fmt_speedup(sp))}</b> faster.</p>"
        )
    fixes = [f for f in top.get("fixes") or [] if isinstance(f, dict)]
    if fixes:
        parts.append("<div><b>Do first:</b> " + prose(fixes[0].get("action", "")) + "</div>")
    parts.append("</section>")
    return "".join(parts)


def _findings(diagnosis: dict[str, Any] | None, has_gpu: bool = True) -> str:
    if diagnosis is None:
        return ""
    findings = [f for f in diagnosis.get("findings") or [] if isinstance(f, dict)]
    out = ['<section id="findings"><h2>Findings and fixes</h2>']
    if not findings:
        out.append('<p class="note">The diagnosis found nothing to report.</p>')
    for i, f in enumerate(findings):
        sev = _severity(f.get("severity"))
        kind = str(f.get("kind", ""))
        conf = finite_or_none(f.get("confidence"))
        width = 0.0 if conf is None else max(0.0, min(1.0, conf)) * 100
        sp = finite_or_none(f.get("est_speedup"))
        # the verdict above already gives the top finding's title and summary: its card here
        # carries the fixes, the evidence and the rule, without saying the same again
        title = (
            f"Evidence for the verdict: {_kind_title(kind, has_gpu)}"
            if i == 0
            else _kind_title(kind, has_gpu)
        )
        head = [
            f'<span class="badge {sev}">{sev}</span>',
            f"<h3>{esc(title)}</h3>",
            f'<code class="kind">{esc(kind)}</code>',
            f'<span class="mute">confidence <span class="conf"><i style="width:{width:.0f}%">'
            f"</i></span> {_pct(conf)}</span>",
        ]
        if sp is not None and sp > 1.01:  # ×1.00 says nothing: nothing to gain
            head.append(
                f'<span class="mute">est. speedup up to <b>{esc(fmt_speedup(sp))}</b></span>'
            )
        fixes = [x for x in f.get("fixes") or [] if isinstance(x, dict)]
        fix_html = (
            (
                "<ol>"
                + "".join(
                    f"<li><b>{prose(x.get('action', ''))}</b>"
                    + (f' <span class="why">— {prose(x["why"])}</span>' if x.get("why") else "")
                    + "</li>"
                    for x in fixes
                )
                + "</ol>"
            )
            if fixes
            else '<p class="note">No fix needed.</p>'
        )
        ev = f.get("evidence")
        ev_html = (
            _kv_table(ev.items(), "evidence")
            if isinstance(ev, dict) and ev
            else '<p class="note">No evidence recorded.</p>'
        )
        rule = f'<p class="note rule">Rule: {prose(f["rule"])}</p>' if f.get("rule") else ""
        summary = "" if i == 0 else f'<p class="summary">{prose(f.get("summary", ""))}</p>'
        out.append(
            f'<article class="finding sev-{sev}" id="finding-{i}"><header>{"".join(head)}'
            f"</header>{summary}"
            f'<div class="cols"><div><b>Fixes</b>{fix_html}</div>'
            f"<div><b>Evidence</b>{ev_html}</div></div>{rule}</article>"
        )
    out.append("</section>")
    return "".join(out)


def _ranks(diagnosis: dict[str, Any] | None) -> str:
    """Each rank's own picture (DDP): where its steps go, and its workers."""
    ranks = [r for r in (diagnosis or {}).get("ranks") or [] if isinstance(r, dict)]
    if len(ranks) < 2:
        return ""
    out = [
        '<section id="ranks"><h2>Ranks</h2><p class="note">The all-reduce makes every '
        "rank's step as long as the slowest rank's: where each rank spends its step tells "
        "which one holds the job back.</p><table><tr><th>rank</th><th>data wait</th>"
        "<th>median step ms</th><th>steps</th><th>pid</th><th>workers</th>"
        "<th>worker CPU % (mean, each)</th></tr>"
    ]
    for r in ranks:
        out.append(
            f'<tr><td class="num">{esc(r.get("rank"))}</td>'
            f'<td class="num">{_pct(r.get("stall_fraction"))}</td>'
            f'<td class="num">{esc(fmt_num(r.get("step_ms_median")))}</td>'
            f'<td class="num">{esc(fmt_num(r.get("steps")))}</td>'
            f'<td class="num">{esc(r.get("pid", "-"))}</td>'
            f'<td class="num">{esc(r.get("workers", "-"))}</td>'
            f'<td class="num">{esc(fmt_num(r.get("worker_cpu_pct")))}</td></tr>'
        )
    out.append("</table></section>")
    return "".join(out)


def _value_html(v: Any, depth: int = 0, key: str = "") -> str:
    if isinstance(v, dict):
        if depth >= 2:
            return esc(v)
        return _kv_table(v.items(), "", depth + 1)
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, str) for x in v):  # sentences (signals seen): one per line
            return '<ul class="plain">' + "".join(f"<li>{esc(x)}</li>" for x in v) + "</ul>"
        return ", ".join(_value_html(x, depth + 1, key) for x in v) or "-"
    if v is None:
        return "-"
    if isinstance(v, (int, float)) and not isinstance(v, bool) and _ID_KEY.search(key):
        return esc(v)  # a pid or a timestamp is not a quantity: 9487, not 9,487
    return esc(fmt_num(v))


def _kv_table(items: Iterable[tuple[Any, Any]], cls: str, depth: int = 0) -> str:
    if cls == "evidence":  # the diagnosis' keys, in words (the raw key in the title)
        rows = "".join(
            f'<tr><td title="{esc(k)}">{esc(key_words(k))}</td>'
            f"<td>{_value_html(v, depth, str(k))}</td></tr>"
            for k, v in items
        )
    else:  # names a user types (DataLoader arguments): as they are spelled
        rows = "".join(
            f"<tr><td><code>{esc(k)}</code></td><td>{_value_html(v, depth, str(k))}</td></tr>"
            for k, v in items
        )
    return f'<table class="kv {cls}">{rows}</table>'


def _plots(data: RunData, figures: list[tuple[str, str, str, str | None]]) -> str:
    span = data.t1 - data.t0
    out = [
        f'<section id="timeline" data-left="{AXES_LEFT}" data-right="{AXES_RIGHT}" '
        f'data-span="{span:.3f}"><h2>Timeline</h2>'
        '<p class="note">All plots share one time axis (time since the run started); '
        'hover to line them up.</p><div id="readout"></div>'
    ]
    for pid, title, note, svg in figures:
        if svg is None:
            out.append(
                f'<div class="skipped" id="plot-{esc(pid)}"><b>{esc(title)}</b> — '
                f"not shown. {esc(note)}</div>"
            )
        else:
            out.append(
                f'<figure class="plot" id="plot-{esc(pid)}"><figcaption>{esc(title)}'
                f"</figcaption>"
                + (f'<p class="note">{esc(note)}</p>' if note else "")
                + f'<div class="plotbox">{svg}<div class="cursor"></div></div></figure>'
            )
    out.append("</section>")
    return "".join(out)


def _summary(data: RunData) -> str:
    rows = data.summary().get("rows") or []
    out = ['<section id="summary"><h2>Resources over the run</h2>']
    if not rows:
        out.append(
            '<p class="note">No samples stored (the run ended before the first '
            "interval).</p></section>"
        )
        return "".join(out)
    out.append(
        "<table><tr><th>metric</th><th>entity</th><th>median</th><th>p95</th>"
        "<th>max</th><th>unit</th></tr>"
    )
    for r in rows:
        metric = str(r.get("metric", ""))
        m = lookup(metric)
        ent = str(r.get("entity", ""))
        if "processes" in r:
            ent = f"{r['processes']} proc"
        elif metric.startswith("gpu."):
            name = data.entity_attrs("gpu", ent).get("name")
            ent = f"{ent} ({name})" if name else ent
        tip = f' title="{esc(m.help)}"' if m else ""
        out.append(
            f"<tr><td{tip}><code>{esc(metric)}</code></td><td>{esc(ent)}</td>"
            + "".join(
                f'<td class="num">{esc(fmt_num(r.get(k)))}</td>' for k in ("median", "p95", "max")
            )
            + f"<td>{esc(r.get('unit', ''))}</td></tr>"
        )
    out.append("</table>")
    idle = data.summary().get("gpu_idle_share") or {}
    during = data.summary().get("gpu_idle_share_training") or {}
    if idle:
        out.append(
            '<p class="note">GPU idle share of the run (100% − utilisation): '
            + esc(", ".join(f"{k} {_pct(v)}" for k, v in sorted(idle.items())))
            + (
                (
                    "; of the training: "
                    + esc(", ".join(f"{k} {_pct(v)}" for k, v in sorted(during.items())))
                )
                if during
                else ""
            )
            + ".</p>"
        )
    from stallscope.analysis.summary import energy_text, health_text

    energy = data.summary().get("gpu_energy") or {}
    if energy:
        out.append(
            '<p class="note">GPU energy: '
            + esc("; ".join(energy_text(k, v) for k, v in sorted(energy.items())))
            + ".</p>"
        )
    for ent, h in sorted((data.summary().get("gpu_health") or {}).items()):
        out.append(f'<p class="note crit">{esc(health_text(ent, h))}.</p>')
    cost = finite_or_none(data.summary().get("collector_cpu_s_per_sample"))
    if cost is not None:
        out.append(f'<p class="note">Monitoring cost: {cost * 1000:.2f} ms CPU per sample.</p>')
    out.append("</section>")
    return "".join(out)


MAX_PROCESSES = 50


def _processes(data: RunData) -> str:
    """The training's processes as the facts hold them (the CPU mean over the training window,
    the figure `compare` shows for the trainer)."""
    procs = data.facts().procs.processes
    if not procs:
        return ""
    out = [
        '<section id="processes"><h2>Trainer processes</h2><table><tr><th>pid</th>'
        "<th>role</th><th>name</th><th>mean CPU % (training window)</th>"
        "<th>max RSS MiB</th><th>seen</th><th>command line</th></tr>"
    ]
    for p in procs[:MAX_PROCESSES]:
        first = finite_or_none(p.get("first_ts"))
        last = finite_or_none(p.get("last_ts"))
        seen = (
            f"{clock(first - data.t0)}–{clock(last - data.t0)}"
            if first is not None and last is not None
            else "-"
        )
        cpu, rss = p.get("cpu_mean_pct"), p.get("rss_max_mib")
        out.append(
            f'<tr><td class="num">{esc(p["pid"])}</td><td>{esc(p["role"])}</td>'
            f"<td>{esc(p['name'])}</td>"
            f'<td class="num">{esc(fmt_num(cpu) if cpu is not None else "-")}</td>'
            f'<td class="num">{esc(fmt_num(rss) if rss is not None else "-")}</td>'
            f'<td class="mono">{esc(seen)}</td>'
            f"<td><code>{esc(p['cmdline'][:160])}</code></td></tr>"
        )
    out.append("</table>")
    if len(procs) > MAX_PROCESSES:
        out.append(f'<p class="note">{len(procs) - MAX_PROCESSES} more processes not shown.</p>')
    out.append("</section>")
    return "".join(out)


#: folded stacks shown per trainer process
TOP_STACKS = 12


def _stacks(data: RunData) -> str:
    """The heaviest folded stacks of each trainer process's training thread."""
    procs = trainer_phases(data.stacks, data.roles())
    if not procs:
        return ""
    out = [
        '<section id="stacks"><h2>Where the training thread spent its time</h2>'
        '<p class="note">The folded stacks of the training thread that stood for the most '
        "time (sampled; start-up left out), innermost frame last. The phase is decided by "
        "the innermost frame a framework table knows (docs/diagnosis.md).</p>"
    ]
    for p in procs:
        total = p.total_s
        who = f"rank {p.rank}, " if p.rank is not None and len(procs) > 1 else ""
        out.append(
            f"<h3>{esc(who)}pid {esc(p.pid)}: {esc(f'{total:.1f}')} s sampled</h3>"
            "<table><tr><th>phase</th><th>time</th><th>share</th><th>stack</th></tr>"
        )
        for folded, phase, secs in top_stacks(data.stacks, p.pid, TOP_STACKS):
            frames = folded.split(";")
            shown = ";".join(frames[-4:])
            more = f"… {len(frames) - 4} frames; " if len(frames) > 4 else ""
            share = secs / total if total > 0 else 0.0
            out.append(
                f'<tr><td>{esc(phase)}</td><td class="num">{esc(f"{secs:.2f}")} s'
                f'</td><td class="num">{esc(f"{share:.0%}")}</td><td><details>'
                f"<summary><code>{esc(more)}{esc(shown)}</code></summary><code>"
                f"{'<br>'.join(esc(f) for f in frames)}</code></details></td></tr>"
            )
        out.append("</table>")
    out.append("</section>")
    return "".join(out)


def _loader(data: RunData) -> str:
    if not data.probes:
        return ""
    out = ['<section id="loader"><h2>Loader configuration (from the probe)</h2>']
    for p in data.probes:
        raw = p.get("config")
        cfg: dict[str, Any] = raw if isinstance(raw, dict) else {}
        shown = {"rank", "steps", "dropped", "epochs"}
        items = [
            ("rank", p.get("rank")),
            ("steps", p.get("steps")),
            ("dropped records", p.get("dropped")),
            *sorted(
                (k, _when(v) if k == "updated" else v) for k, v in cfg.items() if k not in shown
            ),
        ]
        out.append(_kv_table(items, "loader"))
        start = data.meta.get("start")
        out.append(
            _epochs_table(
                cfg.get("epochs"),
                start
                if isinstance(start, (int, float)) and not isinstance(start, bool)
                else data.t0,
            )
        )
    out.append("</section>")
    return "".join(out)


def _when(ts: Any) -> Any:
    """A Unix time as a local date and time (a raw 1763712000.5 says nothing to a reader)."""
    if (
        isinstance(ts, (int, float))
        and not isinstance(ts, bool)
        and math.isfinite(ts)
        and 0 < ts < 1e11
    ):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    return ts


def _epochs_table(epochs: Any, t0: float) -> str:
    """Each epoch's start as time into the run (not a Unix time), the time its iterator took to
    start, and its workers' pids: one row each."""
    if not isinstance(epochs, list) or not epochs:
        return ""
    rows = []
    for e in epochs:
        if not isinstance(e, dict):
            continue
        ts, it = e.get("ts"), e.get("iter_s")
        started = (
            f"{ts - t0:,.1f} s"
            if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts)
            else "-"
        )
        iter_s = (
            f"{it:.3f} s"
            if isinstance(it, (int, float)) and not isinstance(it, bool) and math.isfinite(it)
            else "-"
        )
        pids = e.get("worker_pids")
        workers = " ".join(str(x) for x in pids) if isinstance(pids, list) and pids else "-"
        rows.append(
            f'<tr><td class="num">{esc(e.get("epoch", "-"))}</td>'
            f'<td class="num">{esc(started)}</td><td class="num">{esc(iter_s)}'
            f"</td><td>{esc(workers)}</td></tr>"
        )
    return (
        '<table class="loader epochs"><tr><th>epoch</th><th>began (into the run)</th>'
        "<th>iterator start</th><th>worker pids</th></tr>" + "".join(rows) + "</table>"
    )


def _sources(data: RunData) -> str:
    unavailable = data.meta.get("unavailable") or {}
    out = ['<section id="unavailable"><h2>Unavailable sources</h2>']
    if isinstance(unavailable, dict) and unavailable:
        out.append(
            "<ul>"
            + "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in sorted(unavailable.items()))
            + "</ul>"
        )
    else:
        out.append('<p class="note">Every source was available.</p>')
    out.append("</section>")
    return "".join(out)


def _events(data: RunData) -> str:
    out = ['<section id="events"><h2>Events</h2>']
    if not data.events:
        out.append('<p class="note">None.</p></section>')
        return "".join(out)
    out.append("<table><tr><th>time</th><th>source</th><th>kind</th><th>message</th></tr>")
    for ev in data.events[:MAX_EVENTS]:
        ts = finite_or_none(ev.get("ts"))
        when = clock(ts - data.t0) if ts is not None else "-"
        out.append(
            f'<tr><td class="mono">{esc(when)}</td><td>{esc(ev.get("source", ""))}</td>'
            f"<td>{esc(ev.get('kind', ''))}</td><td>{esc(ev.get('message', ''))}</td>"
            "</tr>"
        )
    out.append("</table>")
    if len(data.events) > MAX_EVENTS:
        out.append(
            f'<p class="note">{len(data.events) - MAX_EVENTS} more events not shown '
            f"(<code>stallscope show --json</code> lists them all).</p>"
        )
    out.append("</section>")
    return "".join(out)


def render_page(
    data: RunData, diagnosis: dict[str, Any] | None, figures: list[tuple[str, str, str, str | None]]
) -> str:
    """The whole HTML document. ``figures`` are (id, title, note, inline svg or None)."""
    script_hash = base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()
    csp = (
        f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{script_hash}'; base-uri 'none'; form-action 'none'"
    )
    title = f"stallscope · {data.run_dir.name}"
    if diagnosis is not None and diagnosis.get("verdict"):
        title += f" · {diagnosis['verdict']}"
    body = "".join(
        (
            _header(data),
            _verdict(diagnosis, _has_gpu(data)),
            _findings(diagnosis, _has_gpu(data)),
            _ranks(diagnosis),
            _plots(data, figures),
            _stacks(data),
            _summary(data),
            _processes(data),
            _loader(data),
            _sources(data),
            _events(data),
            f"<footer>Generated by stallscope {esc(__version__)} on "
            f"{esc(time.strftime('%Y-%m-%d %H:%M:%S'))}. Self-contained: works offline, loads "
            "nothing.</footer>",
        )
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{body}</main><script>{_JS}</script></body></html>\n"
    )
