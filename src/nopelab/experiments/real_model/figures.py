"""The real model's own figure: the adjacency score per layer of each variant."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nopelab.plots import pyplot, save, score_lines

if TYPE_CHECKING:
    import pandas as pd


def scores_by_variant(rows: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency score (mean ± std over samples) per layer: a panel per site, a line per
    ``variant``."""
    sites = list(dict.fromkeys(rows["site"]))
    fig, axes = pyplot().subplots(
        1, len(sites), figsize=(4.2 * len(sites), 3.6), squeeze=False, layout="constrained"
    )
    for ax, site in zip(axes.flat, sites, strict=True):
        score_lines(ax, rows[rows["site"] == site], "layer", "adjacency", "variant")
        ax.set(xlabel="layer", ylabel="adjacency score", title=site)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    save(fig, path)
