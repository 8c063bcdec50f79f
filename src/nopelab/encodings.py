"""The positional encodings: one spec each, the one place that says what an encoding is.

The model builds an encoding's module from its spec; the settings, the memory limits, the data
and length checks, the Hugging Face export and the papers' tables read its properties instead of
comparing names. Adding an encoding is one :class:`Encoding` here, the module that computes it,
and its tests. An unknown name is refused when a :class:`~nopelab.config.ModelConfig` is built.

This module imports no torch: the settings and the command line read it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import nn

    from nopelab.config import ModelConfig

Level = Literal["none", "input", "rotary", "bias"]


def _no_parameters(cfg: ModelConfig) -> int:
    return 0


@dataclass(frozen=True)
class Encoding:
    """What one positional encoding is, for every part of nopelab that needs to know."""

    name: str  # the value of ModelConfig.pos_encoding and of --pos-encoding
    label: str  # how tables and figures name it
    level: Level  # none; added to the input embedding; rotating queries and keys; a logit bias
    module: str = ""  # "package.module:Class" computing it, built by Class.from_config(cfg)
    table: bool = False  # absolute positions from a table of max_seq_len rows, none beyond
    export: tuple[str, ...] = ()  # the Hugging Face architectures that compute it
    shared: bool = False  # one module (and its parameters) for every layer, as in T5
    parameters: Callable[[ModelConfig], int] = _no_parameters  # the encoding's own parameters

    @property
    def in_attention(self) -> bool:
        """Applied inside attention, so ``nope_layers`` can switch it off layer by layer."""
        return self.level in ("rotary", "bias")

    @property
    def scores(self) -> bool:
        """Adds an (H, T, T) bias to the logits: attention materialises the score matrix."""
        return self.level == "bias"

    def build(self, cfg: ModelConfig) -> nn.Module:
        """The module computing this encoding for ``cfg`` (the encoding must have one)."""
        path, name = self.module.split(":")
        cls: Any = getattr(importlib.import_module(path), name)
        return cls.from_config(cfg)


T5_BUCKETS, T5_MAX_DISTANCE = 32, 128  # Raffel et al. 2020's relative-position buckets
_MODEL = "nopelab.models.transformer"
ENCODINGS: dict[str, Encoding] = {
    e.name: e
    for e in (
        Encoding("none", "NoPE", "none", export=("gpt2", "smollm3")),
        Encoding(
            "learned",
            "learned",
            "input",
            f"{_MODEL}:LearnedPositionalEmbedding",
            table=True,
            export=("gpt2",),
            parameters=lambda cfg: cfg.max_seq_len * cfg.d_model,
        ),
        Encoding("sinusoidal", "sinusoidal", "input", f"{_MODEL}:SinusoidalPositionalEmbedding"),
        Encoding("rope", "RoPE", "rotary", f"{_MODEL}:RotaryPE", export=("llama", "smollm3")),
        Encoding("alibi", "ALiBi", "bias", f"{_MODEL}:ALiBiPE"),
        Encoding(
            "t5",
            "T5 bias",
            "bias",
            "nopelab.models.t5_bias:T5RelativeBias",
            shared=True,
            parameters=lambda cfg: T5_BUCKETS * cfg.n_heads,  # a scalar per bucket and head
        ),
    )
}
NAMES: tuple[str, ...] = tuple(ENCODINGS)


def labels_of(names: tuple[str, ...]) -> dict[str, str]:
    """The display labels of ``names``, in that order (figures colour them in that order)."""
    return {name: ENCODINGS[name].label for name in names}


def encoding(name: str) -> Encoding:
    """The spec of a known encoding (a config has been checked: its name is one)."""
    return ENCODINGS[name]
