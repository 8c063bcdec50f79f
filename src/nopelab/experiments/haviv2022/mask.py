"""Haviv et al. 2022's control: the causal mask, not the data, is where NoPE's position comes from.

The same small byte-level LM is trained four ways, at several seeds: causal (next byte) and
bidirectional as a masked LM (BERT's masking of a share of the bytes, loss on the hidden ones),
each without positional encoding (NoPE) and with a learned table. Every trained model is then
measured the same way on held-out text: its perplexity (a masked LM's over its hidden bytes),
a position probe per layer (Haviv's MLP classifier, MAD over random guessing), the decay of
Var(attn_out) from the first to the last position per layer (Chi et al.) and the adjacency score
of attn_out per layer (Zuo et al.). On the causal models, the prefix shuffle (Haviv's Appendix
B): the loss on the rest of a window when its first k bytes are put in random order.

If the papers are right, bidirectional NoPE, blind to order by construction, fails at the LM and
carries no position at any layer (MAD at random, variance ratio and adjacency at their
no-position values), while causal NoPE does both; the learned table rescues the masked LM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nopelab import plots
from nopelab.config import AnalysisConfig, CorpusConfig, PosEncoding, Probe, ProbeConfig
from nopelab.encodings import labels_of
from nopelab.experiments.haviv2022.pretrained import SITES, ProbeScale, random_baseline
from nopelab.experiments.outputs import gather, model_file, write_outputs
from nopelab.experiments.scale_files import read_published, read_scales, scale_schema
from nopelab.experiments.summary_template import corpus_values, fill, schedule_values, shape_values
from nopelab.experiments.train_and_measure import (
    CorpusScale,
    analyze_trained,
    lm_runs,
    read_trained,
    train_into,
    training_job,
)
from nopelab.measure.length import chosen_windows
from nopelab.measure.shuffle import prefix_shuffle
from nopelab.probing.pipeline import probe_model
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import default_workers, run_jobs
from nopelab.runtime.rundir import write_json
from nopelab.tables import markdown_table, mean_std
from nopelab.training.run import TrainRun
from nopelab.training.sources import TextSource
from nopelab.training.trained import load_trained, make_source

POS_ENCODINGS: tuple[PosEncoding, ...] = ("none", "learned")
LABELS = labels_of(POS_ENCODINGS)
KINDS = {"causal": "causal LM", "mlm": "masked LM"}  # the two objectives, as tables name them
PROBE: Probe = "mlp-cls"  # Haviv's probe
PUBLISHED = read_published("haviv2022")["masked"]


@scale_schema
class Scale(CorpusScale):
    model: dict[str, Any]  # ModelConfig fields
    train: dict[str, Any]  # TrainConfig fields
    seeds: int  # models per objective and encoding: --seed, --seed + 1, ...
    mask_rate: float  # the masked LMs' share of hidden bytes
    samples: int  # held-out windows for the variance and adjacency analysis
    probe: ProbeScale
    shuffle: tuple[int, ...]  # prefix lengths k of the shuffle, below the training length
    shuffle_windows: int  # held-out windows the shuffle is measured on


SCALES = read_scales("haviv2022.mask", Scale)


@dataclass(frozen=True)
class Model:
    kind: str  # causal | mlm
    pos_encoding: PosEncoding
    seed: int
    run: TrainRun

    @property
    def key(self) -> str:
        return f"{self.kind}-{self.pos_encoding}-seed{self.seed}"


@dataclass(frozen=True)
class Settings:
    models: tuple[Model, ...]
    analysis: AnalysisConfig  # variance and adjacency: held-out text windows
    probe_analysis: AnalysisConfig
    probe: ProbeConfig
    shuffle: tuple[int, ...]
    shuffle_windows: int
    workers: int


def settings(scale: str, seed: int, device: str, corpus: str | None = None) -> Settings:
    s = SCALES[scale]
    corpus = s.corpus if corpus is None else corpus
    resolve_device(device)
    seq_len = s.train["seq_len"]
    if not s.shuffle or list(s.shuffle) != sorted(set(s.shuffle)) or s.shuffle[-1] >= seq_len:
        raise ValueError(f"haviv2022/scales/mask.toml [{scale}]: shuffle: increasing, < {seq_len}")
    models = []
    for offset in range(s.seeds):
        causal = lm_runs(POS_ENCODINGS, s.model, s.train, seed + offset, device, corpus=corpus)
        for pe, run in causal.items():
            models.append(Model("causal", pe, seed + offset, run))
            masked = dataclasses.replace(
                run,
                model=dataclasses.replace(run.model, vocab_size=257, bidirectional=True),
                corpus=CorpusConfig(
                    source=corpus, tokenizer="byte", objective="masked", mask_rate=s.mask_rate
                ),
            )
            models.append(Model("mlm", pe, seed + offset, masked))
    analysis = AnalysisConfig(
        seq_len=seq_len, samples=s.samples, batch_size=16, input="data", seed=seed, device=device
    )
    probe_analysis = dataclasses.replace(analysis, samples=s.probe.samples, sites=SITES)
    probe = ProbeConfig(
        probes=(PROBE,),
        features=("raw",),
        seeds=3,
        epochs=s.probe.epochs,
        batch_size=s.probe.batch_size,
    )
    return Settings(
        tuple(sorted(models, key=lambda m: (m.seed, m.kind == "causal", m.pos_encoding))),
        analysis,
        probe_analysis,
        probe,
        s.shuffle,
        s.shuffle_windows,
        default_workers(device),
    )


def measure(model: Model, s: Settings, folder: Path) -> None:
    """Train one model into ``folder``; analyse it (init and trained), probe it and, if causal,
    shuffle its prefixes (``probes.json``, ``shuffle.json``). A job."""
    train_into(model.run, folder)
    analyze_trained(model.run, folder, s.analysis)
    trained = load_trained(folder)[1]
    source = make_source(model.run, folder)
    rows = probe_model(trained, s.probe_analysis, s.probe, source=source, description=folder.name)
    write_json(folder / "probes.json", {"rows": rows})
    shuffle = []
    if model.kind == "causal":
        assert isinstance(source, TextSource)  # a language model's run
        length = model.run.train.seq_len
        windows = list(chosen_windows(source.stream, length, s.shuffle_windows, model.seed))
        device = resolve_device(s.analysis.device)
        shuffle = prefix_shuffle(trained.to(device), windows, s.shuffle, 16, device, model.seed)
    write_json(folder / "shuffle.json", {"rows": shuffle})


def _layer_rows(model: Model, folder: Path) -> list[dict[str, Any]]:
    """Per state and layer: the first-over-last variance ratio of attn_out and its adjacency."""
    result, rows = read_trained(folder), []
    for state, analysis in (("init", result.init), ("trained", result.trained)):
        for row in analysis.rows:
            if row["site"] == "attn_out":
                variance = analysis.variance("attn_out", row["layer"])
                rows.append(
                    {
                        **_labels(model),
                        "state": state,
                        "layer": row["layer"],
                        "variance_ratio": float(variance[0] / variance[-1]),
                        "adjacency": row["adjacency_mean"],
                    }
                )
    return rows


def _labels(model: Model) -> dict[str, Any]:
    return {"kind": model.kind, "pos_encoding": model.pos_encoding, "seed": model.seed}


def run(settings: Settings, out: Path) -> None:
    jobs = [training_job(m.key, measure, (m, settings), m.run) for m in settings.models]
    run_jobs(jobs, out / "runs", "haviv2022 causal and masked LMs", settings.workers, what="models")
    labelled = [(m.key, _labels(m)) for m in settings.models]
    perplexity = pd.DataFrame(
        [
            {**_labels(m), "perplexity": model_file(out, m.key)["final_eval"]["perplexity"]}
            for m in settings.models
        ]
    )
    probes = pd.DataFrame(gather(out, labelled, "probes.json", "rows"))
    probes["mad_fraction"] = probes["mad"] / random_baseline(settings.analysis.seq_len)
    layers = pd.DataFrame(
        [r for m in settings.models for r in _layer_rows(m, out / "runs" / m.key)]
    )
    shuffle = pd.DataFrame(gather(out, labelled, "shuffle.json", "rows"))
    verdict = verdicts(perplexity, probes, layers)
    plots.prefix_shuffle(
        shuffle.assign(model=shuffle["pos_encoding"].map(LABELS)),
        out / "shuffle.png",
        by="model",
        title="Causal LMs: the prefix shuffle (mean over seeds)",
    )
    write_outputs(
        out,
        {"perplexity": perplexity, "probes": probes, "layers": layers, "shuffle": shuffle},
        summary_text(settings, perplexity, probes, layers, shuffle, verdict),
        {
            "perplexity": perplexity.to_dict("records"),
            "probes": probes.to_dict("records"),
            "layers": layers.to_dict("records"),
            "shuffle": shuffle.to_dict("records"),
            "verdict": verdict,
            "published": PUBLISHED,
        },
    )


def verdicts(
    perplexity: pd.DataFrame, probes: pd.DataFrame, layers: pd.DataFrame
) -> dict[str, Any]:
    """Per objective: NoPE's perplexity over the learned table's (mean of the seeds' ratios),
    and per model NoPE's and learned's closest approach to position: the lowest MAD fraction over
    layers past the embedding and the highest trained variance ratio and adjacency score."""
    out: dict[str, Any] = {}
    ppl = perplexity.pivot_table(
        index=["kind", "seed"], columns="pos_encoding", values="perplexity"
    )
    for kind in KINDS:
        ratios = (ppl.loc[kind, "none"] / ppl.loc[kind, "learned"]).to_numpy()
        out[f"{kind}_nope_over_learned"] = float(np.mean(ratios))
        out[f"{kind}_nope_over_learned_min"] = float(np.min(ratios))
        out[f"{kind}_nope_over_learned_max"] = float(np.max(ratios))
        for pe in POS_ENCODINGS:
            mine = probes[(probes["kind"] == kind) & (probes["pos_encoding"] == pe)]
            inside = mine[mine["site"] == "resid_post"].groupby("seed")["mad_fraction"].min()
            trained = layers[
                (layers["kind"] == kind)
                & (layers["pos_encoding"] == pe)
                & (layers["state"] == "trained")
            ]
            out[f"{kind}_{pe}_lowest_mad_fraction"] = float(inside.mean())
            out[f"{kind}_{pe}_highest_variance_ratio"] = float(
                trained.groupby("seed")["variance_ratio"].max().mean()
            )
            out[f"{kind}_{pe}_highest_adjacency"] = float(
                trained.groupby("seed")["adjacency"].max().mean()
            )
    return out


def _by_model(frame: pd.DataFrame, value: str, digits: int = 3) -> pd.DataFrame:
    """``value`` per layer (columns) and model (rows), mean ± std over the seeds."""
    grouped = frame.groupby(["kind", "pos_encoding", "layer"], sort=False)[value]
    stats = grouped.agg(["mean", "std", "count"]).reset_index()
    fixed = f".{digits}f"
    stats["cell"] = mean_std(stats["mean"], stats["std"].fillna(0.0), digits=(fixed, fixed))
    stats["model"] = stats["kind"].map(KINDS) + ", " + stats["pos_encoding"].map(LABELS)
    table = stats.pivot(index="model", columns="layer", values="cell")
    table.columns = [f"L{layer}" for layer in table.columns]
    return table.reset_index()


def summary_text(
    s: Settings,
    perplexity: pd.DataFrame,
    probes: pd.DataFrame,
    layers: pd.DataFrame,
    shuffle: pd.DataFrame,
    verdict: dict[str, Any],
) -> str:
    """``summary.md``: perplexity per model and seed beside Haviv's Table 4, the probe, the
    variance ratio and adjacency per layer, the prefix shuffle, the verdict."""
    first = s.models[0].run
    ppl = perplexity.assign(
        model=perplexity["kind"].map(KINDS) + ", " + perplexity["pos_encoding"].map(LABELS)
    ).pivot(index="model", columns="seed", values="perplexity")
    ppl.columns = [f"seed {seed}" for seed in ppl.columns]
    trained = layers[layers["state"] == "trained"]
    shuffled = (
        shuffle.groupby(["pos_encoding", "k"])[["loss", "unshuffled_loss", "rise"]]
        .mean()
        .reset_index()
        .sort_values("pos_encoding", key=lambda pe: pe.map(POS_ENCODINGS.index), kind="stable")
        .assign(pos_encoding=lambda f: f["pos_encoding"].map(LABELS))
    )
    masked = next(m.run for m in s.models if m.kind == "mlm")
    assert masked.corpus is not None  # a language model
    return fill(
        "haviv2022.mask",
        **corpus_values(first),
        **shape_values(first.model),
        **schedule_values(first.train),
        seeds=sorted({m.seed for m in s.models}),
        mask_rate=f"{masked.corpus.mask_rate:.0%}",
        perplexity_table=markdown_table(ppl.reset_index(), ".3f"),
        published=PUBLISHED,
        probe_samples=s.probe_analysis.samples,
        probe_seeds=s.probe.seeds,
        random_baseline=f"{random_baseline(s.analysis.seq_len):.2f}",
        mad_table=markdown_table(_by_model(probes, "mad_fraction")),
        samples=s.analysis.samples,
        variance_table=markdown_table(_by_model(trained, "variance_ratio", 2)),
        adjacency_table=markdown_table(_by_model(trained, "adjacency")),
        shuffle_windows=s.shuffle_windows,
        shuffle_table=markdown_table(shuffled, ".3f"),
        verdict=verdict,
    )
