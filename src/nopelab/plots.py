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


def _layer_colours(layers: list[int]) -> matplotlib.colors.Normalize:
    """The layer-to-colour scale shared by the lines and their colour bar."""
    low, high = min(layers), max(layers)
    return matplotlib.colors.Normalize(vmin=low, vmax=high if high > low else low + 1)


def _layer_colourbar(
    fig: plt.Figure, axes: list[plt.Axes], norm: matplotlib.colors.Normalize
) -> None:
    mappable = matplotlib.cm.ScalarMappable(norm=norm, cmap="viridis")
    bar = fig.colorbar(mappable, ax=axes, fraction=0.02, pad=0.01)
    bar.set_label("layer")
    bar.locator = matplotlib.ticker.MaxNLocator(integer=True)
    bar.update_ticks()


def _lines_by_layer(frame: pd.DataFrame, x: str, y: str) -> tuple[plt.Figure, dict[str, plt.Axes]]:
    """A panel per site, a line of ``y`` against ``x`` (log scale) per layer, a layer colour bar."""
    sites = list(dict.fromkeys(frame["site"]))
    fig, axes = plt.subplots(
        1, len(sites), figsize=(4.2 * len(sites), 3.6), squeeze=False, layout="constrained"
    )
    norm = _layer_colours(sorted(frame["layer"].unique()))
    for ax, site in zip(axes[0], sites, strict=True):
        for layer, rows in frame[frame["site"] == site].groupby("layer"):
            ax.plot(rows[x], rows[y], color=plt.cm.viridis(norm(layer)), lw=1.2)
        ax.set(xscale="log", title=site)
        ax.grid(alpha=0.3, which="both")
    _layer_colourbar(fig, list(axes[0]), norm)
    return fig, dict(zip(sites, axes[0], strict=True))


def variance_by_position(
    positions: pd.DataFrame, path: Path, theory: np.ndarray | None = None, title: str = ""
) -> None:
    """One panel per site: per-position variance (log-log), one line per layer.

    ``theory`` (if given) is the predicted variance of layer 1's ``attn_out``, drawn dashed.
    """
    fig, axes = _lines_by_layer(positions, "position", "variance")
    for ax in axes.values():
        ax.set(yscale="log", xlabel="position m", ylabel="variance")
    if theory is not None and "attn_out" in axes:
        ax = axes["attn_out"]
        (line,) = ax.plot(np.arange(1, len(theory) + 1), theory, "k--", lw=1.5, label="theory, L1")
        ax.legend(handles=[line], fontsize=7)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def cosine_by_distance(distance: pd.DataFrame, path: Path, title: str = "") -> None:
    """Mean cosine similarity against distance |i - j| > 0, a panel per site, a line per layer."""
    fig, axes = _lines_by_layer(distance[distance["distance"] > 0], "distance", "cosine")
    for ax in axes.values():
        ax.set(xlabel="distance |i - j|", ylabel="mean cosine")
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


def _score_lines(ax: plt.Axes, rows: pd.DataFrame, x: str, score: str, by: str) -> None:
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
    fig, axes = plt.subplots(
        1, len(scores), figsize=(4.5 * len(scores), 3.6), squeeze=False, layout="constrained"
    )
    axes = axes[0]
    for ax, score in zip(axes, scores, strict=True):
        _score_lines(ax, rows, "layer", score, "site")
        ax.set(xlabel="layer", ylabel=SCORE_LABELS[score])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def scores_by_variant(rows: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency score (mean ± std over samples) per layer: a panel per site, a line per
    ``variant``."""
    sites = list(dict.fromkeys(rows["site"]))
    fig, axes = plt.subplots(
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
    first = attention[attention["layer"] == attention["layer"].min()]
    (line,) = ax.plot(
        first["position"], first["uniform_entropy"], "k--", lw=1.5, label="uniform (log m)"
    )
    ax.set(xlabel="query position m", ylabel="entropy (nats)", title="")
    ax.legend(handles=[line], fontsize=7)
    _save(fig, path)


def score_against_init(scores: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency score per layer against the init scale: normal(σ) and uniform(±a) panels."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True, layout="constrained")
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
    fig, axes = plt.subplots(
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
    fig, axes = plt.subplots(
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
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
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
    fig, axes = plt.subplots(
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
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
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
    fig, axes = plt.subplots(
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
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
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
    fig, ax = plt.subplots(figsize=(max(5.5, 3.5 + 1.2 * len(layers)), 3.6))
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
    fig, axes = plt.subplots(
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
