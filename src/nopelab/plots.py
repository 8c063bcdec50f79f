"""Figures: variance against position, cosine heatmaps, scores per layer and against init."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def _save(fig: plt.Figure, path: Path) -> None:
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _layer_colourbar(fig: plt.Figure, axes: np.ndarray, layers: list[int]) -> None:
    """A colour bar keyed by layer, shared by panels whose lines are coloured by layer."""
    norm = matplotlib.colors.Normalize(
        vmin=min(layers), vmax=max(layers) / 0.95 if max(layers) else 1
    )
    mappable = matplotlib.cm.ScalarMappable(norm=norm, cmap="viridis")
    bar = fig.colorbar(mappable, ax=list(axes), fraction=0.02, pad=0.01)
    bar.set_label("layer")
    bar.locator = matplotlib.ticker.MaxNLocator(integer=True)
    bar.update_ticks()


def variance_by_position(
    positions: pd.DataFrame, path: Path, theory: np.ndarray | None = None, title: str = ""
) -> None:
    """One panel per site: per-position variance (log-log), one line per layer.

    ``theory`` (if given) is the predicted variance of layer 1's ``attn_out``, drawn dashed.
    """
    sites = list(dict.fromkeys(positions["site"]))
    fig, axes = plt.subplots(
        1, len(sites), figsize=(4.2 * len(sites), 3.6), squeeze=False, layout="constrained"
    )
    layers = sorted(positions["layer"].unique())
    colours = plt.cm.viridis(np.linspace(0, 0.95, max(len(layers), 1)))
    for ax, site in zip(axes[0], sites, strict=True):
        for layer, colour in zip(layers, colours, strict=True):
            rows = positions[(positions["site"] == site) & (positions["layer"] == layer)]
            if len(rows):
                ax.plot(rows["position"], rows["variance"], color=colour, lw=1.2)
        if theory is not None and site == "attn_out":
            m = np.arange(1, len(theory) + 1)
            ax.plot(m, theory, "k--", lw=1.5, label="theory, L1")
        ax.set(xscale="log", yscale="log", xlabel="position m", ylabel="variance", title=site)
        ax.grid(alpha=0.3, which="both")
        if theory is not None and site == "attn_out":
            ax.legend(handles=ax.lines[-1:], fontsize=7)
    _layer_colourbar(fig, axes[0], layers)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def cosine_by_distance(distance: pd.DataFrame, path: Path, title: str = "") -> None:
    """Mean cosine similarity against distance |i - j|, a panel per site, a line per layer."""
    sites = list(dict.fromkeys(distance["site"]))
    fig, axes = plt.subplots(
        1, len(sites), figsize=(4.2 * len(sites), 3.6), squeeze=False, layout="constrained"
    )
    layers = sorted(distance["layer"].unique())
    colours = plt.cm.viridis(np.linspace(0, 0.95, len(layers)))
    for ax, site in zip(axes[0], sites, strict=True):
        for layer, colour in zip(layers, colours, strict=True):
            rows = distance[(distance["site"] == site) & (distance["layer"] == layer)]
            rows = rows[rows["distance"] > 0]
            if len(rows):
                ax.plot(rows["distance"], rows["cosine"], color=colour, lw=1.2)
        ax.set(xscale="log", xlabel="distance |i - j|", ylabel="mean cosine", title=site)
        ax.grid(alpha=0.3, which="both")
    _layer_colourbar(fig, axes[0], layers)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def cosine_heatmaps(
    matrices: dict[str, np.ndarray], path: Path, ncols: int = 6, title: str = ""
) -> None:
    """A grid of mean self-cosine-similarity matrices, one per labelled entry."""
    n = len(matrices)
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(2.6 * ncols, 2.5 * nrows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat:
        ax.axis("off")
    for ax, (label, matrix) in zip(axes.flat, matrices.items(), strict=False):
        image = ax.imshow(matrix, cmap="magma", vmin=min(0.0, float(matrix.min())), vmax=1.0)
        ax.set_title(label, fontsize=8)
        ax.axis("on")
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def scores_by_layer(rows: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency and norm scores (mean ± std over samples) per layer, one line per site."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    for ax, score in zip(axes, ("adjacency", "norm_score"), strict=True):
        for site, group in rows.groupby("site", sort=False):
            ax.errorbar(
                group["layer"],
                group[f"{score}_mean"],
                yerr=group[f"{score}_std"],
                marker="o",
                ms=3,
                capsize=2,
                label=site,
            )
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        ax.set(xlabel="layer", ylabel=score.replace("_", " "), ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def attention_entropy(attention: pd.DataFrame, path: Path) -> None:
    """Attention entropy per query position against the uniform value, one line per layer."""
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    layers = sorted(attention["layer"].unique())
    colours = plt.cm.viridis(np.linspace(0, 0.95, len(layers)))
    for layer, colour in zip(layers, colours, strict=True):
        rows = attention[attention["layer"] == layer]
        ax.plot(rows["position"], rows["entropy"], color=colour, lw=1)
    first = attention[attention["layer"] == layers[0]]
    ax.plot(first["position"], first["uniform_entropy"], "k--", lw=1.5, label="uniform (log m)")
    ax.set(xscale="log", xlabel="query position m", ylabel="entropy (nats)")
    ax.grid(alpha=0.3)
    ax.legend(handles=ax.lines[-1:], fontsize=7)
    _layer_colourbar(fig, np.array([ax]), layers)
    _save(fig, path)


def score_against_init(scores: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency score per layer against the init scale: normal(σ) and uniform(±a) panels."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True, layout="constrained")
    for ax, init in zip(axes, ("normal", "uniform"), strict=True):
        subset = scores[scores["init"] == init].sort_values("init_std")
        for layer, group in subset.groupby("layer"):
            ax.errorbar(
                group["init_std"],
                group["adjacency_mean"],
                yerr=group["adjacency_std"],
                marker="o",
                ms=3,
                capsize=2,
                label=f"L{layer}",
            )
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        symbol = "σ" if init == "normal" else "a"
        ax.set(xscale="log", xlabel=f"{init} init scale {symbol}", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("adjacency score (attn_out)")
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    _save(fig, path)
