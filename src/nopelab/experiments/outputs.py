"""The skeleton every part repeats: its models run as jobs into ``out/runs/KEY``; their files are
gathered into tables, each row labelled with its model; the tables, ``summary.json`` and
``summary.md`` are written at the top of ``out``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from nopelab.runtime.rundir import write_json


def model_file(out: Path, key: str, name: str = "summary.json") -> Any:
    """The JSON file ``name`` of the model ``key``: ``out/runs/KEY/NAME``."""
    return json.loads((out / "runs" / key / name).read_text())


def gather(
    out: Path, models: Iterable[tuple[str, Mapping[str, Any]]], name: str, field: str = ""
) -> list[dict[str, Any]]:
    """The rows of every model's JSON file ``name`` (its list ``field``, or the file itself when
    it is the list), each prefixed by the model's labels; ``models``: ``(key, labels)`` pairs."""
    rows = []
    for key, labels in models:
        found = model_file(out, key, name)
        rows += [{**labels, **row} for row in (found[field] if field else found)]
    return rows


def write_outputs(
    out: Path,
    tables: Mapping[str, pd.DataFrame],
    text: str,
    summary: Mapping[str, Any] | None = None,
) -> None:
    """A part's results: each table as ``out/NAME.parquet``, ``summary`` (unless the part's
    analysis wrote it) as ``summary.json``, and ``text`` as ``summary.md``, last."""
    for name, frame in tables.items():
        frame.to_parquet(out / f"{name}.parquet", index=False)
    if summary is not None:
        write_json(out / "summary.json", dict(summary))
    (out / "summary.md").write_text(text)
