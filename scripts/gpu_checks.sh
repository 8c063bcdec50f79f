#!/usr/bin/env bash
# The checks that need a GPU, in one go: run on a CUDA machine after `scripts/setup.sh` (with a
# CUDA torch in .venv, see the README). Prints what it runs; writes runs under $OUT.
#   DEVICE=cpu PRECISION=float32 bash scripts/gpu_checks.sh   # the same commands on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
PRECISION=${PRECISION:-bfloat16}
OUT=${OUT:-runs/gpu-checks}
SEED=${SEED:-0}
py=.venv/bin/python
run() { echo "+ $*" >&2; "$@"; }

run $py -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
# the CUDA path against the CPU path (skipped without CUDA)
run $py -m pytest -q tests/unit/runtime/test_cuda.py
# tokens/s and MFU, in the trainer's GPU precision and in float32
run $py benchmarks/bench_train.py --device "$DEVICE" --precision "$PRECISION" --quick --seed "$SEED"
run $py benchmarks/bench_train.py --device "$DEVICE" --precision float32 --quick --seed "$SEED"
# a compiled training run (bf16 autocast under --precision auto on CUDA), then probes on it
run .venv/bin/nopelab train --task reverse --layers 4 --heads 4 --d-model 128 --seq-len 64 \
    --batch-size 64 --steps 200 --lr 3e-3 --warmup 20 --eval-every 100 --compile \
    --device "$DEVICE" --seed "$SEED" --out "$OUT/train" --force
run .venv/bin/nopelab probe "$OUT/train" --device "$DEVICE" --seed "$SEED" --out "$OUT/probe" --force
# probe fitting against the collecting forward passes
run $py benchmarks/bench_probes.py --quick --device "$DEVICE" --seed "$SEED"
echo "done: $OUT" >&2
