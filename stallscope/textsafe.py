"""Making text from the machine or from files safe to print in a terminal."""

from __future__ import annotations

from rich.markup import escape

__all__ = ["safe"]


def safe(text: object) -> str:
    """Text from the machine or a file, fit for the terminal: control characters (escape
    sequences in a serial number, a process name, an argv) shown as ``\\x1b``, and rich markup
    (``[bold]``) escaped so it prints literally."""
    s = str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    return escape(s)
