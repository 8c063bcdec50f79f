"""Zuo et al. 2025, mastery: does every NoPE model of ``--part trained`` master its task at
any seed, and in how many steps?

The NoPE models of ``--part trained`` (same tasks, formats, model and recipe) are trained at
three seeds (``--seed`` and the two after it), each until exact match on the held-out evaluation
sample reaches the scale's ``stop_at`` (within its step cap; a curriculum's stages likewise).
The part reports, per task, how many seeds mastered it and the mean, spread and range of the
steps they needed: a fixed step budget set near the point where a task is learned turns a seed,
or another CPU's float rounding, into another conclusion; steps to a target do not.
``POS_ENCODINGS`` names the encodings trained (NoPE, whose claim this is; ``--part trained``
gives every encoding's steps at one seed). Models train in worker processes of one thread each
and are not analysed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nopelab.config import PosEncoding
from nopelab.encodings import labels_of
from nopelab.experiments.outputs import model_file, write_outputs
from nopelab.experiments.summary_template import fill
from nopelab.experiments.train_and_measure import stage_folder, train_into, training_job
from nopelab.experiments.zuo2025 import figures, trained
from nopelab.runtime.jobs import run_jobs
from nopelab.tables import markdown_table
from nopelab.training.run import TrainRun
from nopelab.training.task_config import Layout

SEEDS = 3
POS_ENCODINGS: tuple[PosEncoding, ...] = ("none",)
LABELS = labels_of(POS_ENCODINGS)


@dataclass(frozen=True)
class Settings:
    seeds: tuple[int, ...]
    by_seed: dict[int, trained.Settings]  # the trained part's settings at each seed
    workers: int


def settings(scale: str, seed: int, device: str, layout: Layout | None = None) -> Settings:
    seeds = tuple(range(seed, seed + SEEDS))
    by_seed = {s: trained.settings(scale, s, device, layout) for s in seeds}
    return Settings(seeds, by_seed, by_seed[seed].workers)


def train_job(run: TrainRun, stages: tuple[TrainRun, ...], folder: Path) -> None:
    """Train ``run`` after its curriculum's ``stages`` into ``folder`` (a job)."""
    train_into(run, folder, stages)


def job_name(task: str, pe: str, seed: int) -> str:
    return f"{task}-{pe}-seed{seed}"


def run(settings: Settings, out: Path) -> None:
    first = settings.by_seed[settings.seeds[0]]
    order = sorted(
        first.runs, key=lambda key: (trained.POS_ENCODINGS.index(key[1]), -trained.cost(first, key))
    )
    jobs = [
        training_job(
            job_name(*key, seed),
            train_job,
            (by.runs[key], by.stages[key]),
            by.runs[key],
            by.stages[key],
        )
        for key in order
        if key[1] in POS_ENCODINGS
        for seed, by in settings.by_seed.items()
    ]
    run_jobs(jobs, out / "runs", "zuo2025 mastery", settings.workers, what="models")
    rows = []
    for seed, by in settings.by_seed.items():
        for (task, pe), train_run in by.runs.items():
            if pe not in POS_ENCODINGS:
                continue
            folder = out / "runs" / job_name(task, pe, seed)
            stages = [stage_folder(folder, n) for n in range(1, len(by.stages[task, pe]) + 1)]
            summaries = [model_file(out, path.name) for path in (*stages, folder)]
            steps = sum(summary["steps"] for summary in summaries)
            assert train_run.task is not None  # every run here trains on a task
            rows.append(
                {
                    "task": task,
                    "max_len": train_run.task.max_len,
                    "pos_encoding": pe,
                    "seed": seed,
                    "accuracy": summaries[-1]["final_eval"]["accuracy"],
                    "steps_trained": steps,
                    "steps_to_target": steps if summaries[-1]["steps_to_target"] else None,
                    "train_seconds": sum(summary["train_seconds"] for summary in summaries),
                }
            )
    table = pd.DataFrame(rows).astype({"steps_to_target": float})  # NaN: not reached
    spread = spread_table(table)
    stop_at = first.runs[next(iter(first.runs))].train.stop_at
    assert stop_at is not None  # the mastery part trains every run to a target
    figures.steps_to_mastery(
        table, list(trained.TASKS), list(POS_ENCODINGS), stop_at, out / "mastery.png"
    )
    write_outputs(
        out,
        {"mastery": table},
        summary_text(settings, table, spread),
        {"rows": rows, "spread": spread.to_dict("records")},
    )


def spread_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and encoding: how many seeds mastered the task, the mean, std (over seeds,
    ddof 1), min and max of their steps to mastery (NaN where undefined), and the lowest final
    accuracy."""
    groups = table.groupby(["task", "pos_encoding"], sort=False)
    steps = groups["steps_to_target"]
    return pd.DataFrame(
        {
            "mastered": steps.count(),
            "seeds": groups.size(),
            "steps_mean": steps.mean(),
            "steps_std": steps.std(),
            "steps_min": steps.min(),
            "steps_max": steps.max(),
            "accuracy_min": groups["accuracy"].min(),
        }
    ).reset_index()


def _cell(row: pd.Series) -> str:
    """``3/3: 1200 ± 100 (1100–1300)``; the spread only where there is one."""
    cell = f"{row['mastered']}/{row['seeds']}"
    if row["mastered"]:
        cell += f": {row['steps_mean']:.0f}"
        if row["mastered"] > 1:
            cell += f" ± {row['steps_std']:.0f} ({row['steps_min']:.0f}–{row['steps_max']:.0f})"
    return cell


def summary_text(settings: Settings, table: pd.DataFrame, spread: pd.DataFrame) -> str:
    first = settings.by_seed[settings.seeds[0]]
    run0 = next(iter(first.runs.values()))
    m, t = run0.model, run0.train
    tasks, encodings = list(trained.TASKS), list(POS_ENCODINGS)
    cells = spread.assign(cell=[_cell(row) for _, row in spread.iterrows()])
    overview = cells.pivot(index="task", columns="pos_encoding", values="cell")
    overview = overview.reindex(index=tasks, columns=encodings).rename(columns=LABELS)
    overview = overview.reset_index()
    per_seed = table.assign(
        shown=[
            f"{steps:.0f}" if steps == steps else f"not by {cap} ({acc:.3f})"  # NaN: not reached
            for steps, cap, acc in zip(
                table["steps_to_target"], table["steps_trained"], table["accuracy"], strict=True
            )
        ]
    ).pivot(index=["task", "pos_encoding"], columns="seed", values="shown")
    per_seed = per_seed.reindex(pd.MultiIndex.from_product([tasks, encodings])).reset_index()
    per_seed.columns = ["task", "pos_encoding", *(f"seed {s}" for s in settings.seeds)]
    caps = "; ".join(
        f"{task} "
        + " then ".join(
            str(run.train.steps) for run in (*first.stages[task, "none"], first.runs[task, "none"])
        )
        for task in tasks
    )
    lowest = ", ".join(
        f"{r.task} {r.pos_encoding} {r.accuracy_min:.3f}" for r in spread.itertuples()
    )
    return fill(
        "zuo2025.mastery",
        seeds=", ".join(map(str, settings.seeds)),
        encodings=", ".join(LABELS[pe] for pe in encodings),
        d_model=m.d_model,
        n_heads=m.n_heads,
        n_layers=m.n_layers,
        batch_size=t.batch_size,
        lr=f"{t.lr:g}",
        stop_at=f"{t.stop_at:g}",
        eval_every=t.eval_every,
        caps=caps,
        overview_table=markdown_table(overview),
        per_seed_table=markdown_table(per_seed),
        lowest=lowest,
    )
