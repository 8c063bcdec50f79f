"""The papers' published numbers: one data file per paper, each table with its source."""

from __future__ import annotations

import re

import pytest

from nopelab.experiments.scale_files import read_published


@pytest.mark.parametrize(
    ("paper", "authors"),
    [
        ("haviv2022", "Haviv et al. 2022"),
        ("kazemnejad2023", "Kazemnejad et al. 2023"),
        ("wang2024", "Wang et al. 2024"),
    ],
)
def test_every_published_table_names_its_source(paper: str, authors: str) -> None:
    tables = read_published(paper)
    assert tables
    for name, table in tables.items():
        assert re.fullmatch(rf"{authors}, (Table|Figure|Section|Appendix) .+", table["source"]), (
            name
        )


def test_the_published_numbers_reach_the_reproductions() -> None:
    from nopelab.experiments.haviv2022 import pretrained, sizes
    from nopelab.experiments.kazemnejad2023 import tasks

    assert pretrained.PUBLISHED_MAD["none"][6] == 16.5  # NoPE's minimum, Figure 2
    assert pytest.approx((1024**2 - 1) / (3 * 1024), abs=0.01) == pretrained.PUBLISHED_RANDOM
    assert sizes.PUBLISHED["alibi"][-1] == 12.51  # Table 2, 1.3B
    assert tasks.PUBLISHED_MRR["none"] == 0.69 and tasks.PUBLISHED_MRR["t5"] == 0.55


def test_headscale_starts_at_wang_et_als_published_fit() -> None:
    from nopelab.training.headscale import FIT_SLOPE, fitted_scale

    assert read_published("wang2024")["fit"]["slope"] == FIT_SLOPE
    published = read_published("wang2024")["uniform"]
    for factor, scale in zip(published["length_factor"], published["scale"], strict=True):
        assert fitted_scale(factor) == pytest.approx(scale, abs=0.1)  # their rule of thumb


def test_wang_et_als_table_on_their_page_is_their_data_file() -> None:
    """docs/wang2024.md's copy of their Table 2 says what published.toml holds."""
    from pathlib import Path

    page = (Path(__file__).parents[3] / "docs" / "wang2024.md").read_text()
    pg19 = read_published("wang2024")["pg19"]
    labels = {"rope": "RoPE", "none": "NoPE"}
    for key, values in pg19.items():
        if key in ("source", "lengths") or key == "HeadScale 18K":
            continue
        method, _, setting = key.partition(" ")
        label = labels.get(key) or (
            f"NoPE, uniform {setting}/√d"
            if method == "uniform"
            else f"NoPE, HeadScale trained at {setting}"
        )
        cells = " | ".join("> 1000" if v == ">1000" else f"{v:.1f}" for v in values)
        assert f"| {label} | {cells} |" in page, key
