"""The papers' published numbers: one data file per paper, each table with its source."""

from __future__ import annotations

import pytest

from nopelab.experiments.scale_files import read_published


@pytest.mark.parametrize("paper", ["haviv2022", "kazemnejad2023"])
def test_every_published_table_names_its_source(paper: str) -> None:
    tables = read_published(paper)
    assert tables
    for name, table in tables.items():
        assert table["source"].startswith(("Haviv et al. 2022, ", "Kazemnejad et al. 2023, ")), name


def test_the_published_numbers_reach_the_reproductions() -> None:
    from nopelab.experiments.haviv2022 import pretrained, sizes
    from nopelab.experiments.kazemnejad2023 import tasks

    assert pretrained.PUBLISHED_MAD["none"][6] == 16.5  # NoPE's minimum, Figure 2
    assert pytest.approx((1024**2 - 1) / (3 * 1024), abs=0.01) == pretrained.PUBLISHED_RANDOM
    assert sizes.PUBLISHED["alibi"][-1] == 12.51  # Table 2, 1.3B
    assert tasks.PUBLISHED_MRR["none"] == 0.69 and tasks.PUBLISHED_MRR["t5"] == 0.55
