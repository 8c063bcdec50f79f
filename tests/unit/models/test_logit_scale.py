"""Attention-logit scaling (Wang et al. 2024): ``logit_scale`` multiplies every head's
1/sqrt(head_dim), ``head_scales`` gives each head a learnable factor instead; both attention
paths agree with softmax(c q k^T / sqrt(head_dim)) computed here from the model's own weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

import nopelab.limits as limits
from helpers import run_cli
from nopelab.config import ModelConfig
from nopelab.errors import ConfigError
from nopelab.models.transformer import Attention, Transformer

ATOL = 1e-5
HEADS, D, T = 4, 32, 12


def tiny(**overrides: object) -> Transformer:
    torch.manual_seed(0)
    values = dict(vocab_size=40, d_model=D, n_layers=2, n_heads=HEADS, init_std=0.3)
    return Transformer(ModelConfig(**{**values, **overrides})).eval()


def tokens() -> Tensor:
    return torch.randint(0, 40, (2, T), generator=torch.Generator().manual_seed(1))


def explicit(model: Transformer) -> None:
    """Make every layer take the explicit attention path (it runs when probabilities are hooked)."""
    for block in model.blocks:
        block.attn.hook_probs.register_forward_hook(lambda *_: None)


def brute_force(attn: Attention, x: Tensor, factors: Tensor) -> Tensor:
    """The attention layer's output from its weights: softmax(f_h q k^T / sqrt(d_head) + bias,
    causal) v per head h, concatenated and projected."""
    B, _, C = x.shape
    d_head = C // HEADS
    q, k, v = (
        t.view(B, T, HEADS, d_head).transpose(1, 2).double()
        for t in (x @ attn.qkv.weight.T).split(C, dim=2)
    )
    q, k = attn.pe.rotate(q, k)
    logits = factors.double()[:, None, None] * (q @ k.transpose(-2, -1)) / math.sqrt(d_head)
    bias = attn.pe.bias(T, True, x.device)
    if bias is not None:
        logits = logits + bias.double()
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    probs = logits.masked_fill(future, float("-inf")).softmax(dim=-1)
    heads = (probs @ v).transpose(1, 2).reshape(B, T, C)
    return heads.float() @ attn.proj.weight.T


def layer_input(model: Transformer) -> Tensor:
    return model.blocks[0].norm_1(model.embed(tokens()))


@torch.no_grad()
def test_the_default_scale_changes_nothing() -> None:
    default, explicit_one = tiny(), tiny(logit_scale=1.0)
    assert torch.equal(default(tokens()), explicit_one(tokens()))
    attn, x = default.blocks[0].attn, layer_input(default)
    torch.testing.assert_close(attn(x), brute_force(attn, x, torch.ones(HEADS)), atol=ATOL, rtol=0)


@pytest.mark.parametrize("pos_encoding", ["none", "rope", "alibi", "t5"])
@pytest.mark.parametrize("path", ["fused", "explicit"])
@torch.no_grad()
def test_a_uniform_scale_multiplies_every_head_logits(pos_encoding: str, path: str) -> None:
    model = tiny(logit_scale=1.7, pos_encoding=pos_encoding)
    if path == "explicit":
        explicit(model)
    attn, x = model.blocks[0].attn, layer_input(model)
    expected = brute_force(attn, x, torch.full((HEADS,), 1.7))
    torch.testing.assert_close(attn(x), expected, atol=ATOL, rtol=0)
    assert not torch.allclose(attn(x), brute_force(attn, x, torch.ones(HEADS)), atol=1e-3)


@pytest.mark.parametrize("scale", [1.0, 1.5])
@torch.no_grad()
def test_head_scales_start_as_the_uniform_scale(scale: float) -> None:
    per_head = tiny(head_scales=True, logit_scale=scale)
    for block in per_head.blocks:
        assert block.attn.head_scale.shape == (HEADS,) and block.attn.head_scale.requires_grad
        assert (block.attn.head_scale == scale).all()
    torch.testing.assert_close(
        per_head(tokens()), tiny(logit_scale=scale)(tokens()), atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("pos_encoding", ["none", "rope", "alibi", "t5"])
@pytest.mark.parametrize("path", ["fused", "explicit"])
@torch.no_grad()
def test_each_head_has_its_own_scale(pos_encoding: str, path: str) -> None:
    model = tiny(head_scales=True, pos_encoding=pos_encoding)
    if path == "explicit":
        explicit(model)
    attn, x = model.blocks[0].attn, layer_input(model)
    factors = torch.tensor([0.5, 1.0, 2.0, 3.0])
    attn.head_scale.copy_(factors)
    torch.testing.assert_close(attn(x), brute_force(attn, x, factors), atol=ATOL, rtol=0)
    torch.testing.assert_close(attn.logit_scales(), factors)


def test_head_scales_are_trained_and_counted() -> None:
    cfg = ModelConfig(vocab_size=40, d_model=D, n_layers=2, n_heads=HEADS, head_scales=True)
    model = Transformer(cfg)
    assert limits.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    assert (
        limits.parameter_count(cfg)
        == limits.parameter_count(ModelConfig(vocab_size=40, d_model=D, n_layers=2, n_heads=HEADS))
        + 2 * HEADS
    )
    model(tokens()).sum().backward()
    assert all(block.attn.head_scale.grad.abs().sum() > 0 for block in model.blocks)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the factors follow q's precision
        assert model(tokens()).dtype == torch.bfloat16


def test_the_random_init_theory_is_left_out_for_scaled_logits() -> None:
    from nopelab.config import AnalysisConfig, RunConfig
    from nopelab.measure.run_files import first_layer_theory

    analysis = AnalysisConfig(seq_len=8)
    assert first_layer_theory(RunConfig(ModelConfig(), analysis)) is not None
    for scaled in (ModelConfig(logit_scale=1.5), ModelConfig(head_scales=True)):
        assert first_layer_theory(RunConfig(scaled, analysis)) is None


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_a_scale_must_be_finite_and_positive(value: float) -> None:
    with pytest.raises(ConfigError, match="logit_scale"):
        ModelConfig(logit_scale=value)


def test_the_flag_names_itself(capsys: pytest.CaptureFixture, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(["analyze", "--logit-scale", "0"], monkeypatch) == 2
    assert capsys.readouterr().err == "nopelab: error: --logit-scale: must be > 0, got 0.0\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "overrides",
    [dict(pos_encoding="none", bias=True), dict(pos_encoding="rope", norm="rmsnorm", mlp="swiglu")],
)
@torch.no_grad()
def test_an_export_folds_the_scales_into_the_queries(overrides: dict, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from nopelab.hf.export import export

    model = tiny(head_scales=True, max_seq_len=T, **overrides)
    for i, block in enumerate(model.blocks):
        block.attn.head_scale.copy_(torch.tensor([1.0, 1.5, 2.0, 3.0]) + i)
    export(model, tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    torch.testing.assert_close(
        loaded(input_ids=tokens()).logits, model(tokens()), atol=ATOL, rtol=0
    )
