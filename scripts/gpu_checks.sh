#!/usr/bin/env bash
# The checks that need a GPU, in one go (under 8 minutes on one GPU): run on a CUDA machine after
# `scripts/setup.sh` (with a CUDA torch in .venv, see the README). One line per check, `ok` or
# `FAILED`, with its seconds and the last line of its output; each check's whole output is in
# $OUT/NAME.log. Exits 1 if a check failed.
#   DEVICE=cpu bash scripts/gpu_checks.sh   # the same commands on a CPU (LONG: the analysed length)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-runs/gpu-checks}
SEED=${SEED:-0}
LONG=${LONG:-32768}
py=.venv/bin/python
nopelab=.venv/bin/nopelab
mkdir -p "$OUT"
failed=0
if [ "$DEVICE" = cpu ]; then  # the CPU kernels the stored references were made with
    export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
fi

skip() {  # skip NAME WHY: one line
    printf 'skip    %-22s        %s\n' "$1" "$2"
}

check() {  # check NAME COMMAND...: run COMMAND, its output in $OUT/NAME.log; one line
    local name=$1 start=$SECONDS
    shift
    if "$@" >"$OUT/$name.log" 2>&1; then
        printf 'ok      %-22s %4d s  %s\n' "$name" $((SECONDS - start)) "$(tail -n 1 "$OUT/$name.log")"
    else
        printf 'FAILED  %-22s %4d s  %s\n' "$name" $((SECONDS - start)) "$(tail -n 1 "$OUT/$name.log")"
        failed=$((failed + 1))
    fi
}

tiny=(--layers 2 --heads 2 --d-model 64 --seq-len 64 --batch-size 16 --warmup 1 --lr 3e-3
      --device "$DEVICE" --seed "$SEED")

check device $py -c "import torch; d = torch.device('$DEVICE'); \
print(torch.__version__, torch.cuda.get_device_name() if d.type == 'cuda' else 'cpu')"
# the CUDA path against the CPU path (skipped without CUDA)
check cuda-tests $py -m pytest -q -p no:cacheprovider tests/unit/runtime/test_cuda.py
# a bf16 training step of each encoding (bf16 autocast; on a CPU, slow but the same code)
for pe in none learned sinusoidal rope alibi t5; do
    check "bf16-step-$pe" $nopelab train --task copy --pos-encoding "$pe" "${tiny[@]}" \
        --steps 2 --eval-every 2 --precision bfloat16 --out "$OUT/bf16-$pe" --force
done
# the README's main job on this device, its numbers against the stored CPU reference
check chi2023-main-job $nopelab reproduce chi2023 --device "$DEVICE" --seed "$SEED" \
    --out "$OUT/chi2023" --force
check chi2023-vs-cpu $py scripts/compare_reference.py "$OUT/chi2023" chi2023-random-init-small
# a long context: every statistic of one sequence of LONG tokens
check "analyze-T$LONG" $nopelab analyze --layers 1 --heads 2 --d-model 32 --seq-len "$LONG" \
    --samples 1 --batch-size 1 --sites attn_out --device "$DEVICE" --seed "$SEED" \
    --out "$OUT/long" --force
# data parallelism under torchrun: one process per GPU (two gloo processes on a CPU)
procs=2
if [ "$DEVICE" != cpu ]; then
    procs=$($py -c "import torch; print(torch.cuda.device_count())")
fi
check "torchrun-x$procs" $py -m torch.distributed.run --nproc-per-node "$procs" \
    --master-port 29533 -m nopelab train --task copy "${tiny[@]}" --steps 2 --eval-every 2 \
    --out "$OUT/ddp" --force
# tokens/s and MFU in the trainer's GPU precision and in float32; a compiled run and its probes
if [ "$DEVICE" = cpu ]; then  # bf16 matmuls are emulated on most CPUs: minutes, no meaning
    skip bench-train-bf16 "bf16 throughput means nothing on a CPU"
else
    check bench-train-bf16 $py benchmarks/bench_train.py --device "$DEVICE" \
        --precision bfloat16 --quick --seed "$SEED"
fi
check bench-train-fp32 $py benchmarks/bench_train.py --device "$DEVICE" --precision float32 \
    --quick --seed "$SEED"
check train-compiled $nopelab train --task reverse --layers 4 --heads 4 --d-model 128 \
    --seq-len 64 --batch-size 64 --steps 200 --lr 3e-3 --warmup 20 --eval-every 100 --compile \
    --device "$DEVICE" --seed "$SEED" --out "$OUT/train" --force
check probe $nopelab probe "$OUT/train" --device "$DEVICE" --seed "$SEED" --out "$OUT/probe" \
    --force
check bench-probes $py benchmarks/bench_probes.py --quick --device "$DEVICE" --seed "$SEED"

echo "$failed checks failed; logs: $OUT" >&2
[ "$failed" -eq 0 ]
