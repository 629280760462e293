"""`stallscope disk` (placeholder until its issue lands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("disk", help="(not yet available)")
