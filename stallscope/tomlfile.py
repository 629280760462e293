"""Reading a local TOML file (the agent's config, alert rules), with one clear reason when it
cannot be read. Python 3.11+ has ``tomllib``; on 3.10 the ``tomli`` package stands in."""

from __future__ import annotations

import os
import sys
from typing import Any

from stallscope.errors import StallscopeError

__all__ = ["TomlFileError", "read_toml"]

#: a rules or config file is a few kB; anything this large is not one
MAX_BYTES = 1_000_000


class TomlFileError(StallscopeError):
    """Why a TOML file could not be read (the caller adds which file it is)."""


#: tables and arrays nest at most this deep in a config file (ours need 4)
MAX_DEPTH = 32


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The document in ``path``; :class:`TomlFileError` with the reason otherwise."""
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as toml
        except ImportError:
            raise TomlFileError(
                "reading TOML needs Python 3.11+ or the tomli package (pip install tomli)"
            ) from None
    try:
        if not os.path.isfile(path):
            raise TomlFileError(
                "no such file" if not os.path.exists(path) else "not a regular file"
            )
        if os.path.getsize(path) > MAX_BYTES:
            raise TomlFileError(f"larger than {MAX_BYTES // 1_000_000} MB: not a config file")
        with open(path, "rb") as f:
            doc: dict[str, Any] = toml.load(f)
    except RecursionError:
        raise TomlFileError(f"nested deeper than {MAX_DEPTH} levels: not a config file") from None
    except OSError as exc:
        raise TomlFileError(f"cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise TomlFileError(f"not UTF-8 text ({exc.reason})") from None
    except toml.TOMLDecodeError as exc:
        raise TomlFileError(f"not valid TOML ({exc})") from None
    depth = _depth(doc)
    if depth > MAX_DEPTH:
        raise TomlFileError(f"nested {depth} levels deep (at most {MAX_DEPTH}): not a config file")
    return doc


def _depth(doc: Any) -> int:
    """How deep tables and arrays nest in ``doc`` (iterative: no recursion to exhaust)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest
