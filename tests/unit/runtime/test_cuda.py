"""The CUDA path against the CPU path. Skipped without a CUDA GPU (CI runs on CPU only); run
``.venv/bin/python -m pytest -q tests/unit/runtime/test_cuda.py`` on a GPU machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nopelab.config import AnalysisConfig, ModelConfig, ProbeConfig, TrainConfig
from nopelab.measure.analysis import analyze_model
from nopelab.models.transformer import build_model
from nopelab.probing.probes import fit_probe, position_targets, sequence_splits
from nopelab.training.run import TrainRun
from nopelab.training.task_config import TaskConfig
from nopelab.training.train import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODEL = ModelConfig(d_model=64, n_layers=2, n_heads=2, max_seq_len=64)


@pytest.fixture(autouse=True)
def exact_float32_matmuls():
    """TF32 would round float32 products to 10 mantissa bits; compare at full precision."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def _run(device: str, precision: str) -> TrainRun:
    settings = dict(steps=12, batch_size=16, seq_len=32, lr=3e-3, warmup=2, eval_every=12)
    return TrainRun(
        model=MODEL,
        train=TrainConfig(device=device, precision=precision, **settings),
        task=TaskConfig(name="copy", max_len=5, train_size=2000, test_size=100),
    )


def test_training_on_cuda_tracks_the_cpu(tmp_path: Path) -> None:
    """float32 on the GPU retraces the CPU run; the default there (bf16 autocast) stays close."""
    train(_run("cpu", "float32"), tmp_path / "cpu", progress=False)
    train(_run("cuda", "float32"), tmp_path / "fp32", progress=False)
    summary = train(_run("cuda", "auto"), tmp_path / "bf16", progress=False)
    cpu, fp32, bf16 = (
        pd.read_csv(tmp_path / n / "metrics.csv")["loss"] for n in ("cpu", "fp32", "bf16")
    )
    np.testing.assert_allclose(fp32, cpu, rtol=1e-3)
    np.testing.assert_allclose(bf16, cpu, rtol=3e-2)
    assert not np.array_equal(bf16, fp32)
    assert summary["tokens_per_second"] > 0


def test_streaming_statistics_on_cuda_match_the_cpu() -> None:
    results = {}
    for device in ("cpu", "cuda"):
        cfg = AnalysisConfig(seq_len=64, samples=16, batch_size=8, device=device)
        results[device] = analyze_model(build_model(MODEL, 0), cfg, progress=False).sites
    for key, on_cpu in results["cpu"].items():
        on_gpu = results["cuda"][key]
        for name in ("variance", "norm", "cosine"):
            # a cosine near 0 (a few 1e-6) differs relatively in its last float32 digits
            atol = 1e-6 if name == "cosine" else 0.0
            np.testing.assert_allclose(
                getattr(on_gpu, name), getattr(on_cpu, name), rtol=1e-3, atol=atol
            )
        assert on_gpu.adjacency.mean == pytest.approx(on_cpu.adjacency.mean, abs=2e-3)


@pytest.mark.parametrize("kind", ["linear-cls", "mlp-reg"])
def test_probes_on_cuda_match_the_cpu(kind: str) -> None:
    """Probe ensembles train on the GPU (`--device cuda`) to the same scores."""
    N, T = 48, 32
    features = torch.randn(N, T, 16, generator=torch.Generator().manual_seed(0))
    features[..., 0] += torch.arange(T) / 4  # a plain position signal in one coordinate
    targets = position_targets(N, T, "position")
    splits = sequence_splits(N, 0.25, 3, 0)
    cfg = ProbeConfig(epochs=10, lr=1e-2)
    cpu, gpu = (fit_probe(kind, features, targets, splits, cfg, 0, d) for d in ("cpu", "cuda"))
    metric = "mad" if kind.endswith("cls") else "mae"
    for a, b in zip(cpu, gpu, strict=True):
        assert b[metric] == pytest.approx(a[metric], rel=0.1, abs=0.1)
        assert b[metric] < 0.7 * b["baseline"]
