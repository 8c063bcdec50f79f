"""Chi et al. 2023, pretrained: does the variance shrinkage survive language-model training?

A NoPE language model is trained on the embedded corpus (World English Bible, byte-level), next
to a learned-PE and a RoPE model trained the same way. Each is analysed at init and after
training on the same held-out text windows: per-layer variance against position, and
perplexity at the training length, 2x and 4x it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

import numpy as np
import pandas as pd

from nopelab import plots
from nopelab.config import AnalysisConfig, PosEncoding
from nopelab.experiments.scale_files import read_scales
from nopelab.experiments.summary_template import fill, schedule_values, shape_values
from nopelab.experiments.train_and_measure import (
    Trained,
    lm_runs,
    perplexity_row,
    read_trained,
    train_and_analyze,
)
from nopelab.runtime.device import resolve_device
from nopelab.runtime.rundir import write_json
from nopelab.sweep.runner import Job, default_workers, run_jobs
from nopelab.tables import markdown_table
from nopelab.training.run import TrainRun

POS_ENCODINGS: tuple[PosEncoding, ...] = ("none", "learned", "rope")


class Scale(TypedDict):
    model: dict[str, Any]  # ModelConfig fields
    train: dict[str, Any]  # TrainConfig fields
    samples: int  # held-out text windows analysed


SCALES = cast(dict[str, Scale], read_scales("chi2023_pretrained", Scale))


@dataclass(frozen=True)
class Settings:
    runs: dict[str, TrainRun]  # pos_encoding -> run
    analysis: AnalysisConfig
    workers: int  # models trained at once


def settings(scale: str, seed: int, device: str) -> Settings:
    s = SCALES[scale]
    resolve_device(device)
    runs = lm_runs(POS_ENCODINGS, s["model"], s["train"], seed, device)
    analysis = AnalysisConfig(
        seq_len=s["train"]["seq_len"],
        samples=s["samples"],
        batch_size=min(s["samples"], 16),
        input="data",
        attn_entropy=True,
        seed=seed,
        device=device,
    )
    return Settings(runs, analysis, 1 if scale == "paper" else default_workers(device))


def _layer_ratios(pe: str, result: Trained) -> list[dict]:
    rows = []
    for state, analysis in (("init", result.init), ("trained", result.trained)):
        for row in analysis.rows:
            if row["site"] == "attn_out":
                variance = analysis.variance("attn_out", row["layer"])
                rows.append(
                    {
                        "pos_encoding": pe,
                        "state": state,
                        "layer": row["layer"],
                        "first_over_last": float(variance[0] / variance[-1]),
                        "slope": _loglog_slope(variance),
                        "norm_score": row["norm_score_mean"],
                        "adjacency": row["adjacency_mean"],
                    }
                )
    return rows


def _loglog_slope(variance: np.ndarray) -> float:
    """Least-squares slope of log variance against log position (-1 for a 1/m law)."""
    m = np.arange(1, len(variance) + 1)
    return float(np.polyfit(np.log(m), np.log(np.maximum(variance, 1e-30)), 1)[0])


def run(settings: Settings, out: Path) -> None:
    jobs = [
        Job(f"lm-{pe}", train_and_analyze, (train_run, settings.analysis, ()))
        for pe, train_run in settings.runs.items()
    ]
    run_jobs(jobs, out / "runs", "chi2023 language models", settings.workers, what="models")
    ratios, perplexity, positions = [], [], []
    for pe in settings.runs:
        result = read_trained(out / "runs" / f"lm-{pe}")
        ratios += _layer_ratios(pe, result)
        perplexity.append(perplexity_row(result.summary, pos_encoding=pe))
        if pe == "none":
            for state, analysis in (("init", result.init), ("trained", result.trained)):
                table = analysis.positions
                table = table[table["site"] == "attn_out"].assign(site=f"NoPE attn_out, {state}")
                positions.append(table)

    layers = pd.DataFrame(ratios)
    layers.to_parquet(out / "layers.parquet", index=False)
    ppl = pd.DataFrame(perplexity)
    ppl.to_parquet(out / "perplexity.parquet", index=False)
    write_json(out / "summary.json", {"perplexity": perplexity, "layers": ratios})
    plots.variance_by_position(
        pd.concat(positions), out / "variance.png", title="Variance of attn_out against position"
    )
    (out / "summary.md").write_text(summary_text(settings, layers, ppl))


def summary_text(settings: Settings, layers: pd.DataFrame, ppl: pd.DataFrame) -> str:
    """``summary.md``: perplexity per encoding, and the NoPE variance decay per layer."""
    nope = layers[layers["pos_encoding"] == "none"].pivot(
        index="layer", columns="state", values=["first_over_last", "slope"]
    )
    nope.columns = [f"{stat} ({state})" for stat, state in nope.columns]
    first = settings.runs["none"]
    m, t, a = first.model, first.train, settings.analysis
    return fill(
        "chi2023_pretrained",
        **shape_values(m),
        **schedule_values(t),
        samples=a.samples,
        window=a.seq_len,
        perplexity_table=markdown_table(ppl, ".3f"),
        variance_table=markdown_table(nope.reset_index(), ".3g"),
    )
