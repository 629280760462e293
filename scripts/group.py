"""Print a PEP 735 dependency group of pyproject.toml, one requirement per line, for pips older
than 25.1 (which cannot ``pip install --group``):

    .venv/bin/python scripts/group.py dev > reqs.txt && .venv/bin/python -m pip install -r reqs.txt
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli (a dependency there)
    import tomli as tomllib


def group(groups: dict[str, Any], name: str, seen: tuple[str, ...] = ()) -> list[str]:
    """The requirements of group ``name``, included groups expanded (PEP 735)."""
    if name in seen:
        raise SystemExit(f"group.py: dependency group {name!r} includes itself")
    if name not in groups:
        raise SystemExit(f"group.py: no dependency group {name!r} (have: {', '.join(groups)})")
    out: list[str] = []
    for item in groups[name]:
        if isinstance(item, dict) and "include-group" in item:
            out += group(groups, item["include-group"], (*seen, name))
        elif isinstance(item, str):
            out.append(item)
    return out


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "dev"
    doc = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    print("\n".join(group(doc.get("dependency-groups", {}), name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
