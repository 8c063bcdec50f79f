"""Wang et al. 2024's own figures: perplexity by logit-scale fix, mechanisms by position."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nopelab.plots import pyplot, save

if TYPE_CHECKING:
    import pandas as pd


def perplexity_by_fix(ppl: pd.DataFrame, labels: dict[str, str], path: Path) -> None:
    """Perplexity against multiples of the training length: a panel per model, a line per fix
    (as trained solid and black), 1.1x the unscaled 1x perplexity dotted."""
    models = list(dict.fromkeys(ppl["model"]))
    fig, axes = pyplot().subplots(
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
    save(fig, path)


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
    fig, axes = pyplot().subplots(
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
    save(fig, path)
