"""`stallscope report` (placeholder until its issue lands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("report", help="(not yet available)")
