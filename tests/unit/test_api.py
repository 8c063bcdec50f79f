"""The Python API resolves and analyses models exactly as the command line does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nopelab
from helpers import run_cli
from nopelab.errors import ConfigError, UserError

MODEL = {"n_layers": 2, "n_heads": 2, "d_model": 16}
ANALYSIS = {"seq_len": 12, "samples": 4, "batch_size": 2, "device": "cpu", "seed": 3}


def test_the_documented_example_runs() -> None:
    study = nopelab.load(model={"n_layers": 2}, analysis={"seq_len": 64, "samples": 8})
    rows = nopelab.summary_rows(nopelab.analyze(study, progress=False))
    assert round(rows[0]["adjacency_mean"], 1) == 0.5  # random input vectors: chance
    assert rows[1]["site"] == "attn_out" and rows[1]["adjacency_mean"] > 0.8


def test_api_and_command_line_give_the_same_rows(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "run"
    flags = ["--layers", "2", "--heads", "2", "--d-model", "16", "--seq-len", "12", "--samples",
             "4", "--batch-size", "2", "--device", "cpu", "--seed", "3"]  # fmt: skip
    assert run_cli(["analyze", *flags, "--out", str(out)], monkeypatch) == 0
    cli_rows = json.loads((out / "summary.json").read_text())["rows"]
    study = nopelab.load(model=MODEL, analysis=ANALYSIS)
    api_rows = nopelab.summary_rows(nopelab.analyze(study, progress=False))
    assert json.loads(json.dumps(api_rows)) == cli_rows  # the same seed: the same numbers


def test_a_training_run_gives_its_model_and_held_out_data(finished_run: Path) -> None:
    study = nopelab.load(finished_run, analysis={"seq_len": 16, "samples": 2, "device": "cpu"})
    assert study.config.model.d_model == 16 and study.config.analysis.input == "data"
    assert study.source is not None
    rows = nopelab.summary_rows(nopelab.analyze(study, progress=False))
    assert len(rows) == 1 + 4 * 2  # embed + four block sites in each of two layers
    prompts = nopelab.load(finished_run, analysis={"input": "prompts", "seq_len": 16, "samples": 2})
    assert prompts.config.analysis.input == "prompts"


def test_bad_requests_are_user_errors(finished_run: Path) -> None:
    with pytest.raises(UserError, match="fixes the model"):
        nopelab.load(finished_run, model={"n_layers": 3})
    with pytest.raises(ConfigError, match="input: data needs a training run directory"):
        nopelab.load(model=MODEL, analysis={"input": "data"})
    with pytest.raises(ConfigError, match="seq_len"):
        nopelab.load(model=MODEL, analysis={"seq_len": 2})
    with pytest.raises(UserError, match=r"has no config\.json"):
        nopelab.load(finished_run.parent / "missing")
