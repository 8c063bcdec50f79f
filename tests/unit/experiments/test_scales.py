"""The reproductions' scale files: every part builds valid settings at every scale it offers,
and a scale table with a key its schema does not have, without one it needs, or with a value of
the wrong type (nested tables and list items too) is refused."""

from __future__ import annotations

import importlib
import re
from importlib import resources
from typing import Literal

import pytest

from nopelab.experiments import EXPERIMENTS
from nopelab.experiments.scale_files import SCHEMAS, parse_scales, scale_schema
from nopelab.experiments.zuo2025.trained import Scale

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
    """No orphan file: each ``PAPER/scales/PART.toml`` is what module ``PAPER.PART`` reads."""
    package = resources.files("nopelab.experiments")
    names = sorted(
        (paper.name, f.name.removesuffix(".toml"))
        for paper in package.iterdir()
        if paper.joinpath("scales").is_dir()
        for f in paper.joinpath("scales").iterdir()
        if f.name.endswith(".toml")
    )
    assert len(names) == 12
    for paper, part in names:
        source = package.joinpath(paper, f"{part}.py").read_text()
        assert f'read_scales("{paper}.{part}"' in source, (paper, part)


@scale_schema
class Depth:
    depth: int
    rate: float = 0.5


@scale_schema
class Small:
    width: int
    inner: Depth
    widths: tuple[int, ...] = ()
    kind: Literal["a", "b"] = "a"


GOOD = "[a]\nwidth = 1\ninner = {depth = 2}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD + "widht = 3\n", "[a]: unknown key 'widht'"),
        ("[a]\nwidth = 1\n", "[a]: missing key 'inner'"),
        ("[a]\nwidth = 1\ninner = {depth = 2, dpeth = 3}\n", "[a]: unknown key 'inner.dpeth'"),
        ("a = 1\n", "[a]: expected a table of settings"),
        ('[a]\nwidth = "1"\ninner = {depth = 2}\n', "[a]: width: Input should be a valid integer"),
        ("[a]\nwidth = 1.5\ninner = {depth = 2}\n", "[a]: width: Input should be a valid integer"),
        ("[a]\nwidth = true\ninner = {depth = 2}\n", "[a]: width: Input should be a valid integer"),
        (GOOD + "widths = [1, 2.5]\n", "[a]: widths.1: Input should be a valid integer"),
        (GOOD + 'kind = "c"\n', "[a]: kind: Input should be 'a' or 'b'"),
        (GOOD + "widths = 1979-05-27\n", "[a]: a date or time is no setting"),
        ('[a]\nwidth = 1\ninner = {depth = 2, rate = "x"}\n', "[a]: inner.rate: Input should be"),
    ],
)
def test_a_bad_scale_table_is_refused_naming_file_scale_and_key(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape("x.toml " + message)):
        parse_scales(text, "x.toml", Small)


def test_a_scale_table_is_built_as_its_schema() -> None:
    built = parse_scales(
        GOOD + "widths = [3, 4]\n[b]\nwidth = 2\ninner = {depth = 1, rate = 1}\n", "x.toml", Small
    )
    assert list(built) == ["a", "b"]  # file order
    assert built["a"] == Small(width=1, inner=Depth(depth=2), widths=(3, 4))
    assert built["b"].inner.rate == 1.0 and isinstance(built["b"].inner.rate, float)


@pytest.mark.parametrize(("paper", "part", "scale"), PARTS)
def test_every_scale_is_read_as_a_marked_schema(paper: str, part: str, scale: str) -> None:
    found = EXPERIMENTS[paper].parts[part]
    module = importlib.import_module(f"nopelab.experiments.{found.scale_file or found.module}")
    assert type(module.SCALES[scale]) in SCHEMAS


def test_dataclass_schemas_know_their_optional_fields() -> None:
    text = "[s]\nlengths = {}\nsteps = {}\nmodel = {}\ntrain = {}\ntrain_size = {}\ntest_size = 1\n"
    assert parse_scales(text, "x.toml", Scale)["s"].test_size == 1  # the rest have defaults
    with pytest.raises(ValueError, match="missing key 'test_size'"):
        parse_scales(text.replace("test_size = 1\n", ""), "x.toml", Scale)
