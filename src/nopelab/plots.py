"""Figures: variance against position, cosine heatmaps, scores per layer and against init.

matplotlib is imported on first use. The figures that every analysis draws are laid out with
fixed margins: a layout engine measures every label several times, most of a figure's cost.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import Locator


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=110, pil_kwargs={"compress_level": 1})  # zlib's fastest level
    pyplot().close(fig)


def _grid(
    rows: int,
    cols: int,
    width: float,
    height: float,
    title: str = "",
    gaps: tuple[float, float] = (0.8, 0.7),
    margins: tuple[float, float, float, float] = (0.8, 0.25, 0.55, 0.35),
    colourbar: bool = False,
) -> tuple[Figure, np.ndarray, Axes | None]:
    """A figure of ``rows`` x ``cols`` panels of ``width`` x ``height`` inches, ``gaps``
    (across, down) between them and ``margins`` (left, right, bottom, top) around them, room
    for ``title`` above and for a colour bar on the right; returns the figure, the panels and
    the colour bar's axes (``None`` without one)."""
    left, right, bottom, top = margins
    top += 0.3 if title else 0.0
    bar = 0.85 if colourbar else 0.0
    W = left + cols * width + (cols - 1) * gaps[0] + right + bar
    H = bottom + rows * height + (rows - 1) * gaps[1] + top
    fig = pyplot().figure(figsize=(W, H))
    axes = np.empty((rows, cols), dtype=object)
    for r in range(rows):
        for c in range(cols):
            x, y = left + c * (width + gaps[0]), H - top - (r + 1) * height - r * gaps[1]
            axes[r, c] = fig.add_axes((x / W, y / H, width / W, height / H))
    cax = None
    if colourbar:
        x = W - right - bar + 0.12
        cax = fig.add_axes((x / W, bottom / H, 0.12 / W, (H - bottom - top) / H))
    if title:
        fig.suptitle(title, y=1 - 0.08 / H, va="top")
    return fig, axes, cax


def _layer_colours(layers: list[int]) -> Normalize:
    """The layer-to-colour scale shared by the lines and their colour bar."""
    from matplotlib.colors import Normalize

    low, high = min(layers), max(layers)
    return Normalize(vmin=low, vmax=high if high > low else low + 1)


def _layer_colourbar(fig: Figure, cax: Axes, norm: Normalize) -> None:
    from matplotlib.cm import ScalarMappable

    bar = fig.colorbar(ScalarMappable(norm=norm, cmap="viridis"), cax=cax)
    bar.set_label("layer")
    bar.locator = integer_ticks()
    bar.update_ticks()


def integer_ticks() -> Locator:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _lines_by_layer(
    frame: pd.DataFrame, x: str, y: str, title: str = ""
) -> tuple[Figure, dict[str, Axes]]:
    """A panel per site, a line of ``y`` against ``x`` (log scale) per layer, a layer colour bar."""
    sites = [str(site) for site in frame["site"].unique()]  # in order of appearance
    fig, axes, cax = _grid(1, len(sites), 3.4, 2.7, title, colourbar=True)
    norm = _layer_colours(sorted(frame["layer"].unique()))
    viridis = pyplot().cm.viridis
    for ax, site in zip(axes[0], sites, strict=True):
        for layer, rows in frame[frame["site"] == site].groupby("layer"):
            ax.plot(rows[x], rows[y], color=viridis(norm(layer)), lw=1.2)
        ax.set(xscale="log", title=site)
        plain_log_labels(ax.xaxis)
        ax.grid(alpha=0.3, which="both")
    assert cax is not None  # asked for with colourbar=True
    _layer_colourbar(fig, cax, norm)
    return fig, dict(zip(sites, axes[0], strict=True))


def plain_log_labels(axis: Axis) -> None:
    """Label a log axis with plain numbers (100, 0.02) rather than typeset powers of ten. Minor
    ticks, labelled, only on an axis that spans less than a decade: elsewhere they would cost
    more than the lines. Call it once the data is drawn."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    low, high = sorted(axis.get_view_interval())
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    if high < 10 * low:
        axis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
    else:
        axis.set_minor_locator(NullLocator())


def variance_by_position(
    positions: pd.DataFrame, path: Path, theory: np.ndarray | None = None, title: str = ""
) -> None:
    """One panel per site: per-position variance (log-log), one line per layer.

    ``theory`` (if given) is the predicted variance of layer 1's ``attn_out``, drawn dashed.
    """
    fig, axes = _lines_by_layer(positions, "position", "variance", title)
    for ax in axes.values():
        ax.set(yscale="log", xlabel="position m", ylabel="variance")
    if theory is not None and "attn_out" in axes:
        ax = axes["attn_out"]
        (line,) = ax.plot(np.arange(1, len(theory) + 1), theory, "k--", lw=1.5, label="theory, L1")
        ax.legend(handles=[line], fontsize=7)
    for ax in axes.values():
        plain_log_labels(ax.yaxis)
    save(fig, path)


def cosine_by_distance(distance: pd.DataFrame, path: Path, title: str = "") -> None:
    """Mean cosine similarity against distance |i - j| > 0, a panel per site, a line per layer."""
    fig, axes = _lines_by_layer(distance[distance["distance"] > 0], "distance", "cosine", title)
    for ax in axes.values():
        ax.set(xlabel="distance |i - j|", ylabel="mean cosine")
    save(fig, path)


TILE_PIXELS = 256  # a heatmap tile is 2.2 inches at 110 dpi: 242 pixels


def _block_means(matrix: np.ndarray, most: int) -> np.ndarray:
    """``matrix`` averaged over squares of k x k entries (k = ceil(side / ``most``), the last
    row and column of squares smaller where k does not divide the side): what a tile of ``most``
    pixels can show, drawn at a fraction of the cost of letting the renderer resample it."""
    k = -(-max(matrix.shape) // most)
    if k == 1:
        return matrix
    starts = [np.arange(0, side, k) for side in matrix.shape]
    sums = np.add.reduceat(np.add.reduceat(matrix, starts[0], axis=0), starts[1], axis=1)
    rows, cols = (np.diff(np.append(s, side)) for s, side in zip(starts, matrix.shape, strict=True))
    counts = np.outer(rows, cols)
    return sums / counts


def cosine_heatmaps(
    matrices: dict[str, np.ndarray], path: Path, ncols: int = 6, title: str = ""
) -> None:
    """A grid of mean self-cosine-similarity matrices, one per labelled entry, on one colour
    scale (from the lowest entry, or 0, to 1). The matrices are tiles of one set of axes: a
    panel of axes each would cost more than its image."""
    n = len(matrices)
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    side, across, down = 2.2, 0.15, 0.35  # a tile, and the gaps between tiles (inches)
    width, height = ncols * side + (ncols - 1) * across, nrows * side + (nrows - 1) * down
    fig, axes, cax = _grid(
        1, 1, width, height, title, margins=(0.15, 0.3, 0.15, 0.3), colourbar=True
    )
    ax = axes[0, 0]
    low = min(0.0, *(float(matrix.min()) for matrix in matrices.values()))
    for i, (label, matrix) in enumerate(matrices.items()):
        row, col = divmod(i, ncols)
        x, y = col * (side + across), row * (side + down)  # the tile's top left corner
        shown = _block_means(matrix, TILE_PIXELS)
        image = ax.imshow(
            shown, cmap="magma", vmin=low, vmax=1.0, extent=(x, x + side, y + side, y),
            aspect="auto",
        )  # fmt: skip
        ax.text(x + side / 2, y - 0.06, label, ha="center", va="bottom", fontsize=8)
    ax.set(xlim=(0, width), ylim=(height, 0))
    ax.axis("off")
    fig.colorbar(image, cax=cax)
    save(fig, path)


def score_lines(ax: Axes, rows: pd.DataFrame, x: str, score: str, by: str) -> None:
    """``score`` (mean ± std over samples) against ``x``, a line per value of ``by``, with the
    chance level 0.5 dotted."""
    for label, group in rows.groupby(by, sort=False):
        ax.errorbar(
            group[x],
            group[f"{score}_mean"],
            yerr=group[f"{score}_std"],
            marker="o",
            ms=3,
            capsize=2,
            label=str(label),
        )
    ax.axhline(0.5, color="grey", ls=":", lw=1)
    ax.set(ylim=(0, 1.02))


SCORE_LABELS = {
    "adjacency": "adjacency",
    "norm_score": "norm score",
    "norm_score_zuo": "norm score (Zuo, pooled)",
}


def scores_by_layer(rows: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency and norm scores (mean ± std over samples) per layer, one line per site: a
    panel per score among ``SCORE_LABELS`` whose ``_mean`` column ``rows`` has."""
    scores = [score for score in SCORE_LABELS if f"{score}_mean" in rows]
    fig, axes, _ = _grid(1, len(scores), 3.7, 2.7, title, gaps=(0.7, 0.7))
    axes = axes[0]
    for ax, score in zip(axes, scores, strict=True):
        score_lines(ax, rows, "layer", score, "site")
        ax.set(xlabel="layer", ylabel=SCORE_LABELS[score])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save(fig, path)


def attention_entropy(attention: pd.DataFrame, path: Path) -> None:
    """Attention entropy per query position against the uniform value, one line per layer."""
    fig, axes = _lines_by_layer(attention.assign(site="attention"), "position", "entropy")
    ax = axes["attention"]
    curves: dict[bytes, pd.DataFrame] = {}  # one dashed line per distinct uniform curve
    for _, layer in attention.groupby("layer", sort=True):  # (sliding windows differ)
        curves.setdefault(layer["uniform_entropy"].round(9).to_numpy().tobytes(), layer)
    label = "uniform (log m)" if len(curves) == 1 else "uniform over the visible keys"
    lines = [
        ax.plot(c["position"], c["uniform_entropy"], "k--", lw=1.5, label=label)[0]
        for c in curves.values()
    ]
    ax.set(xlabel="query position m", ylabel="entropy (nats)", title="")
    ax.legend(handles=lines[:1], fontsize=7)
    save(fig, path)


def training_curves(metrics: pd.DataFrame, evals: pd.DataFrame, path: Path) -> None:
    """Training loss (raw and smoothed) and each evaluation metric against step."""
    names = [c for c in evals.columns if c != "step"] if len(evals) else []
    fig, axes = pyplot().subplots(
        1,
        1 + len(names),
        figsize=(4.2 * (1 + len(names)), 3.4),
        squeeze=False,
        layout="constrained",
    )
    ax = axes[0][0]
    if len(metrics):
        ax.plot(metrics["step"], metrics["loss"], lw=0.6, alpha=0.4, color="C0")
        window = max(1, len(metrics) // 50)
        ax.plot(metrics["step"], metrics["loss"].rolling(window).mean(), lw=1.4, color="C0")
    ax.set(xlabel="step", ylabel="training loss", yscale="log", title="training loss")
    for ax, name in zip(axes[0][1:], names, strict=True):
        ax.plot(evals["step"], evals[name], marker="o", ms=3)
        ax.set(xlabel="step", title=f"held-out {name}")
        if name.startswith(("loss", "perplexity")):
            ax.set_yscale("log")
    for ax in axes[0]:
        ax.grid(alpha=0.3, which="both")
    save(fig, path)


def probe_errors(
    rows: pd.DataFrame, path: Path, panel: str = "site", line: str = "features", title: str = ""
) -> None:
    """Probe error (MAD for classifiers, MAE for regressors; seed mean ± std) against layer.

    One panel per value of ``panel`` and probe kind, one line per value of ``line``; the dashed
    grey line is the baseline (predicting the middle position). Lower is better.
    """
    panels = list(dict.fromkeys(zip(rows[panel], rows["probe"], strict=True)))
    ncols = min(4, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = pyplot().subplots(
        nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (name, probe) in zip(axes.flat, panels, strict=False):
        group = rows[(rows[panel] == name) & (rows["probe"] == probe)]
        metric = "mad" if probe.endswith("cls") else "mae"
        for label, lines in group.groupby(line, sort=False):
            lines = lines.sort_values("layer")
            ax.errorbar(
                lines["layer"],
                lines[metric],
                yerr=lines[f"{metric}_std"],
                marker="o",
                ms=3,
                capsize=2,
                label=str(label),
            )
        baseline = group.groupby("layer")["baseline"].mean()
        ax.plot(baseline.index, baseline.values, color="grey", ls="--", lw=1, label="baseline")
        ax.set(xlabel="layer", ylabel=metric.upper(), title=f"{name}: {probe}", ylim=(0, None))
        ax.xaxis.set_major_locator(integer_ticks())
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    save(fig, path)


def series(series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    return series.index.to_numpy(), series.to_numpy()


def intervention_effects(frame: pd.DataFrame, path: Path, title: str = "") -> None:
    """Δmetric per layer: each intervention (solid) beside its control (hatched), ± 2 se;
    ``frame["control_of"]`` names the intervention a control belongs to."""
    edits = [name for name in dict.fromkeys(frame["intervention"]) if name != "none"]
    controls = set(frame.loc[frame["control_of"].notna(), "intervention"])
    layers = list(dict.fromkeys(frame["layer"]))
    fig, ax = pyplot().subplots(figsize=(max(5.5, 3.5 + 1.2 * len(layers)), 3.6))
    width = 0.8 / max(1, len(edits))
    colours = {
        "equalize-norm": "C0",
        "shuffle-norm": "C0",
        "leace": "C1",
        "leace-shuffled": "C1",
        "leace-rotated": "C2",
    }
    for i, name in enumerate(edits):
        group = frame[frame["intervention"] == name].set_index("layer").loc[layers]
        ax.bar(
            [j + (i - (len(edits) - 1) / 2) * width for j in range(len(layers))],
            group["delta"],
            width,
            yerr=2 * group["se"],
            capsize=2,
            color=colours[name],
            alpha=0.5 if name in controls else 0.9,
            hatch="//" if name in controls else None,
            label=name,
        )
    ax.axhline(0, color="grey", lw=1)
    ax.set_xticks(range(len(layers)), [str(layer) for layer in layers])
    ax.set(xlabel="layer", ylabel=f"Δ {frame['metric'].iloc[0]}", title=title or None)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    save(fig, path)


def loss_by_position(frame: pd.DataFrame, path: Path, train_len: int, title: str = "") -> None:
    """Held-out loss against position (log scale, each bucket at its geometric middle), a line
    per multiple of the training length, the training length dashed."""
    fig, ax = pyplot().subplots(figsize=(6.4, 3.8), layout="constrained")
    for i, (factor, rows) in enumerate(frame.groupby("length_factor", sort=True)):
        middle = np.sqrt(rows["bucket_start"].to_numpy() * rows["bucket_end"].to_numpy())
        ax.plot(middle, rows["loss"], marker="o", ms=3, lw=1.2, color=f"C{i}", label=f"{factor}x")
    ax.axvline(train_len, color="grey", ls="--", lw=1, label=f"training length {train_len}")
    ax.set(xscale="log", xlabel="position", ylabel="loss (nats per token)", title=title)
    plain_log_labels(ax.xaxis)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, path)


def prefix_shuffle(frame: pd.DataFrame, path: Path, by: str = "", title: str = "") -> None:
    """Loss on the tokens after a shuffled prefix against its length k (solid) beside the same
    tokens' loss unshuffled (dashed); a colour per value of ``by`` (one line without it)."""
    fig, ax = pyplot().subplots(figsize=(6.4, 3.8), layout="constrained")
    groups = frame.groupby(by, sort=False) if by else [("", frame)]
    for i, (name, rows) in enumerate(groups):
        rows = rows.groupby("k", as_index=False)[["loss", "unshuffled_loss"]].mean()
        ax.plot(rows["k"], rows["loss"], marker="o", ms=3, color=f"C{i}", label=f"{name} shuffled")
        ax.plot(rows["k"], rows["unshuffled_loss"], ls="--", color=f"C{i}", label=f"{name} as is")
    ax.set(xlabel="shuffled prefix length k", ylabel="loss after the prefix (nats)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)
