"""Loss by position: log-spaced buckets, per-position cross-entropy, planning and the flat length."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nopelab.config import ModelConfig
from nopelab.errors import UserError
from nopelab.measure import length as L
from nopelab.models.transformer import Transformer
from nopelab.training.corpus import TokenStream


@pytest.mark.parametrize("length", [1, 2, 7, 32, 100, 4096])
@pytest.mark.parametrize("buckets", [1, 3, 32, 500])
def test_buckets_cover_every_position_exactly_once(length: int, buckets: int) -> None:
    ranges = L.log_buckets(length, buckets)
    covered = [p for first, last in ranges for p in range(first, last + 1)]
    assert covered == list(range(1, length + 1))
    assert 1 <= len(ranges) <= buckets


def test_buckets_are_log_spaced() -> None:
    ranges = L.log_buckets(4096, 12)
    assert ranges[0] == (1, 1) and ranges[-1][1] == 4096
    widths = [last - first + 1 for first, last in ranges]
    assert widths[-1] > 100 * widths[0]


def test_position_loss_equals_brute_force_cross_entropy() -> None:
    cfg = ModelConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=2)
    model = Transformer(cfg).eval()
    x, y = torch.randint(0, 13, (5, 12)), torch.randint(0, 13, (5, 12))
    with torch.no_grad():
        log_p = torch.log_softmax(model(x).double(), dim=-1)
    nll = -np.array(
        [[log_p[w, t, y[w, t]].item() for t in range(12)] for w in range(5)]
    )  # (windows, positions), one token at a time
    for batch in (1, 2, 5, 8):
        loss = L.position_loss(model, zip(x, y, strict=True), 12, batch, torch.device("cpu"))
        assert loss.count.tolist() == [5] * 12 and loss.windows == 5 and loss.tokens == 60
        np.testing.assert_allclose(loss.total / loss.count, nll.mean(0), rtol=1e-5)
        assert loss.mean == pytest.approx(nll.mean(), rel=1e-5)
    rows = L.bucket_rows(loss, 4)
    for row in rows:
        tokens = nll[:, row["bucket_start"] - 1 : row["bucket_end"]]
        assert row["loss"] == pytest.approx(tokens.mean(), rel=1e-5)
        assert row["tokens"] == tokens.size
    assert sum(row["tokens"] for row in rows) == 60


@pytest.mark.parametrize(
    ("perplexities", "flat"),
    [
        ({1: 10.0, 2: 10.9, 4: 11.5, 8: 10.0}, 2),  # 4x is 15% above: 8x does not count
        ({1: 10.0, 2: 8.0, 4: 10.99}, 4),  # lower counts as flat; 9.9% above is within
        ({1: 10.0, 2: 12.0}, 1),
        ({1: 10.0}, 1),
        ({2: 5.0, 4: 5.4}, 4),  # without 1x: against the shortest length
        ({1: 10.0, 2: float("inf")}, 1),
    ],
)
def test_flat_length(perplexities: dict[int, float], flat: int) -> None:
    assert L.flat_length(perplexities) == flat


def test_flat_length_against_another_reference() -> None:
    """A fix is judged against the model it fixes: a lower reference shortens the flat
    length, and a shortest length already above the line has none."""
    fixed = {1: 10.5, 1.1: 10.9, 1.25: 11.5, 2: 12.0}
    assert L.flat_length(fixed) == 1.25  # 11.5 <= 1.1 x 10.5
    assert L.flat_length(fixed, reference=10.0) == 1.1  # 11.5 > 1.1 x 10
    assert L.flat_length(fixed, reference=9.0) is None  # 10.5 > 9.9


def test_plan_lengths_refuses_with_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "available_memory", lambda: 1000)
    asked = {"factors": (1, 2, 4), "windows": 8, "batch_size": 4}
    plans = L.plan_lengths(10, 81, lambda length: 100, **asked)
    assert [(p.factor, p.length, p.windows, p.batch_size) for p in plans] == [
        (1, 10, 8, 4),
        (2, 20, 4, 4),
        (4, 40, 2, 2),  # as many windows as the held-out text holds
    ]
    assert [p.batch_size for p in L.plan_lengths(10, 81, lambda n: 300, **asked)] == [3, 3, 2]
    with pytest.raises(UserError, match=r"^--lengths: 4x is 40 tokens, beyond the learned .* 2x"):
        L.plan_lengths(10, 81, lambda length: 100, table=20, **asked)
    with pytest.raises(UserError, match=r"^--lengths: 4x .* the held-out text has 40 tokens"):
        L.plan_lengths(10, 40, lambda length: 100, **asked)
    one = {"factors": (1,), "windows": 8, "batch_size": 4}
    assert L.plan_lengths(10, 81, lambda length: 60 * length, **one)[0].batch_size == 1
    with pytest.raises(UserError, match=r"^--lengths: a window of 2x \(20 tokens\) needs about"):
        L.plan_lengths(10, 81, lambda length: 60 * length, **asked)


def test_chosen_windows_are_all_or_a_seeded_choice() -> None:
    stream = TokenStream(np.arange(0), np.arange(101))
    every = list(L.chosen_windows(stream, 10, 20, seed=0))
    assert [int(x[0]) for x, _ in every] == list(range(0, 100, 10))
    assert all(torch.equal(y, x + 1) for x, y in every)
    some = [int(x[0]) for x, _ in L.chosen_windows(stream, 10, 4, seed=1)]
    assert len(set(some)) == 4 and some == sorted(some)
    assert some == [int(x[0]) for x, _ in L.chosen_windows(stream, 10, 4, seed=1)]
