"""Capture sites of Hugging Face causal LMs, mapped per architecture onto nopelab's names.

:class:`HFModel` wraps a ``transformers`` causal LM so that everything written for native models
(streaming statistics, probes, loss on text) runs on it unchanged. Its sites are read through
forward hooks on the decoder layers, never through ``output_hidden_states``:

* ``embed`` (layer 0): the input of the first decoder layer;
* ``attn_heads``: the attention heads' outputs concatenated, read as the input of the attention
  output projection (``o_proj``; GPT-2's ``c_proj``, a Conv1D): (B, T, heads × head_dim), which
  is usually ``d_model`` but not always (Qwen3-0.6B: 2048 against 1024);
* ``attn_out``: the self-attention module's output (after the output projection, before the
  residual add);
* ``resid_mid``: the layer's input plus ``attn_out``. In sequential blocks this is the stream the
  MLP reads; in parallel blocks (Cohere2) the model never forms it, and nopelab computes it;
* ``mlp_out``: the feed-forward module's output (the routed sum for mixture-of-experts layers);
* ``resid_post``: the decoder layer's output. The last layer's is taken *before* the final norm.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from nopelab.config import BLOCK_SITES, DEFAULT_SITES, SITES
from nopelab.errors import ConfigError
from nopelab.measure.sites import (
    Edit,
    Observer,
    SiteKey,
    check_site_names,
    first_tensor,
    in_model_order,
    replace_first,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from nopelab.hf.attention import Recording
    from nopelab.measure.attention import AttentionStats


@dataclass(frozen=True)
class Architecture:
    """Where the sites live in one family of Hugging Face causal LMs."""

    layers: str  # dotted path from the causal LM to its list of decoder layers
    attn: str  # the self-attention module of a layer; returns (output, weights)
    mlp: str  # the feed-forward module of a layer
    heads: str | None  # the attention output projection, whose input is attn_heads; None: none
    rope: bool = True  # attention receives ``position_embeddings`` (rotary) from the model
    parallel: bool = False  # attention and MLP read the same normed input (resid_mid not formed)


_LLAMA_LIKE = Architecture("model.layers", "self_attn", "mlp", "self_attn.o_proj")
ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": Architecture("transformer.h", "attn", "mlp", "attn.c_proj", rope=False),
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "smollm3": _LLAMA_LIKE,
    "llama4_text": Architecture("model.layers", "self_attn", "feed_forward", "self_attn.o_proj"),
    "cohere2": Architecture("model.layers", "self_attn", "mlp", "self_attn.o_proj", parallel=True),
}


def architecture(model_type: str) -> Architecture:
    """The site mapping of ``model_type``; an unmapped architecture is a user error."""
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            "model",
            f"architecture {model_type!r} has no site mapping; supported: {', '.join(ARCHITECTURES)}",
        )
    return ARCHITECTURES[model_type]


def check_sites(model_type: str, sites: Iterable[str]) -> None:
    """A ConfigError if ``sites`` asks for ``attn_heads`` of a model with no output projection."""
    if "attn_heads" in sites and architecture(model_type).heads is None:
        allowed = ", ".join(site for site in SITES if site != "attn_heads")
        raise ConfigError(
            "sites",
            f"attn_heads needs an attention output projection, which {model_type!r} lacks; "
            f"allowed: {allowed}",
        )


def check_max_layers(max_layers: int | None) -> None:
    if max_layers is not None and max_layers < 1:
        raise ConfigError("max_layers", f"must be >= 1, got {max_layers}")


@dataclass(frozen=True)
class HFSpec:
    """The few facts about a Hugging Face model that nopelab's analysis code reads (``model.cfg``)."""

    model_type: str
    d_model: int
    n_layers: int  # layers analysed (``max_layers`` may cut the model short)
    vocab_size: int
    total_layers: int
    bidirectional: bool = False


def _hidden_states(args: tuple, kwargs: dict) -> Tensor:
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


class _Stop(Exception):
    """Raised after the last analysed layer, to skip the rest of the forward pass."""


class HFModel(nn.Module):
    """A Hugging Face causal LM behind nopelab's model interface.

    ``forward(idx)`` or ``forward(inputs_embeds=...)`` returns next-token logits, or ``None`` when
    ``max_layers`` cuts the pass short; :meth:`observe` hooks sites by nopelab's names.
    """

    def __init__(self, hf: PreTrainedModel, max_layers: int | None = None, name: str = ""):
        super().__init__()
        config = hf.config
        self.hf = hf
        self.name = name
        self.arch = architecture(config.model_type)
        self.layers: nn.ModuleList = attrgetter(self.arch.layers)(hf)
        total = len(self.layers)
        check_max_layers(max_layers)
        n_layers = min(max_layers or total, total)
        self.cfg = HFSpec(config.model_type, config.hidden_size, n_layers, config.vocab_size, total)

    def forward(
        self,
        idx: Tensor | None = None,
        *,
        inputs_embeds: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor | None:
        inputs = idx if idx is not None else inputs_embeds
        assert inputs is not None, "pass idx or inputs_embeds"
        # An explicit all-ones mask: transformers would read non-contiguous position ids as
        # packed sequences and mask across them.
        mask = torch.ones(inputs.shape[:2], dtype=torch.long, device=inputs.device)
        stop = None
        if self.cfg.n_layers < self.cfg.total_layers:
            stop = self.layers[self.cfg.n_layers - 1].register_forward_hook(_raise_stop)
        try:
            out = self.hf(
                input_ids=idx,
                inputs_embeds=inputs_embeds,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=False,
            )
        except _Stop:
            return None
        finally:
            if stop is not None:
                stop.remove()
        return out.logits

    def site_keys(self, sites: Iterable[str] = DEFAULT_SITES) -> list[SiteKey]:
        """(site, layer) for every requested site over the analysed layers, in model order."""
        sites = check_site_names(sites)
        check_sites(self.cfg.model_type, sites)
        keys = []
        for site in sites:
            if site == "embed":
                keys.append(("embed", 0))
            else:
                keys += [(site, layer) for layer in range(1, self.cfg.n_layers + 1)]
        return in_model_order(keys)

    def observe(
        self, keys: Iterable[SiteKey], fn: Observer
    ) -> list[torch.utils.hooks.RemovableHandle]:
        """Hook ``keys`` so that every forward pass calls ``fn(key, activation)`` with (B, T, d)."""
        wanted = set(keys)
        check_sites(self.cfg.model_type, {site for site, _ in wanted})
        handles = []
        for layer in range(1, self.cfg.n_layers + 1):
            sites = {site for site in BLOCK_SITES if (site, layer) in wanted}
            if layer == 1 and ("embed", 0) in wanted:
                sites.add("embed")
            if sites:
                handles += self._observe_layer(layer, sites, fn)
        return handles

    def _observe_layer(self, layer: int, sites: set[str], fn: Observer) -> list:
        block = self.layers[layer - 1]
        stream: dict[str, Tensor] = {}

        def layer_input(module, args, kwargs) -> None:
            stream["input"] = _hidden_states(args, kwargs)
            if "embed" in sites:
                fn(("embed", 0), stream["input"])

        def heads(module, args) -> None:
            fn(("attn_heads", layer), args[0])

        def attention(module, args, output) -> None:
            out = first_tensor(output)
            if "attn_out" in sites:
                fn(("attn_out", layer), out)
            if "resid_mid" in sites:
                fn(("resid_mid", layer), stream["input"] + out)

        def mlp(module, args, output) -> None:
            fn(("mlp_out", layer), first_tensor(output).view(stream["input"].shape))

        def layer_output(module, args, output) -> None:
            fn(("resid_post", layer), first_tensor(output))

        handles = [block.register_forward_pre_hook(layer_input, with_kwargs=True)]
        if "attn_heads" in sites:
            assert self.arch.heads is not None  # observe's check_sites refused attn_heads
            handles.append(attrgetter(self.arch.heads)(block).register_forward_pre_hook(heads))
        if sites & {"attn_out", "resid_mid"}:
            handles.append(attrgetter(self.arch.attn)(block).register_forward_hook(attention))
        if "mlp_out" in sites:
            handles.append(attrgetter(self.arch.mlp)(block).register_forward_hook(mlp))
        if "resid_post" in sites:
            handles.append(block.register_forward_hook(layer_output))
        return handles

    def edit(self, key: SiteKey, fn: Edit) -> torch.utils.hooks.RemovableHandle:
        """Hook ``key`` so that every forward pass replaces its activation ``h`` by ``fn(h)``.

        ``resid_mid`` is not any module's output here (nopelab forms it from the layer's input
        and ``attn_out``), so it cannot be replaced: edit ``attn_out`` instead.
        """
        site, layer = key
        if key not in self.site_keys([site]):
            raise ConfigError("layers", f"the model has no site {site} at layer {layer}")
        block = self.layers[max(layer, 1) - 1]
        if site == "embed":

            def layer_input(module, args, kwargs):
                if "hidden_states" in kwargs:
                    h = kwargs["hidden_states"]
                    return args, {**kwargs, "hidden_states": fn(h).to(h.dtype)}
                return (fn(args[0]).to(args[0].dtype), *args[1:]), kwargs

            return block.register_forward_pre_hook(layer_input, with_kwargs=True)
        if site == "attn_heads":
            assert self.arch.heads is not None  # site_keys refused attn_heads
            projection = attrgetter(self.arch.heads)(block)
            return projection.register_forward_pre_hook(
                lambda m, args: (fn(args[0]).to(args[0].dtype), *args[1:])
            )
        if site == "resid_mid":
            raise ConfigError(
                "site", "resid_mid of a Hugging Face model is formed by nopelab, not by a module "
                "that could be edited; edit attn_out instead"
            )  # fmt: skip
        if site == "mlp_out":
            module = attrgetter(self.arch.mlp)(block)
        else:
            module = block if site == "resid_post" else attrgetter(self.arch.attn)(block)

        def output(module, args, kwargs, out):
            h = first_tensor(out)
            # a mixture of experts may return (B * T, d): its edit sees (B, T, d)
            shape = _hidden_states(args, kwargs).shape if site == "mlp_out" else h.shape
            new = fn(h.reshape(shape)).reshape(h.shape).to(h.dtype)
            return replace_first(out, new)

        return module.register_forward_hook(output, with_kwargs=True)

    def attention_modules(self) -> list[nn.Module]:
        """The self-attention module of every analysed layer."""
        return [attrgetter(self.arch.attn)(block) for block in self.layers[: self.cfg.n_layers]]

    def attention_layout(self) -> tuple[int, list[bool]]:
        """The query heads per layer and whether each analysed layer is causal; a ConfigError
        unless its attention implementation is one nopelab can read."""
        from nopelab.hf.attention import attention_heads, causal_layers, check_recordable

        check_recordable(self)
        return attention_heads(self), causal_layers(self)

    def record_attention(self, stats: dict[int, AttentionStats]) -> Recording:
        """Fold every forward pass's attention logits into ``stats`` (see
        :func:`nopelab.hf.attention.record_attention`)."""
        from nopelab.hf.attention import record_attention

        return record_attention(self, stats)


def _raise_stop(module, args, output) -> None:
    raise _Stop
