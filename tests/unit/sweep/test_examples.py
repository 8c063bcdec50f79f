"""The grid files under examples/ are valid: every cell builds, with the sizes their comments give."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nopelab.sweep.grid import read_grid

EXAMPLES = sorted((Path(__file__).parents[3] / "examples").rglob("*.toml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_cell_of_an_example_grid_is_valid(path: Path) -> None:
    grid = read_grid(path)
    cells = grid.cells()  # builds and validates every cell's settings
    stated = re.search(r"(\d+) cells", path.read_text())
    assert stated is not None and int(stated.group(1)) == len(cells) == grid.size
