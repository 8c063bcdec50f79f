"""What the figures draw: a heatmap tile shows the block means of a large matrix."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from nopelab.plots import _block_means


@given(rows=st.integers(1, 40), cols=st.integers(1, 40), most=st.integers(1, 12))
def test_block_means_average_every_square_of_the_matrix(rows: int, cols: int, most: int) -> None:
    matrix = np.random.default_rng(rows * 41 + cols).standard_normal((rows, cols))
    shown = _block_means(matrix, most)
    k = -(-max(rows, cols) // most)
    assert shown.shape == (-(-rows // k), -(-cols // k)) and max(shown.shape) <= most
    for i in range(shown.shape[0]):  # brute force: each entry is its square's mean
        for j in range(shown.shape[1]):
            assert np.isclose(shown[i, j], matrix[i * k : (i + 1) * k, j * k : (j + 1) * k].mean())
