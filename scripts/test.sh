#!/usr/bin/env bash
# Run the test suite the way CI does: real iostat, smartctl, fio, Prometheus, Alertmanager,
# headless Chromium, tmux, TensorFlow and torchrun; a missing tool fails the run.
# Usage: scripts/test.sh [--fast] [pytest args...]
#   --fast  the inner-loop tier: leaves out the tests marked slow, those that start a heavy real
#           component (prometheus, alertmanager, chromium, tmux, tensorflow, torchrun) and the
#           exclusive ones (see pyproject.toml), and skips the installs when the test tools are
#           already there
# With pytest args: one pytest run of exactly those (a tier's folder: scripts/test.sh --fast
# tests/unit, see tests/README.md). Without: the whole suite, in two passes.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi
[ -x .venv/bin/python ] || scripts/setup.sh
if [ "$fast" = 0 ] || ! .venv/bin/python -c "import pytest, pytest_timeout, xdist, hypothesis" 2>/dev/null
then
  # shellcheck source=scripts/_apt.sh
  source scripts/_apt.sh
  apt_install sysstat smartmontools fio chromium prometheus prometheus-alertmanager tmux
  # test and lint dependencies (pytest, hypothesis, ruff, mypy, Lightning, transformers...):
  # pyproject.toml's dependency group "dev" (PEP 735), read by scripts/group.py
  .venv/bin/python scripts/group.py dev > .venv/dev-requirements.txt
  .venv/bin/python -m pip install -q -e . -r .venv/dev-requirements.txt
fi
mkdir -p artifacts
# the suite starts Python processes by the hundred (the CLI, `stallscope run`, trainers that
# import the probe): with PYTHONDONTWRITEBYTECODE set (some images set it) each one compiled
# every stallscope module it imported from source, ~0.15 s of a 0.37-s `diagnose --json` on the
# 2-core VM. Compile once, keep the bytecode.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 stallscope tests benchmarks examples >/dev/null
.venv/bin/ruff check stallscope tests benchmarks examples
.venv/bin/mypy
heavy="slow or prometheus or alertmanager or chromium or tmux or tensorflow or torchrun"
if [ "$fast" = 1 ]; then
  exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder \
    -m "not ($heavy or exclusive)" "$@"
fi
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"  # what was asked for, as asked
fi
# the whole suite in two passes: the tests that share the machine well two at a time (a file per
# worker, long files first: tests/conftest.py), then those that measure CPU-bound work, throughput or a disk alone (marker exclusive)
rc=0
.venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not exclusive" \
  --durations=12 || rc=$?
.venv/bin/python -m pytest -m exclusive --durations=12 || rc=$((rc ? rc : $?))
exit "$rc"
