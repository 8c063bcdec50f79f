"""Behaviour of the transformer: symmetries, causality, positional encodings, init schemes.

Most tests run in float64 so that exact identities can be checked with tight tolerances. Two
parts of the model compute in float32 whatever the model dtype: the RoPE angles (``RotaryPE``)
and the sinusoidal table. Tolerances involving them are stated where they are used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from nopelab.config import POS_ENCODINGS, ModelConfig
from nopelab.measure.sites import sites_of
from nopelab.models.t5_bias import T5RelativeBias
from nopelab.models.transformer import (
    ALiBiPE,
    Attention,
    NoAttentionPE,
    RotaryPE,
    Transformer,
    alibi_slopes,
    sinusoidal_table,
)

TIGHT = 1e-10  # float64 identities (rounding is ~1e-16 per op; this leaves ample room)
CHANGED = 1e-3  # "differs": a real change is orders of magnitude above float64 noise


def make_model(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides) -> Transformer:
    """A small model; init_std 0.2 makes attention far from uniform so effects are visible."""
    values = dict(vocab_size=32, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, init_std=0.2)
    values.update(overrides)
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**values)).to(dtype).eval()


def tokens(B: int, T: int, seed: int = 1, vocab: int = 32) -> Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


@contextmanager
def capture(modules: dict[str, nn.Module]) -> Iterator[dict[str, Tensor]]:
    """Record the output of each named module during forward passes inside the block."""
    out: dict[str, Tensor] = {}

    def hook(name: str) -> Callable:
        def fn(_module: nn.Module, _inputs: tuple, output: Tensor) -> None:
            out[name] = output.detach().clone()

        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in modules.items()]
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def run_with_resid(model: Transformer, idx: Tensor) -> dict[str, Tensor]:
    """Logits plus every block's resid_post."""
    sites = {f"resid_post.{i}": b.hook_resid_post for i, b in enumerate(model.blocks)}
    with torch.no_grad(), capture(sites) as acts:
        logits = model(idx)
    return {"logits": logits, **acts}


def scores_of(model: Transformer, idx: Tensor) -> list[Tensor]:
    """Every layer's (B, H, T, T) hook_scores (forces the explicit attention path)."""
    sites = {str(i): b.attn.hook_scores for i, b in enumerate(model.blocks)}
    with torch.no_grad(), capture(sites) as acts:
        model(idx)
    return [acts[str(i)] for i in range(len(model.blocks))]


def max_diff(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


# ------------------------------------------------------------------- permutation symmetry


def test_bidirectional_nope_is_permutation_equivariant() -> None:
    model = make_model(bidirectional=True, pos_encoding="none", n_layers=3)
    idx = tokens(2, 12)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(5))
    base, permuted = run_with_resid(model, idx), run_with_resid(model, idx[:, perm])
    assert set(base) == {"logits", "resid_post.0", "resid_post.1", "resid_post.2"}
    for name in base:
        assert max_diff(permuted[name], base[name][:, perm]) < TIGHT, name
    # Same with input vectors instead of token ids.
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        y, y_perm = model(inputs_embeds=x), model(inputs_embeds=x[:, perm])
    assert max_diff(y_perm, y[:, perm]) < TIGHT


def test_causal_nope_is_not_permutation_equivariant() -> None:
    model = make_model(pos_encoding="none")
    idx = tokens(2, 12)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(5))
    base, permuted = run_with_resid(model, idx), run_with_resid(model, idx[:, perm])
    for name in base:
        assert max_diff(permuted[name], base[name][:, perm]) > CHANGED, name


def test_one_layer_causal_nope_last_token_ignores_order_of_earlier_tokens() -> None:
    """Layer 1 of causal NoPE sees its prefix as a set: with one layer, the last position's
    output is invariant to permuting tokens 0..T-2; with two layers it is not."""
    idx = tokens(2, 10)
    perm = torch.cat(
        [torch.randperm(9, generator=torch.Generator().manual_seed(3)), torch.tensor([9])]
    )
    for n_layers, invariant in ((1, True), (2, False)):
        model = make_model(pos_encoding="none", n_layers=n_layers)
        with torch.no_grad():
            diff = max_diff(model(idx)[:, -1], model(idx[:, perm])[:, -1])
        assert (diff < TIGHT) if invariant else (diff > CHANGED), (n_layers, diff)


# ---------------------------------------------------------------------------- causality


@pytest.mark.parametrize("pe", POS_ENCODINGS)
@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
def test_causal_output_ignores_future_tokens(pe: str, explicit: bool) -> None:
    model = make_model(pos_encoding=pe)
    idx = tokens(2, 16)
    t = 7
    later = idx.clone()
    later[:, t + 1 :] = tokens(2, 16 - t - 1, seed=9)
    assert (later[:, t + 1 :] != idx[:, t + 1 :]).any()
    if explicit:
        model.blocks[0].attn.hook_scores.register_forward_hook(lambda *_: None)
    a, b = run_with_resid(model, idx), run_with_resid(model, later)
    for name in a:
        assert max_diff(a[name][:, : t + 1], b[name][:, : t + 1]) < TIGHT, name
        assert max_diff(a[name][:, t + 1 :], b[name][:, t + 1 :]) > CHANGED, name


@pytest.mark.parametrize("pe", ["none", "rope", "alibi", "t5"])
def test_bidirectional_output_sees_future_tokens(pe: str) -> None:
    """The causality test above can fail: a bidirectional model does look ahead."""
    model = make_model(pos_encoding=pe, bidirectional=True)
    idx = tokens(2, 16)
    later = idx.clone()
    later[:, -1] = (idx[:, -1] + 1) % 32
    with torch.no_grad():
        assert max_diff(model(idx)[:, 0], model(later)[:, 0]) > CHANGED


# --------------------------------------------------------------------------------- RoPE


def reference_rope(x: Tensor, theta: float) -> Tensor:
    """Independent RoPE on (..., T, hd) in the half-split layout, via complex numbers in float64:
    the pair (x_i, x_{i+hd/2}) is rotated by angle m * theta^(-2i/hd) at position m."""
    hd = x.shape[-1]
    half = hd // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / hd)
    angle = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * freq  # (T, hd/2)
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1)


def test_rotary_matches_reference_and_preserves_norms() -> None:
    """Angles are computed in float32: at positions < 64 an angle is off by at most
    64 * 2^-24 ≈ 4e-6 rad, so outputs agree with the float64 reference within 1e-5 * |x|."""
    hd, T = 16, 64
    pe = RotaryPE(hd, 10000.0)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, T, hd, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, T, hd, generator=gen, dtype=torch.float64)
    rq, rk = pe.rotate(q, k)
    scale = q.norm(dim=-1, keepdim=True)
    assert ((rq - reference_rope(q, 10000.0)).abs() / scale).max() < 1e-5
    assert ((rk - reference_rope(k, 10000.0)).abs() / k.norm(dim=-1, keepdim=True)).max() < 1e-5
    # Norm preserved: cos^2 + sin^2 = 1 within float32 rounding (~1e-7 relative).
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), rtol=1e-6, atol=0)
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1), rtol=1e-6, atol=0)
    # Position 0 is not rotated; later positions are.
    assert torch.equal(rq[..., 0, :], q[..., 0, :])
    assert max_diff(rq[..., 1:, :], q[..., 1:, :]) > 0.1


def test_rotary_dot_product_depends_only_on_offset() -> None:
    """Same q at every position m and same k at every n: q_m . k_n is a function of m - n
    (a Toeplitz matrix). Tolerance 1e-5 * |q||k| (float32 angles, see above)."""
    hd, T = 16, 48
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(hd, generator=gen, dtype=torch.float64).expand(1, 1, T, hd)
    k = torch.randn(hd, generator=gen, dtype=torch.float64).expand(1, 1, T, hd)
    rq, rk = RotaryPE(hd, 10000.0).rotate(q, k)
    dots = (rq @ rk.transpose(-2, -1))[0, 0]  # (T, T)
    tol = 1e-5 * q[0, 0, 0].norm().item() * k[0, 0, 0].norm().item()
    assert max_diff(dots[1:, 1:], dots[:-1, :-1]) < tol  # constant along every diagonal
    offsets = torch.stack([dots.diagonal(-d)[0] for d in range(T)])
    assert offsets.max() - offsets.min() > 0.5  # ... yet it does vary with the offset
    expected = reference_rope(q, 10000.0)[0, 0, 5] @ reference_rope(k, 10000.0)[0, 0, 2]
    assert abs(dots[5, 2].item() - expected.item()) < tol


@pytest.mark.parametrize(
    ("pe", "shift_invariant"),
    [("none", True), ("rope", True), ("alibi", True), ("learned", False), ("sinusoidal", False)],
)
def test_first_layer_scores_under_a_prefix_shift(pe: str, shift_invariant: bool) -> None:
    """In layer 1, q_i and k_j depend only on the tokens at i and j, so with relative (or no)
    position the score of (i, j) is unchanged when P tokens are prepended; absolute
    encodings change it. Tolerance 1e-6 * max|score| covers rope's float32 angles."""
    model = make_model(pos_encoding=pe)
    idx = tokens(2, 20)
    prefix = tokens(2, 9, seed=4)
    s0 = scores_of(model, idx)[0]
    s1 = scores_of(model, torch.cat([prefix, idx], dim=1))[0][..., 9:, 9:]
    diff = max_diff(s0, s1)
    if shift_invariant:
        assert diff < 1e-6 * s0.abs().max().item(), diff
    else:
        assert diff > CHANGED, diff


def test_rope_first_layer_scores_are_toeplitz_for_repeated_content() -> None:
    """Tokens a, b alternating: score(i, j) depends on (token_i, token_j, i - j) only, so it is
    constant along each diagonal within each parity class; rope makes it vary across
    diagonals (NoPE would not)."""
    idx = torch.tensor([[3, 17] * 12])
    s = scores_of(make_model(pos_encoding="rope"), idx)[0][0]  # (H, T, T)
    tol = 1e-6 * s.abs().max().item()
    assert max_diff(s[:, 2:, 2:], s[:, :-2, :-2]) < tol
    diag = torch.stack([s[:, d, 0] for d in range(0, 24, 2)], dim=-1)  # token a vs a, offsets
    assert (diag.max(-1).values - diag.min(-1).values).min() > CHANGED
    nope = scores_of(make_model(pos_encoding="none"), idx)[0][0]
    assert max_diff(nope[:, 2:, 2:], nope[:, :-2, :-2]) < TIGHT
    assert max_diff(nope[:, ::2, ::2], nope[:, :1, :1].expand(-1, 12, 12)) < TIGHT


# -------------------------------------------------------------------------------- ALiBi


def press_slopes(n: int) -> list[float]:
    """The slope rule from Press et al.'s reference code, written independently."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_for_eight_heads_are_powers_of_one_half() -> None:
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 12, 16, 20, 24, 32])
def test_alibi_slopes_follow_press_et_al(n: int) -> None:
    slopes = alibi_slopes(n)
    assert slopes.shape == (n,)
    torch.testing.assert_close(slopes, torch.tensor(press_slopes(n)), rtol=1e-6, atol=0)


def test_alibi_slopes_twelve_heads_values() -> None:
    """12 heads: the 8 slopes 2^-1..2^-8, then the odd-indexed powers of 2^-0.5 (16-head rule)."""
    expected = [2.0**-i for i in range(1, 9)] + [2.0 ** -(k + 0.5) for k in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected), rtol=1e-6, atol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_alibi_bias_is_minus_slope_times_distance(bidirectional: bool) -> None:
    """With zero q/k weights the scores are the bias alone: -slope_h * |i - j|. The causal
    softmax of that bias must then give p_ij proportional to exp(-slope_h (i - j)) on j <= i."""
    model = make_model(pos_encoding="alibi", bidirectional=bidirectional, n_layers=1)
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[:64].zero_()  # q and k rows of the fused projection
    T = 12
    attn = model.blocks[0].attn
    with torch.no_grad(), capture({"s": attn.hook_scores, "p": attn.hook_probs}) as acts:
        model(tokens(1, T))
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], dtype=torch.float64)  # 4 heads
    i = torch.arange(T, dtype=torch.float64)
    dist = i[:, None] - i[None, :]
    expected = -slopes[:, None, None] * dist.abs()
    assert max_diff(acts["s"][0], expected) < TIGHT
    weights = torch.exp(expected)
    if not bidirectional:
        weights = weights * (dist >= 0)
    assert max_diff(acts["p"][0], weights / weights.sum(-1, keepdim=True)) < TIGHT


def test_alibi_scores_minus_content_term_equal_bias() -> None:
    """With ordinary weights: hook_scores - q k^T / sqrt(d_head), q and k recomputed from the
    model's own layer-1 norm and qkv weights, is the ALiBi bias on the causal part."""
    model = make_model(pos_encoding="alibi", n_layers=1)
    idx = tokens(2, 10)
    scores = scores_of(model, idx)[0]
    block = model.blocks[0]
    with torch.no_grad():
        h = block.norm_1(model.embed(idx))
        w_q, w_k = block.attn.qkv.weight[:32], block.attn.qkv.weight[32:64]
        q = (h @ w_q.T).view(2, 10, 4, 8).transpose(1, 2)
        k = (h @ w_k.T).view(2, 10, 4, 8).transpose(1, 2)
    bias = scores - q @ k.transpose(-2, -1) / math.sqrt(8)
    i = torch.arange(10, dtype=torch.float64)
    expected = -torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])[:, None, None].double() * (
        i[:, None] - i[None, :]
    )
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    assert max_diff(bias[..., causal], expected[:, causal].expand(2, -1, -1)) < TIGHT
    assert q.abs().max() > 0.1  # the content term is not trivially zero


# -------------------------------------------------------- position-free states, NoPE layers


@pytest.mark.parametrize(
    ("pe", "bidirectional"),
    [(pe, False) for pe in POS_ENCODINGS] + [(pe, True) for pe in ("none", "rope", "alibi", "t5")],
)
def test_repeated_token_states_are_position_free_iff_no_input_encoding(
    pe: str, bidirectional: bool
) -> None:
    """One token repeated: the inputs are identical at every position, so attention averages
    identical value vectors whatever its weights (NoPE, rope, alibi) and every state stays
    identical across positions. Learned and sinusoidal encodings make the inputs differ."""
    model = make_model(pos_encoding=pe, bidirectional=bidirectional, n_layers=3)
    acts = run_with_resid(model, torch.full((1, 16), 5))
    for name, a in acts.items():
        spread = max_diff(a, a[:, :1].expand_as(a))
        if pe in ("learned", "sinusoidal"):
            assert spread > CHANGED, name
        else:
            assert spread < TIGHT, name


@pytest.mark.parametrize("pe", ["rope", "alibi", "t5"])
@pytest.mark.parametrize("nope_layers", [(1,), (2,)])
def test_nope_layers_have_position_free_scores(pe: str, nope_layers: tuple[int, ...]) -> None:
    """Repeated-token input: every layer's input is identical across positions (see above),
    so a layer without attention PE has one constant score matrix per head, while a rope or
    alibi layer's scores vary with i - j."""
    model = make_model(pos_encoding=pe, nope_layers=nope_layers, n_layers=2)
    assert model.cfg.attention_pe_layers() == [1 not in nope_layers, 2 not in nope_layers]
    scores = scores_of(model, torch.full((2, 16), 7))
    for layer, s in enumerate(scores, start=1):
        spread = max_diff(s, s[..., :1, :1].expand_as(s))
        if layer in nope_layers:
            assert type(model.blocks[layer - 1].attn.pe) is NoAttentionPE
            assert spread < TIGHT, layer
        else:
            assert isinstance(model.blocks[layer - 1].attn.pe, (RotaryPE, ALiBiPE, T5RelativeBias))
            assert spread > CHANGED, layer


# ------------------------------------------------------------------- input-level encodings


def test_sinusoidal_table_matches_vaswani() -> None:
    T, d = 50, 12
    table = sinusoidal_table(T, d)
    for pos in range(T):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("pe", ["learned", "sinusoidal", "none"])
def test_input_encoding_is_added_to_the_embedding(pe: str) -> None:
    model = make_model(pos_encoding=pe)
    idx = tokens(2, 10)
    with torch.no_grad(), capture({"e": model.hook_embed}) as acts:
        model(idx)
        tok = model.embed(idx)
    if pe == "learned":
        expected = tok + model.pos.table.weight[:10]
    elif pe == "sinusoidal":  # Vaswani et al. scale token embeddings by sqrt(d_model) = sqrt(32)
        expected = tok * math.sqrt(32) + sinusoidal_table(10, 32).double()
    else:
        expected = tok
    assert max_diff(acts["e"], expected) < TIGHT


def test_sinusoidal_leaves_given_input_vectors_unscaled() -> None:
    model = make_model(pos_encoding="sinusoidal")
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    with torch.no_grad(), capture({"e": model.hook_embed}) as acts:
        model(inputs_embeds=x)
    assert max_diff(acts["e"], x + sinusoidal_table(10, 32).double()) < TIGHT


def test_learned_pe_rejects_sequences_longer_than_the_table() -> None:
    model = make_model(pos_encoding="learned", max_seq_len=16)
    with torch.no_grad():
        assert model(tokens(1, 16)).shape == (1, 16, 32)
        with pytest.raises(ValueError, match="16"):
            model(tokens(1, 17))


@pytest.mark.parametrize("pe", ["none", "sinusoidal", "rope", "alibi"])
def test_other_encodings_run_beyond_max_seq_len(pe: str) -> None:
    model = make_model(pos_encoding=pe, max_seq_len=8)
    with torch.no_grad():
        assert torch.isfinite(model(tokens(1, 20))).all()


def test_forward_needs_exactly_one_input() -> None:
    model = make_model()
    with pytest.raises(ValueError):
        model()
    with pytest.raises(ValueError):
        model(tokens(1, 4), inputs_embeds=torch.zeros(1, 4, 32, dtype=torch.float64))


# ------------------------------------------------------------------- attention paths


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("pe", ["none", "rope", "alibi", "t5"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, TIGHT), (torch.float32, 1e-5)])
def test_explicit_attention_equals_fused(
    pe: str, bidirectional: bool, dtype: torch.dtype, tol: float
) -> None:
    """Hooking the scores switches to the explicit path; outputs must not change. Tolerance:
    1e-10 in float64, 1e-5 in float32 (logits are O(1))."""
    model = make_model(pos_encoding=pe, bidirectional=bidirectional, dtype=dtype, n_layers=3)
    idx = tokens(2, 24)
    with torch.no_grad():
        fused = model(idx)
    calls = []
    for block in model.blocks:
        block.attn.hook_probs.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        explicit = model(idx)
    assert len(calls) == 3  # the explicit path really ran, once per layer
    assert fused.abs().max() > 0.1
    assert max_diff(fused, explicit) < tol


@pytest.mark.parametrize("pe", ["alibi", "t5"])
def test_a_position_bias_keeps_the_fused_kernel(pe: str) -> None:
    """With only the fused (flash) kernel allowed, a biased model still runs: its mask reaches
    ``scaled_dot_product_attention`` in a shape that kernel takes (4-D), not one that falls back
    to the math kernel. T5's learned bias is checked without gradients (the fused kernel has no
    gradient for a mask); ALiBi's fixed one with them, as in training."""
    model = make_model(pos_encoding=pe, dtype=torch.float32).train()
    idx = tokens(2, 24)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.set_grad_enabled(pe == "alibi"):
        out = model(idx)
    with sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
        reference = model(idx)
    assert max_diff(out.detach(), reference) < 1e-5


@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
def test_attn_heads_is_the_input_of_the_output_projection(
    explicit: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``attn_heads`` is exactly what ``proj`` reads, and ``proj(attn_heads) == attn_out``.
    Hooking it keeps the fused path (the explicit one runs only when probabilities are hooked)."""
    model = make_model(dropout=0.0)
    if explicit:
        for block in model.blocks:
            block.attn.hook_probs.register_forward_hook(lambda *_: None)
    else:
        monkeypatch.setattr(Attention, "_explicit", lambda *_: pytest.fail("explicit path ran"))
    read, seen = {}, {}
    for layer, block in enumerate(model.blocks, start=1):
        block.attn.proj.register_forward_pre_hook(
            lambda _m, args, layer=layer: read.__setitem__(layer, args[0])
        )
    keys = [(site, layer) for site in ("attn_heads", "attn_out") for layer in (1, 2)]
    sites_of(model).observe(keys, seen.__setitem__)
    with torch.no_grad():
        model(tokens(2, 16))
        for layer, block in enumerate(model.blocks, start=1):
            heads = seen[("attn_heads", layer)]
            assert heads.shape == (2, 16, 32)
            assert torch.equal(heads, read[layer])
            assert max_diff(block.attn.proj(heads), seen[("attn_out", layer)]) < TIGHT


# ----------------------------------------------------------- norms and tied embeddings


def test_tied_embeddings_share_storage() -> None:
    tied = make_model(tie_embeddings=True)
    assert tied.lm_head.weight is tied.embed.weight
    assert tied.lm_head.weight.data_ptr() == tied.embed.weight.data_ptr()
    with torch.no_grad():
        tied.embed.weight[3, 4] = 123.0
    assert tied.lm_head.weight[3, 4].item() == 123.0
    untied = make_model(tie_embeddings=False)
    assert untied.lm_head.weight.data_ptr() != untied.embed.weight.data_ptr()
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 32 * 32  # one vocab x d_model matrix fewer


def row_stats(model: Transformer, idx: Tensor) -> list[tuple[Tensor, Tensor]]:
    acts = run_with_resid(model, idx)
    return [
        (acts[f"resid_post.{i}"].mean(-1), acts[f"resid_post.{i}"].pow(2).mean(-1))
        for i in range(len(model.blocks))
    ]


def test_post_layernorm_normalises_every_block_output() -> None:
    """Post-LN (gain 1, no bias): each resid_post row has mean 0 and variance s/(s+eps) ≈ 1
    (tolerance 1e-3 covers eps=1e-5 over variances > 0.01); pre-LN rows are not normalised."""
    idx = tokens(2, 12)
    for mean, sq in row_stats(make_model(norm_position="post"), idx):
        assert mean.abs().max() < TIGHT
        assert (sq - 1).abs().max() < 1e-3
    pre = row_stats(make_model(norm_position="pre"), idx)
    assert max((sq - 1).abs().max().item() for _, sq in pre) > 0.1


def test_post_rmsnorm_normalises_mean_square_not_mean() -> None:
    idx = tokens(2, 12)
    stats = row_stats(make_model(norm="rmsnorm", norm_position="post"), idx)
    for _, sq in stats:
        assert (sq - 1).abs().max() < 1e-3
    assert max(mean.abs().max().item() for mean, _ in stats) > CHANGED  # mean not removed


@pytest.mark.parametrize(
    "variant", [{"norm": "rmsnorm"}, {"norm_position": "post"}], ids=["rmsnorm", "post"]
)
def test_norm_variants_run_and_differ_from_pre_layernorm(variant: dict) -> None:
    """Same seed gives the same weights (checked), so any output difference is the norm."""
    base, other = make_model(), make_model(**variant)
    base_sd, other_sd = base.state_dict(), other.state_dict()
    shared = set(base_sd) & set(other_sd)
    assert len(shared) >= len(other_sd) - 1
    for key in shared:
        assert torch.equal(base_sd[key], other_sd[key]), key
    idx = tokens(2, 12)
    with torch.no_grad():
        a, b = base(idx), other(idx)
    assert torch.isfinite(b).all()
    assert max_diff(a, b) > CHANGED


# ------------------------------------------------------------------------ initialisation


def init_model(init: str, std: float = 0.05, **overrides) -> Transformer:
    values = dict(
        vocab_size=96,
        d_model=64,
        n_heads=4,
        n_layers=2,
        max_seq_len=64,
        pos_encoding="learned",
        tie_embeddings=False,
        bias=True,
        init=init,
        init_std=std,
    )
    values.update(overrides)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**values))


def matrices(model: Transformer) -> dict[str, Tensor]:
    return {n: p.detach().double() for n, p in model.named_parameters() if p.dim() >= 2}


def assert_std(name: str, w: Tensor, expected: float) -> None:
    """Sample std of n values has standard error ≈ expected / sqrt(2n); allow 5 of them."""
    n = w.numel()
    tol = 5 * expected / math.sqrt(2 * n)
    assert abs(w.std().item() - expected) < tol, (name, w.std().item(), expected)
    assert abs(w.mean().item()) < 5 * expected / math.sqrt(n), name


EXPECTED_MATRICES = {
    "embed.weight",
    "pos.table.weight",
    "lm_head.weight",
    *(
        f"blocks.{i}.{m}.weight"
        for i in range(2)
        for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    ),
}


def test_normal_init_std() -> None:
    mats = matrices(init_model("normal", std=0.05))
    assert set(mats) == EXPECTED_MATRICES
    for name, w in mats.items():
        assert_std(name, w, 0.05)


def test_gpt2_init_scales_residual_projections() -> None:
    for name, w in matrices(init_model("gpt2", std=0.05)).items():
        residual = name.endswith(("attn.proj.weight", "mlp.proj.weight"))
        assert_std(name, w, 0.05 / math.sqrt(2 * 2) if residual else 0.05)


def test_uniform_init_bounds() -> None:
    a = 0.3
    for name, w in matrices(init_model("uniform", std=a)).items():
        assert w.abs().max() <= a, name
        assert w.abs().max() > 0.99 * a, name  # P(max < 0.99a) = 0.99^n, n >= 4096: ~1e-18
        assert_std(name, w, a / math.sqrt(3))


def expected_init_std(init: str, std: float, w: Tensor) -> float:
    """Std of a freshly drawn weight of shape (fan_out, fan_in) (an embedding's fan_in is d)."""
    fan_out, fan_in = w.shape
    return {
        "normal": std,
        "gpt2": std,  # before the residual scaling
        "uniform": std / math.sqrt(3),
        "xavier_normal": math.sqrt(2 / (fan_in + fan_out)),
        "xavier_uniform": math.sqrt(2 / (fan_in + fan_out)),
        "kaiming_uniform": 1 / math.sqrt(fan_in),  # a=1: gain sqrt(2 / (1 + a^2)) = 1
    }[init]


@pytest.mark.parametrize("init", ["xavier_normal", "xavier_uniform", "kaiming_uniform"])
def test_fan_based_inits(init: str) -> None:
    """Weights are (fan_out, fan_in). Xavier: std sqrt(2/(fan_in+fan_out)), the uniform one on
    ±sqrt(6/(fan_in+fan_out)). Kaiming uniform as in Zuo et al.'s code, kaiming_uniform_(a=1):
    bound sqrt(3/fan_in), std 1/sqrt(fan_in) — not PyTorch's default a=sqrt(5) (bound
    sqrt(1/fan_in), which the max test below rejects) nor a=0 (bound sqrt(6/fan_in), which the
    bound test rejects). Every matrix has n >= 4096 entries, so P(max |w| < 0.95 bound) =
    0.95^n < 1e-90; the bound gets float32 rounding slack."""
    mats = matrices(init_model(init, std=123.0))  # init_std is ignored
    assert set(mats) == EXPECTED_MATRICES
    for name, w in mats.items():
        fan_out, fan_in = w.shape
        std = expected_init_std(init, 123.0, w)
        assert_std(name, w, std)
        if init == "xavier_normal":
            continue
        bound = math.sqrt(3) * std
        assert bound == pytest.approx(
            math.sqrt(3 / fan_in)
            if init == "kaiming_uniform"
            else math.sqrt(6 / (fan_in + fan_out))
        )
        assert w.numel() >= 4096
        assert w.abs().max() <= bound * (1 + 1e-6), name
        assert w.abs().max() > 0.95 * bound, name


@pytest.mark.parametrize(
    "init", ["normal", "gpt2", "uniform", "xavier_normal", "xavier_uniform", "kaiming_uniform"]
)
@pytest.mark.parametrize("tie", [False, True])
def test_schemes_redraw_every_matrix_and_only_gpt2_scales_projections(init: str, tie: bool) -> None:
    """Zuo et al.'s init_scheme override re-draws every non-norm weight — token embedding,
    learned position table, output head, residual projections — by one rule; only ``gpt2``
    (their default) scales attn.proj and mlp.proj by 1/sqrt(2L). With L = 8 that factor is 1/4,
    against a tolerance of 5 standard errors (< 6 % at n >= 4096 entries); PyTorch's own
    defaults (embeddings N(0, 1), linear std 1/sqrt(3 fan_in)) are far off every expected std."""
    L = 8
    model = init_model(init, std=0.05, n_layers=L, tie_embeddings=tie)
    mats = matrices(model)
    layers = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    assert set(mats) == {
        "embed.weight",
        "pos.table.weight",
        *(() if tie else ("lm_head.weight",)),  # a tied head is embed.weight itself
        *(f"blocks.{i}.{m}.weight" for i in range(L) for m in layers),
    }
    if tie:
        assert model.lm_head.weight is model.embed.weight
    for name, w in mats.items():
        residual = name.endswith(("attn.proj.weight", "mlp.proj.weight"))
        scale = 1 / math.sqrt(2 * L) if init == "gpt2" and residual else 1.0
        assert_std(name, w, expected_init_std(init, 0.05, w) * scale)
    head = model.lm_head.weight.detach().double()
    assert_std("lm_head.weight", head, expected_init_std(init, 0.05, head))


@pytest.mark.parametrize(
    "init", ["normal", "gpt2", "uniform", "xavier_normal", "xavier_uniform", "kaiming_uniform"]
)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_biases_zero_and_norm_gains_one(init: str, norm: str) -> None:
    model = init_model(init, norm=norm)
    biases = {n: p for n, p in model.named_parameters() if n.endswith(".bias")}
    assert any(".attn.qkv." in n for n in biases) and any(".mlp.fc." in n for n in biases)
    for name, p in biases.items():
        assert torch.equal(p, torch.zeros_like(p)), name
    gains = [m.weight for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
    assert len(gains) == 2 * 2 + 1
    for g in gains:
        assert torch.equal(g, torch.ones_like(g))


def test_pytorch_init_keeps_torch_defaults() -> None:
    """nn.Linear: weight and bias ~ U(±1/sqrt(fan_in)) (std 1/sqrt(3 fan_in)); nn.Embedding:
    N(0, 1); LayerNorm: weight 1, bias 0. init_std is ignored."""
    model = init_model("pytorch", std=1e-4)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            bound = 1 / math.sqrt(module.in_features)
            assert module.weight.abs().max() <= bound, name
            assert_std(name, module.weight.detach().double(), bound / math.sqrt(3))
            if module.bias is not None:
                assert module.bias.abs().max() <= bound, name
                assert module.bias.abs().max() > 0.5 * bound, name  # not zeroed
        elif isinstance(module, nn.Embedding):
            assert_std(name, module.weight.detach().double(), 1.0)
        elif isinstance(module, nn.LayerNorm):
            assert torch.equal(module.weight, torch.ones_like(module.weight))
            assert torch.equal(module.bias, torch.zeros_like(module.bias))


def test_init_is_deterministic_given_the_seed() -> None:
    a, b = init_model("normal"), init_model("normal")
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), n


# ------------------------------------------------------------------------------ MLP choice


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_runs_with_the_expected_parameter_count(bias: bool) -> None:
    model = make_model(mlp="swiglu", bias=bias)
    d, h, V, L = 32, 4 * 32, 32, 2
    per_block = 4 * d * d + 3 * d * h + 2 * d  # qkv + proj, gate + up + down, two norm gains
    if bias:
        per_block += 3 * d + d + 2 * h + d + 2 * d  # qkv, proj, gate + up, down, norm biases
    expected = V * d + L * per_block + d * (2 if bias else 1)  # tied embedding, final norm
    assert sum(p.numel() for p in model.parameters()) == expected
    gelu = make_model(bias=bias)
    extra = L * (d * h + (h if bias else 0))  # the gate projection
    assert expected - sum(p.numel() for p in gelu.parameters()) == extra
    logits = model(tokens(2, 10))
    assert logits.shape == (2, 10, 32) and torch.isfinite(logits).all()
    assert max_diff(logits, gelu(tokens(2, 10))) > CHANGED


def test_swiglu_down_projection_gets_gpt2_scaling() -> None:
    model = make_model(mlp="swiglu", init="gpt2", init_std=0.02, d_model=64, n_layers=8)
    std = {n: p.std().item() for n, p in model.named_parameters() if n.startswith("blocks.0.mlp")}
    assert std["blocks.0.mlp.proj.weight"] == pytest.approx(0.02 / 4, rel=0.05)
    assert std["blocks.0.mlp.gate.weight"] == pytest.approx(0.02, rel=0.05)


def test_mlp_choice_is_validated(tmp_path, capsys, monkeypatch) -> None:
    import json

    from helpers import run_cli
    from nopelab.config import build
    from nopelab.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        ModelConfig(mlp="typo")
    assert info.value.field == "mlp" and "swiglu" in str(info.value)
    assert build(ModelConfig, {"d_model": 48}, "config.model").mlp == "gelu"  # older configs
    tiny = ["analyze", "--layers", "1", "--heads", "2", "--d-model", "16", "--seq-len", "8",
            "--samples", "2", "--batch-size", "2", "--device", "cpu"]  # fmt: skip
    assert run_cli([*tiny, "--mlp", "typo", "--out", str(tmp_path / "bad")], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mlp" in err, err
    out = tmp_path / "swiglu"
    assert run_cli([*tiny, "--mlp", "swiglu", "--out", str(out)], monkeypatch) == 0
    assert json.loads((out / "config.json").read_text())["model"]["mlp"] == "swiglu"
