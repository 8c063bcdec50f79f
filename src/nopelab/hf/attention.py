"""Attention statistics of Hugging Face models, read where the logits are formed.

Each architecture computes its queries and keys inside its own attention module (rotary
embeddings, Llama 4's temperature tuning, grouped key-value heads), then hands them to one
attention function chosen by ``config._attn_implementation``. While :func:`record_attention`
is active, the model runs nopelab's function, which passes the queries, the (repeated) keys, the
scale and the mask to each layer's :class:`~nopelab.measure.attention.AttentionStats` and then
calls the function the model ran before (``sdpa``, or its own ``eager`` one) with the same
arguments. The model's outputs do not change, and no (B, H, T, T) tensor beyond the model's own
mask is made.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

from nopelab.errors import ConfigError
from nopelab.hf.sites import HFModel
from nopelab.measure.attention import AttentionStats

# nopelab's name for each attention implementation it can read, and the original's mask function
RECORDED = {"sdpa": "nopelab_sdpa", "eager": "nopelab_eager"}
_RECORDING: WeakKeyDictionary[nn.Module, tuple[AttentionStats, Callable[..., Any]]]
_RECORDING = WeakKeyDictionary()


def _attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    stats, original = _RECORDING[module]
    groups = query.shape[1] // key.shape[1]  # grouped key-value heads, each repeated in place
    scaling = kwargs.get("scaling")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    visible = None if attention_mask is None else _visible(attention_mask)
    stats.update(query, key.repeat_interleave(groups, dim=1), 1 / scaling, visible=visible)
    return original(module, query, key, value, attention_mask, **kwargs)


def _visible(mask: Tensor) -> Tensor:
    """The keys each query sees: a bool mask as given, an additive float mask's finite zeros."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    for original, name in RECORDED.items():
        AttentionInterface.register(name, _attention)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])


def _original(module: nn.Module, implementation: str) -> Callable[..., Any]:
    """The attention function ``module`` runs under ``implementation``: the registered one, or
    (eager) its modeling file's own."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


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


def causal_layers(model: HFModel) -> list[bool]:
    """Whether each analysed layer's attention is causal (decoders: all of them)."""
    return [bool(getattr(module, "is_causal", True)) for module in model.attention_modules()]


def check_recordable(model: HFModel) -> None:
    """A ConfigError unless the model runs an attention implementation nopelab can read."""
    implementation = model.hf.config._attn_implementation
    if implementation in RECORDED.values():
        raise ConfigError("sites", "this model's attention is already being recorded")
    if implementation not in RECORDED:
        raise ConfigError(
            "sites",
            f"reads the logits through sdpa or eager attention; this model runs {implementation}",
        )


def record_attention(model: HFModel, stats: dict[int, AttentionStats]) -> Recording:
    """From now on, every forward pass folds the attention logits of layer ``l`` (1-based) into
    ``stats[l]``, then computes the attention with the function the model ran before; the
    returned object's ``remove()`` stops it and restores the attention."""
    check_recordable(model)
    _register()
    implementation = model.hf.config._attn_implementation
    modules = model.attention_modules()
    for layer, layer_stats in stats.items():
        module = modules[layer - 1]
        _RECORDING[module] = (layer_stats, _original(module, implementation))
    model.hf.config._attn_implementation = RECORDED[implementation]
    return Recording(model, [modules[layer - 1] for layer in stats], implementation)
