"""Haviv et al. 2022's own figures: probe MAD beside the published curves, perplexity
and learning curves by model size."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nopelab.plots import integer_ticks, plain_log_labels, pyplot, save, series

if TYPE_CHECKING:
    import pandas as pd


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
    fig, axes = pyplot().subplots(
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
        ax.plot(*series(by_layer["baseline"].mean()), color="grey", ls="--", lw=1,
                label="predict middle")  # fmt: skip
        ax.plot(*series(by_layer["random_baseline"].mean()), color="grey", ls=":", lw=1,
                label="random")  # fmt: skip
        ax.set(xlabel="layer (0 = embedding)", ylabel="MAD", title=f"ours: {probe}", ylim=(0, None))
        ax.xaxis.set_major_locator(integer_ticks())
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
    save(fig, path)


def perplexity_by_size(
    ours: pd.DataFrame,
    published: pd.DataFrame,
    labels: dict[str, str],
    path: Path,
    unit: str,
) -> None:
    """Perplexity (per ``unit``: byte or BPE token) against parameters, ours (seeds' spread as
    error bars) beside the published table, and each encoding's gap to NoPE in % of NoPE's
    perplexity, ours solid, theirs dashed."""
    fig, axes = pyplot().subplots(1, 3, figsize=(13.5, 3.8), layout="constrained")
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
    axes[0].set(title=f"ours: held-out perplexity per {unit}", ylabel="perplexity")
    axes[1].set(title="Haviv et al. Table 2: the Pile, per token")
    axes[2].set(title="gap to NoPE: ours (solid), theirs (dashed)")
    axes[2].set_ylabel("(encoding − NoPE) / NoPE, %")
    axes[2].axhline(0, color="grey", lw=0.8)
    for ax in axes:
        ax.set(xscale="log", xlabel="parameters")
        plain_log_labels(ax.xaxis)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    save(fig, path)


def learning_curves_by_size(
    curves: pd.DataFrame, labels: dict[str, str], path: Path, unit: str
) -> None:
    """Held-out loss (nats per ``unit``) against tokens seen: a panel per size, a line per
    encoding (and seed)."""
    sizes = sorted(curves["size"].unique())
    fig, axes = pyplot().subplots(
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
    axes[0][0].set_ylabel(f"held-out loss (nats per {unit})")
    axes[0][0].legend(fontsize=8)
    save(fig, path)
