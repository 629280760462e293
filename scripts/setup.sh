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
# torch first, pinned, so the extras' ranges are satisfied by it and nothing pulls a newer one.
# Which build comes depends on the index: PyPI serves the CUDA build (several GB); set
# STALLSCOPE_TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build on a machine
# without a local CPU wheel (the CI machines have one).
torch_index=()
if [ -n "${STALLSCOPE_TORCH_INDEX:-}" ]; then torch_index=(--index-url "$STALLSCOPE_TORCH_INDEX"); fi
.venv/bin/python -m pip install -q "${torch_index[@]}" "torch==${STALLSCOPE_TORCH_VERSION:-2.13.0}"
# the runtime and what the demo and the report use; scripts/test.sh adds the test tools
.venv/bin/python -m pip install -q -e ".[torch,report,parquet]"
echo "setup: done — try: .venv/bin/stallscope run -- .venv/bin/python examples/train_cpu.py" >&2
