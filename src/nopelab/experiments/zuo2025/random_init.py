"""Zuo et al. 2025, random init: nearby embeddings are more cosine-similar than distant ones.

We build Zuo's nanoGPT-style model (pre-LN, 6 layers, 6 heads, d = 384, no biases, tied
embeddings, 96-character vocabulary) at random init and feed uniformly random characters.
Three variants at normal(0.02): causal NoPE, causal with a learned position table, and
bidirectional NoPE (the control with no way to tell positions apart). Then causal NoPE across
Zuo's initialisation grid. Measured at the attention output (heads concatenated, after the
projection, before the residual add) and at the block output.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from nopelab import plots
from nopelab.config import AnalysisConfig, Init, ModelConfig, RunConfig, Site
from nopelab.experiments.outputs import write_outputs
from nopelab.experiments.scale_files import RandomInitScale, read_scales
from nopelab.experiments.summary_template import fill, shape_values
from nopelab.experiments.zuo2025 import figures
from nopelab.measure.analysis import analyze_model
from nopelab.measure.run_files import read_analysis, write_analysis
from nopelab.models.transformer import build_model
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import Job, default_workers, run_jobs
from nopelab.tables import by_layer, markdown_table, mean_std

SCALES = read_scales("zuo2025.random_init", RandomInitScale)
SITES: tuple[Site, ...] = ("attn_out", "resid_post")
VARIANTS: dict[str, dict[str, Any]] = {  # name -> the ModelConfig fields that differ
    "causal-nope": dict(pos_encoding="none"),
    "causal-learned": dict(pos_encoding="learned"),
    "bidirectional-nope": dict(pos_encoding="none", bidirectional=True),
}
INIT_GRID: list[tuple[Init, float]] = (
    [("normal", s) for s in (0.0002, 0.002, 0.02, 0.08, 0.2, 2.0)]
    + [("uniform", a) for a in (0.001, 0.02, 1.0, 10.0)]
    + [(name, 0.02) for name in ("xavier_normal", "xavier_uniform", "kaiming_uniform")]
)


@dataclass(frozen=True)
class Settings:
    runs: dict[str, RunConfig]  # name -> configuration, variants first, then the init grid
    workers: int  # models analysed at once


def _label(init: str, std: float) -> str:
    if init == "normal":
        return f"init-normal-{std:g}"
    if init == "uniform":
        return f"init-uniform-{std:g}"
    return f"init-{init}"


def settings(scale: str, seed: int, device: str) -> Settings:
    s = SCALES[scale]
    resolve_device(device)
    base = ModelConfig(
        d_model=s.d_model, n_heads=s.n_heads, n_layers=s.n_layers, max_seq_len=s.seq_len
    )
    analysis = AnalysisConfig(
        seq_len=s.seq_len,
        samples=s.samples,
        batch_size=s.batch_size,
        input="tokens",
        sites=SITES,
        seed=seed,
        device=device,
    )
    runs = {
        name: RunConfig(dataclasses.replace(base, **change), analysis)
        for name, change in VARIANTS.items()
    }
    for init, std in INIT_GRID:
        runs[_label(init, std)] = RunConfig(
            dataclasses.replace(base, init=init, init_std=std), analysis
        )
    return Settings(runs, 1 if scale == "paper" else default_workers(device))


def analyze_into(name: str, cfg: RunConfig, folder: Path) -> None:
    """One configuration's analysis folder (a job)."""
    start = time.perf_counter()
    result = analyze_model(build_model(cfg.model, cfg.analysis.seed), cfg.analysis, name)
    write_analysis(folder, cfg, result, time.perf_counter() - start, title=name, figures=False)


def run(settings: Settings, out: Path) -> None:
    jobs = [Job(name, analyze_into, (name, cfg)) for name, cfg in settings.runs.items()]
    run_jobs(jobs, out / "runs", "zuo2025 configurations", settings.workers, what="models")
    rows, cosines = [], {}
    for name, cfg in settings.runs.items():
        result = read_analysis(out / "runs" / name)
        for row in result.rows:
            rows.append(
                {
                    "run": name,
                    "init": cfg.model.init,
                    "init_std": cfg.model.init_std,
                    "pos_encoding": cfg.model.pos_encoding,
                    "bidirectional": cfg.model.bidirectional,
                    **row,
                }
            )
        cosines[name] = {
            layer: matrix for (site, layer), matrix in result.cosine.items() if site == "attn_out"
        }

    scores = pd.DataFrame(rows)
    attn = scores[scores["site"] == "attn_out"]

    plots.cosine_heatmaps(
        {f"{name} L{layer}": m for name in VARIANTS for layer, m in cosines[name].items()},
        out / "heatmaps.png",
        ncols=len(cosines["causal-nope"]),
        title="attn_out cosine, random init",
    )
    grid = [_label(init, std) for init, std in INIT_GRID]
    plots.cosine_heatmaps(
        {f"{name} L{layer}": m for name in grid for layer, m in cosines[name].items()},
        out / "heatmaps_init.png",
        ncols=len(cosines["causal-nope"]),
        title="causal NoPE attn_out by init",
    )
    grid_scores = attn[attn["run"].isin(grid)]
    figures.score_against_init(grid_scores, out / "score_vs_sigma.png", "Causal NoPE, random init")
    plots.scores_by_layer(
        attn[attn["run"].isin(list(VARIANTS))].assign(site=lambda f: f["run"]),
        out / "scores.png",
        "attn_out scores by variant",
    )
    write_outputs(out, {"scores": scores}, summary_text(settings, attn, grid), {"rows": rows})


def score_table(frame: pd.DataFrame) -> pd.DataFrame:
    cells = mean_std(frame["adjacency_mean"], frame["adjacency_std"], digits=(".3f", ".3f"))
    return by_layer(frame, ["run"], cells, frame["run"].unique()).reset_index()


def summary_text(settings: Settings, attn: pd.DataFrame, grid: list[str]) -> str:
    """``summary.md``: adjacency per layer for the variants, and across initialisations."""
    first = next(iter(settings.runs.values()))
    m, a = first.model, first.analysis
    return fill(
        "zuo2025.random_init",
        **shape_values(m),
        samples=a.samples,
        seq_len=a.seq_len,
        vocab_size=m.vocab_size,
        seed=a.seed,
        variants_table=markdown_table(score_table(attn[attn["run"].isin(list(VARIANTS))])),
        inits_table=markdown_table(score_table(attn[attn["run"].isin(grid)])),
    )
