"""Attention statistics of Hugging Face models, read where the logits are formed.

Each architecture computes its queries and keys inside its own attention module (rotary
embeddings, Llama 4's temperature tuning, grouped key-value heads), then hands them to one
attention function chosen by ``config._attn_implementation``. While :func:`record_attention`
is active, the model runs nopelab's function, which is PyTorch's fused attention as
``transformers`` calls it for ``"sdpa"``, after passing the queries, the (repeated) keys, the
scale and the mask to each layer's :class:`~nopelab.measure.attention.AttentionStats`. The
model's outputs do not change, and no (B, H, T, T) tensor beyond the model's own mask is made.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

from nopelab.errors import ConfigError
from nopelab.hf.sites import HFModel
from nopelab.measure.attention import AttentionStats

IMPLEMENTATION = "nopelab_sdpa"
_RECORDING: WeakKeyDictionary[nn.Module, AttentionStats] = WeakKeyDictionary()


def _attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    stats = _RECORDING.get(module)
    if stats is not None:
        groups = query.shape[1] // key.shape[1]  # grouped key-value heads
        scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
        visible = None if attention_mask is None else _visible(attention_mask)
        stats.update(query, key.repeat_interleave(groups, dim=1), 1 / scaling, visible=visible)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _visible(mask: Tensor) -> Tensor:
    """The keys each query sees: a bool mask as given, an additive float mask's finite zeros."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


class Recording:
    """What :func:`record_attention` changed; ``remove()`` undoes it (a hook handle's method)."""

    def __init__(self, model: HFModel, modules: list[nn.Module], implementation: str):
        self.model, self.modules, self.implementation = model, modules, implementation

    def remove(self) -> None:
        for module in self.modules:
            _RECORDING.pop(module, None)
        self.model.hf.config._attn_implementation = self.implementation


def attention_heads(model: HFModel) -> int:
    """The number of query heads of every attention layer."""
    return int(model.hf.config.num_attention_heads)


def record_attention(model: HFModel, stats: dict[int, AttentionStats]) -> Recording:
    """From now on, every forward pass folds the attention logits of layer ``l`` (1-based) into
    ``stats[l]``; the returned object's ``remove()`` stops it and restores the attention."""
    implementation = model.hf.config._attn_implementation
    if implementation not in ("sdpa", "eager"):
        raise ConfigError(
            "attn_entropy",
            f"reads the logits through sdpa or eager attention; this model runs {implementation}",
        )
    _register()
    modules = model.attention_modules()
    for layer, layer_stats in stats.items():
        _RECORDING[modules[layer - 1]] = layer_stats
    model.hf.config._attn_implementation = IMPLEMENTATION
    return Recording(model, [modules[layer - 1] for layer in stats], implementation)
