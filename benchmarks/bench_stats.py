"""Cost of the streaming statistics, and of the exact adjacency score against brute force.

Run: ``.venv/bin/python benchmarks/bench_stats.py`` (add ``--quick`` to skip T = 2048 and the
T = 4096 brute force; ``--end-to-end`` for part 2 alone; ``--seq-len``, ``--samples`` and
``--batch-size`` set part 2's analysis, T = 512, 32 samples, batch 4 by default). Like the
``nopelab`` command, it runs with ``OMP_WAIT_POLICY=passive`` unless the variable is set (it
starts again with it). Everything is measured in this one run, so the printed ratios compare
like with like on whatever machine runs it.

1. The chi2023 model (pre-LN NoPE, d = 768, 12 heads, 12 layers) at T = 512 and 2048: wall time
   of a bare forward pass, of one with every statistic at every site (49 sites), and of one that
   adds the attention entropy per head (recomputed in chunks of query rows); plus a per-site
   breakdown of the costs.
2. End to end: the whole ``nopelab analyze`` command (a subprocess: start-up, the statistics,
   writing the tables and figures) on the chi2023 small settings (T = 512, 32 samples of random
   vectors, batch 4, every site) against the bare forward loop over the same inputs.
3. The adjacency score of one T x T cosine matrix (of Gaussian vectors, d = 64): the
   O(T^2 log T) exact count against the O(T^3) brute force at T = 256, 1024, 4096.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from nopelab.api import load
from nopelab.config import SITES, AnalysisConfig, ModelConfig
from nopelab.measure.analysis import input_batches
from nopelab.measure.capture import StreamingCapture
from nopelab.measure.metrics import (
    adjacency_score,
    adjacency_score_bruteforce,
    cosine_matrix,
    cosine_row_blocks,
    norm_score,
    norm_score_zuo,
    position_variance,
)
from nopelab.models.transformer import Transformer
from nopelab.runtime.allocator import keep_freed_memory
from timing import best_of, interleaved


@torch.inference_mode()
def forward_costs(seq_len: int, batch: int, repeats: int, seed: int) -> None:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=768, n_heads=12, n_layers=12, max_seq_len=seq_len)
    model = Transformer(cfg).eval()
    x = torch.randn(batch, seq_len, cfg.d_model)

    def with_stats(entropy: bool) -> Callable[[], object]:
        # The accumulators are allocated once, as in an analysis that streams many batches.
        capture = StreamingCapture(model, [*SITES, "attention"][: len(SITES) + entropy], seq_len)

        def run() -> None:
            with capture:
                model(inputs_embeds=x)

        return run

    times = interleaved(
        {
            "bare": lambda: model(inputs_embeds=x),
            "stats": with_stats(False),
            "entropy": with_stats(True),
        },
        repeats,
    )
    best = {name: min(values) for name, values in times.items()}
    bare, stats, entropy = best["bare"], best["stats"], best["entropy"]
    # Each round's own ratio, then their median: robust to a burst of load that slows a round.
    paired = np.median(np.array(times["stats"]) / np.array(times["bare"]))
    sites = 1 + 4 * cfg.n_layers
    print(f"\nT = {seq_len}, batch {batch}, {sites} sites (d = 768, 12 heads, 12 layers)")
    print(f"  bare forward                      {bare:8.3f} s   (best of {repeats})")
    print(
        f"  + every statistic at every site   {stats:8.3f} s   ratio {stats / bare:5.2f}  (+{stats / bare - 1:.0%});"
        f" median of round ratios {paired:.2f}"
    )
    print(f"  + attention entropy as well       {entropy:8.3f} s   ratio {entropy / bare:5.2f}")

    h = torch.randn(batch, seq_len, cfg.d_model)
    similarity = cosine_matrix(h)
    norms = h.norm(dim=-1)
    parts = {
        "variance + norm": lambda: (position_variance(h), h.norm(dim=-1)),
        "cosine matrix": lambda: cosine_matrix(h).sum(0),
        "cosine lower part": lambda: [b.sum(0) for _, b in cosine_row_blocks(h)],
        "adjacency score": lambda: adjacency_score(similarity),
        "norm score": lambda: norm_score(norms),
        "norm score (Zuo)": lambda: norm_score_zuo(norms),
    }
    print(f"  per-site cost of one batch, times {sites} sites, as a share of the bare forward:")
    for name, fn in parts.items():
        seconds = best_of(fn, repeats)
        print(f"    {name:18s} {seconds * 1e3:8.2f} ms/site  -> {seconds * sites / bare:6.1%}")


CHI = ["--layers", "12", "--heads", "12", "--d-model", "768", "--device", "cpu"]


def run_command(args: list[str], out: Path) -> dict[str, float]:
    """Run ``nopelab ARGS --out OUT`` and time its parts from when its progress lines arrive:
    start-up (to the line that starts the statistics), the statistics (to their 100 % line),
    writing (to the exit); ``analysis`` is the statistics' time that summary.json reports."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopelab", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    arrived = [(time.perf_counter() - start, line) for line in proc.stderr]
    proc.wait()
    total = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError("".join(line for _, line in arrived))
    stats = [t for t, line in arrived if ": analysing " in line]
    return {
        "total": total,
        "start-up": stats[0],
        "statistics": stats[-1] - stats[0],
        "writing": total - stats[-1],
        "analysis": json.loads((out / "summary.json").read_text())["seconds"],
    }


@torch.inference_mode()
def command_costs(repeats: int, seed: int, seq_len: int, samples: int, batch: int) -> None:
    """The whole ``nopelab analyze`` command against the bare forward loop of its analysis."""
    sizes = {"seq_len": seq_len, "samples": samples, "batch_size": batch}
    args = ["analyze", *CHI, *(f"--{k.replace('_', '-')}={v}" for k, v in sizes.items())]
    args += ["--seed", str(seed)]
    study = load(
        model={"d_model": 768, "n_heads": 12, "n_layers": 12},
        analysis={**sizes, "seed": seed, "device": "cpu"},
    )
    model, cfg = study.model, study.config.analysis

    def bare() -> None:
        for batch in input_batches(model.cfg, cfg):
            model(**batch)

    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as folder:
        times = interleaved(
            {
                "bare": bare,
                "command": lambda: runs.append(run_command(args, Path(folder) / str(len(runs)))),
            },
            repeats,
        )
    runs = runs[1:]  # the warm-up
    best = min(runs, key=lambda run: run["total"])
    bare_best = min(times["bare"])
    paired = np.median([run["total"] for run in runs] / np.array(times["bare"]))
    print(f"\nEnd to end: nopelab {' '.join(args)}")
    print(f"  bare forward loop ({samples} samples)    {bare_best:8.2f} s   (best of {repeats})")
    print(
        f"  whole command                     {best['total']:8.2f} s   ratio {best['total'] / bare_best:5.2f};"
        f" median of round ratios {paired:.2f}"
    )
    for part in ("start-up", "statistics", "writing"):
        print(
            f"    {part:12s}                    {best[part]:8.2f} s   {best[part] / bare_best:5.2f} x bare"
        )
    print(f"    (the statistics by summary.json: {best['analysis']:.2f} s)")
    share = statistics_flop_share(model, cfg)
    print(
        f"  matrix products of the statistics: +{share:.1%} of the forward pass's FLOPs (torch's"
        f" counter): the least they add at the forward's matmul speed -> floor {1 + share:.2f}"
    )


def statistics_flop_share(model: Transformer, cfg: AnalysisConfig) -> float:
    """FLOPs the statistics add to one batch's forward pass (the exact cosine matrices' products),
    as a share of the forward pass's own, both by torch's FLOP counter."""
    batch = next(input_batches(model.cfg, cfg))
    with FlopCounterMode(display=False) as bare:
        model(**batch)
    capture = StreamingCapture(model, cfg.sites, cfg.seq_len)
    with capture, FlopCounterMode(display=False) as measured:
        model(**batch)
    return measured.get_total_flops() / bare.get_total_flops() - 1


def adjacency_costs(sizes: list[int], brute_max: int, seed: int) -> None:
    print("\nAdjacency score of one T x T cosine matrix: exact count vs brute force")
    rng = np.random.default_rng(seed)
    for size in sizes:
        s = cosine_matrix(torch.from_numpy(rng.standard_normal((1, size, 64), np.float32))).numpy()
        fast = best_of(lambda s=s: adjacency_score(s), 3)
        line = f"  T = {size:5d}  fast {fast * 1e3:9.2f} ms"
        if size <= brute_max:
            brute = best_of(lambda s=s: adjacency_score_bruteforce(s), 1)
            assert adjacency_score(s).score == adjacency_score_bruteforce(s).score
            line += f"   brute force {brute * 1e3:11.1f} ms   speed-up {brute / fast:8.1f}x"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="skip T = 2048 and the 4096 brute force"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and inputs")
    parser.add_argument(
        "--end-to-end", action="store_true", help="only the whole command against the bare loop"
    )
    parser.add_argument("--seq-len", type=int, default=512, help="part 2's sequence length")
    parser.add_argument("--samples", type=int, default=32, help="part 2's sequences")
    parser.add_argument("--batch-size", type=int, default=4, help="part 2's batch size")
    args = parser.parse_args()
    if "OMP_WAIT_POLICY" not in os.environ:  # read when torch loads: start again with it
        env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    kept = keep_freed_memory()  # as the nopelab command does: no page faults on buffer reuse
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, freed memory kept: {kept}, "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    )
    if args.end_to_end:
        command_costs(args.repeats, args.seed, args.seq_len, args.samples, args.batch_size)
        return
    forward_costs(512, batch=4, repeats=args.repeats, seed=args.seed)
    command_costs(args.repeats, args.seed, args.seq_len, args.samples, args.batch_size)
    if not args.quick:
        forward_costs(2048, batch=1, repeats=args.repeats, seed=args.seed)
    adjacency_costs([256, 1024, 4096], brute_max=1024 if args.quick else 4096, seed=args.seed)


if __name__ == "__main__":
    main()
