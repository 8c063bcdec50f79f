"""zuo2025 --part trained --encodings: train some of the part's encodings, NoPE among them."""

from __future__ import annotations

import pytest

from nopelab.cli.reproduce import _names, _said
from nopelab.errors import UserError
from nopelab.experiments import EXPERIMENTS
from nopelab.experiments.zuo2025 import trained


def test_the_chosen_encodings_are_trained_and_nothing_else_changes() -> None:
    every = trained.settings("small", 0, "cpu")
    two = trained.settings("small", 0, "cpu", encodings=("learned", "none"))
    assert two.encodings == ("none", "learned")  # the part's order, whatever the order typed
    assert set(two.runs) == {(t, pe) for t in trained.TASKS for pe in ("none", "learned")}
    assert {k: every.runs[k] for k in two.runs} == two.runs
    assert {k: every.stages[k] for k in two.stages} == two.stages
    assert two.analyses == every.analyses
    assert every.encodings == trained.POS_ENCODINGS == ("none", "learned", "rope")


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (
            ("none", "alibi"),
            "--encodings: 'alibi' is not trained here; allowed: none, learned, rope",
        ),
        (("learned", "rope"), "--encodings: must include none (NoPE, the part's subject)"),
    ],
)
def test_an_encoding_the_part_does_not_train_is_refused(
    names: tuple[str, ...], message: str
) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        trained.settings("small", 0, "cpu", encodings=names)


def test_naming_every_encoding_is_the_same_run_as_naming_none() -> None:
    """--resume compares the options that change the models: all three typed is no option."""
    part = EXPERIMENTS["zuo2025"].parts["trained"]
    assert _said(part, "smoke", 0, "cpu", {"encodings": ("none", "learned", "rope")}) == {}
    assert _said(part, "smoke", 0, "cpu", {"encodings": ("none",)}) == {"encodings": ("none",)}


def test_the_same_encodings_in_another_order_are_the_same_run() -> None:
    assert _names("--encodings", "learned, none") == _names("--encodings", "none,learned")
