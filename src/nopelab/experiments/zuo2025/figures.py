"""Zuo et al. 2025's own figures: scores against the init scale, the trained models'
scores, steps to mastery."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nopelab.plots import integer_ticks, pyplot, save, score_lines

if TYPE_CHECKING:
    import pandas as pd


def score_against_init(scores: pd.DataFrame, path: Path, title: str = "") -> None:
    """Adjacency score per layer against the init scale: normal(σ) and uniform(±a) panels."""
    fig, axes = pyplot().subplots(1, 2, figsize=(9, 3.6), sharey=True, layout="constrained")
    for ax, init in zip(axes, ("normal", "uniform"), strict=True):
        subset = scores[scores["init"] == init].sort_values("init_std")
        score_lines(
            ax, subset.assign(L="L" + subset["layer"].astype(str)), "init_std", "adjacency", "L"
        )
        symbol = "σ" if init == "normal" else "a"
        ax.set(xscale="log", xlabel=f"{init} init scale {symbol}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("adjacency score (attn_out)")
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    save(fig, path)


def trained_scores(scores: pd.DataFrame, path: Path) -> None:
    """Adjacency score per layer, a panel per task, a colour per encoding; init dashed."""
    tasks = list(dict.fromkeys(scores["task"]))
    fig, axes = pyplot().subplots(
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
        ax.xaxis.set_major_locator(integer_ticks())
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("adjacency score (attn_out)")
    axes[0][0].legend(fontsize=7)
    save(fig, path)


def steps_to_mastery(
    table: pd.DataFrame, tasks: list[str], encodings: list[str], stop_at: float, path: Path
) -> None:
    """Steps to mastery per task (a panel each): a dot per seed for each encoding, the mean as a
    bar; a seed that did not reach ``stop_at`` is a cross at the steps it trained."""
    fig, axes = pyplot().subplots(
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
    save(fig, path)
