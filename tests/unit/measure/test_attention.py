"""Attention statistics per head, reduced in chunks of query rows, equal those of the whole
(B, H, T, T) logits computed here from the model's own queries and keys."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor

import nopelab.measure.attention as attention
from nopelab import limits
from nopelab.config import AnalysisConfig, ModelConfig
from nopelab.measure.analysis import analyze_model
from nopelab.measure.capture import StreamingCapture
from nopelab.measure.run_files import attention_heads_table, attention_table
from nopelab.models.transformer import Attention, Transformer, build_model

B, H, T = 3, 4, 13  # T is no multiple of the 5-row chunks below


def tiny(**overrides: object) -> Transformer:
    """init_std 0.3: attention far from uniform, so that the heads differ."""
    values = dict(vocab_size=40, d_model=32, n_heads=H, n_layers=2, init_std=0.3)
    return build_model(ModelConfig(**{**values, **overrides}), seed=0)


def tokens(seed: int) -> Tensor:
    return torch.randint(0, 40, (B, T), generator=torch.Generator().manual_seed(seed))


def reference(q: Tensor, k: Tensor, cfg: ModelConfig, bias: Tensor | None) -> tuple[Tensor, ...]:
    """Per head and query, summed over the batch, from the whole float64 logits: the entropy of
    the masked softmax and the variance of the unmasked logits over the visible keys."""
    factor = 1.0 if cfg.head_scales else cfg.logit_scale  # head scales are already in q
    logits = factor * (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(cfg.head_dim)
    if bias is not None:
        logits = logits + bias.double()
    visible = torch.ones(T, T, dtype=torch.bool)
    if not cfg.bidirectional:
        visible = visible.tril()
    probs = logits.masked_fill(~visible, float("-inf")).softmax(-1)
    entropy = torch.special.entr(probs).sum(-1)
    seen = logits.masked_fill(~visible, float("nan"))
    mean = seen.nanmean(-1, keepdim=True)
    variance = (seen - mean).square().nanmean(-1)
    return entropy.sum(0), variance.sum(0)


# every encoding with each of the other choices, every pair of choices at least once
CASES = [
    ("none", False, "uniform", T),
    ("none", True, "per_head", 1),
    ("none", False, "per_head", 5),
    ("rope", False, "per_head", 1),
    ("rope", True, "uniform", 5),
    ("rope", True, "per_head", T),
    ("alibi", False, "uniform", 1),
    ("alibi", True, "per_head", 5),
    ("alibi", False, "per_head", T),
    ("alibi", True, "uniform", 1),
]


@pytest.mark.parametrize(("pe", "bidirectional", "scales", "chunk_rows"), CASES)
def test_chunked_statistics_equal_the_whole_logits(
    pe: str, bidirectional: bool, scales: str, chunk_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    per_head = scales == "per_head"
    model = tiny(
        pos_encoding=pe, bidirectional=bidirectional, head_scales=per_head, logit_scale=1.7
    )
    if per_head:  # every head its own factor
        for block in model.blocks:
            assert block.attn.head_scale is not None
            block.attn.head_scale.data = torch.tensor([1.7, 0.5, 2.5, 1.1])
    monkeypatch.setattr(limits, "CHUNK_ELEMENTS", B * H * T * chunk_rows)
    assert attention.chunk_rows(B, H, T) == chunk_rows
    qk: dict[int, list[tuple[Tensor, Tensor]]] = {1: [], 2: []}
    for layer, block in enumerate(model.blocks, start=1):
        kept: dict[str, Tensor] = {}
        block.attn.hook_q.register_forward_hook(lambda _m, _i, q, kept=kept: kept.update(q=q))
        block.attn.hook_k.register_forward_hook(
            lambda _m, _i, k, kept=kept, layer=layer: qk[layer].append((kept["q"], k))
        )
    inputs = [tokens(1), tokens(2)]
    with torch.no_grad():
        bare = [model(idx) for idx in inputs]
        with StreamingCapture(model, ["attention"], T) as capture:
            captured = [model(idx) for idx in inputs]
    assert all(torch.equal(a, b) for a, b in zip(bare, captured, strict=True))  # bit-identical
    result = capture.result().attention
    for layer, block in enumerate(model.blocks, start=1):
        bias = block.attn.pe.bias(T, not bidirectional, torch.device("cpu"))
        sums = [reference(q, k, model.cfg, bias) for q, k in qk[layer][-2:]]  # the captured passes
        entropy = (sums[0][0] + sums[1][0]).numpy() / (2 * B)
        variance = (sums[0][1] + sums[1][1]).numpy() / (2 * B)
        stats = result[layer]
        assert stats.samples == 2 * B
        assert stats.head_entropy.shape == stats.head_logit_variance.shape == (H, T)
        np.testing.assert_allclose(stats.head_entropy, entropy, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats.head_logit_variance, variance, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats.entropy, entropy.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats.logit_variance, variance.mean(0), rtol=1e-5, atol=1e-6)
        assert np.ptp(stats.head_entropy[:, -1]) > 0.05  # the heads really differ
        if not bidirectional:  # query 1 sees itself only
            assert (stats.head_entropy[:, 0] == 0).all()
            assert (stats.head_logit_variance[:, 0] == 0).all()
        # never above uniform attention's log m (up to float32 rounding)
        assert (stats.head_entropy <= stats.uniform_entropy + 1e-6).all()


def test_the_explicit_attention_path_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Queries and keys are hooked, not the (B, H, T, T) scores: attention stays fused."""
    monkeypatch.setattr(Attention, "_explicit", lambda *_: pytest.fail("explicit path ran"))
    model = tiny(pos_encoding="alibi")
    with torch.no_grad(), StreamingCapture(model, ["attn_out", "attention"], T) as capture:
        model(tokens(1))
    assert capture.result().attention[2].samples == B


def test_low_precision_is_reduced_in_float32() -> None:
    """A bfloat16 model's statistics come out close to its float32 ones."""
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny(pos_encoding="rope").to(dtype)
        with torch.no_grad(), StreamingCapture(model, ["attention"], T) as capture:
            model(tokens(1))
        results.append(capture.result().attention[1])
    np.testing.assert_allclose(results[1].head_entropy, results[0].head_entropy, atol=0.05)


def test_attention_entropy_and_logit_spread() -> None:
    """Tiny weights give uniform attention: entropy log m and logits of spread ~ d^2 sigma^4."""
    model_cfg = ModelConfig(d_model=64, n_heads=4, n_layers=1, max_seq_len=32, init_std=1e-4)
    cfg = AnalysisConfig(seq_len=32, samples=4, batch_size=4, sites=("attention",), device="cpu")
    attention = analyze_model(build_model(model_cfg, 0), cfg, progress=False).attention[1]
    np.testing.assert_allclose(attention.uniform_entropy, np.log(np.arange(1, 33)))
    np.testing.assert_allclose(attention.entropy, attention.uniform_entropy, atol=1e-5)
    np.testing.assert_allclose(
        attention.head_entropy, attention.uniform_entropy[None].repeat(4, 0), atol=1e-5
    )
    assert attention.logit_variance[1:].max() < 1e-6


def test_the_heads_table_averages_to_the_layer_table() -> None:
    model = tiny()
    with torch.no_grad(), StreamingCapture(model, ["attn_out", "attention"], T) as capture:
        model(tokens(1))
    result = capture.result()
    heads, layers = attention_heads_table(result), attention_table(result)
    assert list(heads.columns) == ["layer", "head", "position", "entropy", "logit_variance"]
    assert len(heads) == 2 * H * T and set(heads["head"]) == set(range(1, H + 1))
    means = heads.groupby(["layer", "position"], as_index=False)[["entropy", "logit_variance"]]
    merged = layers.merge(means.mean(), on=["layer", "position"], suffixes=("", "_heads"))
    np.testing.assert_allclose(merged["entropy"], merged["entropy_heads"], rtol=1e-12)
    np.testing.assert_allclose(merged["logit_variance"], merged["logit_variance_heads"], rtol=1e-12)
    row = heads[(heads["layer"] == 2) & (heads["head"] == 3) & (heads["position"] == 5)]
    assert row["entropy"].item() == result.attention[2].head_entropy[2, 4]


def test_sequences_of_another_length_are_refused() -> None:
    stats = attention.AttentionStats(T + 1, n_heads=H, causal=True)
    q = torch.randn(B, H, T, 8)
    with pytest.raises(
        ValueError, match=f"sequences of {T} positions; these statistics are for {T + 1}"
    ):
        stats.update(q, q, 1.0)
