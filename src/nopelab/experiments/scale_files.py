"""The reproductions' data files: each part's scales, ``experiments/PAPER/scales/PART.toml`` (one
table per scale), and a paper's published numbers, ``experiments/PAPER/published.toml`` (each
with its source in the paper).

Every part's scale tables have one kind of schema: a class marked :func:`scale_schema` (a frozen
dataclass). :func:`read_scales` reads the file and builds one instance per table with pydantic,
checking every key and every value's type (an ``int`` is never a string or a float, a tuple's
items, nested tables), so a typo or a wrong type in a scale file is an error naming the file,
the scale and the key, not a silent default or a failure deep inside a run.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, TypeVar, dataclass_transform

from pydantic import ConfigDict, TypeAdapter, ValidationError

T = TypeVar("T")
SCHEMAS: set[type] = set()  # the classes marked by scale_schema


@dataclass_transform(frozen_default=True, kw_only_default=True)
def scale_schema(cls: type[T]) -> type[T]:
    """Make ``cls`` a scale table's schema: a frozen dataclass whose tables :func:`read_scales`
    checks key by key and type by type (a nested table's class is marked too)."""
    cls.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]
    SCHEMAS.add(cls)
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


@scale_schema
class RandomInitScale:
    """A random-init model's shape and the analysis' inputs (chi2023, zuo2025 random-init)."""

    d_model: int
    n_heads: int
    n_layers: int
    seq_len: int
    samples: int
    batch_size: int


def part_file(part: str, folder: str, suffix: str) -> Traversable:
    """The data file of the part ``PAPER.PART`` (its module under ``nopelab.experiments``) in
    ``FOLDER`` of its paper's package: ``experiments/PAPER/FOLDER/PART.SUFFIX``."""
    paper, _, name = part.partition(".")
    return resources.files(f"nopelab.experiments.{paper}").joinpath(folder, f"{name}{suffix}")


def read_scales(part: str, schema: type[T]) -> dict[str, T]:
    """The scale tables of the part ``PAPER.PART``, ``experiments/PAPER/scales/PART.toml``, in
    file order, each checked against and built as ``schema``."""
    paper, _, name = part.partition(".")
    text = part_file(part, "scales", ".toml").read_text()
    return parse_scales(text, f"{paper}/scales/{name}.toml", schema)


def parse_scales(text: str, file: str, schema: type[T]) -> dict[str, T]:
    """The scale tables of one file's ``text``, each built as ``schema``; the first problem is a
    ``ValueError`` naming the file, the scale and the key."""
    adapter = TypeAdapter(schema)
    scales = {}
    for scale, table in tomllib.loads(text).items():
        where = f"{file} [{scale}]"
        if not isinstance(table, dict):
            raise ValueError(f"{where}: expected a table of settings")
        try:
            data = json.dumps(table)
        except TypeError:  # a TOML date or time: no setting is one
            raise ValueError(f"{where}: a date or time is no setting") from None
        try:  # strict JSON validation: a TOML table is JSON data; no value is coerced
            scales[scale] = adapter.validate_json(data, strict=True)
        except ValidationError as exc:
            error = exc.errors()[0]
            key = ".".join(str(part) for part in error["loc"])
            problem = {
                "extra_forbidden": "unknown key",
                "unexpected_keyword_argument": "unknown key",
                "missing": "missing key",
                "missing_keyword_only_argument": "missing key",
                "missing_argument": "missing key",
            }.get(error["type"])
            if problem:
                raise ValueError(f"{where}: {problem} {key!r}") from None
            raise ValueError(f"{where}: {key}: {error['msg']}, got {error['input']!r}") from None
    return scales


def read_published(paper: str) -> dict[str, Any]:
    """The numbers ``paper`` published that a reproduction shows beside its own
    (``experiments/PAPER/published.toml``; every table names its ``source``)."""
    text = resources.files(f"nopelab.experiments.{paper}").joinpath("published.toml").read_text()
    return tomllib.loads(text)
