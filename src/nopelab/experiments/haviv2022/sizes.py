"""Haviv et al. 2022's size trend: does NoPE's perplexity gap shrink as the models grow?

Byte-level language models with five encodings (NoPE, a learned table, fixed sinusoids, RoPE,
ALiBi) at several sizes, on the embedded corpus, all trained with one CPU recipe to a token
budget set by their size: ``tokens_per_parameter`` tokens per parameter of the size's NoPE model
(every encoding of a size sees the same tokens), and never fewer than ``min_tokens`` (the small
models are still improving at 20 tokens per parameter). Each size and encoding is trained once
per seed; the part reports held-out perplexity (per byte), its gap to NoPE, and the learning
curves, beside Haviv et al.'s Table 2 (the Pile, 125 M to 1.3 B parameters, perplexity per token:
only the relative gaps compare).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from nopelab.config import PosEncoding
from nopelab.encodings import labels_of
from nopelab.errors import ConfigError
from nopelab.experiments.haviv2022 import figures
from nopelab.experiments.outputs import model_file, write_outputs
from nopelab.experiments.scale_files import read_published, read_scales, scale_schema
from nopelab.experiments.summary_template import corpus_values, fill
from nopelab.experiments.train_and_measure import lm_runs, train_into, training_job
from nopelab.limits import check_training, parameter_count
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import default_workers, run_jobs
from nopelab.tables import markdown_table, mean_std
from nopelab.training.corpus import load_text, split_text
from nopelab.training.run import TrainRun
from nopelab.training.sources import load_tokenizer

POS_ENCODINGS: tuple[PosEncoding, ...] = ("none", "learned", "sinusoidal", "rope", "alibi")
LABELS = labels_of(POS_ENCODINGS)

# Haviv et al. 2022, Table 2 (haviv2022/published.toml): validation perplexity on the Pile
# (1024 tokens) by model size
_TABLE_2 = read_published("haviv2022")["sizes"]
PUBLISHED_SIZES: dict[str, float] = _TABLE_2["parameters"]
PUBLISHED: dict[str, list[float]] = {
    pe: _TABLE_2[pe] for pe in ("none", "learned", "sinusoidal", "alibi")
}


EVALUATIONS = 8  # held-out evaluations along each model's training: its learning curve


@scale_schema
class Budget:
    """Models of one vocabulary: their sizes and how many tokens each trains on."""

    sizes: list[dict[str, int]]  # ModelConfig fields of each size, smallest first
    tokens_per_parameter: float
    min_tokens: int
    train: dict[str, Any]  # TrainConfig fields but steps (set by the token budget)


@scale_schema
class BpeBudget(Budget):
    """The models of ``--tokenizer bpe``: a byte-level BPE of ``vocab`` tokens, trained on the
    corpus's training text (token counts and ``seq_len`` in its tokens)."""

    vocab: int


@scale_schema
class Scale(Budget):
    seeds: int  # seeds per model: --seed, --seed + 1, ...
    bpe: BpeBudget | None = None  # the scale's models with --tokenizer bpe


SCALES = read_scales("haviv2022.sizes", Scale)


@dataclass(frozen=True)
class Model:
    """One language model of the part: its size (index and parameters), encoding and seed."""

    size: int
    parameters: int  # of the size's NoPE model
    pos_encoding: str
    seed: int
    run: TrainRun

    @property
    def key(self) -> str:
        return f"size{self.size}-{self.pos_encoding}-seed{self.seed}"


@dataclass(frozen=True)
class Settings:
    models: list[Model]
    workers: int  # models trained at once


def settings(
    scale: str,
    seed: int,
    device: str,
    sizes: list[dict[str, int]] | None = None,
    corpus: str = "default",
    tokenizer: str = "byte",
) -> Settings:
    """The scale's models; ``sizes`` (``--sizes``) replaces its list of sizes; ``tokenizer``
    ``bpe`` (``--tokenizer``) trains the scale's BPE models instead of its byte-level ones."""
    s = SCALES[scale]
    resolve_device(device)
    budget: Budget = s
    vocab = None
    if tokenizer == "bpe":
        if s.bpe is None:
            with_bpe = [name for name, table in SCALES.items() if table.bpe is not None]
            raise ConfigError(
                "--tokenizer",
                f"--scale {scale} has no BPE models; scales with them: {', '.join(with_bpe)}",
            )
        budget, vocab = s.bpe, s.bpe.vocab
    flag = f"--scale {scale}" if sizes is None else "--sizes"  # what set the sizes
    sizes = budget.sizes if sizes is None else sizes
    check_sizes(sizes)
    train = budget.train
    tokens_per_step = train["batch_size"] * train["seq_len"]
    models = []
    for index, size in enumerate(sizes, 1):
        shapes = lm_runs(POS_ENCODINGS, size, {**train, "steps": 1}, seed, device, bpe_vocab=vocab)
        for run in shapes.values():
            m = run.model  # a learned table or ALiBi's scores may not fit where NoPE does
            shown = f"{flag}: {m.d_model}x{m.n_layers}x{m.n_heads}"
            check_training(m, train["batch_size"], train["seq_len"], shown)
            if m.pos_encoding == "none":
                parameters = parameter_count(m)  # closed form: no model is built
        tokens = max(budget.tokens_per_parameter * parameters, budget.min_tokens)
        steps = math.ceil(tokens / tokens_per_step)
        for offset in range(s.seeds):
            runs = lm_runs(
                POS_ENCODINGS, size, {**train, "steps": steps}, seed + offset, device,
                EVALUATIONS, corpus=corpus, bpe_vocab=vocab,
            )  # fmt: skip
            models += [Model(index, parameters, pe, seed + offset, run) for pe, run in runs.items()]
    return Settings(models, 1 if scale == "paper" else default_workers(device))


def check_sizes(sizes: list[dict[str, int]]) -> None:
    """At least one size, each larger than the one before (in width or depth)."""
    if not sizes:
        raise ConfigError("--sizes", "give at least one model size, e.g. 24x2,48x2,80x3x4")
    shapes = [(size.get("d_model", 0), size.get("n_layers", 0)) for size in sizes]
    for before, after in itertools.pairwise(shapes):
        if not (after[0] >= before[0] and after[1] >= before[1] and after != before):
            raise ConfigError(
                "--sizes", f"must grow from one size to the next (d_model, layers), got {shapes}"
            )


def run(settings: Settings, out: Path) -> None:
    jobs = [training_job(m.key, train_into, (m.run,), m.run) for m in settings.models]
    run_jobs(jobs, out / "runs", "haviv2022 sizes", settings.workers, what="models")
    rows, curves = [], []
    first = settings.models[0]  # every model trains on the same text
    corpus = corpus_tokens(first.run, out / "runs" / first.key)
    for m in settings.models:
        summary = model_file(out, m.key)
        tokens_per_step = m.run.train.batch_size * m.run.train.seq_len
        tokens = m.run.train.steps * tokens_per_step
        labels = {
            "size": m.size,
            "parameters": m.parameters,
            "pos_encoding": m.pos_encoding,
            "seed": m.seed,
        }
        rows.append(
            {
                **labels,
                "d_model": m.run.model.d_model,
                "n_layers": m.run.model.n_layers,
                "tokens": tokens,
                "tokens_per_parameter": tokens / m.parameters,
                "epochs": tokens / corpus,
                "perplexity": summary["final_eval"]["perplexity"],
                "loss": summary["final_eval"]["loss"],
                "loss_per_byte": summary["final_eval"].get(
                    "loss_per_byte", summary["final_eval"]["loss"]
                ),
                "train_seconds": summary["train_seconds"],
            }
        )
        evals = pd.read_csv(out / "runs" / m.key / "eval.csv")
        curves += [
            {**labels, "tokens": step * tokens_per_step, "loss": loss}
            for step, loss in zip(evals["step"], evals["loss"], strict=True)
        ]
    models, curve = pd.DataFrame(rows), pd.DataFrame(curves)
    table, gaps = size_table(models), gap_table(models)
    published = published_table()
    assert first.run.corpus is not None  # a language model's run
    unit = "BPE token" if first.run.corpus.tokenizer == "bpe" else "byte"
    figures.perplexity_by_size(table, published, LABELS, out / "sizes.png", unit)
    figures.learning_curves_by_size(curve, LABELS, out / "curves.png", unit)
    verdict = verdicts(gaps)
    write_outputs(
        out,
        {"models": models, "curves": curve, "perplexity": table, "gaps": gaps},
        summary_text(models, table, gaps, published, verdict, settings.models[0].run),
        {
            "perplexity": table.to_dict("records"),
            "gaps": gaps.to_dict("records"),
            "published": published.to_dict("records"),
            "verdict": verdict,
        },
    )


def corpus_tokens(run: TrainRun, folder: Path) -> int:
    """Training tokens in the corpus the run in ``folder`` trained on: its training split in
    the run's tokens (bytes, or its BPE's tokens)."""
    corpus = run.corpus
    assert corpus is not None  # a language model's run
    train, _ = split_text(load_text(corpus.source, corpus.column), corpus.val_fraction)
    tokenizer = load_tokenizer(folder)
    return len(train.encode("utf-8")) if tokenizer is None else len(tokenizer.encode(train))


def size_table(models: pd.DataFrame) -> pd.DataFrame:
    """Perplexity per size and encoding: mean and standard deviation over seeds."""
    grouped = models.groupby(["size", "parameters", "pos_encoding"], sort=False)
    table = grouped.agg(
        perplexity=("perplexity", "mean"),
        perplexity_std=("perplexity", "std"),
        seeds=("seed", "count"),
        tokens_per_parameter=("tokens_per_parameter", "first"),
        epochs=("epochs", "first"),
    ).reset_index()
    table["perplexity_std"] = table["perplexity_std"].fillna(0.0)
    return table


def gap_table(models: pd.DataFrame) -> pd.DataFrame:
    """Each encoding's perplexity minus NoPE's of the same size and seed, in perplexity and as
    a share of NoPE's: mean and standard deviation over seeds, per size."""
    nope = models[models["pos_encoding"] == "none"].set_index(["size", "seed"])["perplexity"]
    others = models[models["pos_encoding"] != "none"].copy()
    base = nope.loc[list(zip(others["size"], others["seed"], strict=True))].to_numpy()
    others["gap"] = others["perplexity"] - base
    others["gap_percent"] = 100 * others["gap"] / base
    grouped = others.groupby(["size", "parameters", "pos_encoding"], sort=False)
    gaps = grouped.agg(
        seeds=("seed", "count"),
        gap=("gap", "mean"),
        gap_std=("gap", "std"),
        gap_percent=("gap_percent", "mean"),
        gap_percent_std=("gap_percent", "std"),
    ).reset_index()
    gaps = gaps.fillna({"gap_std": 0.0, "gap_percent_std": 0.0})
    order = gaps["pos_encoding"].map(POS_ENCODINGS.index)
    return gaps.assign(order=order).sort_values(["order", "size"]).drop(columns="order")


def published_table() -> pd.DataFrame:
    """Haviv et al.'s Table 2 with each encoding's gap to NoPE (the Pile, perplexity per token)."""
    rows = []
    for pe, values in PUBLISHED.items():
        for (name, parameters), value, nope in zip(
            PUBLISHED_SIZES.items(), values, PUBLISHED["none"], strict=True
        ):
            rows.append(
                {
                    "size": name,
                    "parameters": parameters,
                    "pos_encoding": pe,
                    "perplexity": value,
                    "gap_percent": 100 * (value - nope) / nope,
                }
            )
    return pd.DataFrame(rows)


def verdicts(gaps: pd.DataFrame) -> dict[str, Any]:
    """Per encoding: whether its gap to NoPE (in % of NoPE's perplexity) is smaller in magnitude
    at the largest size than at the smallest, by more than the seeds' spread; and NoPE against
    the learned table at the largest size."""
    first, last = gaps["size"].min(), gaps["size"].max()
    shrinks = {}
    for pe, rows in gaps.groupby("pos_encoding", sort=False):
        small = rows[rows["size"] == first].iloc[0]
        large = rows[rows["size"] == last].iloc[0]
        margin = small["gap_percent_std"] + large["gap_percent_std"]
        change = abs(small["gap_percent"]) - abs(large["gap_percent"])
        shrinks[pe] = (
            "shrinks" if change > margin else "grows" if change < -margin else "no clear change"
        )
    learned = gaps[(gaps["pos_encoding"] == "learned") & (gaps["size"] == last)].iloc[0]
    return {
        "seeds": int(gaps["seeds"].max()),
        "gap_with_size": shrinks,
        "learned_minus_nope_percent_at_largest": float(learned["gap_percent"]),
        "learned_minus_nope_percent_std": float(learned["gap_percent_std"]),
    }


def _cell(mean: float, std: float, seeds: int, digits: int = 3) -> str:
    fixed = f".{digits}f"
    return f"{mean:{fixed}}" if seeds < 2 else mean_std([mean], [std], digits=(fixed, fixed))[0]


def summary_text(
    models: pd.DataFrame,
    table: pd.DataFrame,
    gaps: pd.DataFrame,
    published: pd.DataFrame,
    verdict: dict[str, Any],
    run: TrainRun,
) -> str:
    """``summary.md``: perplexity per size and encoding, the gaps beside Haviv's, the verdict;
    ``run`` is one of the models' runs (what they trained on)."""
    seeds = int(table["seeds"].max())
    ours = table.assign(
        encoding=table["pos_encoding"].map(LABELS),
        cell=[
            _cell(m, s, seeds)
            for m, s in zip(table["perplexity"], table["perplexity_std"], strict=True)
        ],
    ).pivot(index="encoding", columns="parameters", values="cell")
    ours = ours.loc[[LABELS[pe] for pe in POS_ENCODINGS]]
    ours.columns = [f"{p / 1e3:.0f} k" for p in ours.columns]
    gap = gaps.assign(
        encoding=gaps["pos_encoding"].map(LABELS),
        cell=[
            _cell(m, s, seeds, 1) + " %"
            for m, s in zip(gaps["gap_percent"], gaps["gap_percent_std"], strict=True)
        ],
    ).pivot(index="encoding", columns="parameters", values="cell")
    gap = gap.loc[[LABELS[pe] for pe in POS_ENCODINGS[1:]]]
    gap.columns = [f"{p / 1e3:.0f} k" for p in gap.columns]
    theirs = (
        published[published["pos_encoding"] != "none"]
        .assign(
            encoding=lambda f: f["pos_encoding"].map(LABELS),
            cell=lambda f: [f"{g:+.1f} %" for g in f["gap_percent"]],
        )
        .pivot(index="encoding", columns="size", values="cell")
    )
    theirs = theirs.loc[[LABELS[pe] for pe in PUBLISHED if pe != "none"], list(PUBLISHED_SIZES)]
    budget = models.groupby("size").agg(
        parameters=("parameters", "first"),
        d_model=("d_model", "first"),
        n_layers=("n_layers", "first"),
        tokens=("tokens", "first"),
        tokens_per_parameter=("tokens_per_parameter", "first"),
        epochs=("epochs", "first"),
    )
    trend = ", ".join(f"{LABELS[pe]} {what}" for pe, what in verdict["gap_with_size"].items())
    learned = verdict["learned_minus_nope_percent_at_largest"]
    spread = verdict["learned_minus_nope_percent_std"]
    theirs_learned = published[published["pos_encoding"] == "learned"]["gap_percent"].abs()
    assert run.corpus is not None  # a language model's run
    bpe = run.corpus.bpe_vocab if run.corpus.tokenizer == "bpe" else 0
    return fill(
        "haviv2022.sizes",
        **corpus_values(run),
        bpe=bpe,
        unit="token" if bpe else "byte",
        seeds=seeds,
        budget_table=markdown_table(budget.round(2).reset_index()),
        perplexity_table=markdown_table(ours.reset_index()),
        gap_table=markdown_table(gap.reset_index()),
        published_table=markdown_table(theirs.reset_index()),
        trend=trend,
        learned=f"{learned:+.1f}",
        spread=f"{spread:.1f}",
        published_min=f"{theirs_learned.min():.1f}",
        published_max=f"{theirs_learned.max():.1f}",
    )
