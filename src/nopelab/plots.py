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


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=110, pil_kwargs={"compress_level": 1})  # zlib's fastest level
    _pyplot().close(fig)


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
    fig = _pyplot().figure(figsize=(W, H))
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
    bar.locator = _integer_ticks()
    bar.update_ticks()


def _integer_ticks() -> Locator:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _lines_by_layer(
    frame: pd.DataFrame, x: str, y: str, title: str = ""
) -> tuple[Figure, dict[str, Axes]]:
    """A panel per site, a line of ``y`` against ``x`` (log scale) per layer, a layer colour bar."""
    sites = [str(site) for site in frame["site"].unique()]  # in order of appearance
    fig, axes, cax = _grid(1, len(sites), 3.4, 2.7, title, colourbar=True)
    norm = _layer_colours(sorted(frame["layer"].unique()))
    viridis = _pyplot().cm.viridis
    for ax, site in zip(axes[0], sites, strict=True):
        for layer, rows in frame[frame["site"] == site].groupby("layer"):
            ax.plot(rows[x], rows[y], color=viridis(norm(layer)), lw=1.2)
        ax.set(xscale="log", title=site)
        _plain_log_labels(ax.xaxis)
        ax.grid(alpha=0.3, which="both")
    assert cax is not None  # asked for with colourbar=True
    _layer_colourbar(fig, cax, norm)
    return fig, dict(zip(sites, axes[0], strict=True))


def _plain_log_labels(axis: Axis) -> None:
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
        _plain_log_labels(ax.yaxis)
    _save(fig, path)


def cosine_by_distance(distance: pd.DataFrame, path: Path, title: str = "") -> None:
    """Mean cosine similarity against distance |i - j| > 0, a panel per site, a line per layer."""
    fig, axes = _lines_by_layer(distance[distance["distance"] > 0], "distance", "cosine", title)
    for ax in axes.values():
        ax.set(xlabel="distance |i - j|", ylabel="mean cosine")
    _save(fig, path)


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
    _save(fig, path)


def _score_lines(ax: Axes, rows: pd.DataFrame, x: str, score: str, by: str) -> None:
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
        _score_lines(ax, rows, "layer", score, "site")
        ax.set(xlabel="layer", ylabel=SCORE_LABELS[score])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    _save(fig, path)


def scores_by_variant(rows: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency score (mean ± std over samples) per layer: a panel per site, a line per
    ``variant``."""
    sites = list(dict.fromkeys(rows["site"]))
    fig, axes = _pyplot().subplots(
        1, len(sites), figsize=(4.2 * len(sites), 3.6), squeeze=False, layout="constrained"
    )
    for ax, site in zip(axes.flat, sites, strict=True):
        _score_lines(ax, rows[rows["site"] == site], "layer", "adjacency", "variant")
        ax.set(xlabel="layer", ylabel="adjacency score", title=site)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    _save(fig, path)


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
    _save(fig, path)


def score_against_init(scores: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency score per layer against the init scale: normal(σ) and uniform(±a) panels."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(9, 3.6), sharey=True, layout="constrained")
    for ax, init in zip(axes, ("normal", "uniform"), strict=True):
        subset = scores[scores["init"] == init].sort_values("init_std")
        _score_lines(
            ax, subset.assign(L="L" + subset["layer"].astype(str)), "init_std", "adjacency", "L"
        )
        symbol = "σ" if init == "normal" else "a"
        ax.set(xscale="log", xlabel=f"{init} init scale {symbol}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("adjacency score (attn_out)")
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def training_curves(metrics: pd.DataFrame, evals: pd.DataFrame, path: Path) -> None:
    """Training loss (raw and smoothed) and each evaluation metric against step."""
    names = [c for c in evals.columns if c != "step"] if len(evals) else []
    fig, axes = _pyplot().subplots(
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
    _save(fig, path)


def trained_scores(scores: pd.DataFrame, path: Path) -> None:
    """Adjacency score per layer, a panel per task, a colour per encoding; init dashed."""
    tasks = list(dict.fromkeys(scores["task"]))
    fig, axes = _pyplot().subplots(
        1, len(tasks), figsize=(3.6 * len(tasks), 3.4), squeeze=False, sharey=True,
        layout="constrained",
    )  # fmt: skip
    for ax, task in zip(axes[0], tasks, strict=True):
        subset = scores[scores["task"] == task]
        for colour, (pe, group) in enumerate(subset.groupby("pos_encoding", sort=False)):
            for state, style in (("init", "--"), ("trained", "-")):
                rows = group[group["state"] == state]
                ax.errorbar(
                    rows["layer"], rows["adjacency_mean"], yerr=rows["adjacency_std"],
                    ls=style, color=f"C{colour}", marker="o", ms=3, capsize=2,
                    label=f"{pe} {state}",
                )  # fmt: skip
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        ax.set(title=task, xlabel="layer", ylim=(0, 1.02))
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("adjacency score (attn_out)")
    axes[0][0].legend(fontsize=7)
    _save(fig, path)


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
    fig, axes = _pyplot().subplots(
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
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def probe_mad_with_reference(
    rows: pd.DataFrame,
    reference: pd.DataFrame,
    path: Path,
    shape_probe: str,
    labels: dict[str, str] | None = None,
    title: str = "",
) -> None:
    """Classifier-probe MAD per layer, a line per encoding, beside published curves.

    ``rows``: ``pos_encoding``, ``probe``, ``layer``, ``mad``, ``mad_std``, ``baseline``
    (predict the middle), ``random_baseline``, ``depth`` (layer / L) and ``mad_fraction``
    (MAD / random). ``reference``: ``pos_encoding``, ``depth``, ``mad_fraction``. One panel
    per probe kind (MAD against layer), then a shape panel: MAD / random against depth, ours
    (``shape_probe``) solid, the reference dashed with markers, the same colour per encoding.
    """
    labels = labels or {}
    encodings = list(dict.fromkeys([*rows["pos_encoding"], *reference["pos_encoding"]]))
    colours = {pe: f"C{i}" for i, pe in enumerate(encodings)}
    probes = list(dict.fromkeys(rows["probe"]))
    fig, axes = _pyplot().subplots(
        1, len(probes) + 1, figsize=(4.2 * (len(probes) + 1), 3.6), layout="constrained"
    )
    for ax, probe in zip(axes, probes, strict=False):
        group = rows[rows["probe"] == probe]
        for pe, lines in group.groupby("pos_encoding", sort=False):
            lines = lines.sort_values("layer")
            ax.errorbar(
                lines["layer"], lines["mad"], yerr=lines["mad_std"], marker="o", ms=3,
                capsize=2, color=colours[pe], label=labels.get(pe, pe),
            )  # fmt: skip
        by_layer = group.groupby("layer")
        ax.plot(*_series(by_layer["baseline"].mean()), color="grey", ls="--", lw=1,
                label="predict middle")  # fmt: skip
        ax.plot(*_series(by_layer["random_baseline"].mean()), color="grey", ls=":", lw=1,
                label="random")  # fmt: skip
        ax.set(xlabel="layer (0 = embedding)", ylabel="MAD", title=f"ours: {probe}", ylim=(0, None))
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    ours = rows[rows["probe"] == shape_probe]
    for pe in encodings:
        mine = ours[ours["pos_encoding"] == pe].sort_values("depth")
        if len(mine):
            ax.plot(mine["depth"], mine["mad_fraction"], color=colours[pe], lw=1.5,
                    label=f"{labels.get(pe, pe)}, ours")  # fmt: skip
        theirs = reference[reference["pos_encoding"] == pe].sort_values("depth")
        if len(theirs):
            ax.plot(theirs["depth"], theirs["mad_fraction"], color=colours[pe], ls="--",
                    marker="s", ms=4, lw=1, label=f"{labels.get(pe, pe)}, published")  # fmt: skip
    ax.axhline(1.0, color="grey", ls=":", lw=1)
    ax.set(
        xlabel="depth (layer / number of layers)",
        ylabel="MAD / random baseline",
        title=f"shape, not scale (ours: {shape_probe})",
        ylim=(0, 1.1),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def _series(series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    return series.index.to_numpy(), series.to_numpy()


def intervention_effects(frame: pd.DataFrame, path: Path, title: str = "") -> None:
    """Δmetric per layer: each intervention (solid) beside its control (hatched), ± 2 se;
    ``frame["control_of"]`` names the intervention a control belongs to."""
    edits = [name for name in dict.fromkeys(frame["intervention"]) if name != "none"]
    controls = set(frame.loc[frame["control_of"].notna(), "intervention"])
    layers = list(dict.fromkeys(frame["layer"]))
    fig, ax = _pyplot().subplots(figsize=(max(5.5, 3.5 + 1.2 * len(layers)), 3.6))
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
    _save(fig, path)


def steps_to_mastery(
    table: pd.DataFrame, tasks: list[str], encodings: list[str], stop_at: float, path: Path
) -> None:
    """Steps to mastery per task (a panel each): a dot per seed for each encoding, the mean as a
    bar; a seed that did not reach ``stop_at`` is a cross at the steps it trained."""
    fig, axes = _pyplot().subplots(
        1, len(tasks), figsize=(3.2 * len(tasks), 3.4), squeeze=False, layout="constrained"
    )
    for ax, task in zip(axes[0], tasks, strict=True):
        for x, pe in enumerate(encodings):
            rows = table[(table["task"] == task) & (table["pos_encoding"] == pe)]
            reached = rows["steps_to_target"].dropna()
            if len(reached):
                ax.bar(x, reached.mean(), width=0.6, color="C0", alpha=0.35)
            ax.scatter([x] * len(reached), reached, color="C0", zorder=3, s=18)
            missed = rows[rows["steps_to_target"].isna()]
            ax.scatter([x] * len(missed), missed["steps_trained"], color="C3", marker="x", zorder=3)
        ax.set_xticks(range(len(encodings)), encodings)
        ax.set_title(task)
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel(f"steps to accuracy ≥ {stop_at:g}")
    fig.suptitle("Steps to mastery (dots: seeds; x: not reached within the cap)")
    _save(fig, path)


def perplexity_by_size(
    ours: pd.DataFrame, published: pd.DataFrame, labels: dict[str, str], path: Path
) -> None:
    """Perplexity against parameters, ours (seeds' spread as error bars) beside the published
    table, and each encoding's gap to NoPE in % of NoPE's perplexity, ours solid, theirs dashed."""
    fig, axes = _pyplot().subplots(1, 3, figsize=(13.5, 3.8), layout="constrained")
    colours = {pe: f"C{i}" for i, pe in enumerate(labels)}
    for pe, rows in ours.groupby("pos_encoding", sort=False):
        axes[0].errorbar(
            rows["parameters"], rows["perplexity"], yerr=rows["perplexity_std"],
            marker="o", ms=4, capsize=3, color=colours[pe], label=labels[pe],
        )  # fmt: skip
    for pe, rows in published.groupby("pos_encoding", sort=False):
        axes[1].plot(
            rows["parameters"], rows["perplexity"], marker="s", ms=4, color=colours[pe],
            label=labels[pe],
        )  # fmt: skip
    nope = ours[ours["pos_encoding"] == "none"].set_index("size")["perplexity"]
    for pe, rows in ours[ours["pos_encoding"] != "none"].groupby("pos_encoding", sort=False):
        gap = 100 * (rows["perplexity"].to_numpy() / nope.loc[rows["size"]].to_numpy() - 1)
        axes[2].plot(rows["parameters"], gap, marker="o", ms=4, color=colours[pe], label=labels[pe])
    theirs = published[published["pos_encoding"] != "none"]
    for pe, rows in theirs.groupby("pos_encoding", sort=False):
        axes[2].plot(rows["parameters"], rows["gap_percent"], ls="--", marker="s", ms=3,
                     color=colours[pe])  # fmt: skip
    axes[0].set(title="ours: held-out perplexity per byte", ylabel="perplexity")
    axes[1].set(title="Haviv et al. Table 2: the Pile, per token")
    axes[2].set(title="gap to NoPE: ours (solid), theirs (dashed)")
    axes[2].set_ylabel("(encoding − NoPE) / NoPE, %")
    axes[2].axhline(0, color="grey", lw=0.8)
    for ax in axes:
        ax.set(xscale="log", xlabel="parameters")
        _plain_log_labels(ax.xaxis)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    _save(fig, path)


def learning_curves_by_size(curves: pd.DataFrame, labels: dict[str, str], path: Path) -> None:
    """Held-out loss against tokens seen: a panel per size, a line per encoding (and seed)."""
    sizes = sorted(curves["size"].unique())
    fig, axes = _pyplot().subplots(
        1, len(sizes), figsize=(3.8 * len(sizes), 3.4), squeeze=False, layout="constrained"
    )
    colours = {pe: f"C{i}" for i, pe in enumerate(labels)}
    for ax, size in zip(axes[0], sizes, strict=True):
        rows = curves[curves["size"] == size]
        for (pe, seed), line in rows.groupby(["pos_encoding", "seed"], sort=False):
            first = seed == rows["seed"].min()
            ax.plot(
                line["tokens"] / 1e6, line["loss"], color=colours[pe], lw=1.2, alpha=0.85,
                label=labels[pe] if first else None,
            )  # fmt: skip
        ax.set(
            xlabel="tokens seen (M)",
            title=f"{rows['parameters'].iloc[0] / 1e3:.0f} k parameters",
        )
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out loss (nats per byte)")
    axes[0][0].legend(fontsize=8)
    _save(fig, path)


def decay_along_training(decay: pd.DataFrame, labels: dict[str, str], path: Path) -> None:
    """The decay of Var(attn_out) against tokens seen, a column of panels per layer, a line per
    encoding: position 1 over the last (top; a 1/m law gives T, no decay 1) and the log-log
    slope against position (bottom; -1 for 1/m, 0 for no decay)."""
    layers = sorted(decay["layer"].unique())
    fig, axes = _pyplot().subplots(
        2, len(layers), figsize=(3.6 * len(layers), 6.2), squeeze=False, sharex=True,
        layout="constrained",
    )  # fmt: skip
    for column, layer in enumerate(layers):
        ratio, slope = axes[0][column], axes[1][column]
        rows = decay[decay["layer"] == layer]
        for i, (pe, line) in enumerate(rows.groupby("pos_encoding", sort=False)):
            style = {"marker": "o", "ms": 3, "color": f"C{i}", "label": labels.get(pe, pe)}
            ratio.plot(line["tokens"] / 1e6, line["first_over_last"], **style)
            slope.plot(line["tokens"] / 1e6, line["slope"], **style)
        ratio.axhline(1, color="grey", lw=0.8)
        ratio.set(yscale="log", title=f"attn_out, layer {layer}")
        _plain_log_labels(ratio.yaxis)
        slope.axhline(-1, color="grey", lw=0.8, ls="--")
        slope.axhline(0, color="grey", lw=0.8)
        slope.set(xlabel="tokens seen (M)")
        for ax in (ratio, slope):
            ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("Var at position 1 / Var at the last")
    axes[1][0].set_ylabel("log-log slope of Var against position")
    axes[0][0].legend(fontsize=8)
    _save(fig, path)


def probe_study(best: pd.DataFrame, inputs: dict[str, str], path: Path) -> None:
    """Probe MAE over the baseline against training sequences, from ``best``: one row per input,
    site, probe, feature set and count (its best layer's). A row of panels per input, a panel
    per site, a line per probe and feature set (below 1: better than predicting the middle)."""
    from matplotlib.ticker import NullLocator

    sites = list(dict.fromkeys(best["site"]))
    kinds = [kind for kind in inputs if kind in set(best["input"])]
    fig, axes = _pyplot().subplots(
        len(kinds), len(sites), figsize=(4.2 * len(sites), 3.3 * len(kinds)), squeeze=False,
        sharey=True, layout="constrained",
    )  # fmt: skip
    for row, kind in zip(axes, kinds, strict=True):
        for ax, site in zip(row, sites, strict=True):
            panel = best[(best["input"] == kind) & (best["site"] == site)]
            for i, ((probe, features), line) in enumerate(
                panel.groupby(["probe", "features"], sort=False)
            ):
                ax.plot(
                    line["samples"], line["mae"] / line["baseline"], marker="o", ms=3,
                    color=f"C{i}", ls="-" if features == "raw" else "--",
                    label=f"{probe}, {features}",
                )  # fmt: skip
            ax.axhline(1, color="grey", lw=0.8)
            ax.set(xscale="log", xlabel="training sequences", title=f"{inputs[kind]}: {site}")
            counts = sorted(best["samples"].unique())
            ax.set_xticks(counts, [str(c) for c in counts])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3, which="both")
        row[0].set_ylabel("MAE / baseline, best layer")
    axes[0][0].legend(fontsize=7)
    _save(fig, path)


def loss_by_position(frame: pd.DataFrame, path: Path, train_len: int, title: str = "") -> None:
    """Held-out loss against position (log scale, each bucket at its geometric middle), a line
    per multiple of the training length, the training length dashed."""
    fig, ax = _pyplot().subplots(figsize=(6.4, 3.8), layout="constrained")
    for i, (factor, rows) in enumerate(frame.groupby("length_factor", sort=True)):
        middle = np.sqrt(rows["bucket_start"].to_numpy() * rows["bucket_end"].to_numpy())
        ax.plot(middle, rows["loss"], marker="o", ms=3, lw=1.2, color=f"C{i}", label=f"{factor}x")
    ax.axvline(train_len, color="grey", ls="--", lw=1, label=f"training length {train_len}")
    ax.set(xscale="log", xlabel="position", ylabel="loss (nats per token)", title=title)
    _plain_log_labels(ax.xaxis)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    _save(fig, path)


def accuracy_by_length(frame: pd.DataFrame, labels: dict[str, str], path: Path) -> None:
    """Exact match against operand length: a panel per task, a line per encoding (mean over
    seeds), the task's training lengths 1..``max_len`` shaded."""
    _by_length(frame, labels, path, None)


def mechanisms_by_length(
    frame: pd.DataFrame, labels: dict[str, str], path: Path, measures: dict[str, str]
) -> None:
    """Each of ``measures`` (column name: axis label) against operand length, a row of panels
    each, laid out as :func:`accuracy_by_length`."""
    _by_length(frame, labels, path, measures)


def _by_length(
    frame: pd.DataFrame, labels: dict[str, str], path: Path, measures: dict[str, str] | None
) -> None:
    tasks = list(dict.fromkeys(frame["task"]))
    rows = measures or {"accuracy": "exact match"}
    fig, axes = _pyplot().subplots(
        len(rows), len(tasks), figsize=(4.2 * len(tasks), 3.4 * len(rows)), squeeze=False,
        layout="constrained",
    )  # fmt: skip
    for panels, (column, label) in zip(axes, rows.items(), strict=True):
        for ax, task in zip(panels, tasks, strict=True):
            of_task = frame[frame["task"] == task]
            mean = of_task.groupby(["pos_encoding", "length"], sort=False)[column].mean()
            for i, pe in enumerate(labels):
                if pe in mean.index.get_level_values(0):
                    ax.plot(mean[pe].index, mean[pe].to_numpy(), marker="o", ms=3, lw=1.2,
                            color=f"C{i}", label=labels[pe])  # fmt: skip
            ax.axvspan(0.5, of_task["max_len"].iloc[0] + 0.5, color="grey", alpha=0.15, lw=0)
            ax.set(xlabel="operand length", title=f"{task} (shaded: trained lengths)")
            if measures is None:
                ax.set_ylim(-0.03, 1.03)
            ax.xaxis.set_major_locator(_integer_ticks())
            ax.grid(alpha=0.3)
        panels[0].set_ylabel(label, fontsize=8 if measures else None)
    axes[0][0].legend(fontsize=8)
    _save(fig, path)


def perplexity_by_fix(ppl: pd.DataFrame, labels: dict[str, str], path: Path) -> None:
    """Perplexity against multiples of the training length: a panel per model, a line per fix
    (as trained solid and black), 1.1x the unscaled 1x perplexity dotted."""
    models = list(dict.fromkeys(ppl["model"]))
    fig, axes = _pyplot().subplots(
        1, len(models), figsize=(4.8 * len(models), 3.8), squeeze=False, layout="constrained"
    )
    for ax, model in zip(axes[0], models, strict=True):
        rows = ppl[ppl["model"] == model]
        for i, (fix, line) in enumerate(rows.groupby("fix", sort=False)):
            ax.plot(
                line["length_factor"], line["perplexity"], marker="o", ms=3, lw=1.2,
                color="black" if fix == "none" else f"C{i}", label=fix,
            )  # fmt: skip
        base = rows[(rows["fix"] == "none") & (rows["length_factor"] == 1)]["perplexity"].iloc[0]
        ax.axhline(1.1 * base, color="grey", ls=":", lw=1)
        ax.set(xscale="log", xlabel="× training length", title=_model_title(rows, labels))
        factors = [f for f in sorted(rows["length_factor"].unique()) if f == round(f)]
        ax.set_xticks(factors, [f"{f:g}" for f in factors])
        ax.xaxis.set_minor_formatter("")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("held-out perplexity (per byte)")
    axes[0][0].legend(fontsize=7)
    _save(fig, path)


def _model_title(rows: pd.DataFrame, labels: dict[str, str]) -> str:
    """One model's encoding and seed, from its rows."""
    return f"{labels[rows['pos_encoding'].iloc[0]]}, seed {rows['seed'].iloc[0]}"


def mechanisms_by_position(
    mechanisms: pd.DataFrame, labels: dict[str, str], train_len: int, path: Path
) -> None:
    """Attention entropy (a panel per layer) and Var(attn_out) of layer 1 against position: a row
    per model, a line per analysed length, the training length dashed."""
    models = list(dict.fromkeys(mechanisms["model"]))
    layers = sorted(mechanisms["layer"].unique())
    panels = [("entropy", layer) for layer in layers] + [("variance", 1)]
    fig, axes = _pyplot().subplots(
        len(models), len(panels), figsize=(3.4 * len(panels), 3.0 * len(models)),
        squeeze=False, layout="constrained",
    )  # fmt: skip
    for row, model in zip(axes, models, strict=True):
        frame = mechanisms[mechanisms["model"] == model]
        name = _model_title(frame, labels)
        for ax, (measure, layer) in zip(row, panels, strict=True):
            rows = frame[(frame["measure"] == measure) & (frame["layer"] == layer)]
            for i, (factor, line) in enumerate(rows.groupby("length_factor", sort=True)):
                middle = np.sqrt(line["bucket_start"].to_numpy() * line["bucket_end"].to_numpy())
                ax.plot(middle, line["value"], lw=1.2, color=f"C{i}", label=f"{factor}x")
            ax.axvline(train_len, color="grey", ls="--", lw=1)
            scale = "log" if measure == "variance" else "linear"
            ax.set(
                xscale="log",
                yscale=scale,
                xlabel="position",
                title=f"{name}: {measure}, layer {layer}",
            )
            ax.grid(alpha=0.3, which="both")
        row[0].set_ylabel("entropy (nats)")
        row[-1].set_ylabel("Var(attn_out)")
    axes[0][0].legend(fontsize=7)
    _save(fig, path)
