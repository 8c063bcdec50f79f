"""The prose templates of the reproductions' ``summary.md``: each template is filled by some
module, every call passes exactly the template's placeholders, and a missing value is an error."""

from __future__ import annotations

import ast
from importlib import resources

import pytest

from nopelab.config import CorpusConfig, ModelConfig, TrainConfig
from nopelab.experiments.summary_template import (
    corpus_values,
    fill,
    schedule_values,
    shape_values,
    template,
)
from nopelab.training.run import TrainRun

PACKAGE = resources.files("nopelab.experiments")
TEMPLATES = sorted(
    p.name.removesuffix(".md")
    for p in PACKAGE.joinpath("templates").iterdir()
    if p.name.endswith(".md")
)


# the helpers whose values a call may spread (``**shape_values(m)``), with the keys they give
SPREAD = {
    "shape_values": set(shape_values(ModelConfig())),
    "schedule_values": set(schedule_values(TrainConfig())),
    "corpus_values": set(
        corpus_values(TrainRun(ModelConfig(), TrainConfig(), corpus=CorpusConfig()))
    ),
}


def fill_calls() -> list[tuple[str, str, set[str]]]:
    """Every ``fill("NAME", key=...)`` call in ``experiments/*.py``: (module, NAME, keys)."""
    calls = []
    for path in PACKAGE.iterdir():
        if not path.name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fill":
                name = node.args[0]
                assert isinstance(name, ast.Constant), f"{path.name}: fill's name is not a literal"
                keys = {k.arg for k in node.keywords if k.arg is not None}
                for spread in (k.value for k in node.keywords if k.arg is None):
                    helper = getattr(getattr(spread, "func", None), "id", None)
                    assert helper in SPREAD, f"{path.name}: fill(**values) cannot be checked"
                    keys |= SPREAD[helper]
                calls.append((path.name.removesuffix(".py"), name.value, keys))
    return calls


CALLS = fill_calls()


def test_every_module_with_a_summary_fills_its_template() -> None:
    """No orphan template, and each module's main template is ``templates/MODULE.md``."""
    assert len(TEMPLATES) == 14
    filled = {name for _, name, _ in CALLS}
    assert filled == set(TEMPLATES)
    for module, name, _ in CALLS:
        assert name.startswith(module), (module, name)
    modules = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name.endswith(".py")}
    with_summary = {
        m for m in modules if "def summary_text(" in PACKAGE.joinpath(f"{m}.py").read_text()
    }
    assert with_summary == {module for module, _, _ in CALLS}
    assert with_summary <= set(TEMPLATES)


@pytest.mark.parametrize(("module", "name", "keys"), CALLS, ids=[c[1] for c in CALLS])
def test_a_call_passes_exactly_the_placeholders_of_its_template(
    module: str, name: str, keys: set[str]
) -> None:
    t = template(name)
    assert t.is_valid(), f"{name}.md: a `$` that is no placeholder (write `$$`)"
    assert set(t.get_identifiers()) == keys, module


def test_a_missing_value_raises() -> None:
    keys = set(template("zuo2025").get_identifiers())
    values = dict.fromkeys(keys, "x")
    assert "x layers" in fill("zuo2025", **values)
    del values["seed"]
    with pytest.raises(KeyError, match="seed"):
        fill("zuo2025", **values)
