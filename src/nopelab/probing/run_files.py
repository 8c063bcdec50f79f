"""The files of a probe run (``nopelab probe``, ``nopelab compare-signals``).

* ``config.json`` — the resolved model, analysis and probe settings, plus versions;
* ``probes.parquet`` — one row per (site, layer, features, probe) (plus ``model``/``state`` for
  compare-signals): ``mad`` and ``accuracy`` (classifiers) or ``mae`` and ``r`` (regressors),
  ``baseline`` (error of predicting the middle), each metric's seed spread as ``NAME_std``, and
  ``seeds``;
* ``summary.json`` — ``rows`` (the same), ``verdict`` (compare-signals), ``seconds``;
* ``verdict.parquet`` — compare-signals: per layer, which signal alone recovers position best;
* ``probes.png`` — error against layer, a line per feature set, the baseline dashed;
* ``summary.md`` — the tables in markdown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from nopelab import plots
from nopelab.runtime.rundir import environment, write_json
from nopelab.tables import markdown_table, mean_std

LABELS = ["model", "state"]


def readable(rows: pd.DataFrame) -> pd.DataFrame:
    """The probe rows as a compact table: the error as ``mean ± std``, the baseline, and
    accuracy or Pearson r."""
    columns = [c for c in [*LABELS, "site", "layer", "features", "probe"] if c in rows]
    table = rows[columns].copy()
    regression = rows["probe"].str.endswith("reg")

    def pick(if_regression: str, if_classifier: str) -> pd.Series:
        # a run with only classifiers (or only regressors) has no column for the other kind
        missing = pd.Series(float("nan"), index=rows.index)
        return rows.get(if_regression, missing).where(regression, rows.get(if_classifier, missing))

    metric, spread = pick("mae", "mad"), pick("mae_std", "mad_std")
    table["error (MAE/MAD)"] = mean_std(metric, spread)
    table["baseline"] = rows["baseline"].round(3)
    table["r / accuracy"] = pick("r", "accuracy").round(3)
    return table


def write_probes(
    out: Path,
    config: dict[str, Any],
    rows: list[dict[str, Any]],
    seconds: float,
    title: str,
    verdict: pd.DataFrame | None = None,
) -> None:
    """Write a probe run's files into ``out``."""
    frame = pd.DataFrame(rows)
    write_json(out / "config.json", {**config, "environment": environment()})
    summary: dict[str, Any] = {"rows": rows, "seconds": seconds}
    frame.to_parquet(out / "probes.parquet", index=False)
    text = f"# nopelab probes: {title}\n\n{seconds:.1f} s. Lower error is better; the baseline predicts the middle position.\n\n"
    if verdict is not None:
        summary["verdict"] = verdict.to_dict(orient="records")
        verdict.to_parquet(out / "verdict.parquet", index=False)
        text += "## Which signal alone recovers position best (regression MAE)\n\n"
        text += markdown_table(verdict) + "\n\n"
    write_json(out / "summary.json", summary)
    panel = frame["site"]
    for label in reversed(LABELS):
        if label in frame:
            panel = frame[label].astype(str) + " " + panel
    plots.probe_errors(frame.assign(panel=panel), out / "probes.png", panel="panel", title=title)
    text += "## Probes\n\n" + markdown_table(readable(frame)) + "\n"
    (out / "summary.md").write_text(text)
