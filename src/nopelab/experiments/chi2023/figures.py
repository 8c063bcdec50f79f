"""Chi et al. 2023's own figures: the variance decay along training, the probe study."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nopelab.plots import plain_log_labels, pyplot, save

if TYPE_CHECKING:
    import pandas as pd


def decay_along_training(decay: pd.DataFrame, labels: dict[str, str], path: Path) -> None:
    """The decay of Var(attn_out) against tokens seen, a column of panels per layer, a line per
    encoding: position 1 over the last (top; a 1/m law gives T, no decay 1) and the log-log
    slope against position (bottom; -1 for 1/m, 0 for no decay)."""
    layers = sorted(decay["layer"].unique())
    fig, axes = pyplot().subplots(
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
        plain_log_labels(ratio.yaxis)
        slope.axhline(-1, color="grey", lw=0.8, ls="--")
        slope.axhline(0, color="grey", lw=0.8)
        slope.set(xlabel="tokens seen (M)")
        for ax in (ratio, slope):
            ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("Var at position 1 / Var at the last")
    axes[1][0].set_ylabel("log-log slope of Var against position")
    axes[0][0].legend(fontsize=8)
    save(fig, path)


def probe_study(best: pd.DataFrame, inputs: dict[str, str], path: Path) -> None:
    """Probe MAE over the baseline against training sequences, from ``best``: one row per input,
    site, probe, feature set and count (its best layer's). A row of panels per input, a panel
    per site, a line per probe and feature set (below 1: better than predicting the middle)."""
    from matplotlib.ticker import NullLocator

    sites = list(dict.fromkeys(best["site"]))
    kinds = [kind for kind in inputs if kind in set(best["input"])]
    fig, axes = pyplot().subplots(
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
    save(fig, path)
