"""The hooks that stream statistics during a forward pass.

:class:`StreamingCapture` attaches a :class:`~nopelab.measure.stats.SiteStats` to each chosen
site of any model with nopelab's sites (:mod:`nopelab.measure.sites`: native, Hugging Face, or
modules named as sites) and, for the site ``attention``, an
:class:`~nopelab.measure.attention.AttentionStats` to each layer of a native or Hugging Face
model; every forward pass inside the ``with`` block folds its batch into them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import torch

from nopelab.config import ATTENTION
from nopelab.errors import ConfigError, RunFailed
from nopelab.measure.attention import AttentionResult, AttentionStats
from nopelab.measure.sites import SiteKey, Sites, sites_of
from nopelab.measure.stats import SiteResult, SiteStats
from nopelab.models.transformer import Block, Transformer

if TYPE_CHECKING:
    from nopelab.hf.sites import HFModel


@runtime_checkable
class RecordsAttention(Protocol):
    """A model whose attention pattern is read through its own hooks (a Hugging Face model:
    :class:`nopelab.hf.sites.HFModel`), not through a native block's queries and keys."""

    def attention_layout(self) -> tuple[int, list[bool]]:
        """Query heads per layer, and whether each analysed layer is causal."""
        ...

    def record_attention(self, stats: dict[int, AttentionStats]) -> Any:
        """Fold the attention of layer ``l`` into ``stats[l]`` until ``remove()`` is called."""
        ...


@dataclass(frozen=True)
class CaptureResult:
    """Everything one analysis reduced: per-site statistics and, if asked, per-layer attention."""

    sites: dict[SiteKey, SiteResult]
    attention: dict[int, AttentionResult]


class StreamingCapture:
    """Context manager that reduces the chosen sites' activations on the fly; the site
    ``attention`` reduces every layer's attention pattern per head, in chunks.

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
        model: Transformer | HFModel | Sites,
        sites: Iterable[str],
        seq_len: int,
        device: torch.device | str = "cpu",
    ):
        sites = list(sites)
        vectors = [site for site in sites if site != ATTENTION]
        self.model = model
        self.sites = sites_of(model)
        self.stats = {key: SiteStats(seq_len, device) for key in self.sites.site_keys(vectors)}
        self.attention: dict[int, AttentionStats] = {}
        if ATTENTION in sites:
            self.attention = _attention_stats(model, seq_len, device)
        self._handles: list[Any] = []  # hook handles and recordings: each has remove()

    def __enter__(self) -> StreamingCapture:
        try:
            self._handles += self.sites.observe(
                self.stats, lambda key, h: self.stats[key].update(h)
            )
            if isinstance(self.model, Transformer):
                for layer, stats in self.attention.items():
                    self._handles += stats.attach(cast(Block, self.model.blocks[layer - 1]).attn)
            elif self.attention:
                model = cast(RecordsAttention, self.model)
                self._handles.append(model.record_attention(self.attention))
        except BaseException:
            self.__exit__()  # no hook outlives a capture that did not start
            raise
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
        ran = any(stats.samples for stats in self.stats.values()) or not self.stats
        for layer, attention in self.attention.items():
            if ran and not attention.samples:
                raise RunFailed(
                    f"the attention of layer {layer} was never computed where nopelab reads it: "
                    "this model's attention cannot be measured (drop attention from --sites)"
                )
        return CaptureResult(
            sites={key: stats.result() for key, stats in self.stats.items()},
            attention={layer: stats.result() for layer, stats in self.attention.items()},
        )


def _attention_stats(
    model: Transformer | HFModel | Sites, seq_len: int, device: torch.device | str
) -> dict[int, AttentionStats]:
    """An :class:`AttentionStats` for every layer of a native or Hugging Face model."""
    if isinstance(model, Transformer):
        heads, causal = model.cfg.n_heads, [not model.cfg.bidirectional] * model.cfg.n_layers
    elif isinstance(model, RecordsAttention):
        heads, causal = model.attention_layout()
    else:
        raise ConfigError(
            "sites", "attention is read from native nopelab or Hugging Face models only"
        )
    return {
        layer: AttentionStats(seq_len, n_heads=heads, causal=causal[layer - 1], device=device)
        for layer in range(1, len(causal) + 1)  # one per analysed layer
    }
