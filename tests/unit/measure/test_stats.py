"""Streaming statistics equal those computed from fully stored activations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from nopelab.config import SITES, AnalysisConfig, ModelConfig
from nopelab.measure.analysis import analyze_model, input_batches
from nopelab.measure.sites import site_modules
from nopelab.measure.stats import RunningMoments, SiteStats
from nopelab.models.transformer import build_model


def _stored_activations(model, model_cfg, cfg) -> dict:
    """Every site's full activations, concatenated over batches (the thing streaming avoids)."""
    store: dict = {key: [] for key in site_modules(model, cfg.sites)}
    handles = [
        module.register_forward_hook(
            lambda mod, inp, out, key=key: store[key].append(out.detach().clone())
        )
        for key, module in site_modules(model, cfg.sites).items()
    ]
    with torch.no_grad():
        for batch in input_batches(model_cfg, cfg):
            model(**batch)
    for handle in handles:
        handle.remove()
    return {key: torch.cat(chunks).double().numpy() for key, chunks in store.items()}


def _adjacency_by_loops(h: np.ndarray) -> float:
    """The §3 definition, literally: rows i, pairs j < k < i, S_ik > S_ij."""
    unit = h / np.linalg.norm(h, axis=-1, keepdims=True)
    S = unit @ unit.T
    T = len(S)
    hits = sum(S[i, k] > S[i, j] for i in range(T) for k in range(i) for j in range(k))
    return hits / (T * (T - 1) * (T - 2) / 6)


@pytest.mark.parametrize("input_kind", ["random", "tokens"])
def test_streaming_equals_stored(input_kind: str) -> None:
    model_cfg = ModelConfig(d_model=32, n_heads=4, n_layers=2, max_seq_len=16, vocab_size=7)
    cfg = AnalysisConfig(
        seq_len=12, samples=7, batch_size=3, input=input_kind, sites=SITES, device="cpu"
    )
    model = build_model(model_cfg, seed=3)
    stored = _stored_activations(model, model_cfg, cfg)
    result = analyze_model(model, cfg, progress=False)

    assert set(result.sites) == set(stored)
    for key, h in stored.items():  # h: (samples, T, d) in float64
        stats = result.sites[key]
        assert stats.samples == 7
        np.testing.assert_allclose(stats.variance, h.var(axis=-1).mean(0), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(stats.norm, np.linalg.norm(h, axis=-1).mean(0), rtol=1e-4)
        unit = h / np.linalg.norm(h, axis=-1, keepdims=True)
        np.testing.assert_allclose(
            stats.cosine, (unit @ unit.transpose(0, 2, 1)).mean(0), atol=1e-5
        )
        scores = np.array([_adjacency_by_loops(sample) for sample in h])
        # float32 vs float64 similarities may order near-equal pairs differently: allow 1 pair in 220
        assert stats.adjacency.mean == pytest.approx(scores.mean(), abs=1 / 220)
        assert stats.adjacency.std == pytest.approx(scores.std(ddof=1), abs=2 / 220)
        norms = np.linalg.norm(h, axis=-1)
        norm_scores = [
            np.mean([n[k] < n[j] for j in range(12) for k in range(j + 1, 12)]) for n in norms
        ]
        assert stats.norm_score.mean == pytest.approx(np.mean(norm_scores), abs=1e-9)
        # Zuo et al.'s pooled norm score: rows i, pairs j < k < i, ||h_k|| < ||h_j||
        zuo = [
            np.mean([n[k] < n[j] for i in range(12) for k in range(i) for j in range(k)])
            for n in norms
        ]
        assert stats.norm_score_zuo.count == 7
        assert stats.norm_score_zuo.mean == pytest.approx(np.mean(zuo), abs=1e-9)
        assert stats.norm_score_zuo.std == pytest.approx(np.std(zuo, ddof=1), abs=1e-9)


def test_sites_cover_every_layer() -> None:
    model = build_model(ModelConfig(n_layers=3, d_model=16, n_heads=2), seed=0)
    keys = list(site_modules(model, SITES))
    assert keys[0] == ("embed", 0)
    assert len(keys) == 1 + 3 * 5
    assert {layer for _, layer in keys} == {0, 1, 2, 3}


def test_attn_heads_alone_is_analysed_at_every_layer() -> None:
    model_cfg = ModelConfig(d_model=16, n_heads=2, n_layers=2, max_seq_len=8)
    cfg = AnalysisConfig(seq_len=8, samples=4, batch_size=2, sites=("attn_heads",), device="cpu")
    result = analyze_model(build_model(model_cfg, 0), cfg, progress=False)
    assert list(result.sites) == [("attn_heads", 1), ("attn_heads", 2)]
    for stats in result.sites.values():
        assert stats.samples == 4 and stats.variance.shape == stats.norm.shape == (8,)
        assert stats.cosine.shape == (8, 8) and 0 <= stats.adjacency.mean <= 1


def test_memory_does_not_grow_with_samples() -> None:
    """The accumulators have the same size after 4 and after 40 samples."""
    model_cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_seq_len=8)
    sizes = []
    for samples in (4, 40):
        cfg = AnalysisConfig(seq_len=8, samples=samples, batch_size=4, device="cpu")
        result = analyze_model(build_model(model_cfg, 0), cfg, progress=False)
        stats = result.sites[("attn_out", 1)]
        sizes.append((stats.variance.shape, stats.cosine.shape, stats.samples))
    assert sizes[0][:2] == sizes[1][:2] and sizes[1][2] == 40


def test_running_moments_match_numpy() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 2.0, size=101)
    moments = RunningMoments()
    for chunk in np.array_split(values, [1, 7, 30, 31, 80]):
        moments.update(chunk)
    assert moments.count == 101
    assert moments.mean == pytest.approx(values.mean(), rel=1e-12)
    assert moments.std == pytest.approx(values.std(ddof=1), rel=1e-10)


@pytest.mark.parametrize(("T", "max_matrix"), [(13, 5), (13, 4), (40, 7), (64, 8), (200, 30)])
def test_long_context_state_equals_the_whole_matrix(T: int, max_matrix: int) -> None:
    """Past ``max_matrix`` positions the cosine is kept as block means and summed by distance on
    the fly: the same numbers as reducing the whole T x T matrix."""
    whole, bounded = SiteStats(T), SiteStats(T, max_matrix=max_matrix)
    generator = torch.Generator().manual_seed(T)
    for _ in range(3):
        h = torch.randn(2, T, 8, generator=generator).cumsum(1)  # neighbours alike
        h[0, 3] = 0  # a zero vector: cosine 0, itself included
        whole.update(h)
        bounded.update(h)
    a, b = whole.result(), bounded.result()
    block = -(-T // max_matrix)
    assert b.block == block and a.block == 1 and b.cosine.shape == (-(-T // block),) * 2
    np.testing.assert_allclose(b.cosine_by_distance, a.cosine_by_distance, rtol=1e-6, atol=1e-9)
    edges = [*range(0, T, block), T]
    means = [
        [a.cosine[i0:i1, j0:j1].mean() for j0, j1 in itertools.pairwise(edges)]
        for i0, i1 in itertools.pairwise(edges)
    ]
    np.testing.assert_allclose(b.cosine, np.array(means), rtol=1e-6, atol=1e-9)
    for name in ("variance", "norm"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for name in ("adjacency", "norm_score", "norm_score_zuo"):
        assert getattr(a, name).mean == getattr(b, name).mean
