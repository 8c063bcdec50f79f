"""A masked language model's data: BERT's masking of the training windows, targets at the
hidden positions only, the mask token in the vocabulary, and a model that cannot cheat."""

from __future__ import annotations

import pytest
import torch

from nopelab.config import CorpusConfig, ModelConfig, TrainConfig
from nopelab.errors import ConfigError
from nopelab.training.run import TrainRun, data_vocab_size
from nopelab.training.sources import IGNORE, TextSource, mask_tokens
from nopelab.training.train import check_objective


def test_masking_hides_the_rate_and_splits_80_10_10() -> None:
    x = torch.randint(0, 256, (400, 500), generator=torch.Generator().manual_seed(0))
    idx, targets = mask_tokens(x, 0.15, 256, 256, torch.Generator().manual_seed(1))
    hidden = targets != IGNORE
    assert hidden.float().mean().item() == pytest.approx(0.15, abs=0.003)
    assert torch.equal(targets[hidden], x[hidden])  # the original token, at its own position
    assert torch.equal(idx[~hidden], x[~hidden])  # the rest is untouched
    masked = (idx == 256)[hidden].float().mean().item()
    kept = (idx == x)[hidden].float().mean().item()  # 10 % stay, and 1/256 of the random ones
    assert masked == pytest.approx(0.8, abs=0.01)
    assert kept == pytest.approx(0.1 + 0.1 / 256, abs=0.01)
    assert (idx[hidden] < 256).float().mean().item() == pytest.approx(0.2, abs=0.01)


def test_masking_is_reproducible_by_its_generator() -> None:
    x = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(0))
    a = mask_tokens(x, 0.3, 256, 256, torch.Generator().manual_seed(5))
    b = mask_tokens(x, 0.3, 256, 256, torch.Generator().manual_seed(5))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_a_masked_source_masks_the_windows_a_causal_one_shifts() -> None:
    causal = TextSource(CorpusConfig(), eval_tokens=256)
    masked = TextSource(CorpusConfig(objective="masked", mask_rate=0.5), eval_tokens=256)
    assert (causal.vocab_size, masked.vocab_size) == (256, 257)
    x, y = causal.batch(8, 32, torch.Generator().manual_seed(3))
    assert torch.equal(x[:, 1:], y[:, :-1])  # next tokens
    idx, targets = masked.batch(8, 32, torch.Generator().manual_seed(3))
    hidden = targets != IGNORE
    assert hidden.any() and torch.equal(targets[hidden], x[hidden])  # the same windows, unshifted
    assert torch.equal(idx[~hidden], x[~hidden]) and (idx == 256).any()


def test_a_masked_lm_needs_the_mask_token_and_a_causal_lm_cannot_see_ahead() -> None:
    masked = TextSource(CorpusConfig(objective="masked"), eval_tokens=256)
    with pytest.raises(ConfigError, match="tokenizer and the mask token take 257 ids; got 256"):
        masked.check_model(ModelConfig(vocab_size=256, bidirectional=True), 32)
    masked.check_model(ModelConfig(vocab_size=257, bidirectional=True), 32)
    assert data_vocab_size({"corpus": {"objective": "masked"}}) == 257
    assert data_vocab_size({"corpus": {"tokenizer": "bpe", "bpe_vocab": 512}}) == 512


def test_a_run_attends_as_its_objective_needs() -> None:
    def run(objective: str, bidirectional: bool) -> TrainRun:
        model = ModelConfig(vocab_size=257, bidirectional=bidirectional)
        return TrainRun(model=model, train=TrainConfig(), corpus=CorpusConfig(objective=objective))

    with pytest.raises(ConfigError, match="sees the next token it would predict"):
        check_objective(run("next", True))
    with pytest.raises(ConfigError, match="a masked LM attends both ways"):
        check_objective(run("masked", False))
    check_objective(run("next", False))
    check_objective(run("masked", True))


def test_every_window_hides_a_token_even_at_a_tiny_rate() -> None:
    x = torch.randint(0, 256, (500, 8), generator=torch.Generator().manual_seed(0))
    _, targets = mask_tokens(x, 0.001, 256, 256, torch.Generator().manual_seed(1))
    assert ((targets != IGNORE).sum(1) >= 1).all()


def test_the_mask_rate_is_a_share() -> None:
    for rate in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match=r"mask_rate: must be in \(0, 1\)"):
            CorpusConfig(objective="masked", mask_rate=rate)


def test_a_masked_lm_is_evaluated_on_the_same_hidden_tokens_every_time() -> None:
    source = TextSource(CorpusConfig(objective="masked"), eval_tokens=512)
    torch.manual_seed(0)
    from nopelab.models.transformer import Transformer

    model = Transformer(ModelConfig(vocab_size=257, d_model=16, n_layers=1, n_heads=2,
                                    bidirectional=True)).eval()  # fmt: skip
    cpu, plain = torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False)
    first = source.evaluate(model, 32, True, cpu, plain)
    assert source.evaluate(model, 32, True, cpu, plain) == first
    assert first["loss"] == pytest.approx(torch.log(torch.tensor(257.0)).item(), rel=0.1)
