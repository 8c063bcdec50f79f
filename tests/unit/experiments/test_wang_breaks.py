"""wang2024: where a curve breaks past the training length, and the flat length of each fix."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from nopelab.experiments.wang2024.lengths import (
    adjacency_change,
    break_length,
    fix_table,
    flat_comparison,
    loss_break,
    model_name,
    seed_table,
)
from nopelab.measure.breaks import departure, lasting_from, order
from nopelab.measure.length import log_buckets

T = 64


def bucket_middles(length: int, buckets: int) -> np.ndarray:
    return np.array([math.sqrt(a * b) for a, b in log_buckets(length, buckets)])


def test_departure_finds_a_known_kink_in_a_log_linear_curve() -> None:
    positions = bucket_middles(8 * T, 32)
    kink = 3 * T
    values = 0.8 * np.log(positions) + 0.5
    values += np.where(positions > kink, 1.5 * np.log(positions / kink), 0.0)
    found = departure(positions, values, T, tolerance=0.1)
    assert found is not None
    # the first bucket past the kink where 1.5 ln(p / kink) > 0.1: p > kink * e^(0.1 / 1.5)
    expected = positions[positions > kink * math.exp(0.1 / 1.5)][0]
    assert found == pytest.approx(expected)


def test_departure_is_none_for_a_straight_curve_and_ignores_a_passing_blip() -> None:
    positions = bucket_middles(8 * T, 32)
    values = 0.8 * np.log(positions) + 0.5
    assert departure(positions, values, T, tolerance=0.1) is None
    blip = values.copy()
    blip[np.argmax(positions > 2 * T)] += 1.0  # one bucket off, then back on the line
    assert departure(positions, blip, T, tolerance=0.1) is None


def test_lasting_from_needs_every_later_position() -> None:
    positions = np.array([1.0, 2, 4, 8, 16, 32])
    exceeds = np.array([True, False, True, False, True, True])
    assert lasting_from(positions, exceeds, after=1) == 16
    assert lasting_from(positions, exceeds, after=20) == 32
    assert lasting_from(positions, np.array([True] * 5 + [False]), after=1) is None


def test_loss_break_against_the_level_within_the_training_length() -> None:
    positions = np.array([10.0, 40, 50, 60, 70, 100, 200, 400])
    loss = np.array([3.0, 2.0, 2.0, 2.0, 2.05, 2.2, 2.3, 2.6])  # level 2.0 over 32..64
    assert loss_break(positions, loss, T) == 100  # 2.2 > 2.0 + ln 1.1 = 2.095; 2.05 is not
    assert loss_break(positions, np.minimum(loss, 2.05), T) is None


def test_flat_and_break_lengths() -> None:
    assert break_length({1: 10.0, 2: 10.9, 4: 11.5, 8: 30.0}) == 4  # 11.5 > 11: flat to 2x
    assert break_length({1: 10.0, 2: 9.0, 4: 10.5}) is None


def test_order_of_two_breaks() -> None:
    assert order(100, 120) == "with"  # within a factor 1.5
    assert order(100, 200) == "before"
    assert order(300, 100) == "after"
    assert order(None, None) == "neither"
    assert order(100, None) == "only first"
    assert order(None, 100) == "only second"


def test_adjacency_change_is_the_first_length_that_moves_in_some_layer() -> None:
    rows = pd.DataFrame(
        {
            "length_factor": [1, 1, 2, 2, 4, 4],
            "layer": [1, 2, 1, 2, 1, 2],
            "value": [0.9, 0.8, 0.88, 0.82, 0.9, 0.7],
        }
    )
    assert adjacency_change(rows) == 4
    assert adjacency_change(rows[rows["length_factor"] < 4]) is None


def test_fix_table_flat_length_and_cost_at_1x() -> None:
    lengths = [1, 2, 4, 8, 16]
    ppl = {"none": [10, 10.5, 12, 20, 40], "uniform 1.5": [10.2, 10.3, 10.9, 11.2, 15]}
    frame = pd.DataFrame(
        [
            {"model": "lm-none", "fix": fix, "length_factor": f, "perplexity": p}
            for fix, values in ppl.items()
            for f, p in zip(lengths, values, strict=True)
        ]
    )
    table = fix_table(frame).set_index("fix")
    assert table.loc["none", "flat_length"] == 2
    # against the model as trained (1.1 x 10 = 11), not the fix's own 1x (1.1 x 10.2 = 11.22)
    assert table.loc["uniform 1.5", "flat_length"] == 4
    assert table.loc["none", "cost_at_1x_percent"] == 0
    assert table.loc["uniform 1.5", "cost_at_1x_percent"] == pytest.approx(2.0)


def test_seed_table_gives_each_encodings_range_over_its_seeds() -> None:
    """Two NoPE seeds and one RoPE seed, worked by hand (T = 64)."""

    def breaks(flat: int, loss: float | None, entropy: float | None) -> dict:
        return {"flat_length": flat, "loss_break": loss, "entropy_inflection_earliest": entropy,
                "variance_departure": None}  # fmt: skip

    found = {
        "lm-none-seed0": breaks(2, 80.0, 64.0),
        "lm-none-seed1": breaks(1, 128.0, None),
        "lm-rope-seed0": breaks(1, 70.0, 66.0),
    }
    fixes = pd.DataFrame(
        [
            {"model": "lm-none-seed0", "fix": "none", "ppl_1x": 4.0, "ppl_2x": 4.4},
            {"model": "lm-none-seed0", "fix": "headscale", "ppl_1x": 9.0, "ppl_2x": 9.0},
            {"model": "lm-none-seed1", "fix": "none", "ppl_1x": 5.0, "ppl_2x": 5.25},
            {"model": "lm-rope-seed0", "fix": "none", "ppl_1x": 3.0, "ppl_2x": 6.0},
        ]
    )
    table = seed_table(found, fixes, 64).set_index("model")
    assert table.loc["NoPE", "seeds"] == 2 and table.loc["NoPE", "flat length"] == "2x, 1x"
    assert table.loc["NoPE", "2x perplexity"] == "+5.0 … +10.0 %"
    assert table.loc["NoPE", "loss break"] == "1.2 … 2x"  # 80 / 64 and 128 / 64
    assert table.loc["NoPE", "entropy inflection"] == "1x, none in 1"
    assert table.loc["NoPE", "variance departure"] == "none in 2"
    assert table.loc["RoPE", "2x perplexity"] == "+100.0 %"
    assert model_name("lm-rope-seed12") == "RoPE, seed 12"


def test_flat_comparison_counts_the_seeds_where_nope_is_flat_longer() -> None:
    flat = {"lm-none-seed0": 1.2, "lm-rope-seed0": 1.1, "lm-none-seed1": 1.1,
            "lm-rope-seed1": 1.1, "lm-none-seed2": 1.0, "lm-rope-seed2": 1.25}  # fmt: skip
    breaks = {key: {"flat_length": value} for key, value in flat.items()}
    assert flat_comparison(breaks) == (
        "NoPE's flat length is longer than RoPE's at 1 of 3 seeds, the same at 1 "
        "(NoPE 1.2x, 1.1x, 1x; RoPE 1.1x, 1.1x, 1.25x)."
    )
