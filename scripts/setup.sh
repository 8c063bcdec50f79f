#!/usr/bin/env bash
# Set up nopelab in ./.venv: Python 3.11+, PyTorch, nopelab and its test tools.
# On a machine without torch this installs the CPU build torch==2.13.0 first, so the package's
# loose "torch>=2.4" requirement never pulls a multi-GB CUDA build. To use another build (a CUDA
# one on a GPU machine), set TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0" with the CUDA index
# configured in pip, or install torch into .venv yourself before running this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[dev]"
