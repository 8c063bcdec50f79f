"""Every number a page quotes from a measured run equals that run's result file.

``docs/results/claims.toml`` lists the claims: a passage of a page, quoted verbatim (whitespace
aside), the result file it comes from (``docs/results/NAME.json``) and, for each number in the
passage in order, a JMESPath expression over that file that gives it ("" for a number that is
a setting, not a result). A number matches when its value rounds to it at the precision the
page writes (``0.962`` is any value in [0.9615, 0.9625]). ``[[covered]]`` names stretches of a
page in which every number must belong to a claim or to a ``[[quoted]]`` passage (one whose
numbers are settings or the papers' own). docs/results/README.md has the details.
"""

from __future__ import annotations

import math
import re
import statistics
import tomllib
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import jmespath
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jmespath import functions

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
CLAIMS = tomllib.loads((RESULTS / "claims.toml").read_text())
# a number: an optional sign (the minus sign or a hyphen right before the digits), digits, an
# optional fraction and exponent; not a part of a word or of a longer number
NUMBER = re.compile(r"(?<![\w.])([−+-]?)(\d+(?:\.\d+)?)(?:e([−+-]?\d+))?(?![\w.]*\d)")


class Derived(functions.Functions):
    """The derived quantities a claim may compute from a result file."""

    @functions.signature({"types": ["number"]}, {"types": ["number"]})
    def _func_change(self, value: float, base: float) -> float:
        """``value`` against ``base``, in percent: 100 (value / base - 1)."""
        return 100 * (value / base - 1)

    @functions.signature({"types": ["number"]}, {"types": ["number"]})
    def _func_below(self, value: float, base: float) -> float:
        """How far ``value`` lies below ``base``, in percent of it: 100 (1 - value / base)."""
        return 100 * (1 - value / base)

    @functions.signature({"types": ["number"]}, {"types": ["number"]})
    def _func_ratio(self, value: float, base: float) -> float:
        return value / base

    @functions.signature({"types": ["array-number"]})
    def _func_std(self, values: list[float]) -> float:
        """The sample standard deviation (ddof = 1), as every page reports it."""
        return statistics.stdev(values)

    @functions.signature({"types": ["array"]})
    def _func_same(self, values: list[Any]) -> Any:
        """The one value every item has (``2`` for "2x at every seed"), else null."""
        return values[0] if values and all(v == values[0] for v in values) else None

    @functions.signature({"types": ["number"]})
    def _func_minutes(self, seconds: float) -> float:
        """A wall time in minutes (``floor(minutes(s))`` for the 18 of 18 min 42 s)."""
        return seconds / 60

    @functions.signature({"types": ["number"]})
    def _func_seconds(self, seconds: float) -> int:
        """The seconds past the whole minutes (``42`` of 18 min 42 s)."""
        return int(round(seconds) % 60)


OPTIONS = jmespath.Options(custom_functions=Derived())


def numbers(text: str) -> list[tuple[float, float]]:
    """Each number written in ``text``, with half a unit of its last written digit."""
    found = []
    for sign, digits, exponent in NUMBER.findall(text):
        places = len(digits.partition(".")[2])
        power = int(exponent.replace("−", "-")) if exponent else 0
        value = float(digits) * 10.0**power * (-1 if sign in "−-" and sign else 1)
        found.append((value, 0.5 * 10.0 ** (power - places)))
    return found


def flat(text: str) -> str:
    return " ".join(text.split())


@cache
def page(doc: str) -> str:
    return flat((ROOT / doc).read_text())


@cache
def result(name: str) -> Any:
    import json

    return json.loads((RESULTS / name).read_text())


def check(claim: dict[str, Any]) -> list[str]:
    """What is wrong with one claim (nothing: an empty list)."""
    text = flat(claim["text"])
    if text not in page(claim["doc"]):
        return [f"{claim['doc']} does not say {text!r}"]
    return check_numbers(text, claim["values"], claim["file"])


def check_numbers(text: str, values: list[str], file: str) -> list[str]:
    """Which numbers of ``text`` differ from their expressions' values in ``file``."""
    written = numbers(text)
    if len(written) != len(values):
        return [f"{text!r}: {len(written)} numbers, {len(values)} values"]
    if not any(values):
        return [f"{text!r}: no number is checked"]
    wrong = []
    for (number, half), expression in zip(written, values, strict=True):
        if not expression:
            continue
        got = jmespath.search(expression, result(file), options=OPTIONS)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            wrong.append(f"{text!r}: {expression} gives {got!r}, not a number")
        elif not abs(got - number) <= half * (1 + 1e-9):
            wrong.append(f"{text!r}: {number:g} written, {file} gives {got!r}")
    return wrong


@pytest.mark.parametrize("claim", CLAIMS["claim"], ids=lambda c: f"{c['doc']}:{c['text'][:40]}")
def test_the_claim_is_what_its_result_file_holds(claim: dict[str, Any]) -> None:
    assert (RESULTS / claim["file"]).is_file(), claim["file"]
    assert check(claim) == []


@pytest.mark.parametrize("stretch", CLAIMS["covered"], ids=lambda c: f"{c['doc']}:{c['from']}")
def test_every_number_in_a_covered_stretch_belongs_to_a_claim(stretch: dict[str, str]) -> None:
    text = page(stretch["doc"])
    start = text.index(flat(stretch["from"]))
    end = text.index(flat(stretch["to"]), start)
    claimed = [False] * (end - start)
    for claim in CLAIMS["claim"] + CLAIMS["quoted"]:
        if claim["doc"] != stretch["doc"]:
            continue
        quote = flat(claim["text"])
        at = text.find(quote, start)
        while 0 <= at < end:
            claimed[at - start : at - start + len(quote)] = [True] * len(quote)
            at = text.find(quote, at + 1)
    loose = [
        m.group(0)
        for m in NUMBER.finditer(text, start, end)
        if not all(claimed[m.start() - start : m.end() - start])
    ]
    assert loose == [], f"numbers of {stretch['doc']} that no claim covers"


@pytest.mark.parametrize("quoted", CLAIMS["quoted"], ids=lambda c: f"{c['doc']}:{c['text'][:40]}")
def test_a_quoted_passage_is_on_its_page(quoted: dict[str, str]) -> None:
    assert flat(quoted["text"]) in page(quoted["doc"])


def test_every_result_file_is_listed_and_records_its_run() -> None:
    listed = (RESULTS / "README.md").read_text()
    for path in RESULTS.glob("*.json"):
        assert f"`{path.name}`" in listed, f"{path.name} is not in docs/results/README.md"
        run = result(path.name)["run"]
        assert {"command", "commit", "cpu", "seconds", "nopelab"} <= set(run), path.name


def test_a_changed_number_fails_its_claim() -> None:
    """The check is not vacuous: in every claim, each checked number written one unit of its
    last digit higher (as a changed result would be) is reported."""
    for claim in CLAIMS["claim"]:
        text = flat(claim["text"])
        for match, expression in zip(NUMBER.finditer(text), claim["values"], strict=True):
            if not expression:
                continue
            digits = Decimal(match.group(2))
            bumped = str(digits + Decimal(1).scaleb(digits.as_tuple().exponent))
            changed = text[: match.start(2)] + bumped + text[match.end(2) :]
            assert check_numbers(changed, claim["values"], claim["file"]), changed


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), st.integers(0, 5))
def test_numbers_reads_back_what_is_written(value: float, places: int) -> None:
    written = f"{value:.{places}f}".replace("-", "−")
    ((number, half),) = numbers(f"the loss {written} nats")
    assert number == pytest.approx(float(written.replace("−", "-")))
    assert half == pytest.approx(0.5 * 10.0**-places)


def test_numbers_in_prose() -> None:
    text = "NoPE +8.9–16.1 % at 2× (lm-none-seed0, 9-digit), 2.159e-4 and −1.22; T = 512."
    assert [n for n, _ in numbers(text)] == pytest.approx([8.9, 16.1, 2, 9, 2.159e-4, -1.22, 512])
    assert math.isclose(numbers("2.159e-4")[0][1], 5e-8)
