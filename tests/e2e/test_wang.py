"""``nopelab reproduce wang2024`` at smoke scale: every table's rows, the files, and a resume."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from helpers import assert_matches_reference, reproduce
from nopelab.experiments.wang2024.lengths import LENGTHS, MECHANISM_LENGTHS, SCALES

FILES = (
    "perplexity.parquet",
    "positions.parquet",
    "mechanisms.parquet",
    "perplexity.png",
    "mechanisms.png",
    "summary.json",
    "summary.md",
)


@pytest.mark.reference
@pytest.mark.slow
def test_wang2024_smoke_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "wang"
    reproduce(["wang2024", "--out", str(out)], monkeypatch)
    assert_matches_reference(out, "wang2024-lengths")
    for name in FILES:
        assert (out / name).is_file(), name
    run = json.loads((out / "run.json").read_text())
    assert run["command"] == (
        f"nopelab reproduce wang2024 --part lengths --scale smoke --seed 0 --device cpu --out {out}"
    )
    assert run["seconds"] > 0 and run["cores"] == os.cpu_count() and run["cpu"]
    scale = SCALES["smoke"]
    models = ["lm-none-seed0", "lm-rope-seed0"]
    fixes = ["none", *(f"uniform {c:g}" for c in scale.uniform), "headscale"]

    ppl = pd.read_parquet(out / "perplexity.parquet")
    keys = set(zip(ppl["model"], ppl["fix"], ppl["length_factor"], strict=True))
    assert len(ppl) == len(keys) == len(models) * len(fixes) * len(LENGTHS)
    assert keys == set(itertools.product(models, fixes, LENGTHS))
    assert set(ppl["pos_encoding"]) == {"none", "rope"} and set(ppl["seed"]) == {0}
    one = ppl[ppl["length_factor"] == 1].set_index(["model", "fix"])["perplexity"]
    for model in models:  # a uniform factor of 1 is the model as trained
        assert one[(model, "uniform 1")] == one[(model, "none")]

    positions = pd.read_parquet(out / "positions.parquet")
    covered = positions.groupby(["model", "fix", "length_factor", "length"])
    assert len(covered) == len(keys)
    for (_, _, _, length), rows in covered:
        assert rows["bucket_start"].iloc[0] == 1 and rows["bucket_end"].iloc[-1] == length
        assert rows["tokens"].sum() > 0

    mechanisms = pd.read_parquet(out / "mechanisms.parquet")
    layers = range(1, scale.model["n_layers"] + 1)
    measures = ["entropy", "variance", "adjacency"]
    columns = ["model", "length_factor", "layer", "measure"]
    found = set(mechanisms[columns].itertuples(index=False, name=None))
    assert found == set(itertools.product(models, MECHANISM_LENGTHS, layers, measures))
    assert mechanisms["value"].notna().all()

    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["breaks"]) == set(models)
    text = (out / "summary.md").read_text()
    assert "NoPE, seed 0 stays flat up to" in text and "Over the seeds" in text

    # interrupted before one model finished: --resume trains and measures only it, to the same rows
    kept = (out / "runs" / "lm-none-seed0" / "measured.json").stat().st_mtime_ns
    shutil.rmtree(out / "runs" / "lm-rope-seed0")
    for name in FILES:
        (out / name).unlink()
    reproduce(["wang2024", "--out", str(out), "--resume"], monkeypatch)
    for name in ("perplexity", "positions", "mechanisms"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(out / f"{name}.parquet"),
            {"perplexity": ppl, "positions": positions, "mechanisms": mechanisms}[name],
        )
    assert (out / "runs" / "lm-none-seed0" / "measured.json").stat().st_mtime_ns == kept
