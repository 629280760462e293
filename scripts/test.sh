#!/usr/bin/env bash
# Run the test suite the way CI does: real iostat, smartctl, fio, Prometheus, Alertmanager,
# headless Chromium, tmux, TensorFlow and torchrun; a missing tool fails the run.
# Usage: scripts/test.sh [--fast] [--under-load] [pytest args...]
#   --fast        the inner-loop tier: leaves out the tests marked slow, those that start a heavy
#                 real component (prometheus, alertmanager, chromium, tmux, tensorflow, torchrun,
#                 fio) and the exclusive ones (see pyproject.toml); installs only what that tier
#                 runs (smartctl), and the Python test dependencies when they are missing
#   --under-load  run the tests beside two CPU hogs (busy-looping Python processes, started here
#                 and always stopped when the script ends, however it ends): what the suite meets
#                 on a busy 2-core machine. The fast tier must pass so (scripts/test.sh --fast
#                 --under-load); a test that fails only under load asserts against an idle
#                 machine's wall clock instead of what the host gave it
# With pytest args: one pytest run of exactly those (a tier's folder: scripts/test.sh --fast
# tests/unit, see tests/README.md). Without: the whole suite, in two passes.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
under_load=0
while [ $# -gt 0 ]; do
  case "$1" in
    --fast) fast=1; shift ;;
    --under-load) under_load=1; shift ;;
    *) break ;;
  esac
done
[ -x .venv/bin/python ] || scripts/setup.sh
# shellcheck source=scripts/_apt.sh
source scripts/_apt.sh
if [ "$fast" = 1 ]; then
  # the real tools of the fast tier's tests: smartctl (tests/integration/test_health.py,
  # test_cli_disk.py); iostat is only in an exclusive test, fio only in tests marked fio, and
  # the components of tests/conftest.py COMPONENTS only in the tests marked with them
  apt_install smartmontools
else
  apt_install sysstat smartmontools fio chromium prometheus prometheus-alertmanager tmux
fi
if [ "$fast" = 0 ] || ! .venv/bin/python -c "import pytest, pytest_timeout, xdist, hypothesis" 2>/dev/null
then
  # test and lint dependencies (pytest, hypothesis, ruff, mypy, Lightning, transformers...):
  # pyproject.toml's dependency group "dev" (PEP 735), read by scripts/group.py
  .venv/bin/python scripts/group.py dev > .venv/dev-requirements.txt
  .venv/bin/python -m pip install -q -e . -r .venv/dev-requirements.txt
fi
hogs=()
stop_hogs() {
  local pid
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
  hogs=()
}
if [ "$under_load" = 1 ]; then
  trap stop_hogs EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  for _ in 1 2; do
    # a busy loop that also ends on its own when this script is gone (SIGKILL runs no trap)
    python3 -c 'import os
p = os.getppid()
while os.getppid() == p:
    for _ in range(100_000):
        pass' &
    hogs+=("$!")
  done
  echo "test.sh: under load: CPU hogs ${hogs[*]} beside the tests" >&2
fi
mkdir -p artifacts
# the suite starts Python processes by the hundred (the CLI, `stallscope run`, trainers that
# import the probe): with PYTHONDONTWRITEBYTECODE set (some images set it) each one compiled
# every stallscope module it imported from source, ~0.15 s of a 0.37-s `diagnose --json` on the
# 2-core VM. Compile once, keep the bytecode.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 stallscope tests benchmarks examples >/dev/null
.venv/bin/ruff check stallscope tests benchmarks examples scripts
.venv/bin/ruff format --check --quiet stallscope tests benchmarks examples scripts
.venv/bin/mypy
heavy="slow or prometheus or alertmanager or chromium or tmux or tensorflow or torchrun or fio"
started=$SECONDS
if [ "$fast" = 1 ]; then
  rc=0
  .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder \
    -m "not ($heavy or exclusive)" "$@" || rc=$?
  echo "test.sh: the fast tier took $((SECONDS - started)) s$([ "$under_load" = 1 ] && echo " beside two CPU hogs")" >&2
  exit "$rc"
fi
if [ $# -gt 0 ]; then
  rc=0
  .venv/bin/python -m pytest "$@" || rc=$?  # what was asked for, as asked
  exit "$rc"
fi
# the whole suite in two passes: the tests that share the machine well, three at a time on two
# cores (a file per worker, long files first: tests/conftest.py): they wait on subprocesses,
# servers and timeouts as much as they compute, so two workers kept 1.1 of the 2 cores busy
# (cpuacct over a fresh clone's pass on 2026-11-29: 905 CPU-s in 824 s) and three 1.5 (941 in
# 615 s, beside other work both times); then those that measure CPU-bound work, throughput or
# a disk alone (marker exclusive)
# (each pass's per-test times land in artifacts/pytest-*.xml: `.venv/bin/python
# scripts/suite_times.py artifacts/pytest-parallel.xml artifacts/pytest-exclusive.xml` sums them
# per file, to see which file holds a pass up)
rc=0
.venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder -m "not exclusive" \
  --durations=12 --junitxml artifacts/pytest-parallel.xml || rc=$?
# the exclusive pass collects only the files that name the marker (a file marks its tests in its
# own text, where tests/unit/test_layout.py reads them): collecting all ~100 files again imported
# every one of them for ~35 tests of ~15 files
mapfile -t exclusive_files < <(grep -rlw --include='test_*.py' exclusive tests | sort)
.venv/bin/python -m pytest -m exclusive --durations=12 --junitxml artifacts/pytest-exclusive.xml \
  "${exclusive_files[@]}" || rc=$((rc ? rc : $?))
exit "$rc"
