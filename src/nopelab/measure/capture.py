"""Named capture sites and the hooks that stream their statistics during a forward pass.

Sites: ``embed`` (layer 0, the input to the first block) and, for blocks 1..L, ``attn_heads``
(the attention heads' outputs concatenated, the input of the output projection), ``attn_out``
(attention output after the projection, before the residual add), ``resid_mid``, ``mlp_out``
and ``resid_post``. :func:`observe` hooks them on a native model or on a Hugging Face model
(:class:`nopelab.hf.sites.HFModel`, which maps them per architecture).
:class:`StreamingCapture` attaches a :class:`~nopelab.measure.stats.SiteStats` to each chosen site; every
forward pass inside the ``with`` block folds its batch into them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from nopelab.config import BLOCK_SITES, DEFAULT_SITES, SITES
from nopelab.errors import ConfigError, RunFailed
from nopelab.measure.stats import AttentionResult, AttentionStats, SiteResult, SiteStats
from nopelab.models.transformer import Block, Transformer

if TYPE_CHECKING:
    from nopelab.hf.sites import HFModel

SiteKey = tuple[str, int]  # (site, layer)


def site_modules(
    model: Transformer, sites: Iterable[str] = DEFAULT_SITES
) -> dict[SiteKey, nn.Module]:
    """The hook point of every requested site, keyed by (site, layer); layer 0 is ``embed``."""
    modules: dict[SiteKey, nn.Module] = {}
    for site in sites:
        if site == "embed":
            modules[("embed", 0)] = model.hook_embed
        elif site in BLOCK_SITES:
            hook = attrgetter("attn.hook_heads" if site == "attn_heads" else f"hook_{site}")
            for layer, block in enumerate(model.blocks, start=1):
                modules[(site, layer)] = hook(block)
        else:
            raise ValueError(f"unknown site {site!r}; allowed: {', '.join(SITES)}")
    return dict(sorted(modules.items(), key=lambda item: (item[0][1], SITES.index(item[0][0]))))


def site_keys(model: Transformer | HFModel, sites: Iterable[str] = DEFAULT_SITES) -> list[SiteKey]:
    """Every (site, layer) of ``model`` for the requested sites, in model order."""
    if not isinstance(model, Transformer):  # a Hugging Face model
        return model.site_keys(sites)
    return list(site_modules(model, sites))


def observe(
    model: Transformer | HFModel,
    keys: Iterable[SiteKey],
    fn: Callable[[SiteKey, torch.Tensor], None],
) -> list[torch.utils.hooks.RemovableHandle]:
    """Hook ``keys`` so that every forward pass calls ``fn(key, activation)`` with (B, T, d)."""
    keys = list(keys)
    if not isinstance(model, Transformer):  # a Hugging Face model
        return model.observe(keys, fn)
    modules = site_modules(model, {site for site, _ in keys})

    def hook(key: SiteKey):
        return lambda module, inputs, output: fn(key, output)

    return [modules[key].register_forward_hook(hook(key)) for key in keys]


@dataclass(frozen=True)
class CaptureResult:
    """Everything one analysis reduced: per-site statistics and, if asked, per-layer attention."""

    sites: dict[SiteKey, SiteResult]
    attention: dict[int, AttentionResult]


class StreamingCapture:
    """Context manager that reduces the chosen sites' activations on the fly.

    >>> from nopelab.config import ModelConfig
    >>> from nopelab.models.transformer import build_model
    >>> model = build_model(ModelConfig(d_model=32, n_heads=2, n_layers=1), seed=0)
    >>> with StreamingCapture(model, ["attn_out"], seq_len=16) as capture:
    ...     _ = model(inputs_embeds=torch.randn(4, 16, 32))
    >>> capture.result().sites[("attn_out", 1)].variance.shape  # one per position
    (16,)
    """

    def __init__(
        self,
        model: Transformer | HFModel,
        sites: Iterable[str],
        seq_len: int,
        attn_entropy: bool = False,
        device: torch.device | str = "cpu",
    ):
        self.model = model
        self.stats = {key: SiteStats(seq_len, device) for key in site_keys(model, sites)}
        self.attention: dict[int, AttentionStats] = {}
        if attn_entropy:
            if not isinstance(model, Transformer):
                raise ConfigError(
                    "attn_entropy", "only native nopelab models expose attention logits"
                )
            causal = not model.cfg.bidirectional
            self.attention = {
                layer: AttentionStats(seq_len, causal, device)
                for layer in range(1, model.cfg.n_layers + 1)
            }
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> StreamingCapture:
        self._handles += observe(self.model, self.stats, lambda key, h: self.stats[key].update(h))
        for layer, stats in self.attention.items():
            assert isinstance(self.model, Transformer)  # attention stats: native models only
            attn = cast(Block, self.model.blocks[layer - 1]).attn
            self._handles.append(
                attn.hook_scores.register_forward_hook(_reducer(stats.update_scores))
            )
            self._handles.append(
                attn.hook_probs.register_forward_hook(_reducer(stats.update_probs))
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def result(self) -> CaptureResult:
        """The reduced statistics; non-finite activations (an overflow, broken weights) are a
        :class:`~nopelab.errors.RunFailed` naming the first site where they appeared."""
        for (site, layer), stats in self.stats.items():
            if not stats.finite():
                raise RunFailed(
                    f"the activations at {site} layer {layer} are not finite (NaN or inf): "
                    "check the weights and --init-std, or analyse in --dtype float32"
                )
        return CaptureResult(
            sites={key: stats.result() for key, stats in self.stats.items()},
            attention={layer: stats.result() for layer, stats in self.attention.items()},
        )


def _reducer(update):
    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        update(output)

    return hook
