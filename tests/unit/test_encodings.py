"""The encoding registry: every spec builds the module the model uses, at the level it says."""

from __future__ import annotations

from typing import get_args

import pytest

from nopelab.config import ModelConfig, PosEncoding
from nopelab.encodings import ENCODINGS, NAMES, labels_of
from nopelab.errors import ConfigError
from nopelab.models.transformer import NoAttentionPE, NoPositionalEmbedding, Transformer


def test_the_settings_offer_exactly_the_registered_encodings() -> None:
    assert get_args(PosEncoding) == NAMES
    with pytest.raises(ConfigError, match="pos_encoding: unknown value 'nosuch'; allowed: none,"):
        ModelConfig(pos_encoding="nosuch")


@pytest.mark.parametrize("name", NAMES)
def test_the_model_puts_each_encoding_where_its_spec_says(name: str) -> None:
    spec = ENCODINGS[name]
    model = Transformer(ModelConfig(d_model=16, n_heads=2, n_layers=2, pos_encoding=name))
    pes = [block.attn.pe for block in model.blocks]
    if spec.level == "input":
        assert type(model.pos).__name__ == spec.module.split(":")[1]
    else:
        assert type(model.pos) is NoPositionalEmbedding
    if spec.in_attention:
        assert all(type(pe).__name__ == spec.module.split(":")[1] for pe in pes)
        assert (pes[0] is pes[1]) == spec.shared
    else:
        assert all(type(pe) is NoAttentionPE for pe in pes)
    assert spec.scores == (spec.level == "bias")


def test_nope_layers_are_refused_for_encodings_outside_attention() -> None:
    with pytest.raises(ConfigError, match=r"attention-level encodings \(rope, alibi, t5\)"):
        ModelConfig(n_layers=2, pos_encoding="learned", nope_layers=(1,))


def test_labels_follow_the_order_asked() -> None:
    assert labels_of(("rope", "none")) == {"rope": "RoPE", "none": "NoPE"}
    assert list(labels_of(NAMES).values()) == [e.label for e in ENCODINGS.values()]
