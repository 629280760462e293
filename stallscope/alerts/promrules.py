"""The shipped defaults as Prometheus alerting rules, rendered for a fleet.

``stallscope/alerts/prometheus-alerts.yml`` is the template: the alerts over the agents'
metrics, each with a ``summary``, a templated ``description`` and a ``runbook_url`` into an
anchor of docs/alerts.md. :func:`render` puts in where the runbooks live and a label selector
for the fleet's series (``job="gpu-nodes"``, ``cluster="a"``); ``stallscope alerts prometheus``
prints it, and ``deploy/prometheus/stallscope-alerts.yml`` is its output with the defaults
(a test holds the two equal).

The selector goes into every selector of an ``expr`` over stallscope's raw series and replaces
``job="stallscope"`` in the agent-down rule. Recorded series (``rank:stallscope_...``) are left
alone: the recording rules sum the target labels away (give their rule file the same selector
by hand if the fleet shares a Prometheus), and so are the ``ALERTS`` series of the hysteresis
clauses, matched on their labels already.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

__all__ = ["DEFAULT_RUNBOOK", "TEMPLATE", "check_selector", "render"]

TEMPLATE = Path(__file__).with_name("prometheus-alerts.yml")
#: where the runbooks are, by default: the repository's docs (give the URL where your copy of
#: docs/alerts.md is served, so Alertmanager's links open)
DEFAULT_RUNBOOK = "docs/alerts.md"
#: the agent-down rule's selector when none is given: the job deploy/prometheus.yml names
DEFAULT_UP = 'job="stallscope"'

#: a raw stallscope series (a recorded one, ``rank:stallscope_...:...``, is not: the recording
#: rules aggregate the job and other target labels away)
_METRIC = re.compile(r"(?<![\w:])(stallscope_[a-z0-9_]+)(?![\w:])(\{([^}]*)\})?")


#: PromQL string escapes (Go's): \a \b \f \n \r \t \v \\ \' \" \xHH \uHHHH \UHHHHHHHH, octal
_ESCAPE = re.compile(r'\\(?:[abfnrtv\\\'"]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}'
                     r'|[0-7]{3})')
_PARTS = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=|!=|=~|!~)\s*"((?:[^"\\]|\\.)*)"\s*')


def _unprintable(text: str) -> str | None:
    """The first control, format or line/paragraph-separator character in ``text`` (CR, NEL,
    U+2028, ESC, BEL...), or None: such characters break the YAML or the terminal."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return ch
    return None


def check_selector(selector: str) -> str:
    """``selector`` as label matchers (``job="a", cluster=~"b.*"``), or ValueError with why:
    each part must parse as a PromQL label matcher (a label name that is not reserved, an
    operator, a quoted value with PromQL's escapes; a regular expression that compiles), with no
    empty parts and no control characters."""
    sel = selector.strip()
    if sel.startswith("{") and sel.endswith("}"):
        sel = sel[1:-1].strip()
    if not sel:
        return ""
    bad = _unprintable(sel)
    if bad is not None:
        raise ValueError(f"the selector holds a control character ({bad!r}); give plain "
                         "label matchers such as job=\"gpu-nodes\"")
    for part in _split(sel):
        if not part.strip():
            raise ValueError("the selector has an empty matcher (a stray comma)")
        m = _PARTS.fullmatch(part)
        if not m:
            raise ValueError(f"selector part {part.strip()!r} is not a label matcher such as "
                             f'job="gpu-nodes"')
        name, op, value = m.groups()
        if name.startswith("__"):
            raise ValueError(f"selector part {part.strip()!r}: label names starting with '__' "
                             "are Prometheus' own")
        if _ESCAPE.sub("", value).count("\\"):
            raise ValueError(f"selector part {part.strip()!r}: not a PromQL escape in the value "
                             "(\\n, \\t, \\\\, \\\" and the like)")
        if op in ("=~", "!~"):
            try:
                re.compile(value.encode().decode("unicode_escape"))
            except (re.error, UnicodeDecodeError) as exc:
                raise ValueError(f"selector part {part.strip()!r}: not a regular expression "
                                 f"({exc})") from None
    return sel


def _split(sel: str) -> list[str]:
    """Matchers separated by commas outside quotes (empty ones kept: they are errors)."""
    parts, cur, quoted, esc = [], "", False, False
    for ch in sel:
        if esc:
            cur, esc = cur + ch, False
            continue
        if ch == "\\":
            cur, esc = cur + ch, True
            continue
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def _with(sel: str, m: re.Match[str]) -> str:
    name, inner = m.group(1), (m.group(3) or "").strip()
    return f"{name}{{{inner + ', ' if inner else ''}{sel}}}"


def render(selector: str = "", runbook: str = DEFAULT_RUNBOOK) -> str:
    """The alerting rules with ``selector`` on every stallscope series and runbook links to
    ``runbook`` (a URL or path of docs/alerts.md; the alert's anchor is appended)."""
    sel = check_selector(selector)
    runbook = runbook.strip()
    if (not runbook or any(c in runbook for c in '"\\#') or _unprintable(runbook) is not None
            or "{{" in runbook or "}}" in runbook):
        raise ValueError(f"the runbook URL must be a URL or path without quotes, '#', braces "
                         f"or control characters, got {runbook!r}")
    out: list[str] = []
    in_expr = False
    expr_indent = 0
    for line in TEMPLATE.read_text().splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith("expr:"):
            in_expr, expr_indent = True, indent
            head, body = line.split("expr:", 1)
            if body.strip() == "|":
                line = head + "expr:" + body
            elif sel:  # one line: single-quoted, so a '#' in a value is no YAML comment
                line = head + "expr: '" + _select(body, sel).strip().replace("'", "''") + "'"
            else:
                line = head + "expr:" + body
        elif in_expr and stripped and indent > expr_indent:
            line = _select(line, sel)
        elif stripped:
            in_expr = False
        out.append(line.replace('"RUNBOOK#', f'"{runbook}#'))
    return "\n".join(out) + "\n"


def _select(text: str, sel: str) -> str:
    if sel:
        text = _METRIC.sub(lambda m: _with(sel, m), text)
        return text.replace(f"up{{{DEFAULT_UP}}}", f"up{{{sel}}}")
    return text
