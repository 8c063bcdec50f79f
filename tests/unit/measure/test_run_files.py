"""What an analysis writes: the cosine matrices' block size is recorded with them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nopelab.api import load
from nopelab.measure.analysis import analyze_model
from nopelab.measure.run_files import read_analysis, write_analysis


@pytest.mark.parametrize(("seq_len", "block"), [(40, 1), (1030, 2)])
def test_the_cosine_block_is_written_beside_the_matrices(tmp_path: Path, seq_len, block) -> None:
    study = load(
        model={"d_model": 8, "n_heads": 2, "n_layers": 1},
        analysis={"seq_len": seq_len, "samples": 1, "batch_size": 1, "sites": ["attn_out"]},
    )
    result = analyze_model(study.model, study.config.analysis, progress=False)
    write_analysis(tmp_path, study.config, result, 0.0, figures=False)
    assert json.loads((tmp_path / "summary.json").read_text())["cosine_block"] == block
    matrix = read_analysis(tmp_path).cosine[("attn_out", 1)]
    assert matrix.shape == (-(-seq_len // block),) * 2
    assert np.isfinite(matrix).all()
