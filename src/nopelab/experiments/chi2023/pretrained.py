"""Chi et al. 2023, pretrained: does the variance shrinkage survive language-model training?

A NoPE language model is trained on an embedded corpus (``--corpus``; by default the World English
Bible, at ``large`` both embedded corpora; byte-level), next
to a learned-PE and a RoPE model trained the same way. Each is analysed at init and after
training on the same held-out text windows: per-layer variance against position, and
perplexity at the training length, 2x and 4x it. Each model keeps its weights at every
checkpoint, and the attention output's variance decay (position 1 over the last, and the
log-log slope) is measured at each on those same windows: the decay along training.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nopelab import plots
from nopelab.config import ATTENTION, DEFAULT_SITES, AnalysisConfig, PosEncoding
from nopelab.encodings import labels_of
from nopelab.experiments.chi2023 import figures
from nopelab.experiments.outputs import gather, write_outputs
from nopelab.experiments.scale_files import read_scales, scale_schema
from nopelab.experiments.summary_template import (
    corpus_values,
    fill,
    schedule_values,
    shape_values,
)
from nopelab.experiments.train_and_measure import (
    CorpusScale,
    Trained,
    kept_checkpoints,
    lm_runs,
    perplexity_row,
    read_trained,
    train_and_analyze,
    training_job,
)
from nopelab.measure.analysis import analyze_model
from nopelab.measure.capture import CaptureResult
from nopelab.models.transformer import build_model
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import default_workers, run_jobs
from nopelab.runtime.rundir import write_json
from nopelab.tables import markdown_table
from nopelab.training.checkpoint import load_model
from nopelab.training.run import TrainRun
from nopelab.training.trained import make_source

POS_ENCODINGS: tuple[PosEncoding, ...] = ("none", "learned", "rope")
LABELS = labels_of(POS_ENCODINGS)


@scale_schema
class Scale(CorpusScale):
    model: dict[str, Any]  # ModelConfig fields
    train: dict[str, Any]  # TrainConfig fields
    samples: int  # held-out text windows analysed
    checkpoints: int  # checkpoints kept along training, evenly spaced


SCALES = read_scales("chi2023.pretrained", Scale)


@dataclass(frozen=True)
class Settings:
    runs: dict[str, TrainRun]  # pos_encoding -> run
    analysis: AnalysisConfig
    workers: int  # models trained at once


def settings(scale: str, seed: int, device: str, corpus: str | None = None) -> Settings:
    s = SCALES[scale]
    corpus = s.corpus if corpus is None else corpus  # --corpus, or the scale's
    resolve_device(device)
    runs = lm_runs(POS_ENCODINGS, s.model, s.train, seed, device, kept=s.checkpoints, corpus=corpus)
    analysis = AnalysisConfig(
        seq_len=s.train["seq_len"],
        samples=s.samples,
        batch_size=min(s.samples, 16),
        input="data",
        sites=(*DEFAULT_SITES, ATTENTION),
        seed=seed,
        device=device,
    )
    return Settings(runs, analysis, 1 if scale == "paper" else default_workers(device))


def _layer_ratios(pe: str, result: Trained) -> list[dict]:
    rows = []
    for state, analysis in (("init", result.init), ("trained", result.trained)):
        for row in analysis.rows:
            if row["site"] == "attn_out":
                rows.append(
                    {
                        "pos_encoding": pe,
                        "state": state,
                        "layer": row["layer"],
                        **_decay(analysis.variance("attn_out", row["layer"])),
                        "norm_score": row["norm_score_mean"],
                        "adjacency": row["adjacency_mean"],
                    }
                )
    return rows


def train_and_follow(run: TrainRun, analysis: AnalysisConfig, folder: Path) -> None:
    """Train and analyse one model (:func:`train_and_analyze`), then measure the attention
    output's variance decay at init and at every checkpoint it kept (``along.json``). A job."""
    train_and_analyze(run, analysis, (), folder)
    source = make_source(run, folder)
    only = dataclasses.replace(analysis, sites=("attn_out",))
    rows = []
    for step, weights in [(0, None), *kept_checkpoints(folder)]:
        model = build_model(run.model, run.train.seed)  # where training started
        if weights is not None:
            load_model(model, weights)
        result = analyze_model(model, only, progress=False, source=source)
        rows += _decay_rows(result, step * run.train.batch_size * run.train.seq_len, step)
    write_json(folder / "along.json", {"rows": rows})


def _decay_rows(result: CaptureResult, tokens: int, step: int) -> list[dict[str, Any]]:
    """Per layer: the decay of Var(attn_out) (:func:`_decay`)."""
    return [
        {"step": step, "tokens": tokens, "layer": layer, **_decay(stats.variance)}
        for (_, layer), stats in result.sites.items()
    ]


def _decay(variance: np.ndarray) -> dict[str, float]:
    """Variance at position 1 over the last (``first_over_last``) and the least-squares slope
    of log variance against log position (``slope``: -1 for a 1/m law)."""
    m = np.arange(1, len(variance) + 1)
    slope = np.polyfit(np.log(m), np.log(np.maximum(variance, 1e-30)), 1)[0]
    return {"first_over_last": float(variance[0] / variance[-1]), "slope": float(slope)}


def run(settings: Settings, out: Path) -> None:
    jobs = [
        training_job(f"lm-{pe}", train_and_follow, (train_run, settings.analysis), train_run)
        for pe, train_run in settings.runs.items()
    ]
    run_jobs(jobs, out / "runs", "chi2023 language models", settings.workers, what="models")
    along = gather(
        out, [(f"lm-{pe}", {"pos_encoding": pe}) for pe in settings.runs], "along.json", "rows"
    )
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

    layers, ppl, decay = pd.DataFrame(ratios), pd.DataFrame(perplexity), pd.DataFrame(along)
    plots.variance_by_position(
        pd.concat(positions), out / "variance.png", title="Variance of attn_out against position"
    )
    figures.decay_along_training(decay, LABELS, out / "along.png")
    write_outputs(
        out,
        {"layers": layers, "perplexity": ppl, "along": decay},
        summary_text(settings, layers, ppl, decay),
        {"perplexity": perplexity, "layers": ratios, "along": along},
    )


def summary_text(
    settings: Settings, layers: pd.DataFrame, ppl: pd.DataFrame, decay: pd.DataFrame
) -> str:
    """``summary.md``: perplexity per encoding, the NoPE variance decay per layer, and the
    decay along training for every encoding."""
    nope = layers[layers["pos_encoding"] == "none"].pivot(
        index="layer", columns="state", values=["first_over_last", "slope"]
    )
    nope.columns = [f"{stat} ({state})" for stat, state in nope.columns]
    first = settings.runs["none"]
    m, t, a = first.model, first.train, settings.analysis
    return fill(
        "chi2023.pretrained",
        **corpus_values(first),
        **shape_values(m),
        **schedule_values(t),
        seed=t.seed,
        samples=a.samples,
        window=a.seq_len,
        perplexity_table=markdown_table(ppl, ".3f"),
        variance_table=markdown_table(nope.reset_index(), ".3g"),
        checkpoints=decay["step"].nunique() - 1,
        along_table=markdown_table(_along_table(decay, "first_over_last"), ".3g"),
        slope_table=markdown_table(_along_table(decay, "slope"), ".2f"),
    )


def _along_table(decay: pd.DataFrame, value: str) -> pd.DataFrame:
    """``value`` (``first_over_last`` or ``slope``) per encoding and layer (rows) at each step
    kept (columns: tokens)."""
    table = decay.assign(encoding=decay["pos_encoding"].map(LABELS)).pivot(
        index=["encoding", "layer"], columns="tokens", values=value
    )
    table = table.reindex([LABELS[pe] for pe in POS_ENCODINGS], level="encoding")
    table.columns = [f"{tokens / 1e6:.2g} M" for tokens in table.columns]
    return table.reset_index()
