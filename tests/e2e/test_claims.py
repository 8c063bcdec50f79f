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
import sys
import tomllib
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
# a number: an optional sign (the minus sign or a hyphen right before the digits), digits (with
# thousands separators: 1,000), an optional fraction and exponent; not a part of a word or of a
# longer number, but either end of a range 1..8
NUMBER = re.compile(
    r"(?:(?<![\w.])|(?<=\.\.))([−+-]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:[eE]([−+-]?\d+))?"
    r"(?!\.?\d)(?![A-Za-z_]*\d)"
)


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

    @functions.signature({"types": ["number"]}, {"types": ["number"]})
    def _func_minus(self, value: float, base: float) -> float:
        """``value`` - ``base`` (JMESPath has no arithmetic)."""
        return value - base

    @functions.signature({"types": ["number"]})
    def _func_exp(self, value: float) -> float:
        """e to the ``value``: a perplexity from a loss in nats."""
        return math.exp(value)

    @functions.signature({"types": ["array-number"]})
    def _func_std(self, values: list[float]) -> float | None:
        """The sample standard deviation (ddof = 1), as every page reports it; null for fewer
        than two values (a filter that matched less than it should)."""
        return statistics.stdev(values) if len(values) > 1 else None

    @functions.signature({"types": ["array"]}, {"types": ["number"]})
    def _func_same(self, values: list[Any], count: int) -> Any:
        """The one value all ``count`` items share (``2`` for "2x at every seed"), else null: a
        projection drops missing and null items, so the count is checked."""
        if len(values) != count or any(v is None or v != values[0] for v in values):
            return None
        return values[0]

    @functions.signature({"types": ["array"]}, {"types": ["number"]})
    def _func_every(self, values: list[Any], count: int) -> list[Any] | None:
        """``values`` when it holds ``count`` items (every seed, for ``min``/``max``), else
        null."""
        return values if len(values) == count and None not in values else None

    @functions.signature({"types": ["number"]})
    def _func_minutes(self, seconds: float) -> float:
        """A wall time in minutes: "18 min" is ``minutes(s)``; the 18 of "18 min 42 s" is
        ``floor(minutes(s))``."""
        return seconds / 60

    @functions.signature({"types": ["number"]})
    def _func_seconds(self, seconds: float) -> int:
        """The seconds past the whole minutes (``42`` of 18 min 42 s)."""
        return int(round(seconds) % 60)


OPTIONS = jmespath.Options(custom_functions=Derived())


def numbers(text: str) -> list[tuple[float, float]]:
    """Each number written in ``text``, with half a unit of its last written digit."""
    found = []
    for sign, whole, fraction, exponent in NUMBER.findall(text):
        places = max(len(fraction) - 1, 0)
        power = int(exponent.replace("−", "-")) if exponent else 0
        value = float(whole.replace(",", "") + fraction) * 10.0**power
        found.append((-value if sign in ("−", "-") else value, 0.5 * 10.0 ** (power - places)))
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
        got = value(expression, result(file))
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            wrong.append(f"{text!r}: {expression} gives {got!r}, not a number")
        elif not matches(got, number, half, exact=expression.startswith("=")):
            wrong.append(f"{text!r}: {number:g} written, {file} gives {got!r}")
    return wrong


def value(expression: str, data: Any) -> Any:
    """A claim's expression over a result file (a leading ``=``: the value must be exact)."""
    return jmespath.search(expression.removeprefix("="), data, options=OPTIONS)


def matches(got: float, number: float, half: float, exact: bool) -> bool:
    """Whether ``got`` is written as ``number``: rounded to the written precision (the interval
    is half-open, so a value halfway between is written once), or equal for an exact value (a
    grid point such as a flat length of 1.25, a count, a bound)."""
    if exact:
        return got == number
    return -half * (1 + 1e-9) <= got - number < half * (1 - 1e-9)


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


def _perturbed(data: Any, strings: bool = False) -> Any:
    """Every number of a result file moved (x -> 1.37 x + 0.11), booleans kept; with
    ``strings``, every string value too (a label no filter names any more)."""
    if isinstance(data, dict):
        return {key: _perturbed(item, strings) for key, item in data.items()}
    if isinstance(data, list):
        return [_perturbed(item, strings) for item in data]
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return 1.37 * data + 0.11
    if strings and isinstance(data, str):
        return data + "~"
    return data


@cache
def _moved(name: str) -> tuple[Any, Any]:
    """A result file with every number moved, and with every number and string moved."""
    data = result(name)
    return _perturbed(data), _perturbed(data, strings=True)


def test_every_checked_number_reads_its_result_file() -> None:
    """The check is not vacuous: with every number of the result file moved, every checked
    expression gives another value (or none), so a changed result fails its claim; an
    expression that reads nothing from the file (a constant) would not. A count of records
    picked by their labels (``length(rows[?label == 'x'])``) moves when the labels do; a count
    of none must at least pick records with a filter."""
    for claim in CLAIMS["claim"]:
        data = result(claim["file"])
        moved, relabelled = _moved(claim["file"])
        for expression in filter(None, claim["values"]):
            before = value(expression, data)
            try:
                after = value(expression, moved)
                if after == before:
                    after = value(expression, relabelled)
            except jmespath.exceptions.JMESPathError:
                continue  # the moved file no longer fits the expression: it would fail too
            assert after != before or (before == 0 and "[?" in expression), (
                claim["text"],
                expression,
            )


def test_a_changed_result_fails_its_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    """One result value changed by hand (a perplexity in the third decimal) fails exactly the
    claim that quotes it."""
    import json

    claim = next(c for c in CLAIMS["claim"] if c["text"].startswith("| NoPE, 0 | 4.682 |"))
    data = json.loads((RESULTS / claim["file"]).read_text())
    fixes = data["summary"]["fixes"]
    row = next(f for f in fixes if f["model"] == "lm-none-seed0" and f["fix"] == "none")
    text = flat(claim["text"])
    assert check_numbers(text, claim["values"], claim["file"]) == []
    row["ppl_2x"] += 0.002
    monkeypatch.setattr(sys.modules[__name__], "result", lambda name: data)
    assert check_numbers(text, claim["values"], claim["file"]) == [
        f"{text!r}: 5.041 written, {claim['file']} gives {row['ppl_2x']!r}"
    ]


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
    assert [n for n, _ in numbers("lengths 1..8, 1,000 lines, 2.1E-4, v1.2.3")] == pytest.approx(
        [1, 8, 1000, 2.1e-4]
    )
    assert numbers("2x and 1.25x")[1] == (1.25, 0.005)
