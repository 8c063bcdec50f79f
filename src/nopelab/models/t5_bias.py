"""T5's relative position bias (Raffel et al. 2020): a learned scalar per head for each bucket
of query-key distance, added to the attention logits; one table shared by every layer.

Distances below half the buckets get a bucket each; longer ones share logarithmically wider
buckets up to ``max_distance``, beyond which all fall in the last. A causal model sees only
keys at or before the query, so all buckets go to those distances (T5's decoder); a
bidirectional one splits them between keys before and after the query (T5's encoder).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nopelab.config import ModelConfig
from nopelab.encodings import T5_BUCKETS, T5_MAX_DISTANCE
from nopelab.models.transformer import AttentionPE


def relative_position_bucket(
    relative: Tensor, bidirectional: bool, buckets: int, max_distance: int
) -> Tensor:
    """The bucket of each relative position ``key - query`` (an integer tensor)."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        bucket = bucket + (relative > 0).long() * buckets  # keys after the query: upper half
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # the future is masked: its bucket does not matter
    exact = buckets // 2
    # beyond ``exact``, log-spaced up to max_distance; clamp(min=1) keeps log finite where the
    # exact branch is taken anyway
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    wide = exact + (log_ratio * (buckets - exact)).long()
    wide = wide.clamp(max=buckets - 1)
    return bucket + torch.where(distance < exact, distance, wide)


class T5RelativeBias(AttentionPE):
    """A (buckets, n_heads) table of learned biases, looked up by the bucket of ``j - i``; the
    buckets are causal or bidirectional as the attention calling :meth:`bias` is."""

    def __init__(
        self, n_heads: int, buckets: int = T5_BUCKETS, max_distance: int = T5_MAX_DISTANCE
    ):
        super().__init__()
        self.buckets, self.max_distance = buckets, max_distance
        self.table = nn.Embedding(buckets, n_heads)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> T5RelativeBias:
        return cls(cfg.n_heads)

    def bias(self, T: int, causal: bool, device: torch.device) -> Tensor:
        position = torch.arange(T, device=device)
        relative = position[None, :] - position[:, None]  # (T, T): key j minus query i
        bucket = relative_position_bucket(relative, not causal, self.buckets, self.max_distance)
        return self.table(bucket).permute(2, 0, 1)  # (H, T, T)
