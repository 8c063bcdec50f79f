"""Haviv et al. 2022: language models without positional encodings still learn position.

Byte-level language models with no positional encoding (NoPE), a learned table, fixed
sinusoids and ALiBi are trained the same way on an embedded corpus (``--corpus``; by default the
World English Bible, at ``large`` both embedded corpora).
For each we report held-out perplexity, then freeze it and probe every layer's output for
absolute position: a linear and a one-hidden-layer MLP classifier over the T positions
(cross-entropy), scored by the mean absolute distance (MAD) |target − argmax| on held-out
text windows. Layer 0 is the input to the first block (token plus input-level position
embedding); layer l is block l's output.

Haviv et al.'s model had 1.3B parameters, 24 layers and T = 1024; ours are far smaller and
shorter, so their published per-layer MADs are drawn beside ours for the shape of the curve
only: depth as a fraction of the stack, MAD as a fraction of the random-guess baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from nopelab.config import AnalysisConfig, PosEncoding, Probe, ProbeConfig, Site
from nopelab.encodings import labels_of
from nopelab.experiments.haviv2022 import figures
from nopelab.experiments.outputs import gather, model_file, write_outputs
from nopelab.experiments.scale_files import read_published, read_scales, scale_schema
from nopelab.experiments.summary_template import (
    corpus_values,
    fill,
    schedule_values,
    shape_values,
)
from nopelab.experiments.train_and_measure import (
    CorpusScale,
    lm_runs,
    perplexity_row,
    train_into,
    training_job,
)
from nopelab.probing.pipeline import probe_model
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import default_workers, run_jobs
from nopelab.runtime.rundir import write_json
from nopelab.tables import by_layer, markdown_table, mean_std
from nopelab.training.run import TrainRun
from nopelab.training.trained import load_trained, make_source

POS_ENCODINGS: tuple[PosEncoding, ...] = ("none", "learned", "sinusoidal", "alibi")
LABELS = labels_of(POS_ENCODINGS)
PROBES: tuple[Probe, ...] = ("linear-cls", "mlp-cls")
SHAPE_PROBE = "mlp-cls"  # the probe drawn against the published curves
SITES: tuple[Site, ...] = ("embed", "resid_post")

# Haviv et al. 2022 (haviv2022/published.toml, with the figure and table of each): the probe's
# MAD per layer of their 1.3B models (24 layers, the Pile, T = 1024) and WikiText-103 perplexity
_PUBLISHED = read_published("haviv2022")
PUBLISHED_LAYERS: int = _PUBLISHED["probe"]["layers"]
PUBLISHED_SEQ_LEN: int = _PUBLISHED["probe"]["seq_len"]
PUBLISHED_RANDOM: float = _PUBLISHED["probe"]["random_baseline"]
PUBLISHED_MAD: dict[str, dict[int, float]] = {
    pe: {int(layer): mad for layer, mad in by_layer.items()}
    for pe, by_layer in _PUBLISHED["probe"]["mad"].items()
}
PUBLISHED_PERPLEXITY: dict[str, float] = _PUBLISHED["wikitext103"]["perplexity"]


@scale_schema
class ProbeScale:
    samples: int  # held-out text windows probed
    epochs: int
    batch_size: int


@scale_schema
class Scale(CorpusScale):
    model: dict[str, Any]  # ModelConfig fields
    train: dict[str, Any]  # TrainConfig fields
    probe: ProbeScale


SCALES = read_scales("haviv2022.pretrained", Scale)


@dataclass(frozen=True)
class Settings:
    runs: dict[str, TrainRun]  # pos_encoding -> run
    analysis: AnalysisConfig  # the probes' inputs: held-out text windows
    probe: ProbeConfig
    workers: int  # models trained and probed at once


def settings(scale: str, seed: int, device: str, corpus: str | None = None) -> Settings:
    s = SCALES[scale]
    corpus = s.corpus if corpus is None else corpus  # --corpus, or the scale's
    resolve_device(device)
    runs = lm_runs(POS_ENCODINGS, s.model, s.train, seed, device, corpus=corpus)
    p = s.probe
    analysis = AnalysisConfig(
        seq_len=s.train["seq_len"],
        samples=p.samples,
        batch_size=16,
        input="data",
        sites=SITES,
        seed=seed,
        device=device,
    )
    probe = ProbeConfig(
        probes=PROBES,
        features=("raw",),
        seeds=3,
        epochs=p.epochs,
        batch_size=p.batch_size,
        memory_gb=16.0,  # beyond this the kept activations are memory-mapped (paper scale)
    )
    return Settings(runs, analysis, probe, 1 if scale == "paper" else default_workers(device))


def random_baseline(seq_len: int) -> float:
    """Expected |X − Y| for independent uniform positions X, Y in 0..T−1: (T² − 1) / 3T.

    Haviv et al.'s random baseline (341.33 at T = 1024)."""
    return (seq_len**2 - 1) / (3 * seq_len)


def published_table() -> pd.DataFrame:
    """The published MADs, with depth and MAD as fractions (of the stack, of random)."""
    return pd.DataFrame(
        [
            {
                "pos_encoding": pe,
                "layer": layer,
                "mad": mad,
                "depth": layer / PUBLISHED_LAYERS,
                "mad_fraction": mad / PUBLISHED_RANDOM,
            }
            for pe, by_layer in PUBLISHED_MAD.items()
            for layer, mad in by_layer.items()
        ]
    )


def mad_table(probes: pd.DataFrame) -> pd.DataFrame:
    """One row per (encoding, probe): MAD ± std per layer, the predict-the-middle baseline and
    the random-guess baseline."""
    rows = pd.MultiIndex.from_product([POS_ENCODINGS, PROBES])
    cells = mean_std(probes["mad"], probes["mad_std"])
    table = by_layer(probes, ["pos_encoding", "probe"], cells, rows)
    table["baseline"] = probes.groupby(["pos_encoding", "probe"])["baseline"].mean().round(2)
    table["random"] = probes.groupby(["pos_encoding", "probe"])["random_baseline"].first().round(2)
    return table.reset_index()


def _shape_line(frame: pd.DataFrame) -> str:
    """Where one of our MAD-by-depth curves starts, bottoms out and ends (fractions of random)."""
    frame = frame.sort_values("depth")
    low = frame.loc[frame["mad_fraction"].idxmin()]
    first, last = frame.iloc[0], frame.iloc[-1]
    return (
        f"{first['mad_fraction']:.3f} at depth {first['depth']:.2f}, minimum "
        f"{low['mad_fraction']:.3f} at depth {low['depth']:.2f}, "
        f"{last['mad_fraction']:.3f} at depth {last['depth']:.2f}"
    )


def _listed_points(frame: pd.DataFrame) -> str:
    """The published points (only the listed layers) as depth: fraction of random."""
    frame = frame.sort_values("depth")
    return ", ".join(
        f"{d:.2f}: {f:.3f}" for d, f in zip(frame["depth"], frame["mad_fraction"], strict=True)
    )


def _nope_curve(probes: pd.DataFrame) -> pd.DataFrame:
    """NoPE's rows of the shape probe, by layer."""
    shape = probes[probes["probe"] == SHAPE_PROBE]
    return shape[shape["pos_encoding"] == "none"].set_index("layer")


def train_and_probe(
    pe: str, run: TrainRun, analysis: AnalysisConfig, probe: ProbeConfig, folder: Path
) -> None:
    """Train one language model into ``folder``, then probe every layer for absolute position
    (``probes.json``: one row per layer and probe). A job."""
    train_into(run, folder)
    model = load_trained(folder)[1]
    rows = probe_model(
        model,
        analysis,
        probe,
        source=make_source(run, folder),
        description=folder.name,
        labels={"pos_encoding": pe},
    )
    write_json(folder / "probes.json", {"rows": rows})


def run(settings: Settings, out: Path) -> None:
    a = settings.analysis
    jobs = [
        training_job(f"lm-{pe}", train_and_probe, (pe, train_run, a, settings.probe), train_run)
        for pe, train_run in settings.runs.items()
    ]
    run_jobs(jobs, out / "runs", "haviv2022 language models", settings.workers, what="models")
    perplexity = [
        perplexity_row(model_file(out, f"lm-{pe}"), pos_encoding=pe) for pe in settings.runs
    ]
    baseline = {"random_baseline": random_baseline(a.seq_len)}
    rows = gather(out, [(f"lm-{pe}", {}) for pe in settings.runs], "probes.json", "rows")
    rows = [{**row, **baseline} for row in rows]

    first = next(iter(settings.runs.values()))
    n_layers = first.model.n_layers
    ppl = pd.DataFrame(perplexity)
    ppl["relative_to_nope"] = ppl["perplexity"] / float(
        ppl.loc[ppl["pos_encoding"] == "none", "perplexity"].iloc[0]
    )
    ppl["published_wikitext103"] = ppl["pos_encoding"].map(PUBLISHED_PERPLEXITY)
    probes = pd.DataFrame(rows)
    probes["depth"] = probes["layer"] / n_layers
    probes["mad_fraction"] = probes["mad"] / probes["random_baseline"]
    published = published_table()

    title = "Haviv et al. 2022: position probes on frozen language models"
    figures.probe_mad_with_reference(
        probes,
        published,
        out / "probes.png",
        shape_probe=SHAPE_PROBE,
        labels=LABELS,
        title=title,
    )

    best = int(_nope_curve(probes)["mad"].idxmin())
    write_outputs(
        out,
        {"perplexity": ppl, "probes": probes, "published": published},
        summary_text(settings, ppl, probes, published),
        {
            "perplexity": perplexity,
            "probes": rows,
            "published": {
                "mad": {pe: {str(k): v for k, v in d.items()} for pe, d in PUBLISHED_MAD.items()},
                "perplexity": PUBLISHED_PERPLEXITY,
                "random_baseline": PUBLISHED_RANDOM,
                "layers": PUBLISHED_LAYERS,
                "seq_len": PUBLISHED_SEQ_LEN,
            },
            "nope_best_layer": best,
        },
    )


def summary_text(
    settings: Settings, ppl: pd.DataFrame, probes: pd.DataFrame, published: pd.DataFrame
) -> str:
    """``summary.md``: perplexity per encoding, probe MAD per layer, the published shapes."""
    first = next(iter(settings.runs.values()))
    a = settings.analysis
    shape = probes[probes["probe"] == SHAPE_PROBE]
    shapes = []
    for pe in POS_ENCODINGS:
        ours = shape[shape["pos_encoding"] == pe]
        theirs = published[published["pos_encoding"] == pe]
        shapes.append(
            {
                "encoding": LABELS[pe],
                "ours": _shape_line(ours),
                "published (depth: fraction, listed layers only)": _listed_points(theirs),
            }
        )
    nope = _nope_curve(probes)
    best = int(nope["mad"].idxmin())
    m, t, p = first.model, first.train, settings.probe
    ppl_table = ppl.assign(pos_encoding=ppl["pos_encoding"].map(LABELS))
    return fill(
        "haviv2022.pretrained",
        **corpus_values(first),
        **shape_values(m),
        **schedule_values(t),
        seed=t.seed,
        published_seq_len=PUBLISHED_SEQ_LEN,
        perplexity_table=markdown_table(ppl_table, ".3f"),
        window=a.seq_len,
        samples=a.samples,
        train_share=f"{1 - p.test_fraction:.0%}",
        probe_seeds=p.seeds,
        random_baseline=f"{random_baseline(a.seq_len):.2f}",
        probe_hidden=p.hidden,
        probe_lr=f"{p.lr:g}",
        probe_batch_size=p.batch_size,
        probe_epochs=p.epochs,
        mad_table=markdown_table(mad_table(probes)),
        shape_probe=SHAPE_PROBE,
        best_layer=best,
        best_mad=f"{nope.loc[best, 'mad']:.3g}",
        best_mad_std=f"{nope.loc[best, 'mad_std']:.2g}",
        shapes_table=markdown_table(pd.DataFrame(shapes)),
    )
