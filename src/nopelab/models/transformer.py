"""A decoder-only transformer with switchable positional encodings, in one file.

Positional encodings come in two kinds, each a small swappable part with a null object:

* added to the input embedding: ``NoPositionalEmbedding`` (NoPE), ``LearnedPositionalEmbedding``,
  ``SinusoidalPositionalEmbedding``;
* applied inside attention: ``NoAttentionPE`` (NoPE), ``RotaryPE`` (RoPE), ``ALiBiPE``, and
  T5's bucketed relative bias (:mod:`nopelab.models.t5_bias`, one module shared by every layer).

  Each encoding's spec in :mod:`nopelab.encodings` names its module, which the model builds
  with the module's ``from_config``.
  ``ModelConfig.nope_layers`` switches the attention-level encoding off in chosen layers,
  the way SmolLM3 and Llama 4 interleave NoPE layers with RoPE layers.

The MLP is GPT-2's (GELU) or Llama's gated SwiGLU (``ModelConfig.mlp``);
:mod:`nopelab.hf.export` turns matching configurations into GPT-2, Llama or SmolLM3 models.

Every block exposes named :class:`HookPoint` sites (``attn_out``, ``resid_mid``, ``mlp_out``,
``resid_post``), and its attention ``attn_heads`` (``hook_heads``: the heads' outputs
concatenated, the input of the output projection); the model exposes ``embed``. Capture code
attaches forward hooks to them.
Attention runs through ``scaled_dot_product_attention`` unless someone hooks the attention
scores or probabilities, which only the explicit path materialises; its queries and keys
(``hook_q``, ``hook_k``) can be hooked on either path. Both scale the logits
q·k by ``logit_scale / sqrt(head_dim)`` (``ModelConfig.logit_scale``, 1 by default), or, with
``ModelConfig.head_scales``, each head's by its own learnable ``head_scale / sqrt(head_dim)``:
Wang et al.'s (2024) cure for the attention of NoPE models spreading out past the training
length. A position bias (ALiBi, T5's) is added after the scaling.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nopelab.config import ModelConfig
from nopelab.encodings import encoding


class HookPoint(nn.Identity):
    """An identity module marking a named site where activations can be observed."""


# ---------------------------------------------------------------- input-level encodings


class NoPositionalEmbedding(nn.Module):
    """NoPE: the input embedding carries no position."""

    token_scale = 1.0  # factor on token embeddings (not on given input vectors) before forward

    def forward(self, x: Tensor) -> Tensor:
        return x


class LearnedPositionalEmbedding(nn.Module):
    """A trained table of absolute position vectors (GPT-2)."""

    token_scale = 1.0

    def __init__(self, max_seq_len: int, d_model: int):
        super().__init__()
        self.table = nn.Embedding(max_seq_len, d_model)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> LearnedPositionalEmbedding:
        return cls(cfg.max_seq_len, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        if self.table.num_embeddings < T:
            raise ValueError(
                f"sequence length {T} exceeds the learned table ({self.table.num_embeddings})"
            )
        return x + self.table.weight[:T]


def sinusoidal_table(length: int, d_model: int) -> Tensor:
    """The fixed encoding of Vaswani et al.: sin on even, cos on odd coordinates."""
    position = torch.arange(length, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table.float()


class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoids added to the input; defined for any length.

    As in Vaswani et al., token embeddings are multiplied by sqrt(d_model) first: without it a
    table of amplitude 1 swamps embeddings initialised at std 0.02, and the model trains poorly
    (byte-level LM, haviv2022 small: perplexity 12.4 instead of 7.3). Input vectors given
    directly (``inputs_embeds``) are not scaled.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model
        self.token_scale = math.sqrt(d_model)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> SinusoidalPositionalEmbedding:
        return cls(cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return x + sinusoidal_table(x.shape[1], self.d_model).to(x.device, x.dtype)


# ------------------------------------------------------------ attention-level encodings


class AttentionPE(nn.Module):
    """A position signal inside attention: it may rotate queries and keys (``rotate``) and add
    a bias to the logits (``bias``); by default it does neither."""

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def bias(self, T: int, causal: bool, device: torch.device) -> Tensor | None:
        return None


class NoAttentionPE(AttentionPE):
    """NoPE inside attention (the null object): queries and keys are left alone, no bias."""


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryPE(AttentionPE):
    """RoPE (Su et al.) in the half-split layout that Llama and GPT-NeoX use."""

    inv_freq: Tensor  # (head_dim / 2,) a buffer

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> RotaryPE:
        return cls(cfg.head_dim, cfg.rope_theta)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        T = q.shape[-2]
        freqs = torch.outer(torch.arange(T, device=q.device, dtype=torch.float32), self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def alibi_slopes(n_heads: int) -> Tensor:
    """Head slopes of Press et al.: a geometric sequence, interleaved for non-powers of two."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


class ALiBiPE(AttentionPE):
    """ALiBi: a per-head linear penalty on query-key distance, added to the logits."""

    slopes: Tensor  # (n_heads,) a buffer

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> ALiBiPE:
        return cls(cfg.n_heads)

    def bias(self, T: int, causal: bool, device: torch.device) -> Tensor:
        pos = torch.arange(T, device=device)
        distance = (
            (pos[:, None] - pos[None, :]).abs().float()
        )  # (T, T); only j <= i is used when causal
        return -self.slopes.to(device)[:, None, None] * distance  # (H, T, T)


def make_input_pe(cfg: ModelConfig) -> nn.Module:
    """The input-level encoding of ``cfg`` (its spec in :mod:`nopelab.encodings`), else NoPE."""
    spec = encoding(cfg.pos_encoding)
    return spec.build(cfg) if spec.level == "input" else NoPositionalEmbedding()


def make_attention_pes(cfg: ModelConfig) -> list[AttentionPE]:
    """Each layer's attention-level encoding: NoPE where ``cfg`` has none or ``nope_layers``
    switches it off; one module for all layers where the encoding is shared (T5's bias)."""
    spec = encoding(cfg.pos_encoding)
    if not spec.in_attention:
        return [NoAttentionPE() for _ in range(cfg.n_layers)]
    shared = spec.build(cfg) if spec.shared else None
    return [
        cast(AttentionPE, shared if shared is not None else spec.build(cfg))
        if uses
        else NoAttentionPE()
        for uses in cfg.attention_pe_layers()
    ]


# ------------------------------------------------------------------------------ blocks


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


class Attention(nn.Module):
    """Multi-head self-attention, causal unless the config says bidirectional."""

    def __init__(self, cfg: ModelConfig, pe: AttentionPE):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.causal = not cfg.bidirectional
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.pe = pe
        self.logit_scale = cfg.logit_scale
        # per-head factors multiply q, so the fused kernel needs only the common 1/sqrt(head_dim)
        self.head_scale = (
            nn.Parameter(torch.full((cfg.n_heads,), cfg.logit_scale)) if cfg.head_scales else None
        )
        factor = 1.0 if cfg.head_scales else cfg.logit_scale
        self.scale = factor / math.sqrt(cfg.head_dim)  # the fused kernel's
        self.divisor = math.sqrt(cfg.head_dim) / factor  # the explicit path's: exact at 1
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        # (B, H, T, head_dim), after the positional rotation and the per-head scale, before the
        # 1/sqrt(head_dim) scaling; hooking them keeps the fused path
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_scores = HookPoint()  # (B, H, T, T) scaled logits incl. position bias, unmasked
        self.hook_probs = HookPoint()  # (B, H, T, T) attention probabilities
        self.hook_heads = HookPoint()  # (B, T, d) the heads' outputs concatenated, before proj

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            for t in self.qkv(x).split(C, dim=2)
        )
        q, k = self.pe.rotate(q, k)
        if self.head_scale is not None:
            q = q * self.head_scale.to(q.dtype)[:, None, None]
        q, k = self.hook_q(q), self.hook_k(k)
        bias = self.pe.bias(T, self.causal, x.device)
        if self.hook_scores._forward_hooks or self.hook_probs._forward_hooks:
            y = self._explicit(q, k, v, bias)
        else:
            y = self._fused(q, k, v, bias)
        y = self.hook_heads(y.transpose(1, 2).reshape(B, T, C))
        return self.resid_dropout(self.proj(y))

    def logit_scales(self) -> Tensor:
        """Each head's factor on the 1/sqrt(head_dim) scale of its logits, (n_heads,)."""
        if self.head_scale is not None:
            return self.head_scale
        return torch.full((self.n_heads,), self.logit_scale)

    def _causal_mask(self, T: int, device: torch.device) -> Tensor:
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        p = self.dropout if self.training else 0.0
        if bias is None:
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=p, is_causal=self.causal, scale=self.scale
            )
        mask = bias.to(q.dtype)
        if self.causal:
            mask = mask.masked_fill(~self._causal_mask(q.shape[-2], q.device), float("-inf"))
        # (1, H, T, T): the CPU's fused kernel takes a 4-D mask only; a 3-D one falls back to
        # the unfused math kernel, twice as slow (benchmarks/bench_encodings.py)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask[None], dropout_p=p, scale=self.scale
        )

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        scores = (q / self.divisor) @ k.transpose(-2, -1)  # scale the smaller tensor
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        scores = self.hook_scores(scores)
        if self.causal:
            scores = scores.masked_fill(~self._causal_mask(q.shape[-2], q.device), float("-inf"))
        probs = self.hook_probs(scores.softmax(dim=-1))
        return F.dropout(probs, self.dropout, self.training) @ v


class MLP(nn.Module):
    """GPT-2's MLP: ``proj(gelu(fc(x)))`` with the exact (erf) GELU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.fc = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class SwiGLU(nn.Module):
    """Llama's gated MLP: ``proj(silu(gate(x)) * up(x))``; ``proj`` is Llama's ``down_proj``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.gate = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.silu(self.gate(x)) * self.up(x)))


def make_mlp(cfg: ModelConfig) -> nn.Module:
    return SwiGLU(cfg) if cfg.mlp == "swiglu" else MLP(cfg)


class Block(nn.Module):
    """One transformer layer, pre-LN (GPT-2) or post-LN (original Transformer)."""

    def __init__(self, cfg: ModelConfig, pe: AttentionPE):
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.norm_1, self.norm_2 = make_norm(cfg), make_norm(cfg)
        self.attn = Attention(cfg, pe)
        self.mlp = make_mlp(cfg)
        self.hook_attn_out = HookPoint()  # attention output after the projection, before the add
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_norm:
            x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.norm_1(x))))
            return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.norm_2(x))))
        x = self.hook_resid_mid(self.norm_1(x + self.hook_attn_out(self.attn(x))))
        return self.hook_resid_post(self.norm_2(x + self.hook_mlp_out(self.mlp(x))))


class Transformer(nn.Module):
    """Token ids or input vectors in, next-token logits out."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = make_input_pe(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg, pe) for pe in make_attention_pes(cfg))
        self.norm_f = make_norm(cfg) if cfg.norm_position == "pre" else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        init_weights(self, cfg)

    def forward(self, idx: Tensor | None = None, *, inputs_embeds: Tensor | None = None) -> Tensor:
        """``idx``: (B, T) token ids, or ``inputs_embeds``: (B, T, d) vectors. Returns (B, T, V)."""
        if (idx is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of idx and inputs_embeds")
        if inputs_embeds is None:
            x = self.embed(idx)
            if self.pos.token_scale != 1.0:
                x = x * self.pos.token_scale
        else:
            x = inputs_embeds
        x = self.hook_embed(self.dropout(self.pos(x)))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


# ------------------------------------------------------------------------ initialisation


def init_weights(model: Transformer, cfg: ModelConfig) -> None:
    """Initialise every weight matrix by ``cfg.init``; zero the biases; norm gains stay at one.

    Every parameter with two or more dimensions is re-drawn: the linear layers (residual output
    projections included), the token embedding (the tied output head is the same tensor; an
    untied one is re-drawn too) and a learned position table. Fans are PyTorch's: a weight of
    shape (rows, cols) has fan_in = cols, fan_out = rows (an embedding's fan_in is d_model).

    * ``normal``: N(0, init_std²), no residual scaling;
    * ``gpt2``: N(0, init_std²) with the residual projections (``attn.proj``, ``mlp.proj``)
      scaled by 1/sqrt(2 * n_layers) — nanoGPT's and hence Zuo et al.'s default;
    * ``uniform``: U(-init_std, init_std);
    * ``xavier_normal`` / ``xavier_uniform``: std sqrt(2 / (fan_in + fan_out)), the uniform
      one on ±sqrt(6 / (fan_in + fan_out));
    * ``kaiming_uniform``: ``kaiming_uniform_(w, a=1)`` as in Zuo et al.'s code, i.e.
      U(±sqrt(3 / fan_in)), std 1/sqrt(fan_in) (PyTorch's default a=sqrt(5) would give
      ±sqrt(1 / fan_in), a=0 ±sqrt(6 / fan_in));
    * ``pytorch``: PyTorch's own per-module defaults, biases included (nothing is touched).

    The schemes other than ``gpt2`` and ``pytorch`` behave like Zuo et al.'s ``init_scheme``
    override: every non-norm weight, embeddings and output projections included, is re-drawn
    by the one rule, with no 1/sqrt(2L) scaling. The fan-based schemes ignore ``init_std``.
    """
    if cfg.init == "pytorch":
        return
    std = cfg.init_std
    for name, param in model.named_parameters():
        if param.dim() < 2:
            if name.endswith(".bias"):
                nn.init.zeros_(param)
            continue
        if cfg.init == "normal":
            nn.init.normal_(param, 0.0, std)
        elif cfg.init == "gpt2":
            scale = (
                1 / math.sqrt(2 * cfg.n_layers)
                if name.endswith(("attn.proj.weight", "mlp.proj.weight"))
                else 1
            )
            nn.init.normal_(param, 0.0, std * scale)
        elif cfg.init == "uniform":
            nn.init.uniform_(param, -std, std)
        elif cfg.init == "xavier_normal":
            nn.init.xavier_normal_(param)
        elif cfg.init == "xavier_uniform":
            nn.init.xavier_uniform_(param)
        elif cfg.init == "kaiming_uniform":
            nn.init.kaiming_uniform_(param, a=1)  # bound sqrt(3 / fan_in), as in Zuo et al.


def build_model(cfg: ModelConfig, seed: int) -> Transformer:
    """A randomly initialised model, in eval mode; the same seed gives the same weights on
    every device."""
    torch.manual_seed(seed)
    return Transformer(cfg).eval()
