"""Kazemnejad et al. 2023: which positional encoding lets a decoder generalise to longer inputs?

Task models with six encodings (NoPE, a learned table, fixed sinusoids, RoPE, ALiBi and T5's
relative bias) are trained on instances of operand
lengths drawn uniformly from 1..L, in the plain format (``copy(abc)=abc``, ``rev(123)=321``,
``sort(cba)=abc``; ``12+34=64`` with the sum least-significant digit first where a scale names
``add``), lines packed end to end from a line
start with the loss on every character. Each is then tested by greedy decoding, every prompt
alone from position 0, on fresh instances of every length 1..3L: exact match per length. Per
task, the encodings are ranked by their mean accuracy over the unseen lengths L+1..3L (ties
share the average rank), and each encoding's mean reciprocal rank (MRR) over the tasks is set
beside Kazemnejad et al.'s (ten tasks, L = 20, tested to 2L). A model that does not learn the
task at the training lengths says nothing about generalisation: the summary flags it.

Beside the accuracy, each model's position mechanisms are measured on the test instances of
every length (:func:`mechanisms`): the slope of log Var(``attn_out``) against log position
(Chi et al.'s 1/m law: -1), the adjacency score of ``attn_out`` and the attention entropy over
that of uniform attention, per layer. Where each departs from its trend over the training
lengths (:func:`nopelab.measure.breaks.departure`) is set beside where the accuracy breaks.

Models train (and are tested) in worker processes, one per core on a CPU; a run directory that
already holds finished models is continued, not retrained.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from nopelab.config import ATTENTION, ModelConfig, PosEncoding, TrainConfig
from nopelab.encodings import labels_of
from nopelab.experiments.kazemnejad2023 import figures
from nopelab.experiments.outputs import gather, model_file, write_outputs
from nopelab.experiments.scale_files import read_published, read_scales, scale_schema
from nopelab.experiments.summary_template import fill, sentence, shape_values
from nopelab.experiments.train_and_measure import train_into, training_job
from nopelab.measure import breaks
from nopelab.measure.capture import StreamingCapture
from nopelab.models.transformer import Transformer
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import default_workers, run_jobs
from nopelab.runtime.rundir import write_json
from nopelab.tables import markdown_table, mean_std
from nopelab.training.run import TrainRun
from nopelab.training.task_config import TaskConfig, max_line_len
from nopelab.training.task_kinds import TASK_KINDS, Example
from nopelab.training.tasks import accuracy, encode, make_splits

POS_ENCODINGS: tuple[PosEncoding, ...] = ("none", "learned", "sinusoidal", "rope", "alibi", "t5")
LABELS = labels_of(POS_ENCODINGS)
# Kazemnejad et al. 2023, Figure 1 (kazemnejad2023/published.toml): mean reciprocal rank over
# ten tasks; "absolute" (0.22) stands for both absolute encodings here
_MRR = read_published("kazemnejad2023")["mrr"]
PUBLISHED_MRR: dict[str, float] = {pe: _MRR[pe] for pe in POS_ENCODINGS}
STRETCH = 3  # tested at lengths 1..STRETCH x L
# held-out exact match (on the test split: lines of lengths 1..L that are not training lines)
# below which a model has not learned its task
LEARNED_AT = 0.9
BROKEN_AT = 0.5  # accuracy breaks where it stays below this share of the in-distribution mean
# How far a mechanism may stray from its trend over the training lengths before it departs
TOLERANCES = {"variance_slope": 0.2, "adjacency": 0.05, "entropy_ratio": 0.05}
MEASURES = {
    "variance_slope": "slope of log Var(attn_out) on log position, layer 1",
    "adjacency": "adjacency score of attn_out, mean over layers",
    "entropy_ratio": "attention entropy / uniform's, mean over layers",
}


@scale_schema
class Scale:
    max_len: dict[str, int]  # L per task (plain format): training operand lengths over 1..L
    steps: dict[str, int]  # training steps per task
    train_size: dict[str, int]  # training lines per task
    model: dict[str, Any]  # ModelConfig fields but max_seq_len and pos_encoding
    train: dict[str, Any]  # TrainConfig fields but steps and seq_len (the longest training line)
    test_size: int  # held-out lines of lengths 1..L, evaluated along training
    per_length: int  # test instances of each length 1..3L (all of them where fewer exist)
    seeds: int  # --seed, --seed + 1, ...


SCALES = read_scales("kazemnejad2023.tasks", Scale)


@dataclass(frozen=True)
class Model:
    """One task model of the part: its task, training lengths 1..``max_len``, encoding, seed."""

    task: str
    max_len: int
    pos_encoding: str
    seed: int
    run: TrainRun

    @property
    def key(self) -> str:
        return f"{self.task}-{self.pos_encoding}-seed{self.seed}"


@dataclass(frozen=True)
class Settings:
    models: list[Model]
    per_length: int
    workers: int


def task_config(task: str, max_len: int, train_size: int, test_size: int) -> TaskConfig:
    """Training lines of operand lengths 1..``max_len`` in the plain format (the sum written
    least-significant digit first), packed, the loss on every character; held-out lines
    likewise."""
    return TaskConfig(
        name=task,  # type: ignore[arg-type]  # checked by TaskConfig
        format="plain",
        min_len=1,
        max_len=max_len,
        reversed_answer=task == "add",
        train_size=train_size,
        test_size=test_size,
        layout="packed",
        loss_mode="all",
    )


def longest_line(task_cfg: TaskConfig, max_len: int) -> int:
    """The longest line of the task up to operand length ``max_len``."""
    return max_line_len(dataclasses.replace(task_cfg, test_max_len=max_len))


def settings(scale: str, seed: int, device: str) -> Settings:
    s = SCALES[scale]
    resolve_device(device)
    for name in ("steps", "train_size"):
        if set(getattr(s, name)) != set(s.max_len):
            raise ValueError(
                f"scales/kazemnejad2023.toml [{scale}]: {name} must name the tasks of max_len"
            )
    runs = {}  # per task: its lines, training settings and the positions a model needs
    for task, L in s.max_len.items():
        task_cfg = task_config(task, L, s.train_size[task], s.test_size)
        steps = s.steps[task]
        train = TrainConfig(
            **s.train,
            steps=steps,
            seq_len=max_line_len(task_cfg),  # rows start at a line start: the longest one fits
            eval_every=max(1, steps // 5),
            checkpoint_every=max(1, steps // 5),
            device=device,
        )
        # a learned table covers the longest tested line; the other encodings take any length
        runs[task] = (task_cfg, train, longest_line(task_cfg, STRETCH * L))
    models = []
    for offset in range(s.seeds):  # seed by seed: a run's first seed is whole first
        for task, (task_cfg, train, positions) in runs.items():
            for pe in POS_ENCODINGS:
                model = ModelConfig(**s.model, max_seq_len=positions, pos_encoding=pe)
                run = TrainRun(model, dataclasses.replace(train, seed=seed + offset), task_cfg)
                models.append(Model(task, s.max_len[task], pe, seed + offset, run))
    return Settings(models, s.per_length, default_workers(device))


def length_test(
    task_cfg: TaskConfig, length: int, size: int, seed: int, trained: set[str]
) -> tuple[list[Example], int]:
    """``size`` distinct instances of operand length ``length`` (every one where fewer exist),
    drawn by ``seed``, and how many of them are training prompts (``trained``): those come in
    only where the length has too few others."""
    kind, fmt = TASK_KINDS[task_cfg.name], task_cfg.resolved_format
    want = min(size, kind.count(fmt, length))
    if want == 0:  # a length no instance has (SCAN's 23 actions)
        return [], 0
    rng = random.Random(f"{task_cfg.name} {length} {seed}")
    unseen: dict[str, Example] = {}
    seen: dict[str, Example] = {}
    for _ in range(50 * want + 1000):  # ample to find every prompt of a short length
        example = kind.example(kind.draw_plain(length, rng), fmt, task_cfg.reversed_answer)
        (seen if example.prompt in trained else unseen).setdefault(example.prompt, example)
        if len(unseen) == want:
            break
    examples = [*unseen.values(), *seen.values()][:want]
    return examples, sum(e.prompt in trained for e in examples)


def train_and_test(run: TrainRun, longest: int, per_length: int, folder: Path) -> None:
    """Train ``run`` into ``folder``, then write its exact match and position mechanisms at
    every operand length 1..``longest`` (``lengths.json``, ``mechanisms.json``; a job)."""
    from nopelab.training.trained import load_trained

    train_into(run, folder)
    device = resolve_device(run.train.device)
    _, model = load_trained(folder, device)
    instances = instances_by_length(run, longest, per_length)
    rows = []
    for length, (examples, seen) in instances.items():
        right = accuracy(model, examples, device=device)
        rows.append({"length": length, "accuracy": right, "instances": len(examples), "seen": seen})
    write_json(folder / "lengths.json", rows)
    write_mechanisms(model, instances, device, folder)


def instances_by_length(
    run: TrainRun, longest: int, per_length: int
) -> dict[int, tuple[list[Example], int]]:
    """Per operand length 1..``longest`` that has instances: :func:`length_test`'s instances
    for ``run``'s task and seed, and how many of them are training prompts."""
    task_cfg = run.task_config
    kind, fmt = TASK_KINDS[task_cfg.name], task_cfg.resolved_format
    trained = {e.prompt for e in make_splits(task_cfg, run.train.seed)[0]}
    return {
        length: length_test(task_cfg, length, per_length, run.train.seed, trained)
        for length in range(1, longest + 1)
        if kind.count(fmt, length)  # SCAN has no command of some lengths
    }


def write_mechanisms(
    model: Transformer,
    instances: dict[int, tuple[list[Example], int]],
    device: torch.device,
    folder: Path,
) -> None:
    """Write ``mechanisms.json``: :func:`mechanisms` at every length of ``instances``."""
    measured = []
    for length, (examples, _) in instances.items():
        measured += [{"length": length, **row} for row in mechanisms(model, examples, device)]
    write_json(folder / "mechanisms.json", measured)


@torch.inference_mode()
def mechanisms(
    model: Transformer, examples: list[Example], device: torch.device
) -> list[dict[str, Any]]:
    """Per layer, over the instances' whole lines (prompt, answer, newline) from position 0:
    the least-squares slope of log Var(``attn_out``) on log position, the adjacency score of
    ``attn_out`` and the attention entropy over uniform attention's (positions 2..T). Lines of
    the most common length only (a sum may be a digit longer than another of its length)."""
    tokens = Counter(len(e.text) for e in examples).most_common(1)[0][0]
    ids = torch.tensor([encode(e.text) for e in examples if len(e.text) == tokens], device=device)
    with StreamingCapture(model, ["attn_out", ATTENTION], tokens, device) as cap:
        for batch in ids.split(256):
            model(batch)
    result = cap.result()
    log_position = np.log(np.arange(1, tokens + 1))
    rows = []
    for (_, layer), stats in result.sites.items():
        attention = result.attention[layer]
        log_variance = np.log(np.maximum(stats.variance, 1e-30))
        rows.append(
            {
                "layer": layer,
                "tokens": tokens,
                "lines": len(ids),
                "variance_slope": float(np.polyfit(log_position, log_variance, 1)[0]),
                "adjacency": stats.adjacency.mean,
                "entropy_ratio": float(
                    np.mean(attention.entropy[1:] / attention.uniform_entropy[1:])
                ),
            }
        )
    return rows


def run(settings: Settings, out: Path) -> None:
    jobs = [
        training_job(
            m.key, train_and_test, (m.run, STRETCH * m.max_len, settings.per_length), m.run
        )
        for m in settings.models
    ]
    run_jobs(jobs, out / "runs", "kazemnejad2023 task models", settings.workers, what="models")
    keys = ["task", "pos_encoding", "seed"]
    labelled = [
        (
            m.key,
            {"task": m.task, "pos_encoding": m.pos_encoding, "seed": m.seed, "max_len": m.max_len},
        )
        for m in settings.models
    ]
    rows = [
        {**row, "in_distribution": row["length"] <= row["max_len"]}
        for row in gather(out, labelled, "lengths.json")
    ]
    measured = gather(out, labelled, "mechanisms.json")
    trainings = []
    for m in settings.models:
        labels = dict(zip(keys, (m.task, m.pos_encoding, m.seed), strict=True))
        summary = model_file(out, m.key)
        trainings.append(
            {
                **labels,
                "steps": summary["steps"],
                "held_out_accuracy": summary["final_eval"]["accuracy"],
                "train_seconds": summary["train_seconds"],
            }
        )
    by_length = pd.DataFrame(rows)
    models = model_table(by_length, pd.DataFrame(trainings))
    ranks = rank_table(models)
    by_seed = seed_mrr_table(models)
    mrr = mrr_table(ranks, by_seed)
    curves = mechanism_curves(pd.DataFrame(measured))
    broken = break_table(by_length, curves, models)
    figures.accuracy_by_length(by_length, LABELS, out / "accuracy_by_length.png")
    figures.mechanisms_by_length(curves, LABELS, out / "mechanisms_by_length.png", MEASURES)
    verdict = verdicts(mrr, models, by_seed)
    tables = {"accuracy": by_length, "models": models, "ranks": ranks, "mrr": mrr}
    tables |= {"mrr_by_seed": by_seed}
    tables |= {"mechanisms": pd.DataFrame(measured), "breaks": broken}
    write_outputs(
        out,
        tables,
        summary_text(settings, by_length, ranks, mrr, verdict, broken),
        {
            "max_len": {m.task: m.max_len for m in settings.models},
            "stretch": STRETCH,
            "models": models.to_dict("records"),
            "ranks": ranks.to_dict("records"),
            "mrr": mrr.to_dict("records"),
            "mrr_by_seed": by_seed.to_dict("records"),
            "verdict": verdict,
            "breaks": broken.to_dict("records"),
        },
    )


def mechanism_curves(measured: pd.DataFrame) -> pd.DataFrame:
    """Per model and length, one value of each of :data:`MEASURES`: the variance slope of layer
    1 (where Chi et al.'s law holds), the adjacency score and entropy ratio averaged over
    layers."""
    keys = ["task", "pos_encoding", "seed", "max_len", "length"]
    first = measured[measured["layer"] == 1].set_index(keys)["variance_slope"]
    means = measured.groupby(keys, sort=False)[["adjacency", "entropy_ratio"]].mean()
    return means.join(first).reset_index()[[*keys, *MEASURES]]


def break_table(
    by_length: pd.DataFrame, curves: pd.DataFrame, models: pd.DataFrame
) -> pd.DataFrame:
    """Per model, in operand lengths: whether it learned its task (``models``' column), where
    the exact match breaks (the first length past L from which it stays below
    :data:`BROKEN_AT` of its mean over 1..L), where each mechanism departs from its trend over
    1..L (by :data:`TOLERANCES`), and which comes first (``with``: at the same length)."""
    keys = ["task", "pos_encoding", "seed"]
    learned = models.set_index(keys)["learned"]
    rows = []
    for labels, model in by_length.groupby(keys, sort=False):
        L = int(model["max_len"].iloc[0])
        model = model.sort_values("length")
        lengths, right = model["length"].to_numpy(float), model["accuracy"].to_numpy()
        level = right[lengths <= L].mean()
        row = dict(zip(keys, labels, strict=True))
        row["learned"] = bool(learned[labels])
        row["accuracy_break"] = breaks.lasting_from(lengths, right < BROKEN_AT * level, L)
        curve = curves.merge(pd.DataFrame([row])[keys], on=keys).sort_values("length")
        for measure, tolerance in TOLERANCES.items():
            values = curve[measure].to_numpy()
            where = breaks.departure(curve["length"].to_numpy(float), values, L, tolerance)
            row[f"{measure}_departure"] = where
            row[f"accuracy_vs_{measure}"] = breaks.order(row["accuracy_break"], where, 1.0)
        row["variance_vs_adjacency"] = breaks.order(
            row["variance_slope_departure"], row["adjacency_departure"], 1.0
        )
        rows.append(row)
    return pd.DataFrame(rows)


def model_table(by_length: pd.DataFrame, trainings: pd.DataFrame) -> pd.DataFrame:
    """Per model: mean exact match over the training lengths (in distribution) and over the
    longer ones (out of distribution), each length weighing the same, beside its row of
    ``trainings``; ``learned``: its ``held_out_accuracy`` at the end of training reaches
    :data:`LEARNED_AT`. That test split holds the longer lengths, whose prompts the training
    lines do not exhaust; the mean over 1..L weighs as much as them a short length with few
    distinct prompts, every one a training line (reverse has ten of length 1)."""
    keys = ["task", "pos_encoding", "seed"]
    mean = by_length.groupby([*keys, "in_distribution"], sort=False)["accuracy"].mean()
    table = mean.unstack("in_distribution").rename(
        columns={True: "in_distribution_accuracy", False: "ood_accuracy"}
    )
    table = table[["in_distribution_accuracy", "ood_accuracy"]].reset_index()
    table.columns.name = None
    table = table.merge(trainings, on=keys)
    table["learned"] = table["held_out_accuracy"] >= LEARNED_AT
    return table


def rank_table(models: pd.DataFrame) -> pd.DataFrame:
    """Per task and encoding: accuracies averaged over seeds, and the encoding's rank among the
    task's by out-of-distribution accuracy (1: best; ties share the average rank)."""
    table = (
        models.groupby(["task", "pos_encoding"], sort=False)
        .agg(
            seeds=("seed", "count"),
            in_distribution_accuracy=("in_distribution_accuracy", "mean"),
            ood_accuracy=("ood_accuracy", "mean"),
            ood_accuracy_std=("ood_accuracy", "std"),
        )
        .reset_index()
        .fillna({"ood_accuracy_std": 0.0})
    )
    table["rank"] = _ood_rank(table, ["task"])
    table["reciprocal_rank"] = 1 / table["rank"]
    return table


def seed_mrr_table(models: pd.DataFrame) -> pd.DataFrame:
    """Per encoding and seed: the MRR over tasks of that seed's models alone (each task's
    encodings ranked by that seed's out-of-distribution accuracy), the spread of
    :func:`mrr_table`'s."""
    ranked = models.assign(reciprocal_rank=1 / _ood_rank(models, ["task", "seed"]))
    per_seed = ranked.groupby(["pos_encoding", "seed"], sort=False)["reciprocal_rank"].mean()
    return per_seed.rename("mrr").reset_index()


def _ood_rank(table: pd.DataFrame, within: list[str]) -> pd.Series:
    """Each row's rank by ``ood_accuracy`` among the rows of the same ``within`` columns (1:
    best; ties share the average rank)."""
    # rounded: a mean of equal accuracies summed in another order must still tie
    score = table["ood_accuracy"].round(12)
    return score.groupby([table[c] for c in within]).rank(ascending=False, method="average")


def mrr_table(ranks: pd.DataFrame, by_seed: pd.DataFrame) -> pd.DataFrame:
    """Per encoding: the mean reciprocal rank over tasks (of the accuracies averaged over
    seeds), beside Kazemnejad et al.'s; its spread, the mean and standard deviation of the
    seeds' own MRRs (``by_seed``: :func:`seed_mrr_table`); and the MRR over the tasks that
    separate the encodings (``mrr_separating``; NaN when none does): a task on which every
    encoding ties gives each the same reciprocal rank and only pulls the MRRs together."""
    table = (
        ranks.groupby("pos_encoding", sort=False)
        .agg(tasks=("task", "count"), mrr=("reciprocal_rank", "mean"))
        .reset_index()
    )
    seeds = by_seed.groupby("pos_encoding")["mrr"]
    table["mrr_seed_mean"] = table["pos_encoding"].map(seeds.mean())
    table["mrr_seed_std"] = table["pos_encoding"].map(seeds.std()).fillna(0.0)
    separating = ranks.groupby("task")["rank"].transform("nunique") > 1
    table["tasks_separating"] = ranks.loc[separating, "task"].nunique()
    by_encoding = ranks[separating].groupby("pos_encoding")["reciprocal_rank"].mean()
    table["mrr_separating"] = table["pos_encoding"].map(by_encoding)
    table["published_mrr"] = table["pos_encoding"].map(PUBLISHED_MRR)
    order = table["pos_encoding"].map(POS_ENCODINGS.index)
    return table.assign(order=order).sort_values("order").drop(columns="order")


RIVALS = ("alibi", "t5")  # the encodings Kazemnejad et al. rank next to NoPE


def verdicts(mrr: pd.DataFrame, models: pd.DataFrame, by_seed: pd.DataFrame) -> dict[str, Any]:
    """Which encodings have the highest MRR (NoPE among them?); NoPE against each of
    :data:`RIVALS` seed by seed (the MRR difference's mean and standard deviation over seeds, and
    at how many seeds NoPE is above, level, below); which models did not learn their task at the
    training lengths."""
    best = mrr["mrr"].round(12) == mrr["mrr"].round(12).max()
    top = [str(pe) for pe in mrr.loc[best, "pos_encoding"]]
    unlearned = models[~models["learned"]]
    per_seed = by_seed.pivot(index="seed", columns="pos_encoding", values="mrr")
    versus = {}
    for rival in (r for r in RIVALS if r in per_seed):
        difference = (per_seed["none"] - per_seed[rival]).round(12)
        versus[rival] = {
            "difference": float(difference.mean()),
            "difference_std": float(difference.std()) if len(difference) > 1 else 0.0,
            "above": int((difference > 0).sum()),
            "level": int((difference == 0).sum()),
            "below": int((difference < 0).sum()),
        }
    return {
        "best": top,
        "nope_best": "none" in top,
        "nope_alone_best": top == ["none"],
        "nope_versus": versus,
        "not_learned": [
            f"{row.task} {LABELS[str(row.pos_encoding)]} seed {row.seed}"
            for row in unlearned.itertuples()
        ],
    }


def nope_answer(verdict: dict[str, Any], mrr: pd.DataFrame) -> str:
    """The plain sentence: does NoPE generalise best here?"""
    score = mrr.set_index("pos_encoding")["mrr"]
    return sentence("kazemnejad2023.sentences", "nope_answer")(
        [LABELS[pe] for pe in verdict["best"]],
        LABELS["none"],
        score["none"],
        score.max(),
        bool(verdict["not_learned"]),
    )


def versus_answer(verdict: dict[str, Any], seeds: int) -> str:
    """NoPE against ALiBi and T5's bias, seed by seed."""
    return sentence("kazemnejad2023.sentences", "versus_answer")(
        {LABELS[pe]: facts for pe, facts in verdict["nope_versus"].items()}, seeds
    )


def summary_text(
    settings: Settings,
    by_length: pd.DataFrame,
    ranks: pd.DataFrame,
    mrr: pd.DataFrame,
    verdict: dict[str, Any],
    broken: pd.DataFrame,
) -> str:
    """``summary.md``: the recipe, MRR beside Kazemnejad et al.'s, accuracies and ranks per task,
    the verdict, the models that did not learn their task, and where the mechanisms break."""
    first = settings.models[0].run
    tasks = {m.task: m for m in settings.models}  # one model per task: its recipe
    recipe = pd.DataFrame(
        [
            {
                "task": task,
                "L": m.max_len,
                "trained lengths": f"1..{m.max_len}",
                "tested lengths": f"1..{STRETCH * m.max_len}",
                "steps": m.run.train.steps,
                "training lines": m.run.task_config.train_size,
            }
            for task, m in tasks.items()
        ]
    )
    seeds = int(ranks["seeds"].max())
    spread = (
        {}
        if seeds < 2
        else {
            f"ours, each seed's (mean ± std over {seeds})": mean_std(
                mrr["mrr_seed_mean"], mrr["mrr_seed_std"], digits=(".2f", ".2f")
            )
        }
    )
    table = pd.DataFrame(
        {
            "encoding": [LABELS[pe] for pe in mrr["pos_encoding"]],
            "MRR, ours": [f"{v:.2f}" for v in mrr["mrr"]],
            **spread,
            f"ours, the {int(mrr['tasks_separating'].iloc[0])} tasks that separate them": [
                "—" if pd.isna(v) else f"{v:.2f}" for v in mrr["mrr_separating"]
            ],
            "Kazemnejad et al.": [
                f"{v:.2f}" + (" (absolute)" if pe in ("learned", "sinusoidal") else "")
                for pe, v in zip(mrr["pos_encoding"], mrr["published_mrr"], strict=True)
            ],
        }
    )
    accuracy = (
        [f"{a:.3f}" for a in ranks["ood_accuracy"]]
        if seeds < 2
        else mean_std(ranks["ood_accuracy"], ranks["ood_accuracy_std"], digits=(".3f", ".3f"))
    )
    cells = ranks.assign(
        encoding=ranks["pos_encoding"].map(LABELS),
        ood=[f"{a} ({r:g})" for a, r in zip(accuracy, ranks["rank"], strict=True)],
        ind=[f"{a:.3f}" for a in ranks["in_distribution_accuracy"]],
    )
    order = [LABELS[pe] for pe in POS_ENCODINGS]
    ood = cells.pivot(index="task", columns="encoding", values="ood").loc[list(tasks), order]
    ind = cells.pivot(index="task", columns="encoding", values="ind").loc[list(tasks), order]
    mixed = by_length[by_length["seen"] > 0].groupby(["task", "length"], sort=False)["seen"].max()
    return fill(
        "kazemnejad2023.tasks",
        **shape_values(first.model),
        recipe_table=markdown_table(recipe),
        n_tasks=len(tasks),
        per_length=settings.per_length,
        seeds=seeds,
        n_encodings=len(POS_ENCODINGS),
        batch_size=first.train.batch_size,
        lr=f"{first.train.lr:g}",
        warmup=first.train.warmup,
        mrr_table=markdown_table(table),
        answer=nope_answer(verdict, mrr),
        versus=versus_answer(verdict, seeds),
        ood_table=markdown_table(ood.reset_index()),
        in_table=markdown_table(ind.reset_index()),
        learned_at=f"{LEARNED_AT:g}",
        not_learned=verdict["not_learned"],
        seen=[f"{n} for {task} at length {k}" for (task, k), n in mixed.items()],
        broken_at=f"{BROKEN_AT:g}",
        tolerances=", ".join(f"{m} {t:g}" for m, t in TOLERANCES.items()),
        breaks_table=markdown_table(_break_cells(broken)),
        breaks_answer=breaks_answer(broken),
    )


def _break_cells(broken: pd.DataFrame) -> pd.DataFrame:
    def at(value: float | None) -> str:
        return "—" if value is None or pd.isna(value) else f"{value:g}"

    return pd.DataFrame(
        {
            "task": broken["task"],
            "encoding": broken["pos_encoding"].map(LABELS),
            "seed": broken["seed"],
            "accuracy breaks": broken["accuracy_break"].map(at),
            **{
                f"{measure} departs": broken[f"{measure}_departure"].map(at)
                for measure in TOLERANCES
            },
        }
    )


def breaks_answer(broken: pd.DataFrame) -> str:
    """How each mechanism's departure stands to the accuracy break, counted over the models
    that learned their task and whose accuracy breaks, and the variance law against the
    adjacency pattern over the learned models."""
    learned = broken[broken["learned"]]
    failing = learned[learned["accuracy_break"].notna()]
    departures = {
        measure: failing[f"accuracy_vs_{measure}"].value_counts().to_dict()
        for measure in TOLERANCES
    }
    relation = learned["variance_vs_adjacency"].value_counts().to_dict()
    return sentence("kazemnejad2023.sentences", "breaks_answer")(len(failing), departures, relation)
