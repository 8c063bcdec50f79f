"""kazemnejad2023 end to end at smoke scale: every row and file, and a resume that retrains only
the missing model, to the same numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from helpers import assert_matches_reference, reproduce, run_cli
from nopelab.experiments.kazemnejad2023.tasks import POS_ENCODINGS, SCALES, STRETCH


@pytest.mark.reference
@pytest.mark.slow
def test_kazemnejad2023_smoke_and_its_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "kazemnejad"
    reproduce(["kazemnejad2023", "--out", str(out)], monkeypatch)
    assert_matches_reference(out, "kazemnejad2023-tasks")
    scale = SCALES["smoke"]
    tasks = list(scale.max_len)
    table = pd.read_parquet(out / "accuracy.parquet")
    assert table.groupby(["task", "pos_encoding", "seed", "length"]).size().eq(1).all()
    for (task, _), rows in table.groupby(["task", "pos_encoding"]):  # every length, once
        assert list(rows["length"]) == list(range(1, STRETCH * scale.max_len[task] + 1))
    assert len(table.groupby(["task", "pos_encoding"])) == len(tasks) * len(POS_ENCODINGS)
    assert table["accuracy"].between(0, 1).all()
    assert (table["max_len"] == table["task"].map(scale.max_len)).all()
    assert (table["in_distribution"] == (table["length"] <= table["max_len"])).all()
    assert (table["instances"] <= scale.per_length).all() and (table["instances"] > 0).all()
    assert (table.loc[table["length"] > 2, "instances"] == scale.per_length).all()
    assert (table.loc[~table["in_distribution"], "seen"] == 0).all()  # longer than any trained
    ranks = pd.read_parquet(out / "ranks.parquet")
    assert len(ranks) == len(tasks) * len(POS_ENCODINGS)
    n = len(POS_ENCODINGS)
    assert ranks.groupby("task")["rank"].sum().eq(n * (n + 1) / 2).all()  # 1 + ... + n, ties or not
    mrr = pd.read_parquet(out / "mrr.parquet")
    assert list(mrr["pos_encoding"]) == list(POS_ENCODINGS)
    assert mrr["published_mrr"].tolist() == [0.69, 0.22, 0.22, 0.33, 0.50, 0.55]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_len"] == scale.max_len and summary["stretch"] == STRETCH
    text = (out / "summary.md").read_text()
    assert "Does NoPE generalise best here?" in text and "| T5 bias |" in text
    assert (out / "accuracy_by_length.png").stat().st_size > 0
    models = pd.read_parquet(out / "models.parquet")
    assert len(models) == len(tasks) * len(POS_ENCODINGS)
    measured = pd.read_parquet(out / "mechanisms.parquet")  # every model, length and layer
    layers = SCALES["smoke"].model["n_layers"]
    assert len(measured) == len(table) * layers
    assert measured.groupby(["task", "pos_encoding", "seed", "length"]).size().eq(layers).all()
    assert measured["entropy_ratio"].between(0, 1 + 1e-6).all() and measured.notna().all().all()
    broken = pd.read_parquet(out / "breaks.parquet")
    assert len(broken) == len(models) and len(summary["breaks"]) == len(models)
    assert "## Position mechanisms past the training lengths" in text
    assert (out / "mechanisms_by_length.png").stat().st_size > 0

    # interrupted after some models: --resume trains only the missing one, to the same numbers
    kept = {p.name: (p / "summary.json").stat().st_mtime_ns for p in (out / "runs").iterdir()}
    gone = f"{tasks[0]}-rope-seed0"
    shutil.rmtree(out / "runs" / gone)
    del kept[gone]
    for name in ("accuracy.parquet", "summary.json", "summary.md"):
        (out / name).unlink()
    reproduce(["kazemnejad2023", "--out", str(out), "--resume"], monkeypatch)
    for name, mtime in kept.items():
        assert (out / "runs" / name / "summary.json").stat().st_mtime_ns == mtime
    assert (out / "runs" / gone / "lengths.json").is_file()
    pd.testing.assert_frame_equal(pd.read_parquet(out / "accuracy.parquet"), table)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "mechanisms.parquet"), measured)


def test_an_unknown_scale_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["reproduce", "kazemnejad2023", "--scale", "paper", "--out", str(tmp_path / "o")]
    assert run_cli(args, monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--scale" in err and "medium" in err, err
    assert not (tmp_path / "o").exists()
