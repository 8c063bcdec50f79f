"""The tables that summaries show: markdown, ``mean ± std`` cells, a column per layer."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-style markdown table (no extra dependency)."""

    def fmt(value: Any) -> str:
        return format(value, floatfmt) if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += [
        "| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)
    ]
    return "\n".join(lines)


def mean_std(
    means: Iterable[float],
    stds: Iterable[float],
    r: Iterable[float] | None = None,
    digits: tuple[str, str] = (".3g", ".2g"),
) -> list[str]:
    """``mean ± std`` cells (with ``(r …)``, a Pearson r, when given); ``digits``: the formats
    of the mean and of the spread."""
    m, s = digits
    cells = [f"{mean:{m}} ± {std:{s}}" for mean, std in zip(means, stds, strict=True)]
    if r is None:
        return cells
    return [f"{cell} (r {value:.2f})" for cell, value in zip(cells, r, strict=True)]


def by_layer(
    frame: pd.DataFrame, index: list[str], cells: Sequence[str], rows: Any = None
) -> pd.DataFrame:
    """One row per value of ``index`` (in the order of ``rows``, a list or MultiIndex, when
    given), a column ``L1``, ``L2``, … per layer holding ``cells`` (one per row of ``frame``);
    indexed by ``index``, so that per-row columns can join before ``reset_index``."""
    table = frame.assign(cell=list(cells)).pivot(index=index, columns="layer", values="cell")
    if rows is not None:
        table = table.reindex(rows).rename_axis(index)
    table.columns = [f"L{layer}" for layer in table.columns]
    return table
