"""``nopelab reproduce`` reads its papers, parts and scales from the experiments' registry."""

from __future__ import annotations

import inspect

from nopelab.cli.reproduce import reproduce
from nopelab.experiments import EXPERIMENTS, with_reuse


def _help(name: str) -> str:
    parameter = inspect.signature(reproduce, eval_str=True).parameters[name]
    return parameter.annotation.__metadata__[0].help


def test_the_help_names_every_paper_part_and_scale() -> None:
    # the help is written out (importing every experiment would slow every command's start-up)
    papers, parts, scales = _help("paper"), _help("part"), _help("scale")
    for paper, experiment in EXPERIMENTS.items():
        assert paper in papers
        for name, part in experiment.parts.items():
            assert f"{paper}: " in parts and name in parts.split(f"{paper}: ")[1], (paper, name)
            assert all(scale in scales for scale in part.scales)


def test_models_is_offered_where_a_part_can_reuse_models() -> None:
    assert with_reuse() == ["zuo2025 --part probes"]
    assert "zuo2025 probes" in _help("models")
