"""Haviv et al.'s prefix shuffle: no shuffle at k = 0 and 1, no rise for a model that reads its
context as a bag of tokens, a rise for one that reads order."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from nopelab.measure.shuffle import prefix_shuffle, shuffled

V, T, N = 11, 12, 20


class Bag(nn.Module):
    """Causal and blind to order: each position's logits depend on the multiset of the tokens up
    to it (a running count of each token) and on its own token."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(V, V)
        torch.manual_seed(0)
        nn.init.normal_(self.out.weight)

    def forward(self, idx: Tensor) -> Tensor:
        own = torch.nn.functional.one_hot(idx, V).double()
        counts = own.cumsum(1)  # exact in float64
        return self.out(counts.float()) + 3 * own.float()


class CountFromFirst(nn.Module):
    """Causal and order-bound: predicts that the token after position t is the window's first
    token plus t + 1 (mod V), which is right on a counting sequence and needs to know which
    token came first."""

    def forward(self, idx: Tensor) -> Tensor:
        steps = torch.arange(1, idx.shape[1] + 1)
        return 10 * nn.functional.one_hot((idx[:, :1] + steps) % V, V).float()


def windows() -> list[tuple[Tensor, Tensor]]:
    torch.manual_seed(2)
    ids = torch.randint(0, V, (N, T + 1))
    return [(row[:-1], row[1:]) for row in ids]


def test_shuffling_permutes_only_the_prefix() -> None:
    pairs = windows()
    out = list(shuffled(pairs, 5, torch.Generator().manual_seed(0)))
    for (x, y), (x2, y2) in zip(pairs, out, strict=True):
        assert torch.equal(x[5:], x2[5:]) and torch.equal(y, y2)
        assert sorted(x[:5].tolist()) == sorted(x2[:5].tolist())
    assert any(not torch.equal(x[:5], x2[:5]) for (x, _), (x2, _) in zip(pairs, out, strict=True))


def counting() -> list[tuple[Tensor, Tensor]]:
    """Windows that count up from a random start: s, s + 1, s + 2, ... (mod V)."""
    torch.manual_seed(3)
    ids = (torch.randint(0, V, (N, 1)) + torch.arange(T + 1)) % V
    return [(row[:-1], row[1:]) for row in ids]


def test_no_prefix_to_shuffle_is_the_plain_loss_on_every_token() -> None:
    rows = prefix_shuffle(Bag(), windows(), [0, 1], 8, torch.device("cpu"), 0)
    for row in rows:
        assert row["loss"] == row["unshuffled_loss"] and row["rise"] == 0
        assert row["tokens"] == N * (T - row["k"])


def test_a_bag_of_tokens_model_pays_nothing_for_the_shuffle() -> None:
    rows = prefix_shuffle(Bag(), windows(), [0, 4, 8, 11], 8, torch.device("cpu"), 0)
    for row in rows:
        assert row["rise"] == pytest.approx(0, abs=1e-5)
        assert row["tokens"] == N * (T - row["k"])


def test_an_order_reading_model_loses_with_the_shuffle() -> None:
    model, pairs = CountFromFirst(), counting()
    rows = {r["k"]: r for r in prefix_shuffle(model, pairs, [0, 6, 11], 8, torch.device("cpu"), 0)}
    assert rows[0]["loss"] < 1e-3  # it knows the sequence
    assert rows[6]["rise"] > 5 and rows[11]["rise"] > 5  # most shuffles move the first token
    # the unshuffled loss after the prefix, by hand: positions k on
    with torch.no_grad():
        x, y = (torch.stack(t) for t in zip(*pairs, strict=True))
        loss = nn.functional.cross_entropy(
            model(x).flatten(0, 1), y.flatten(), reduction="none"
        ).view(N, T)
    assert rows[6]["unshuffled_loss"] == pytest.approx(float(loss[:, 6:].mean()), rel=1e-6)


def test_a_prefix_length_shuffles_alike_whatever_else_is_asked() -> None:
    alone = prefix_shuffle(CountFromFirst(), counting(), [8], 8, torch.device("cpu"), 0)[0]
    among = prefix_shuffle(CountFromFirst(), counting(), [0, 4, 8, 11], 8, torch.device("cpu"), 0)[
        2
    ]
    assert alone == among


def test_a_prefix_as_long_as_the_window_is_refused() -> None:
    with pytest.raises(ValueError, match=r"prefix lengths must be in 0\.\.11"):
        prefix_shuffle(Bag(), windows(), [0, T], 8, torch.device("cpu"), 0)
