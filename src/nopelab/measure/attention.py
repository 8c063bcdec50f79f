"""Attention statistics per head and query position, reduced batch by batch.

:class:`AttentionStats` reads one layer's queries and keys (``Attention.hook_q`` and
``hook_k``, which leave the fused attention path in place) and rebuilds the scaled logits a
chunk of query rows at a time, so that no (B, H, T, T) tensor is kept: per head and query
position, the entropy of the attention distribution and the spread of the logits over the
visible keys. Which keys are visible is the causal triangle (or every key), or a mask the caller
passes (a Hugging Face model's sliding windows: :mod:`nopelab.hf.attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from nopelab.limits import chunk_rows
from nopelab.models.transformer import Attention


@dataclass(frozen=True)
class AttentionResult:
    """Reduced attention statistics of one layer, indexed by 0-based query position."""

    samples: int
    entropy: np.ndarray  # (T,) mean entropy of the attention distribution (nats), over heads
    uniform_entropy: np.ndarray  # (T,) entropy of uniform attention over the visible keys
    logit_variance: np.ndarray  # (T,) mean variance of the scaled logits over the visible keys
    head_entropy: np.ndarray  # (H, T) entropy per head
    head_logit_variance: np.ndarray  # (H, T) logit variance per head


class AttentionStats:
    """Accumulates one layer's attention entropy and logit spread per head and query position."""

    def __init__(
        self, seq_len: int, *, n_heads: int, causal: bool, device: torch.device | str = "cpu"
    ):
        self.causal = causal
        self.samples = 0
        self.entropy_sum = torch.zeros(n_heads, seq_len, dtype=torch.float64, device=device)
        self.logit_var_sum = torch.zeros(n_heads, seq_len, dtype=torch.float64, device=device)
        self.log_visible_sum = torch.zeros(seq_len, dtype=torch.float64, device=device)

    def attach(self, attn: Attention) -> list[RemovableHandle]:
        """Hook ``attn`` so that every forward pass folds its queries and keys in."""
        kept: dict[str, Tensor] = {}

        def keep(module: nn.Module, inputs: tuple, q: Tensor) -> None:
            kept["q"] = q

        def reduce(module: nn.Module, inputs: tuple, k: Tensor) -> None:
            bias = attn.pe.bias(k.shape[-2], attn.causal, k.device)
            self.update(kept.pop("q"), k, attn.divisor, bias)

        return [
            attn.hook_q.register_forward_hook(keep),
            attn.hook_k.register_forward_hook(reduce),
        ]

    @torch.no_grad()
    def update(
        self,
        q: Tensor,
        k: Tensor,
        divisor: float,
        bias: Tensor | None = None,
        visible: Tensor | None = None,
    ) -> None:
        """(B, H, T, head_dim) queries and keys as the attention multiplies them: the logits are
        ``q / divisor @ k^T`` plus the (H, T, T) position ``bias``, if any. ``visible``: a bool
        (B or 1, H or 1, T, T) mask of the keys each query sees (a sliding window), read within
        the causal triangle when causal; without it, the causal triangle or every key."""
        q, k = q.detach().float(), k.detach().float()
        B, H, T, _ = q.shape
        if self.entropy_sum.shape[1] != T:
            raise ValueError(
                f"sequences of {T} positions; these statistics are for {self.entropy_sum.shape[1]}"
            )
        rows = chunk_rows(B, H, T)
        # the widest chunks first (causal): the allocator reuses their memory for the rest
        for start in reversed(range(0, T, rows)):
            stop = min(start + rows, T)
            keys = stop if self.causal else T
            if visible is not None:
                hidden = ~visible[..., start:stop, :keys]
            elif self.causal:
                hidden = torch.ones(stop - start, keys, dtype=torch.bool, device=q.device)
                hidden = hidden.triu(start + 1)
            else:
                hidden = None
            entropy, variance, counts = _row_statistics(
                q[:, :, start:stop] / divisor,
                k[:, :, :keys],
                None if bias is None else bias[:, start:stop, :keys],
                hidden,
            )
            self.entropy_sum[:, start:stop] += entropy.sum(0, dtype=torch.float64)
            self.logit_var_sum[:, start:stop] += variance.sum(0, dtype=torch.float64)
            log_counts = counts.double().log().expand(B, -1, -1).mean(1)  # (B, rows)
            self.log_visible_sum[start:stop] += log_counts.sum(0)
        self.samples += B

    def result(self) -> AttentionResult:
        n = max(self.samples, 1)
        entropy = (self.entropy_sum / n).cpu().numpy()
        variance = (self.logit_var_sum / n).cpu().numpy()
        return AttentionResult(
            samples=self.samples,
            entropy=entropy.mean(0),
            uniform_entropy=(self.log_visible_sum / n).cpu().numpy(),
            logit_variance=variance.mean(0),
            head_entropy=entropy,
            head_logit_variance=variance,
        )


def _row_statistics(
    q: Tensor, k: Tensor, bias: Tensor | None, hidden: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The entropy (nats) and the logit variance over the visible keys, (B, H, rows), and the
    number of visible keys, (B or 1, H or 1, rows), of the scaled queries ``q``
    (B, H, rows, head_dim) against the keys ``k`` (B, H, keys, head_dim). ``hidden``: a bool
    mask, broadcastable to the logits, of the keys a query does not see; None when it sees
    every key. A function, so that its chunk-sized temporaries die with it."""
    logits = q @ k.transpose(-2, -1)
    if bias is not None:
        logits += bias.float()
    if hidden is None:
        counts = torch.full((1, 1, logits.shape[-2]), logits.shape[-1], device=q.device)
        return torch.special.entr(logits.softmax(-1)).sum(-1), logits.var(-1, correction=0), counts
    while hidden.dim() < logits.dim():
        hidden = hidden[None]
    counts = (~hidden).sum(-1)
    mean = logits.masked_fill(hidden, 0.0).sum(-1) / counts
    variance = (logits - mean[..., None]).masked_fill_(hidden, 0.0).square_().sum(-1) / counts
    logits.masked_fill_(hidden, float("-inf"))
    return torch.special.entr(logits.softmax(-1)).sum(-1), variance, counts
