"""Wang et al. 2024: where a NoPE language model breaks past its training length, and how far
scaling the attention logits of the frozen model carries it.

Byte-level NoPE and RoPE language models are trained at a short length T, one job per model
(:func:`measure_model`, resumable). Each job then measures its model:

* held-out loss by position and perplexity at 1x, 1.1x, 1.2x, 1.25x, 1.5x, 2x, 4x, 8x and 16x T
  (:mod:`nopelab.measure.length`): as trained, with every head's logits scaled by each uniform
  factor of the scale, and with HeadScale (a factor per head trained on the frozen model at
  ``length_factor`` x T; :mod:`nopelab.training.headscale`);
* the model as trained at 1x, 2x, 4x and 8x T, on held-out text of that length
  (:func:`~nopelab.measure.analysis.analyze_model`): attention entropy per query position (mean
  over heads) and the variance of ``attn_out`` per position, per layer, in log-spaced buckets of
  positions, and the adjacency score of ``attn_out`` per layer.

Where each breaks, on the bucketed curves at the longest analysed length (8x):

* the *flat length* (:func:`~nopelab.measure.length.flat_length`): the longest length whose
  perplexity, and that of every shorter length, is at most 10 % above the 1x perplexity of the
  model as trained (for a fix too: a fix is judged against the model it fixes); the *loss
  break* (:func:`loss_break`): the first
  position past T from which the loss per position stays more than ln 1.1 nats above its level
  over positions T/2..T;
* the *entropy inflection* and the *variance departure* (:func:`departure`): the first position
  past T from which the entropy (nats), or the log variance, stays more than a tolerance away
  from its least-squares line against log position over T/8..T;
* the *adjacency change*: the first length whose adjacency score differs from the 1x one by
  more than :data:`ADJACENCY_TOLERANCE` in some layer.

Two positions coincide when within a factor :data:`COINCIDE` of each other (:func:`order`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nopelab.config import ATTENTION, AnalysisConfig, PosEncoding
from nopelab.encodings import labels_of
from nopelab.experiments.outputs import model_file, write_outputs
from nopelab.experiments.scale_files import read_scales, scale_schema
from nopelab.experiments.summary_template import (
    corpus_values,
    fill,
    schedule_values,
    sentence,
    shape_values,
)
from nopelab.experiments.train_and_measure import lm_runs, train_into, training_job
from nopelab.experiments.wang2024 import figures
from nopelab.measure.analysis import analyze_model
from nopelab.measure.breaks import COINCIDE, departure, lasting_from, order
from nopelab.measure.length import (
    FLAT_TOLERANCE,
    bucket_rows,
    chosen_windows,
    flat_length,
    log_buckets,
    position_loss,
)
from nopelab.models.transformer import Transformer
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import default_workers, run_jobs
from nopelab.runtime.rundir import write_json
from nopelab.tables import markdown_table
from nopelab.training.headscale import (
    HeadScaleTraining,
    fitted_scale,
    rescaled,
    scales_by_layer,
    train_head_scales,
)
from nopelab.training.run import TrainRun
from nopelab.training.sources import TextSource
from nopelab.training.train import autocast_for
from nopelab.training.trained import load_trained, make_source

POS_ENCODINGS: tuple[PosEncoding, ...] = ("none", "rope")
LABELS = labels_of(POS_ENCODINGS)
# multiples of the training length evaluated: 0.1x apart up to 1.25x, where a break is near
LENGTHS = (1, 1.1, 1.2, 1.25, 1.5, 2, 4, 8, 16)
MECHANISM_LENGTHS = (1, 2, 4, 8)  # those analysed
BATCH_TOKENS = 8192  # tokens per forward pass when evaluating
ENTROPY_TOLERANCE = 0.1  # nats off the line
VARIANCE_TOLERANCE = 0.2  # in log variance: about 20 % off the line
ADJACENCY_TOLERANCE = 0.05  # change of the adjacency score (a probability) from 1x
UP_TO = f"up to {MECHANISM_LENGTHS[-1]}x"  # where the breaks by position are looked for
RESULT_FILE = "measured.json"


@scale_schema
class Scale:
    model: dict[str, Any]  # ModelConfig fields
    train: dict[str, Any]  # TrainConfig fields
    eval_tokens: int  # held-out tokens per evaluated length
    buckets: int  # log-spaced buckets of positions per length
    samples: int  # held-out sequences analysed per length
    uniform: list[float]  # uniform logit factors swept
    headscale: dict[str, Any]  # length_factor, steps, lr, batch_size
    seeds: int  # --seed, --seed + 1, ...


SCALES = read_scales("wang2024.lengths", Scale)


@dataclass(frozen=True)
class Measures:
    """What every model's job measures once it has trained."""

    eval_tokens: int
    buckets: int
    samples: int
    uniform: tuple[float, ...]
    headscale: dict[str, Any]


@dataclass(frozen=True)
class Model:
    """One language model of the part: its encoding, seed and training run."""

    pos_encoding: str
    seed: int
    run: TrainRun

    @property
    def key(self) -> str:
        return f"lm-{self.pos_encoding}-seed{self.seed}"


@dataclass(frozen=True)
class Settings:
    models: list[Model]
    measures: Measures
    workers: int  # models trained at once


def settings(scale: str, seed: int, device: str, corpus: str = "default") -> Settings:
    s = SCALES[scale]
    resolve_device(device)
    models = [
        Model(pe, seed + offset, run)
        for offset in range(s.seeds)
        for pe, run in lm_runs(
            POS_ENCODINGS, s.model, s.train, seed + offset, device, corpus=corpus
        ).items()
    ]
    measures = Measures(s.eval_tokens, s.buckets, s.samples, tuple(s.uniform), s.headscale)
    longest = window(LENGTHS[-1], s.train["seq_len"])
    if measures.eval_tokens < longest:  # at least one window at every length
        raise ValueError(f"scale {scale}: eval_tokens must be at least {longest}")
    return Settings(models, measures, default_workers(device))


def window(factor: float, train_len: int) -> int:
    """The evaluated length, in tokens, at ``factor`` x the training length."""
    return round(factor * train_len)


# ------------------------------------------------------------------------ one model (a job)


def measure_model(run: TrainRun, measures: Measures, folder: Path) -> None:
    """Train ``run`` into ``folder``, then measure it (the module's protocol) into
    :data:`RESULT_FILE`: rows of perplexity, loss by position bucket and mechanisms, and the
    HeadScale factors. A job."""
    train_into(run, folder)
    source = make_source(run, folder)
    assert isinstance(source, TextSource)  # a language model's run
    device = resolve_device(run.train.device)
    model = load_trained(folder, device)[1].eval()
    train_len = run.train.seq_len
    variants: dict[str, tuple[float | None, Transformer]] = {"none": (1.0, model)}
    variants |= {
        f"uniform {c:g}": (c, rescaled(model, c, head_scales=False)) for c in measures.uniform
    }
    h = measures.headscale
    training = HeadScaleTraining(
        length_factor=h["length_factor"],
        length=round(h["length_factor"] * train_len),
        steps=h["steps"],
        lr=h["lr"],
        init_scale=fitted_scale(h["length_factor"]),
        batch_size=h["batch_size"],
        seed=run.train.seed,
    )
    scaled = rescaled(model, training.init_scale, head_scales=True)
    losses, _ = train_head_scales(scaled, source, training, device, autocast_for(run.train, device))
    variants["headscale"] = (None, scaled.eval())  # a factor per head: headscale.scales
    lengths, positions = [], []
    for fix, (scale, variant) in variants.items():
        for factor in LENGTHS:
            length = window(factor, train_len)
            count = measures.eval_tokens // length
            pairs = chosen_windows(source.stream, length, count, run.train.seed)
            batch = max(1, BATCH_TOKENS // length)
            loss = position_loss(variant, pairs, length, batch, device)
            where = {"fix": fix, "logit_scale": scale, "length_factor": factor, "length": length}
            lengths.append({**where, **loss.row()})
            positions += [{**where, **row} for row in bucket_rows(loss, measures.buckets)]
    record = {
        "perplexity": lengths,
        "positions": positions,
        "mechanisms": mechanism_rows(model, run, source, measures),
        "headscale": {"loss": losses, "scales": scales_by_layer(scaled)},
    }
    write_json(folder / RESULT_FILE, record)


def mechanism_rows(
    model: Transformer, run: TrainRun, source: TextSource, measures: Measures
) -> list[dict[str, Any]]:
    """Attention entropy and ``attn_out`` variance per layer and position bucket, and the
    adjacency score of ``attn_out`` per layer (its bucket: every position), at each of
    :data:`MECHANISM_LENGTHS` on held-out text of that length."""
    rows = []
    for factor in MECHANISM_LENGTHS:
        length = factor * run.train.seq_len
        cfg = AnalysisConfig(
            seq_len=length,
            samples=measures.samples,
            batch_size=max(1, min(measures.samples, BATCH_TOKENS // length)),
            input="data",
            sites=("attn_out", ATTENTION),
            seed=run.train.seed,
            device=run.train.device,
        )
        result = analyze_model(model, cfg, progress=False, source=source)
        where = {"length_factor": factor, "length": length}
        for (_, layer), stats in result.sites.items():
            curves = {"entropy": result.attention[layer].entropy, "variance": stats.variance}
            for measure, values in curves.items():
                rows += [
                    {**where, "layer": layer, "measure": measure, **row}
                    for row in bucketed(values, measures.buckets)
                ]
            whole = {"bucket_start": 1, "bucket_end": length, "value": stats.adjacency.mean}
            rows.append({**where, "layer": layer, "measure": "adjacency", **whole})
    return rows


def bucketed(values: np.ndarray, buckets: int) -> list[dict[str, Any]]:
    """The mean of ``values`` (by 0-based position) over each log-spaced bucket of positions."""
    return [
        {"bucket_start": first, "bucket_end": last, "value": float(values[first - 1 : last].mean())}
        for first, last in log_buckets(len(values), buckets)
    ]


# ------------------------------------------------------------------------ where things break


def middles(rows: pd.DataFrame) -> np.ndarray:
    """Each bucket's geometric middle position."""
    return np.sqrt(rows["bucket_start"].to_numpy() * rows["bucket_end"].to_numpy())


def loss_break(
    positions: np.ndarray,
    loss: np.ndarray,
    train_len: int,
    tolerance: float = math.log1p(FLAT_TOLERANCE),
) -> float | None:
    """The first position past ``train_len`` from which the loss stays more than ``tolerance``
    nats above its mean over positions ``train_len``/2..``train_len`` (``None``: it never
    does)."""
    within = (positions > train_len / 2) & (positions <= train_len)
    level = loss[within].mean()
    return lasting_from(positions, loss > level + tolerance, train_len)


def break_length(ppl: dict[float, float]) -> float | None:
    """The first length factor past the flat length, or ``None`` when every length is flat."""
    flat = flat_length(ppl)
    return next((f for f in sorted(ppl) if flat is None or f > flat), None)


def adjacency_change(adjacency: pd.DataFrame) -> int | None:
    """The first length factor whose adjacency score differs from the 1x one by more than
    :data:`ADJACENCY_TOLERANCE` in some layer (rows: ``length_factor``, ``layer``, ``value``)."""
    table = adjacency.pivot(index="length_factor", columns="layer", values="value")
    moved = (table - table.iloc[0]).abs().max(axis=1) > ADJACENCY_TOLERANCE
    return next((int(f) for f, m in moved.items() if m), None)


def model_breaks(
    train_len: int, ppl: pd.DataFrame, positions: pd.DataFrame, mechanisms: pd.DataFrame
) -> dict[str, Any]:
    """One model's breaks (the module's definitions), as trained: positions in tokens."""
    unscaled = ppl[ppl["fix"] == "none"]
    longest = MECHANISM_LENGTHS[-1]
    curve = positions[(positions["fix"] == "none") & (positions["length_factor"] == longest)]
    at = mechanisms[mechanisms["length_factor"] == longest]
    entropy = {}
    for layer, rows in at[at["measure"] == "entropy"].groupby("layer"):
        entropy[int(layer)] = departure(
            middles(rows), rows["value"].to_numpy(), train_len, ENTROPY_TOLERANCE
        )
    first_layer = at[(at["measure"] == "variance") & (at["layer"] == 1)]
    log_variance = np.log(np.maximum(first_layer["value"].to_numpy(), 1e-30))
    variance = departure(middles(first_layer), log_variance, train_len, VARIANCE_TOLERANCE)
    found = [p for p in entropy.values() if p is not None]
    earliest = min(found) if found else None
    loss = loss_break(middles(curve), curve["loss"].to_numpy(), train_len)
    lengths = dict(zip(unscaled["length_factor"], unscaled["perplexity"], strict=True))
    return {
        "flat_length": flat_length(lengths),
        "break_length": break_length(lengths),
        "loss_break": loss,
        "entropy_inflection": entropy,
        "entropy_inflection_earliest": earliest,
        "variance_departure": variance,
        "adjacency_change": adjacency_change(mechanisms[mechanisms["measure"] == "adjacency"]),
        "loss_vs_entropy": order(loss, earliest),
        "loss_vs_variance": order(loss, variance),
        "entropy_vs_variance": order(earliest, variance),
    }


def fix_table(ppl: pd.DataFrame) -> pd.DataFrame:
    """Per model and fix: the flat length against the model as trained (its 1x perplexity),
    the perplexity at each length and the cost at 1x (perplexity over the unscaled model's at
    1x, minus 1)."""
    rows = []
    for (model, fix), group in ppl.groupby(["model", "fix"], sort=False):
        lengths = dict(zip(group["length_factor"], group["perplexity"], strict=True))
        unscaled = ppl[(ppl["model"] == model) & (ppl["fix"] == "none")]
        base = float(unscaled[unscaled["length_factor"] == 1]["perplexity"].iloc[0])
        rows.append(
            {
                "model": model,
                "fix": fix,
                "flat_length": flat_length(lengths, reference=base),
                "cost_at_1x_percent": 100 * (lengths[1] / base - 1),
                **{ppl_column(f): lengths[f] for f in sorted(lengths)},
            }
        )
    return pd.DataFrame(rows)


def ppl_column(factor: float) -> str:
    """:func:`fix_table`'s column of the perplexity at ``factor`` x T, e.g. ``ppl_1.25x``."""
    return f"ppl_{factor:g}x"


def flat_comparison(breaks: dict[str, dict[str, Any]]) -> str:
    """Whether NoPE's flat length (as trained) is longer than RoPE's, seed by seed."""
    seeds = sorted({int(k.rsplit("-seed", 1)[1]) for k in breaks})
    pairs = [
        (breaks[f"lm-none-seed{s}"]["flat_length"], breaks[f"lm-rope-seed{s}"]["flat_length"])
        for s in seeds
        if f"lm-none-seed{s}" in breaks and f"lm-rope-seed{s}" in breaks
    ]

    def length(flat: float | None) -> float:  # none (a diverged model): shorter than any
        return -1.0 if flat is None or _no_length(flat) else flat

    return sentence("wang2024.sentences", "flat_comparison")(
        sum(length(n) > length(r) for n, r in pairs),
        sum(length(n) == length(r) for n, r in pairs),
        [_times(n) for n, _ in pairs],
        [_times(r) for _, r in pairs],
    )


# ------------------------------------------------------------------------ the part


def run(settings: Settings, out: Path) -> None:
    jobs = [
        training_job(m.key, measure_model, (m.run, settings.measures), m.run)
        for m in settings.models
    ]
    run_jobs(jobs, out / "runs", "wang2024 language models", settings.workers, what="models")
    tables: dict[str, list[pd.DataFrame]] = {"perplexity": [], "positions": [], "mechanisms": []}
    headscale = {}
    for m in settings.models:
        record = model_file(out, m.key, RESULT_FILE)
        labels = {"model": m.key, "pos_encoding": m.pos_encoding, "seed": m.seed}
        for name, frames in tables.items():
            frames.append(pd.DataFrame(record[name]).assign(**labels)[[*labels, *record[name][0]]])
        headscale[m.key] = record["headscale"]["scales"]
    ppl, positions, mechanisms = (
        pd.concat(frames, ignore_index=True) for frames in tables.values()
    )
    train_len = settings.models[0].run.train.seq_len
    breaks = {
        key: model_breaks(
            train_len,
            ppl[ppl["model"] == key],
            positions[positions["model"] == key],
            mechanisms[mechanisms["model"] == key],
        )
        for key in ppl["model"].unique()
    }
    fixes = fix_table(ppl)
    figures.perplexity_by_fix(ppl, LABELS, out / "perplexity.png")
    figures.mechanisms_by_position(mechanisms, LABELS, train_len, out / "mechanisms.png")
    write_outputs(
        out,
        {"perplexity": ppl, "positions": positions, "mechanisms": mechanisms},
        summary_text(settings, breaks, fixes, headscale),
        {
            "train_len": train_len,
            "breaks": breaks,
            "fixes": fixes.to_dict("records"),
            "headscale": headscale,
        },
    )


# ------------------------------------------------------------------------ summary


def model_name(key: str) -> str:
    """``lm-none-seed1`` -> ``NoPE, seed 1``."""
    pos_encoding, seed = key.removeprefix("lm-").rsplit("-seed", 1)
    return f"{LABELS[pos_encoding]}, seed {seed}"


def seed_table(
    breaks: dict[str, dict[str, Any]], fixes: pd.DataFrame, train_len: int
) -> pd.DataFrame:
    """Per encoding, over the seeds: the flat length at each, the range of the 2x perplexity's
    change over the 1x one, and the ranges of the breaks by position (in multiples of T)."""
    trained = fixes[fixes["fix"] == "none"].set_index("model")
    rows = []
    for pe in POS_ENCODINGS:
        keys = [k for k in breaks if k.removeprefix("lm-").rsplit("-seed", 1)[0] == pe]
        change = [
            100 * (trained.loc[k, ppl_column(2)] / trained.loc[k, ppl_column(1)] - 1) for k in keys
        ]
        row = {
            "model": LABELS[pe],
            "seeds": len(keys),
            "flat length": ", ".join(_times(breaks[k]["flat_length"]) for k in keys),
            "2x perplexity": _span([f"{c:+.1f}" for c in change], " %"),
        }
        for name, field in [
            ("loss break", "loss_break"),
            ("entropy inflection", "entropy_inflection_earliest"),
            ("variance departure", "variance_departure"),
        ]:
            found = [breaks[k][field] / train_len for k in keys if breaks[k][field] is not None]
            missing = len(keys) - len(found)
            span = _span([f"{v:.2g}" for v in sorted(found)], "x") if found else ""
            row[name] = span + (f"{', ' if found else ''}none in {missing}" if missing else "")
        rows.append(row)
    return pd.DataFrame(rows)


def _span(values: list[str], unit: str) -> str:
    """The first and last of ``values`` (formatted, in order) as a range, or the one value."""
    ordered = sorted(values, key=float)
    first, last = ordered[0], ordered[-1]
    return f"{first}{unit}" if first == last else f"{first} … {last}{unit}"


def _position(p: float | None, train_len: int) -> str:
    return f"none {UP_TO}" if p is None else f"{p:.0f} ({p / train_len:.2g}x)"


def _length(factor: float | None) -> str:
    return "none up to the longest length" if factor is None else _times(factor)


def _times(factor: float | None) -> str:
    """A length factor, ``1.25x``; ``none`` for a fix above the line already at 1x."""
    return "none" if _no_length(factor) else f"{factor:g}x"


def _no_length(factor: float | None) -> bool:
    """A flat length that is none: ``None`` in a record, NaN in a table column."""
    return factor is None or factor != factor


def _verdict(key: str, b: dict[str, Any], train_len: int) -> str:
    """Plain sentences about one model's breaks."""
    at = {
        "flat": _times(b["flat_length"]),
        "past": _length(b["break_length"]),
        "loss": _position(b["loss_break"], train_len),
        "entropy": _position(b["entropy_inflection_earliest"], train_len),
        "variance": _position(b["variance_departure"], train_len),
    }
    return sentence("wang2024.sentences", "model_verdict")(model_name(key), b, at, UP_TO)


def _fix_verdict(fixes: pd.DataFrame, key: str, target: int) -> str:
    """Whether a fix extends the flat length of the model as trained (every flat length is
    judged against its 1x perplexity), and what each fix does at the length HeadScale trains at
    (``target`` x T)."""
    rows = fixes[fixes["model"] == key].set_index("fix")
    flat = float(rows.loc["none", "flat_length"])
    uniform = rows.drop(index=["none", "headscale"])
    best = uniform.sort_values(["flat_length", "cost_at_1x_percent"], ascending=[False, True])
    top = best.index[0]
    gain = float(best.loc[top, "flat_length"])
    at = ppl_column(target)
    closest = uniform[at].idxmin()
    headscale = rows.loc["headscale"]
    return sentence("wang2024.sentences", "fix_verdict")(
        model_name(key),
        _times(flat),
        _times(gain) if gain > flat else "",
        top,
        best.loc[top, "cost_at_1x_percent"],
        flat == LENGTHS[-1],
        {
            "flat": None
            if _no_length(headscale["flat_length"])
            else _times(headscale["flat_length"]),
            "cost": headscale["cost_at_1x_percent"],
        },
        target,
        {
            "trained": rows.loc["none", at],
            "uniform": uniform.loc[closest, at],
            "closest": closest,
            "headscale": headscale[at],
        },
    )


def summary_text(
    settings: Settings,
    breaks: dict[str, dict[str, Any]],
    fixes: pd.DataFrame,
    headscale: dict[str, list[list[float]]],
) -> str:
    """``summary.md``: the breaks of each model and what each fix does."""
    first = settings.models[0].run
    m, t, s = first.model, first.train, settings.measures
    rows = []
    for key, b in breaks.items():
        rows.append(
            {
                "model": model_name(key),
                "flat length": _times(b["flat_length"]),
                "loss break": _position(b["loss_break"], t.seq_len),
                "entropy inflection": _position(b["entropy_inflection_earliest"], t.seq_len),
                "variance departure (layer 1)": _position(b["variance_departure"], t.seq_len),
                "adjacency change": f"none {UP_TO}"
                if b["adjacency_change"] is None
                else f"{b['adjacency_change']}x",
            }
        )
    scales = [
        {"model": model_name(key), "layer": layer, "scales": ", ".join(
            f"{v:.2f}" for v in values
        )}
        for key, layers in headscale.items()
        for layer, values in enumerate(layers, 1)
    ]  # fmt: skip
    shown = fixes.assign(
        model=fixes["model"].map(model_name), flat_length=fixes["flat_length"].map(_times)
    )
    return fill(
        "wang2024.lengths",
        **corpus_values(first),
        **shape_values(m),
        **schedule_values(t),
        eval_tokens=s.eval_tokens,
        samples=s.samples,
        lengths=", ".join(f"{f}x" for f in LENGTHS),
        mechanism_lengths=", ".join(f"{f}x" for f in MECHANISM_LENGTHS),
        headscale_length=f"{s.headscale['length_factor']}x",
        headscale_steps=s.headscale["steps"],
        headscale_lr=f"{s.headscale['lr']:g}",
        entropy_tolerance=f"{ENTROPY_TOLERANCE:g}",
        variance_tolerance=f"{VARIANCE_TOLERANCE:g}",
        adjacency_tolerance=f"{ADJACENCY_TOLERANCE:g}",
        coincide=f"{COINCIDE:g}",
        flat_sentence=" ".join(
            f"{model_name(key)} stays flat up to {_times(b['flat_length'])} T."
            for key, b in breaks.items()
        ),
        breaks_table=markdown_table(pd.DataFrame(rows)),
        seeds_table=markdown_table(seed_table(breaks, fixes, t.seq_len)),
        flat_comparison=flat_comparison(breaks),
        seeds=sorted({m.seed for m in settings.models}),
        verdicts="\n\n".join(_verdict(key, b, t.seq_len) for key, b in breaks.items()),
        fixes_table=markdown_table(shown, ".3f"),
        fix_verdicts="\n\n".join(
            _fix_verdict(fixes, key, s.headscale["length_factor"]) for key in breaks
        ),
        scales_table=markdown_table(pd.DataFrame(scales)),
    )
