"""Turn reduced statistics into tables, figures and the files of a run directory.

A run directory holds:

* ``config.json`` — the resolved model and analysis configuration, plus versions;
* ``summary.json`` — ``rows``: one object per (layer, site) with the scores and variances;

with a vector site among the sites:

* ``positions.parquet`` — long format: layer, site, position (1-based), variance, norm;
* ``distance.parquet`` — layer, site, distance, mean cosine similarity at that distance;
* ``cosine.npz`` — one mean cosine matrix per (site, layer), named ``{site}_{layer}``: T x T up
  to 1024 positions, block means over squares of ceil(T / 1024) positions beyond
  (``summary.json``'s ``cosine_block``);
* ``variance.png``, ``distance.png``, ``cosine_{site}.png``, ``scores.png``;

with the site ``attention``:

* ``attention.parquet`` — layer, position, entropy, uniform_entropy, logit_variance (heads' mean);
* ``attention_heads.parquet`` — the same per head: layer, head, position, entropy, logit_variance;
* ``attention.png``;

and ``summary.md`` — the headline numbers in tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nopelab import plots
from nopelab.config import RunConfig
from nopelab.encodings import encoding
from nopelab.measure import theory
from nopelab.measure.capture import CaptureResult
from nopelab.runtime.device import resolve_device
from nopelab.runtime.rundir import environment, write_json
from nopelab.tables import markdown_table


def summary_rows(result: CaptureResult) -> list[dict[str, Any]]:
    """One row per (layer, site) with scores (mean and std over samples) and variances."""
    rows = []
    for (site, layer), stats in result.sites.items():
        by_distance = stats.cosine_by_distance
        rows.append(
            {
                "layer": layer,
                "site": site,
                "samples": stats.samples,
                "adjacency_mean": stats.adjacency.mean,
                "adjacency_std": stats.adjacency.std,
                "adjacency_signed_mean": stats.adjacency_signed.mean,
                "adjacency_signed_std": stats.adjacency_signed.std,
                "norm_score_mean": stats.norm_score.mean,
                "norm_score_std": stats.norm_score.std,
                "norm_score_zuo_mean": stats.norm_score_zuo.mean,
                "norm_score_zuo_std": stats.norm_score_zuo.std,
                "norm_signed_mean": stats.norm_signed.mean,
                "norm_signed_std": stats.norm_signed.std,
                "variance_first": float(stats.variance[0]),
                "variance_last": float(stats.variance[-1]),
                "variance_ratio": float(stats.variance[0] / max(stats.variance[-1], 1e-30)),
                "norm_first": float(stats.norm[0]),
                "norm_last": float(stats.norm[-1]),
                "cosine_distance_1": float(by_distance[1]),
                "cosine_distance_half": float(by_distance[len(by_distance) // 2]),
            }
        )
    return rows


def positions_table(result: CaptureResult) -> pd.DataFrame:
    frames = [
        pd.DataFrame(
            {
                "layer": layer,
                "site": site,
                "position": np.arange(1, len(stats.variance) + 1),
                "variance": stats.variance,
                "norm": stats.norm,
            }
        )
        for (site, layer), stats in result.sites.items()
    ]
    return pd.concat(frames, ignore_index=True)


def distance_table(result: CaptureResult) -> pd.DataFrame:
    frames = []
    for (site, layer), stats in result.sites.items():
        by_distance = stats.cosine_by_distance
        frames.append(
            pd.DataFrame(
                {
                    "layer": layer,
                    "site": site,
                    "distance": np.arange(len(by_distance)),
                    "cosine": by_distance,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def attention_table(result: CaptureResult) -> pd.DataFrame:
    frames = [
        pd.DataFrame(
            {
                "layer": layer,
                "position": np.arange(1, len(stats.entropy) + 1),
                "entropy": stats.entropy,
                "uniform_entropy": stats.uniform_entropy,
                "logit_variance": stats.logit_variance,
            }
        )
        for layer, stats in result.attention.items()
    ]
    return pd.concat(frames, ignore_index=True)


def attention_heads_table(result: CaptureResult) -> pd.DataFrame:
    """One row per (layer, head, position), heads and positions 1-based."""
    frames = []
    for layer, stats in result.attention.items():
        heads, T = stats.head_entropy.shape
        frames.append(
            pd.DataFrame(
                {
                    "layer": layer,
                    "head": np.repeat(np.arange(1, heads + 1), T),
                    "position": np.tile(np.arange(1, T + 1), heads),
                    "entropy": stats.head_entropy.ravel(),
                    "logit_variance": stats.head_logit_variance.ravel(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def first_layer_theory(cfg: RunConfig) -> np.ndarray | None:
    """Predicted variance of layer 1's ``attn_out`` per position, where the derivation applies.

    It applies to a causal pre-LN model with normal(σ) weights, no biases, no input-level or
    ALiBi position signal, the usual 1/sqrt(head_dim) logit scale, fed random input vectors
    (Chi et al.'s setting).
    """
    m, a = cfg.model, cfg.analysis
    applies = (
        not m.bidirectional
        and m.logit_scale == 1
        and not m.head_scales
        and m.norm_position == "pre"
        and m.init == "normal"
        and not m.bias
        and encoding(m.pos_encoding).level in ("none", "rotary")  # no position added or biased
        and a.input == "random"
    )
    if not applies:
        return None
    positions = np.arange(1, a.seq_len + 1)
    return theory.attn_output_variance(positions, m.d_model, m.init_std)


def write_analysis(
    out: Path,
    cfg: RunConfig,
    result: CaptureResult,
    seconds: float,
    title: str = "",
    figures: bool = True,
    random_init: bool = True,
) -> dict:
    """Write every file of a run directory into ``out`` (figures optional); return the summary.

    ``random_init=False`` (a trained model) leaves out the random-init theory curve. The
    per-site files are written when a vector site was measured, the attention files when the
    site ``attention`` was.
    """
    rows = summary_rows(result)
    summary = {
        "rows": rows,
        "seconds": seconds,
        "device": str(resolve_device(cfg.analysis.device)),
        # positions per side of cosine.npz's squares (1: whole T x T matrices)
        "cosine_block": max((s.block for s in result.sites.values()), default=1),
    }
    write_json(out / "config.json", {**cfg.to_dict(), "environment": environment()})
    write_json(out / "summary.json", summary)
    if result.sites:
        _write_sites(out, cfg, result, rows, title if figures else None, random_init)
    attention_md = ""
    if result.attention:
        attention = attention_table(result)
        last = attention[attention["position"] == cfg.analysis.seq_len]
        attention_md = (
            "\nAttention at the last position (entropy over heads' mean, uniform's over the "
            f"keys it sees):\n\n{markdown_table(last.drop(columns='position'))}\n"
        )
        attention.to_parquet(out / "attention.parquet", index=False)
        attention_heads_table(result).to_parquet(out / "attention_heads.parquet", index=False)
        if figures:
            plots.attention_entropy(attention, out / "attention.png")
    columns = [
        "layer",
        "site",
        "adjacency_mean",
        "adjacency_std",
        "norm_score_mean",
        "norm_score_zuo_mean",
        "variance_first",
        "variance_last",
        "variance_ratio",
    ]
    table = f"{markdown_table(pd.DataFrame(rows)[columns])}\n" if rows else ""
    (out / "summary.md").write_text(
        f"# nopelab analysis{': ' + title if title else ''}\n\n"
        f"{cfg.analysis.samples} samples of length {cfg.analysis.seq_len}, {seconds:.1f} s.\n\n"
        + table
        + attention_md
    )
    return summary


def _write_sites(
    out: Path,
    cfg: RunConfig,
    result: CaptureResult,
    rows: list[dict[str, Any]],
    title: str | None,
    random_init: bool,
) -> None:
    """The per-site tables, the kept cosine matrices and (``title`` not None) their figures."""
    positions = positions_table(result)
    positions.to_parquet(out / "positions.parquet", index=False)
    distance = distance_table(result)
    distance.to_parquet(out / "distance.parquet", index=False)
    cosine = {key: s.cosine.astype(np.float32) for key, s in result.sites.items()}
    # uncompressed: deflate takes seconds for these matrices and saves about a seventh
    matrices: dict[str, Any] = {f"{site}_{layer}": m for (site, layer), m in cosine.items()}
    np.savez(out / "cosine.npz", **matrices)
    if title is None:
        return
    theory_curve = first_layer_theory(cfg) if random_init else None
    plots.variance_by_position(positions, out / "variance.png", theory_curve, title)
    plots.cosine_by_distance(distance, out / "distance.png", title)
    for site in dict.fromkeys(site for site, _ in cosine):
        matrices = {f"{s} L{layer}": m for (s, layer), m in cosine.items() if s == site}
        plots.cosine_heatmaps(matrices, out / f"cosine_{site}.png", title=f"{title} {site}".strip())
    plots.scores_by_layer(pd.DataFrame(rows), out / "scores.png", title)


@dataclass(frozen=True)
class WrittenAnalysis:
    """The files :func:`write_analysis` wrote, read back: what tables across runs are built of."""

    rows: list[dict[str, Any]]  # summary.json's rows (a non-finite score reads as None)
    positions: pd.DataFrame  # positions.parquet
    cosine: dict[
        tuple[str, int], np.ndarray
    ]  # (site, layer) -> T x T (block means past 1024), float32

    def variance(self, site: str, layer: int) -> np.ndarray:
        """Variance against position (1-based, in order) at one site and layer."""
        frame = self.positions[
            (self.positions["site"] == site) & (self.positions["layer"] == layer)
        ]
        return frame.sort_values("position")["variance"].to_numpy()


def read_analysis(folder: Path) -> WrittenAnalysis:
    """Read the run directory that :func:`write_analysis` wrote into ``folder``."""
    with np.load(folder / "cosine.npz") as matrices:
        cosine = {}
        for key in matrices.files:
            site, _, layer = key.rpartition("_")
            cosine[site, int(layer)] = matrices[key]
    return WrittenAnalysis(
        rows=json.loads((folder / "summary.json").read_text())["rows"],
        positions=pd.read_parquet(folder / "positions.parquet"),
        cosine=cosine,
    )
