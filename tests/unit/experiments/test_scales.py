"""The reproductions' scale files: every part builds valid settings at every scale it offers,
and a scale table with a key its schema does not have (or without one it needs) is refused."""

from __future__ import annotations

from importlib import resources
from typing import TypedDict

import pytest

from nopelab.experiments import EXPERIMENTS
from nopelab.experiments.scale_files import parse_scales
from nopelab.experiments.zuo2025_trained import Scale

PARTS = [
    (paper, name, scale)
    for paper, experiment in EXPERIMENTS.items()
    for name, part in experiment.parts.items()
    for scale in part.scales
]


@pytest.mark.parametrize(("paper", "part", "scale"), PARTS)
def test_every_part_builds_valid_settings_at_every_scale(paper: str, part: str, scale: str) -> None:
    # the config dataclasses validate on construction: a bad value in a scale file raises here
    assert EXPERIMENTS[paper].parts[part].settings(scale, 0, "cpu") is not None


def test_every_scale_file_is_read_by_an_experiment() -> None:
    """No orphan file: each ``scales/NAME.toml`` is what module ``experiments.NAME`` reads."""
    folder = resources.files("nopelab.experiments").joinpath("scales")
    names = sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )
    assert len(names) == 11
    for name in names:
        source = resources.files("nopelab.experiments").joinpath(f"{name}.py").read_text()
        assert f'read_scales("{name}"' in source, name


class Small(TypedDict):
    width: int
    depth: int


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[a]\nwidth = 1\ndepth = 2\nwidht = 3\n", "x.toml [a]: unknown key 'widht'"),
        ("[a]\nwidth = 1\n", "x.toml [a]: missing key 'depth'"),
        ("a = 1\n", "x.toml [a]: expected a table of settings"),
    ],
)
def test_a_bad_scale_table_is_refused_naming_file_scale_and_key(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_scales(text, "x.toml", Small)


def test_dataclass_schemas_know_their_optional_fields() -> None:
    text = "[s]\nlengths = {}\nsteps = {}\nmodel = {}\ntrain = {}\ntrain_size = {}\ntest_size = 1\n"
    assert parse_scales(text, "x.toml", Scale)["s"]["test_size"] == 1  # the rest have defaults
    with pytest.raises(ValueError, match="missing key 'test_size'"):
        parse_scales(text.replace("test_size = 1\n", ""), "x.toml", Scale)
