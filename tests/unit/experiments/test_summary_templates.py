"""The prose templates of the reproductions' ``summary.md``: each template is filled by some
module, every call passes exactly the template's placeholders, and a missing value is an error."""

from __future__ import annotations

import ast
from importlib import resources

import jinja2
import pytest

from nopelab.config import CorpusConfig, ModelConfig, TrainConfig
from nopelab.experiments.summary_template import (
    corpus_values,
    environment,
    fill,
    placeholders,
    schedule_values,
    shape_values,
    source,
)
from nopelab.training.run import TrainRun

PACKAGE = resources.files("nopelab.experiments")
PAPERS = sorted(p for p in PACKAGE.iterdir() if p.joinpath("__init__.py").is_file())
TEMPLATES = sorted(
    f"{paper.name}.{t.name.removesuffix('.md')}"
    for paper in PAPERS
    for t in paper.joinpath("templates").iterdir()
    if t.name.endswith(".md") and t.name != "sentences.md"
)
SENTENCES = sorted(  # a paper's verdict sentences: macros its modules call through sentence()
    f"{paper.name}.sentences"
    for paper in PAPERS
    if paper.joinpath("templates", "sentences.md").is_file()
)
MODULES = {
    f"{paper.name}.{m.name.removesuffix('.py')}": m
    for paper in PAPERS
    for m in paper.iterdir()
    if m.name.endswith(".py") and m.name != "__init__.py"
}


# the helpers whose values a call may spread (``**shape_values(m)``), with the keys they give
SPREAD = {
    "shape_values": set(shape_values(ModelConfig())),
    "schedule_values": set(schedule_values(TrainConfig())),
    "corpus_values": set(
        corpus_values(TrainRun(ModelConfig(), TrainConfig(), corpus=CorpusConfig()))
    ),
}


def fill_calls() -> list[tuple[str, str, set[str]]]:
    """Every ``fill("PAPER.NAME", key=...)`` call in ``experiments/PAPER/*.py``: (module
    ``PAPER.PART``, ``PAPER.NAME``, keys)."""
    calls = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fill":
                name = node.args[0]
                assert isinstance(name, ast.Constant), f"{path.name}: fill's name is not a literal"
                keys = {k.arg for k in node.keywords if k.arg is not None}
                for spread in (k.value for k in node.keywords if k.arg is None):
                    helper = getattr(getattr(spread, "func", None), "id", None)
                    assert helper in SPREAD, f"{path.name}: fill(**values) cannot be checked"
                    keys |= SPREAD[helper]
                calls.append((module, name.value, keys))
    return calls


CALLS = fill_calls()


def test_every_module_with_a_summary_fills_its_template() -> None:
    """No orphan template, and each part's main template is ``PAPER/templates/PART.md``."""
    assert len(TEMPLATES) == 13
    filled = {name for _, name, _ in CALLS}
    assert filled == set(TEMPLATES)
    for module, name, _ in CALLS:
        assert name.startswith(module), (module, name)
    with_summary = {m for m, path in MODULES.items() if "def summary_text(" in path.read_text()}
    assert with_summary == {module for module, _, _ in CALLS}
    assert with_summary <= set(TEMPLATES)


@pytest.mark.parametrize(("module", "name", "keys"), CALLS, ids=[c[1] for c in CALLS])
def test_a_call_passes_exactly_the_placeholders_of_its_template(
    module: str, name: str, keys: set[str]
) -> None:
    assert placeholders(name) == keys, module


def sentence_calls() -> set[tuple[str, str]]:
    """Every ``sentence("PAPER.sentences", "MACRO")`` call in the papers' modules."""
    calls = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "sentence":
                name, macro = (arg.value for arg in node.args if isinstance(arg, ast.Constant))
                calls.add((name, macro))
    return calls


def test_every_sentence_macro_is_called_and_every_call_finds_its_macro() -> None:
    assert SENTENCES == ["kazemnejad2023.sentences", "wang2024.sentences"]
    calls = sentence_calls()
    assert {name for name, _ in calls} == set(SENTENCES)
    for name in SENTENCES:
        module = environment().get_template(name).module
        defined = {m for m in dir(module) if not m.startswith("_")}
        called = {macro for n, macro in calls if n == name}
        used_inside = {m for m in defined if source(name).count(f"{m}(") > 1}  # by another
        assert called <= defined and defined <= called | used_inside, name


def test_a_missing_value_raises() -> None:
    values = dict.fromkeys(placeholders("zuo2025.random_init"), "x")
    assert "x layers" in fill("zuo2025.random_init", **values)
    del values["seed"]
    with pytest.raises(jinja2.UndefinedError, match="seed"):
        fill("zuo2025.random_init", **values)
