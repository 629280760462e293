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

import functools
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
_ESCAPE = re.compile(
    r'\\(?:[abfnrtv\\\'"]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}'
    r"|[0-7]{3})"
)
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
        raise ValueError(
            f"the selector holds a control character ({bad!r}); give plain "
            'label matchers such as job="gpu-nodes"'
        )
    for part in _split(sel):
        if not part.strip():
            raise ValueError("the selector has an empty matcher (a stray comma)")
        m = _PARTS.fullmatch(part)
        if not m:
            raise ValueError(
                f'selector part {part.strip()!r} is not a label matcher such as job="gpu-nodes"'
            )
        name, op, value = m.groups()
        if name.startswith("__"):
            raise ValueError(
                f"selector part {part.strip()!r}: label names starting with '__' "
                "are Prometheus' own"
            )
        if _ESCAPE.sub("", value).count("\\"):
            raise ValueError(
                f"selector part {part.strip()!r}: not a PromQL escape in the value "
                '(\\n, \\t, \\\\, \\" and the like)'
            )
        if op in ("=~", "!~"):
            try:
                re.compile(value.encode().decode("unicode_escape"))
            except (re.error, UnicodeDecodeError) as exc:
                raise ValueError(
                    f"selector part {part.strip()!r}: not a regular expression ({exc})"
                ) from None
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
    ``runbook`` (a URL or path of docs/alerts.md; the alert's anchor is appended).

    The template is read as YAML, the selector and runbook go into its values, and every group
    and rule is written by PyYAML's emitter, which quotes or escapes whatever a value holds;
    the template's comments are kept before the group or rule they precede. The text is read
    back before it is returned and must give the same rules (ValueError otherwise)."""
    import yaml  # only this command needs it

    sel = check_selector(selector)
    runbook = runbook.strip()
    if (
        not runbook
        or any(c in runbook for c in '"\\#')
        or _unprintable(runbook) is not None
        or "{{" in runbook
        or "}}" in runbook
    ):
        raise ValueError(
            f"the runbook URL must be a URL or path without quotes, '#', braces "
            f"or control characters, got {runbook!r}"
        )
    text = TEMPLATE.read_text(encoding="utf-8")
    header, group_notes, rule_notes = _comments(text)
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _select(rule["expr"], sel)
            notes = rule.get("annotations", {})
            if "runbook_url" in notes:
                notes["runbook_url"] = notes["runbook_url"].replace("RUNBOOK#", f"{runbook}#")
    if len(group_notes) != len(doc["groups"]) or len(rule_notes) != sum(
        len(g["rules"]) for g in doc["groups"]
    ):
        raise ValueError(
            f"{TEMPLATE.name}: its comments could not be placed (a comment inside "
            "a rule, or after the last one? put it before a rule)"
        )
    out = [header, "groups:\n"]
    notes_left = iter(rule_notes)
    for group, note in zip(doc["groups"], group_notes):
        head = {k: v for k, v in group.items() if k != "rules"}
        out += [note, _indent(_dump([head]), 2), "    rules:\n"]
        for rule in group["rules"]:
            out += [next(notes_left), _indent(_dump([rule]), 6)]
    rendered = "".join(out)
    if yaml.safe_load(rendered) != doc:
        raise ValueError("the rendered rules do not read back as written")
    return rendered


def _comments(text: str) -> tuple[str, list[str], list[str]]:
    """The template's comment lines: those before ``groups:`` (the header), and the block of
    comment and blank lines before each group and each rule, in order. A comment anywhere
    else (inside a rule) cannot be kept, and leaves the counts short."""
    header, rest = text.split("\ngroups:\n", 1)
    groups: list[str] = []
    rules: list[str] = []
    pending: list[str] = []
    for line in rest.splitlines(keepends=True):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            pending.append(line)
            continue
        if _GROUP.match(line):
            groups.append("".join(pending))
        elif _RULE.match(line):
            rules.append("".join(pending))
        elif any(p.strip() for p in pending):
            rules.append("")  # a comment inside a rule: one block too many, refused above
        pending = []
    if any(p.strip() for p in pending):
        rules.append("")  # comments after the last rule: nothing to keep them before
    return header + "\n", groups, rules


_GROUP = re.compile(r"^  - name:")
_RULE = re.compile(r"^      - (alert|record):")


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def _dump(value: object) -> str:
    import yaml

    return yaml.dump(
        value,
        Dumper=_dumper(),
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=1 << 16,
    )


@functools.cache
def _dumper() -> type:
    """PyYAML's safe dumper with nested sequences indented (as Prometheus' docs write them),
    several lines as a literal block, words in double quotes unless they hold some (a
    selector's), else the emitter's choice; it falls back to quotes when it must. Made once."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)

    def _text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else '"' if " " in data and '"' not in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _text)
    return _Dumper


def _select(text: str, sel: str) -> str:
    if sel:
        text = _METRIC.sub(lambda m: _with(sel, m), text)
        return text.replace(f"up{{{DEFAULT_UP}}}", f"up{{{sel}}}")
    return text
