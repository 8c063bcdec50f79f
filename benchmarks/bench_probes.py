"""Probe fitting against the forward passes that collect its features.

Run: ``.venv/bin/python benchmarks/bench_probes.py`` (``--quick`` for a smaller model,
``--device cuda`` on a GPU). Everything is measured in this one run, so the ratios compare like
with like on whatever machine runs it.

For the chi2023 model (pre-LN NoPE, d = 768, 12 heads, 12 layers; ``--quick``: d = 256, 4
layers) on N sequences of length T: the wall time of collecting one site at every layer, then,
for one layer, of deriving each feature set and of fitting each probe kind (3 seeds as one
batched ensemble), each as a ratio to the collection time. The ridge probe is the closed form;
the others train for the configured epochs.
"""

from __future__ import annotations

import argparse
import time

import torch

from nopelab.config import FEATURES, PROBES, AnalysisConfig, ModelConfig, ProbeConfig
from nopelab.measure.analysis import input_batches
from nopelab.models.transformer import build_model
from nopelab.probing.features import collect, feature_matrix
from nopelab.probing.probes import fit_probe, position_targets, sequence_splits


def _timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    value = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="d = 256, 4 layers, T = 256")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if args.quick:
        model_cfg, T = ModelConfig(d_model=256, n_heads=4, n_layers=4, max_seq_len=256), 256
    else:
        model_cfg, T = ModelConfig(d_model=768, n_heads=12, n_layers=12, max_seq_len=512), 512
    analysis = AnalysisConfig(seq_len=T, samples=args.samples, batch_size=8, seed=args.seed)
    model = build_model(model_cfg, args.seed).to(args.device)
    keys = [("resid_post", layer) for layer in range(1, model_cfg.n_layers + 1)]
    warm_up = AnalysisConfig(seq_len=T, samples=8, batch_size=8, seed=args.seed)
    collect(model, keys[:1], input_batches(model_cfg, warm_up), 8, T)
    acts, collect_s = _timed(
        lambda: collect(model, keys, input_batches(model_cfg, analysis), args.samples, T)
    )
    tokens = args.samples * T
    print(
        f"\nd = {model_cfg.d_model}, {model_cfg.n_layers} layers, {args.samples} sequences x "
        f"T = {T} ({tokens} tokens), device {args.device}"
    )
    print(f"  collect resid_post at every layer  {collect_s:8.2f} s   (the reference: 1.00)")

    layer = acts[keys[0]]
    for name in FEATURES:
        _, seconds = _timed(lambda name=name: feature_matrix(layer, name))
        print(f"  feature {name:<27}{seconds:8.2f} s   ratio {seconds / collect_s:6.2f}")

    cfg = ProbeConfig(epochs=args.epochs, seeds=3)
    splits = sequence_splits(args.samples, cfg.test_fraction, cfg.seeds, args.seed)
    y = position_targets(args.samples, T, "position")
    for features in ("raw", "variance"):
        X = feature_matrix(layer, features)
        for kind in PROBES:
            _, seconds = _timed(
                lambda X=X, kind=kind: fit_probe(kind, X, y, splits, cfg, args.seed, args.device)
            )
            print(
                f"  fit {kind:<10} on {features:<8} (3 seeds) {seconds:8.2f} s   "
                f"ratio {seconds / collect_s:6.2f}"
            )


if __name__ == "__main__":
    main()
