"""Long contexts: peak memory and time of the streaming statistics against T = 2 k ... 32 k.

Run: ``.venv/bin/python benchmarks/bench_long.py`` (``--lengths 2048,4096`` for fewer; ``--layers``,
``--d-model`` for another model). Each length runs in a fresh process, so its peak resident
memory (``ru_maxrss``) is its own. For one sequence of random vectors through a NoPE model it
measures, in that process:

- the bare forward pass;
- the forward pass with every statistic of ``attn_out`` and ``resid_post`` at every layer (as
  ``nopelab analyze --sites attn_out,resid_post`` computes them);
- the reference the statistics are held to: the forward pass plus the cosine products' FLOPs
  (the lower triangle of a T x T x d product per site and layer) at this machine's measured
  matrix-multiply rate.

Past 1024 positions the statistics keep O(T) state per site and layer (block means of the
cosine matrix, at most 1024 x 1024, for figures), so memory should grow linearly in T while
time grows as T² (the cosine products and the exact adjacency count, O(T² log T)).
Everything is measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from nopelab.config import ModelConfig
from nopelab.measure.capture import StreamingCapture
from nopelab.models.transformer import build_model

SITES = ("attn_out", "resid_post")


def matmul_rate(n: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of a float32 n x n x n product on this machine (the best of ``repeats``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@torch.inference_mode()
def one_length(T: int, layers: int, d_model: int, heads: int) -> dict[str, float]:
    """Time and peak memory at one length, in this process."""
    cfg = ModelConfig(
        d_model=d_model, n_layers=layers, n_heads=heads, max_seq_len=T, pos_encoding="none"
    )
    model = build_model(cfg, seed=0)
    x = torch.randn(1, T, d_model, generator=torch.Generator().manual_seed(1))
    model(inputs_embeds=x[:, :64])  # warm-up, and numba's compilation of the pair counting
    with StreamingCapture(model, SITES, 64, "cpu"):
        model(inputs_embeds=x[:, :64])
    forward = _seconds(lambda: model(inputs_embeds=x))
    capture = StreamingCapture(model, SITES, T, "cpu")
    with capture:
        statistics = _seconds(lambda: model(inputs_embeds=x))
    capture.result()
    return {
        "forward_s": forward,
        "statistics_s": statistics,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one length
    args = parser.parse_args()
    shape = (args.layers, args.d_model, args.heads)
    if args.one:
        print(json.dumps(one_length(args.one, *shape)))
        return
    rate = matmul_rate()
    site_layers = len(SITES) * args.layers
    print(
        f"NoPE model: {args.layers} layers, d = {args.d_model}, {args.heads} heads; statistics of "
        f"{', '.join(SITES)} at every layer; one sequence; matmul rate {rate / 1e9:.1f} GFLOP/s"
    )
    print(
        f"{'T':>6} {'forward s':>10} {'stats s':>9} {'GEMM s':>8} "
        f"{'stats / (fwd+GEMM)':>19} {'peak MB':>8} {'KB per position':>16}"
    )
    for T in (int(t) for t in args.lengths.split(",")):
        command = [sys.executable, __file__, "--one", str(T), "--layers", str(args.layers)]
        command += ["--d-model", str(args.d_model), "--heads", str(args.heads)]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        gemm = site_layers * T * (T + 1) / 2 * args.d_model * 2 / rate  # the lower triangle
        ratio = row["statistics_s"] / (row["forward_s"] + gemm)
        print(
            f"{T:>6} {row['forward_s']:>10.2f} {row['statistics_s']:>9.2f} {gemm:>8.2f} "
            f"{ratio:>19.2f} {row['peak_mb']:>8.0f} {row['peak_mb'] * 1024 / T:>16.1f}"
        )


if __name__ == "__main__":
    main()
