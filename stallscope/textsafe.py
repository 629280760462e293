"""Making text from the machine or from files safe to print in a terminal or put in HTML."""

from __future__ import annotations

import html
import re

__all__ = ["ERROR_LIMIT", "TERMINAL_LIMIT", "clip", "error_text", "html_text", "plain", "safe"]

#: the most characters of one machine string shown in the terminal (JSON keeps all of it)
TERMINAL_LIMIT = 200

#: the most characters of one line of an error message (a 990,000-character key name in a config
#: file is named, not echoed whole)
ERROR_LIMIT = 400

#: C0 controls except tab and newline, DEL, and C1 controls: never valid in HTML text
_HTML_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clip(text: str, limit: int | None = TERMINAL_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, the cut shown as ``…(+N chars)``."""
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}…(+{len(text) - limit:,} chars)"


def plain(text: object, limit: int | None = TERMINAL_LIMIT) -> str:
    """Text from the machine or a file for a rich ``Text`` (no markup is parsed there):
    clipped to ``limit`` characters first (a 100,000-character model name would take rich
    seconds to lay out), then control characters shown as ``\\x1b``."""
    s = clip(str(text), limit)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    return s


def safe(text: object, limit: int | None = None) -> str:
    """Text from the machine or a file, fit for the terminal: control characters (escape
    sequences in a serial number, a process name, an argv) shown as ``\\x1b``, and rich markup
    (``[bold]``) escaped so it prints literally. ``limit``: clip to that many characters."""
    from rich.markup import escape  # here: the agent never prints through rich

    return escape(plain(text, limit))


def html_text(v: object) -> str:
    """Anything as HTML text, safe inside element content and quoted attribute values:
    control characters (C0 but tab and newline, DEL, C1: an ESC or BEL from a process name)
    removed, then ``html.escape`` with quotes."""
    s = str(v)
    if _HTML_CONTROLS.search(s):
        s = _HTML_CONTROLS.sub("", s)
    return html.escape(s, quote=True)


def error_text(text: object, limit: int = ERROR_LIMIT) -> str:
    """An error message for stderr: each line clipped to ``limit`` characters and control
    characters shown as ``\\x1b`` (an error quoting a file or a server must not move the
    cursor or retitle the terminal); its line breaks kept."""
    return "\n".join(plain(line, limit) for line in str(text).split("\n"))


_COMMAND = re.compile(r"`([^`]*\s[^`]*)`")


def split_commands(advice: str) -> tuple[str, list[str]]:
    """Advice -> (its prose, its multi-word commands in backticks). The commands come out of
    the sentence to be printed one per line, never folded (they must survive copy and paste):
    one that ends the sentence leaves no trace (the prose then ends in ":"), one in the middle
    leaves "(below)"."""
    found = list(_COMMAND.finditer(advice))
    if not found:
        return advice, []
    last = found[-1]
    if advice[last.end() :].strip(" .;,)"):
        prose = _COMMAND.sub("(below)", advice)
    else:
        prose = _COMMAND.sub("(below)", advice[: last.start()]).rstrip(" :;,(") + ":"
    return prose, [m.group(1) for m in found]
