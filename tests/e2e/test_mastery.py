"""Training to a target accuracy (``stop_at``), and the steps-to-mastery reproduction."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import assert_matches_reference, run_cli
from nopelab.config import ModelConfig, TrainConfig
from nopelab.errors import ConfigError
from nopelab.experiments.train_and_measure import stage_folder, train_into
from nopelab.experiments.zuo2025 import mastery as zuo2025_mastery
from nopelab.experiments.zuo2025 import trained as zuo2025_trained
from nopelab.training.run import TrainRun
from nopelab.training.task_config import TaskConfig
from nopelab.training.train import train


def wherex_run(stop_at: float | None = None, steps: int = 40) -> TrainRun:
    """A tiny wherex model whose held-out accuracy moves within a few dozen steps."""
    return TrainRun(
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=16),
        train=TrainConfig(
            steps=steps,
            batch_size=16,
            seq_len=16,
            lr=3e-3,
            warmup=2,
            eval_every=4,
            eval_samples=32,
            checkpoint_every=8,
            stop_at=stop_at,
            device="cpu",
        ),
        task=TaskConfig(name="wherex", max_len=3, train_size=300, test_size=32, layout="padded"),
    )


@pytest.fixture(scope="module")
def unstopped(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The evaluations of the run trained for all its steps."""
    out = tmp_path_factory.mktemp("unstopped") / "run"
    train(wherex_run(), out, progress=False)
    return pd.read_csv(out / "eval.csv")


def target_and_stop(evals: pd.DataFrame) -> tuple[float, int]:
    """A target first reached before the last evaluation, and the step where that happens."""
    early = evals[evals["step"] < evals["step"].max()]
    target = float(early["accuracy"].max())
    assert target > 0, "the tiny run must learn something for the test to mean anything"
    return target, int(early.loc[early["accuracy"] >= target, "step"].iloc[0])


@pytest.mark.slow
def test_a_run_stops_at_the_first_evaluation_that_reaches_the_target(
    tmp_path: Path, unstopped: pd.DataFrame
) -> None:
    target, stop = target_and_stop(unstopped)
    summary = train(wherex_run(stop_at=target), tmp_path / "run", progress=False)
    assert summary is not None
    assert summary["steps"] == summary["steps_to_target"] == stop
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert metrics["step"].max() == stop
    evals = pd.read_csv(tmp_path / "run" / "eval.csv")
    # the same seed retraces the unstopped run up to the stop
    pd.testing.assert_series_equal(
        evals["accuracy"], unstopped["accuracy"][: len(evals)], check_names=False
    )
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["step"] == stop


@pytest.mark.slow
def test_a_target_never_reached_trains_every_step(tmp_path: Path, unstopped: pd.DataFrame) -> None:
    above = float(unstopped["accuracy"].max()) + 1e-6
    if above > 1:
        pytest.skip("the tiny run reached accuracy 1")
    summary = train(wherex_run(stop_at=above), tmp_path / "run", progress=False)
    assert summary is not None
    assert summary["steps"] == 40 and summary["steps_to_target"] is None


@pytest.mark.slow
def test_a_run_killed_after_reaching_the_target_finishes_without_training(
    tmp_path: Path, unstopped: pd.DataFrame
) -> None:
    target, stop = target_and_stop(unstopped)
    out = tmp_path / "run"
    finished = train(wherex_run(stop_at=target), out, progress=False)
    (out / "summary.json").unlink()  # as if killed between the last checkpoint and the summary
    rows = len(pd.read_csv(out / "metrics.csv"))
    resumed = train(wherex_run(stop_at=target), out, resume=True, progress=False)
    assert resumed is not None and finished is not None
    assert resumed["steps_to_target"] == stop
    assert resumed["final_eval"] == finished["final_eval"]
    assert len(pd.read_csv(out / "metrics.csv")) == rows


def test_stop_at_is_checked() -> None:
    with pytest.raises(ConfigError, match="stop_at"):
        TrainConfig(stop_at=1.5)
    with pytest.raises(ConfigError, match="stop_at"):
        TrainConfig(stop_at=0.0)


@pytest.mark.slow
def test_a_moved_curriculum_folder_resumes(tmp_path: Path) -> None:
    """A stage's ``init_from`` is an absolute path; once the folder has a checkpoint it no
    longer matters, so the reproduction folder can be moved and continued."""
    final = wherex_run(steps=12)
    first = dataclasses.replace(
        final, task=dataclasses.replace(final.task, max_len=2, train_size=90)
    )
    whole = train_into(final, tmp_path / "whole" / "runs" / "wherex-none", stages=(first,))
    folder = tmp_path / "before" / "runs" / "wherex-none"
    train_into(first, stage_folder(folder, 1))
    started = dataclasses.replace(
        final,
        train=dataclasses.replace(final.train, init_from=str(stage_folder(folder, 1).absolute())),
    )
    assert train(started, folder, progress=False, stop_after=8) is None
    shutil.move(tmp_path / "before", tmp_path / "after")
    moved = tmp_path / "after" / "runs" / "wherex-none"
    summary = train_into(final, moved, stages=(first,))
    assert summary["final_eval"] == whole["final_eval"]


def test_spread_table_against_a_hand_count() -> None:
    table = pd.DataFrame(
        {
            "task": ["add"] * 6,
            "pos_encoding": ["none"] * 3 + ["rope"] * 3,
            "seed": [0, 1, 2] * 2,
            "accuracy": [1.0, 0.995, 0.99, 0.5, 0.99, 1.0],
            "steps_to_target": [1200.0, 1500.0, 2100.0, np.nan, 900.0, 700.0],
            "steps_trained": [1200, 1500, 2100, 4000, 900, 700],
        }
    )
    spread = zuo2025_mastery.spread_table(table).set_index("pos_encoding")
    none, rope = spread.loc["none"], spread.loc["rope"]
    assert (none["mastered"], none["seeds"]) == (3, 3)
    assert none["steps_mean"] == pytest.approx(1600.0)
    assert none["steps_std"] == pytest.approx(np.std([1200, 1500, 2100], ddof=1))
    assert (none["steps_min"], none["steps_max"]) == (1200, 2100)
    assert (rope["mastered"], rope["steps_mean"], rope["accuracy_min"]) == (2, 800.0, 0.5)
    assert zuo2025_mastery._cell(rope) == "2/3: 800 ± 141 (700–900)"


@pytest.mark.slow
def test_mastery_part_reports_every_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The part at smoke scale, reduced to wherex with NoPE at two seeds: each seed's run is the
    trained part's run at that seed, and the tables agree with the runs' summaries."""
    monkeypatch.setattr(zuo2025_trained, "TASKS", ("wherex",))
    monkeypatch.setattr(zuo2025_trained, "POS_ENCODINGS", ("none",))
    monkeypatch.setattr(zuo2025_mastery, "SEEDS", 2)
    settings = zuo2025_mastery.settings("smoke", 5, "cpu")
    settings = dataclasses.replace(settings, workers=1)
    assert (
        settings.by_seed[6].runs["wherex", "none"]
        == (zuo2025_trained.settings("smoke", 6, "cpu").runs["wherex", "none"])
    )
    zuo2025_mastery.run(settings, tmp_path)
    table = pd.read_parquet(tmp_path / "mastery.parquet")
    assert list(table["seed"]) == [5, 6]
    for row in table.itertuples():
        folder = tmp_path / "runs" / f"wherex-none-seed{row.seed}"
        stage = json.loads((stage_folder(folder, 1) / "summary.json").read_text())
        final = json.loads((folder / "summary.json").read_text())
        assert row.steps_trained == stage["steps"] + final["steps"]
        assert row.accuracy == final["final_eval"]["accuracy"]
        assert (row.steps_to_target == row.steps_trained) == (final["steps_to_target"] is not None)
    text = (tmp_path / "summary.md").read_text()
    assert "seeds 5, 6" in text and "| wherex | none |" in text
    assert (tmp_path / "mastery.png").stat().st_size > 0


@pytest.mark.reference
@pytest.mark.slow
def test_mastery_smoke_matches_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "mastery"
    argv = ["reproduce", "zuo2025", "--part", "mastery", "--scale", "smoke", "--device", "cpu"]
    assert run_cli([*argv, "--out", str(out)], monkeypatch) == 0
    assert_matches_reference(out, "zuo2025-mastery")
