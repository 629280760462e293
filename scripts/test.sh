#!/usr/bin/env bash
# Run the whole test suite the way CI does: real iostat, smartctl, fio and headless Chromium.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/setup.sh
# shellcheck source=scripts/_apt.sh
source scripts/_apt.sh
apt_install sysstat smartmontools fio chromium prometheus prometheus-alertmanager tmux
# test and lint dependencies (pytest, hypothesis, ruff, mypy, Lightning, transformers...)
.venv/bin/python -m pip install -q -e ".[dev]"
mkdir -p artifacts
.venv/bin/ruff check stallscope tests benchmarks examples
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
