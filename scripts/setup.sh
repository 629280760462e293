#!/usr/bin/env bash
# Install stallscope into ./.venv (and smartctl for `stallscope disk` where apt is available).
# Usage: scripts/setup.sh [--no-apt]
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/_apt.sh
source scripts/_apt.sh

if [ "${1:-}" != "--no-apt" ]; then
  apt_install smartmontools
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first, pinned: an unpinned torch pulls the multi-GB CUDA build
.venv/bin/python -m pip install -q "torch==${STALLSCOPE_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev]"
echo "setup: done — try: .venv/bin/stallscope run -- .venv/bin/python examples/train_cpu.py" >&2
