"""Kazemnejad et al. 2023's own figures: accuracy and mechanisms against operand length."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nopelab.plots import integer_ticks, pyplot, save

if TYPE_CHECKING:
    import pandas as pd


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
    fig, axes = pyplot().subplots(
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
            ax.xaxis.set_major_locator(integer_ticks())
            ax.grid(alpha=0.3)
        panels[0].set_ylabel(label, fontsize=8 if measures else None)
    axes[0][0].legend(fontsize=8)
    save(fig, path)
