"""haviv2022 --part sizes: its size list is checked, and its gaps and verdicts follow from the
perplexities (synthetic tables, worked out by hand)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from nopelab.errors import ConfigError, UserError
from nopelab.experiments.haviv2022.sizes import check_sizes, gap_table, size_table, verdicts


@pytest.mark.parametrize(
    "sizes",
    [
        [],
        [{"d_model": 32, "n_layers": 2}, {"d_model": 32, "n_layers": 2}],
        [{"d_model": 64, "n_layers": 2}, {"d_model": 32, "n_layers": 3}],
    ],
)
def test_a_size_list_that_is_empty_or_does_not_grow_is_refused(sizes: list) -> None:
    with pytest.raises(ConfigError, match="sizes"):
        check_sizes(sizes)


def test_parameters_are_counted_without_building_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count of a size is the built NoPE model's; a size too large to train is refused at
    once, naming --sizes, with no model built (building one took minutes)."""
    from nopelab.experiments.haviv2022 import sizes as haviv2022_sizes
    from nopelab.models import transformer

    sizes = [
        {"d_model": 24, "n_layers": 2, "n_heads": 2},
        {"d_model": 40, "n_layers": 3, "n_heads": 4},
    ]
    built = [
        sum(p.numel() for p in transformer.Transformer(m.run.model).parameters())
        for m in haviv2022_sizes.settings("smoke", 0, "cpu", sizes).models
        if m.pos_encoding == "none"
    ]

    def no_model(*args: object) -> None:
        raise AssertionError("a model was built")

    monkeypatch.setattr(transformer.Transformer, "__init__", no_model)
    settings = haviv2022_sizes.settings("smoke", 0, "cpu", sizes)
    assert [m.parameters for m in settings.models if m.pos_encoding == "none"] == built
    huge = [sizes[0], {"d_model": 100_000_000, "n_layers": 100_000, "n_heads": 2}]
    with pytest.raises(UserError, match=r"^--sizes: 100000000x100000x2: training needs about"):
        haviv2022_sizes.settings("smoke", 0, "cpu", huge)


def models(perplexity: dict[tuple[int, str, int], float]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"size": size, "parameters": 1000 * size, "pos_encoding": pe, "seed": seed,
             "perplexity": value, "tokens_per_parameter": 20.0, "epochs": 1.0}
            for (size, pe, seed), value in perplexity.items()
        ]
    )  # fmt: skip


def test_gaps_are_paired_by_size_and_seed_and_the_verdict_follows_the_spread() -> None:
    frame = models(
        {
            (1, "none", 0): 10.0, (1, "none", 1): 12.0,
            (1, "alibi", 0): 9.0, (1, "alibi", 1): 10.8,  # -10 % at both seeds
            (1, "learned", 0): 10.0, (1, "learned", 1): 12.6,  # 0 % and +5 %
            (2, "none", 0): 8.0, (2, "none", 1): 8.0,
            (2, "alibi", 0): 7.6, (2, "alibi", 1): 7.6,  # -5 %: shrinks beyond the spread
            (2, "learned", 0): 8.0, (2, "learned", 1): 8.4,  # 0 % and +5 %: no clear change
        }
    )  # fmt: skip
    gaps = gap_table(frame).set_index(["pos_encoding", "size"])
    assert gaps.loc[("alibi", 1), "gap_percent"] == pytest.approx(-10.0)
    assert gaps.loc[("alibi", 1), "gap_percent_std"] == pytest.approx(0.0)
    assert gaps.loc[("learned", 2), "gap_percent"] == pytest.approx(2.5)
    assert gaps.loc[("learned", 2), "gap"] == pytest.approx(0.2)
    assert list(gaps.index.get_level_values(0)) == ["learned"] * 2 + ["alibi"] * 2  # model order
    verdict = verdicts(gap_table(frame))
    assert verdict["gap_with_size"] == {"learned": "no clear change", "alibi": "shrinks"}
    assert verdict["learned_minus_nope_percent_at_largest"] == pytest.approx(2.5)
    table = size_table(frame).set_index(["size", "pos_encoding"])
    assert table.loc[(1, "none"), "perplexity"] == pytest.approx(11.0)
    assert table.loc[(1, "none"), "seeds"] == 2


@pytest.mark.parametrize("unit", ["byte", "BPE token"])
def test_the_figures_name_the_unit_of_their_perplexity(
    unit: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A BPE run's perplexity is per token, not per byte: both figures say which."""
    from nopelab.experiments.haviv2022 import figures
    from nopelab.experiments.haviv2022.sizes import LABELS, published_table

    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    ours = pd.DataFrame(
        [
            {"size": s, "parameters": p, "pos_encoding": pe, "perplexity": x, "perplexity_std": 0.1}
            for s, p in ((1, 20_000), (2, 70_000))
            for pe, x in (("none", 9.0), ("learned", 6.0))
        ]
    )
    curves = pd.DataFrame(
        [
            {
                "size": 1,
                "parameters": 20_000,
                "pos_encoding": pe,
                "seed": 0,
                "tokens": t,
                "loss": 2.0,
            }
            for pe in ("none", "learned")
            for t in (0, 1000)
        ]
    )
    figures.perplexity_by_size(ours, published_table(), LABELS, tmp_path / "a.png", unit)
    figures.learning_curves_by_size(curves, LABELS, tmp_path / "b.png", unit)
    sizes_fig, curves_fig = drawn
    assert sizes_fig.axes[0].get_title() == f"ours: held-out perplexity per {unit}"
    assert curves_fig.axes[0].get_ylabel() == f"held-out loss (nats per {unit})"
