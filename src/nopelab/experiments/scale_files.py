"""The reproductions' data files: their scales, ``experiments/scales/PART.toml`` (one table per
scale), and the papers' published numbers, ``experiments/published/PAPER.toml`` (each with its
source in the paper).

Each experiment module names the schema of its scale tables (a ``TypedDict`` or a dataclass);
:func:`read_scales` reads the file and checks every table's keys against it, so a typo in a
scale file is an error naming the file, the scale and the key, not a silent default.
"""

from __future__ import annotations

import dataclasses
import tomllib
from importlib import resources
from typing import Any, TypedDict, get_type_hints


class RandomInitScale(TypedDict):
    """A random-init model's shape and the analysis' inputs (chi2023, zuo2025 random-init)."""

    d_model: int
    n_heads: int
    n_layers: int
    seq_len: int
    samples: int
    batch_size: int


def read_scales(part: str, schema: type) -> dict[str, dict[str, Any]]:
    """The scale tables of ``scales/PART.toml``, in file order, keys checked against ``schema``
    (nested tables are left to the caller)."""
    text = resources.files("nopelab.experiments").joinpath("scales", f"{part}.toml").read_text()
    return parse_scales(text, f"scales/{part}.toml", schema)


def parse_scales(text: str, file: str, schema: type) -> dict[str, dict[str, Any]]:
    """The scale tables of one file's ``text``, keys checked against ``schema``."""
    scales = tomllib.loads(text)
    allowed, required = _keys(schema)
    for scale, table in scales.items():
        where = f"{file} [{scale}]"
        if not isinstance(table, dict):
            raise ValueError(f"{where}: expected a table of settings")
        if unknown := sorted(set(table) - allowed):
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {sorted(allowed)}")
        if missing := sorted(required - set(table)):
            raise ValueError(f"{where}: missing key {missing[0]!r}")
    return scales


def _keys(schema: type) -> tuple[set[str], set[str]]:
    """The keys a scale table may hold, and those it must hold."""
    if dataclasses.is_dataclass(schema):
        fields = dataclasses.fields(schema)
        optional = {
            f.name
            for f in fields
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        }
        return {f.name for f in fields}, {f.name for f in fields} - optional
    return set(get_type_hints(schema)), set(getattr(schema, "__required_keys__", ()))


def read_published(paper: str) -> dict[str, Any]:
    """The numbers ``paper`` published that a reproduction shows beside its own
    (``published/PAPER.toml``; every table names its ``source``)."""
    text = resources.files("nopelab.experiments").joinpath("published", f"{paper}.toml").read_text()
    return tomllib.loads(text)
