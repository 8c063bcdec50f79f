"""T5's relative position bias: its buckets against transformers' own T5 implementation, the
invariants of a relative bias, and one table shared by every layer."""

from __future__ import annotations

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from nopelab.config import ModelConfig
from nopelab.limits import parameter_count
from nopelab.models.t5_bias import T5RelativeBias, relative_position_bucket
from nopelab.models.transformer import NoAttentionPE, Transformer
from nopelab.training.checkpoint import load_model, save_model


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (8, 20), (16, 64)])
def test_buckets_match_transformers_t5(
    bidirectional: bool, buckets: int, max_distance: int
) -> None:
    relative = torch.arange(-600, 601)[None, :]
    ours = relative_position_bucket(relative, bidirectional, buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance
    )
    assert torch.equal(ours, theirs)


def test_causal_buckets_spend_all_buckets_on_the_past() -> None:
    past = relative_position_bucket(-torch.arange(0, 1000), False, 32, 128)
    assert past[:16].tolist() == list(range(16))  # one bucket per distance below 16
    assert past.tolist() == sorted(past.tolist()) and past.max() == 31  # wider, then the last
    assert (past[128:] == 31).all()  # everything at max_distance or beyond shares it


def _bias(T: int, causal: bool = True) -> torch.Tensor:
    torch.manual_seed(0)
    return T5RelativeBias(n_heads=3).bias(T, causal, torch.device("cpu"))


@pytest.mark.parametrize("causal", [True, False])
def test_the_bias_depends_on_the_distance_alone(causal: bool) -> None:
    """Shift invariance: bias[h, i, j] is a function of j - i (of where a key lies relative to
    its query), so a longer sequence repeats the shorter one's bias in its corner."""
    bias = _bias(300, causal)
    assert bias.shape == (3, 300, 300)
    for shift in (1, 17, 150):
        torch.testing.assert_close(bias[:, shift:, shift:], bias[:, :-shift, :-shift])
    torch.testing.assert_close(_bias(40, causal), bias[:, :40, :40])
    if not causal:  # a key 3 after the query has a bucket of its own, not that of 3 before
        assert not torch.equal(bias[:, 10, 13], bias[:, 10, 7])


def test_one_table_serves_every_layer_and_is_counted_once() -> None:
    cfg = ModelConfig(vocab_size=40, d_model=24, n_heads=3, n_layers=4, pos_encoding="t5")
    model = Transformer(cfg)
    pes = [block.attn.pe for block in model.blocks]
    assert all(pe is pes[0] for pe in pes) and isinstance(pes[0], T5RelativeBias)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(cfg)
    none = Transformer(ModelConfig(vocab_size=40, d_model=24, n_heads=3, n_layers=4))
    assert parameter_count(cfg) - sum(p.numel() for p in none.parameters()) == 32 * 3


def test_nope_layers_switch_the_shared_bias_off() -> None:
    cfg = ModelConfig(
        vocab_size=40, d_model=24, n_heads=3, n_layers=3, pos_encoding="t5", nope_layers=(2,)
    )
    pes = [block.attn.pe for block in Transformer(cfg).blocks]
    assert type(pes[1]) is NoAttentionPE and pes[0] is pes[2]


def test_the_table_trains_and_round_trips_through_a_checkpoint(tmp_path) -> None:
    cfg = ModelConfig(vocab_size=40, d_model=24, n_heads=3, n_layers=2, pos_encoding="t5")
    torch.manual_seed(0)
    model = Transformer(cfg)
    table = model.blocks[0].attn.pe.table.weight
    before = table.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 40, (4, 30))
    loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    assert not torch.equal(table.detach(), before)  # the bias is learned
    save_model(model, tmp_path / "model.safetensors")
    again = Transformer(cfg)
    load_model(again, tmp_path / "model.safetensors")
    assert all(block.attn.pe is again.blocks[0].attn.pe for block in again.blocks)
    with torch.no_grad():
        torch.testing.assert_close(again(idx), model(idx), rtol=0, atol=0)
