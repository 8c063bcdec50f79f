"""zuo2025 --layout: the task models train on Zuo et al.'s 256-character windows instead of one
padded line per row, with the padded recipe's characters a step; every part built on the
trained one takes it."""

from __future__ import annotations

from nopelab.experiments.zuo2025 import mastery, probes, trained
from nopelab.training.task_config import max_line_len


def test_windows_are_zuos_256_characters_with_the_padded_characters_a_step() -> None:
    padded, windows = (
        trained.settings("small", 0, "cpu"),
        trained.settings("small", 0, "cpu", layout="windows"),
    )
    assert padded.runs.keys() == windows.runs.keys()
    for key, run in windows.runs.items():
        before = padded.runs[key]
        assert before.task_config.layout == "padded" and run.task_config.layout == "windows"
        line = max_line_len(before.task_config)
        assert before.train.seq_len == line and run.train.seq_len == trained.WINDOW == 256
        assert run.train.batch_size == max(1, round(before.train.batch_size * line / 256))
        assert run.train.steps == before.train.steps and run.model == before.model.__class__(
            **{**before.model.__dict__, "max_seq_len": 256}
        )


def test_the_parts_built_on_the_trained_models_take_the_layout() -> None:
    by_seed = mastery.settings("small", 0, "cpu", layout="windows").by_seed
    assert all(
        run.task_config.layout == "windows" for s in by_seed.values() for run in s.runs.values()
    )
    assert all(
        r.task_config.layout == "windows"
        for r in probes.settings("small", 0, "cpu", "windows").runs.values()
    )
    assert trained.settings("small", 0, "cpu", layout="padded") == trained.settings(
        "small", 0, "cpu"
    )


def test_a_scale_that_names_its_row_length_keeps_it() -> None:
    paper = trained.settings("paper", 0, "cpu")  # Zuo's own recipe: windows of 256, batch 256
    assert {(r.train.seq_len, r.train.batch_size) for r in paper.runs.values()} == {(256, 256)}
