"""Zuo et al. 2025, trained: is the adjacency pattern there in models that solve their tasks?

NoPE, learned-PE and RoPE models are trained on ``add``, ``reverse``, ``order`` and ``wherex`` in
Zuo et al.'s formats (``$50+148=891$``, ``rev(...)=``, ``order(...,...)=``, ``wherex(...,x)=``)
with the nanoGPT recipe (AdamW, weight decay 0.1, beta2 0.99, clip 1.0, warm-up then cosine
decay), the same budget for every encoding (``--encodings`` trains some of them, NoPE among
them). Each model is analysed at init and after training
with Zuo et al.'s protocol: test prompts, one per sequence, left-padded with newlines to the
task's longest prompt, at ``attn_heads`` (the heads' outputs before the output projection, their
hook point), ``attn_out`` and ``resid_post``.

Scales (``SCALES``): ``paper`` is Zuo et al.'s recipe (6 x 6 x 384, dropout 0.2, windows of
256 characters with the loss on every character, batch 256, 5000 steps); ``medium`` keeps their
task lengths with the CPU recipe; ``small`` shortens the instances (in the same formats) so
that the whole part fits in 45 minutes on two cores; ``smoke`` checks the plumbing. The CPU
recipe trains one left-padded line per row with the loss on every character of the line (Zuo
et al.'s objective; on the answers alone NoPE learns 3-digit addition far more slowly): see the
recipe search in docs/zuo2025.md. Where NoPE does not learn a task's full length from scratch
(9-digit ``wherex``), ``medium`` trains it through a curriculum: first on shorter instances, then
on the full length from those weights; every encoding goes through the same curriculum.

Models train and are analysed in worker processes of one thread each (one per core on a CPU);
a run directory that already holds finished models is continued, not retrained.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from nopelab import plots
from nopelab.config import AnalysisConfig, ModelConfig, PosEncoding, Site, TrainConfig
from nopelab.errors import UserError
from nopelab.experiments.outputs import model_file, write_outputs
from nopelab.experiments.scale_files import read_scales, scale_schema
from nopelab.experiments.summary_template import fill, shape_values
from nopelab.experiments.train_and_measure import (
    read_trained,
    stage_folder,
    train_and_analyze,
    training_job,
)
from nopelab.experiments.zuo2025 import figures
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import default_workers, run_jobs
from nopelab.tables import by_layer, markdown_table, mean_std
from nopelab.training.run import TrainRun
from nopelab.training.task_config import Layout, LossMode, TaskConfig, max_line_len, max_prompt_len
from nopelab.training.task_kinds import Task

TASKS: tuple[Task, ...] = ("add", "reverse", "order", "wherex")
POS_ENCODINGS: tuple[PosEncoding, ...] = ("none", "learned", "rope")
SITES: tuple[Site, ...] = ("attn_heads", "attn_out", "resid_post")
WINDOW = 256  # Zuo et al.'s training window (characters) for the windows layout
ZUO_LENGTHS = {"add": 3, "reverse": 16, "order": 5, "wherex": 9}  # max_len of Zuo's data


@scale_schema
class Stage:
    """An earlier stage of a curriculum: the same model trained on shorter instances."""

    max_len: int
    steps: int
    train_size: int


@scale_schema
class Scale:
    """One scale's settings: task lengths and training budget per task, model, recipe."""

    lengths: dict[str, int]  # max_len per task (Zuo's format: most instances this long)
    steps: dict[str, int]  # training steps per task
    model: dict[str, Any]  # ModelConfig fields
    train: dict[str, Any]  # TrainConfig fields (seq_len: the line length when not given)
    train_size: dict[str, int]  # training lines per task
    test_size: int
    layout: Layout = "padded"
    loss_mode: LossMode = "all"
    samples: int = 256  # analysed prompts per model
    workers: int | None = None  # models at once (None: one single-thread job per CPU core)
    curriculum: dict[str, tuple[Stage, ...]] = field(default_factory=dict)  # task -> stages
    stop_at: float | None = None  # stop each stage at this held-out accuracy (steps: the cap)
    eval_every: int | None = None  # steps between evaluations (None: a tenth of the steps)


SCALES = read_scales("zuo2025.trained", Scale)


@dataclass(frozen=True)
class Settings:
    scale: Scale
    runs: dict[tuple[str, str], TrainRun]  # (task, pos_encoding) -> run
    stages: dict[tuple[str, str], tuple[TrainRun, ...]]  # its curriculum's earlier stages
    analyses: dict[str, AnalysisConfig]  # task -> Zuo's protocol at that task's prompt length
    workers: int

    @property
    def encodings(self) -> tuple[PosEncoding, ...]:
        """The encodings trained (``--encodings``), in :data:`POS_ENCODINGS`' order."""
        return tuple(pe for pe in POS_ENCODINGS if (TASKS[0], pe) in self.runs)


def task_config(scale: Scale, task: Task) -> TaskConfig:
    return TaskConfig(
        name=task,
        max_len=scale.lengths[task],
        train_size=scale.train_size[task],
        test_size=scale.test_size,
        layout=scale.layout,
        loss_mode=scale.loss_mode,
    )


def train_config(
    scale: Scale, task_cfg: TaskConfig, steps: int, seed: int, device: str
) -> TrainConfig:
    """The CPU recipe (or the scale's) for ``steps`` steps on lines of ``task_cfg``: a row is
    the longest line unless the scale says otherwise, or with the ``windows`` layout Zuo et
    al.'s window of :data:`WINDOW` characters, as many rows a step as give the padded recipe's
    characters a step."""
    line = max_line_len(task_cfg)
    shape: dict[str, Any] = {}  # the scale's seq_len stands
    if "seq_len" not in scale.train:
        shape = {"seq_len": line}
        if task_cfg.layout == "windows":
            batch = scale.train.get("batch_size", TrainConfig().batch_size)
            shape = {"seq_len": WINDOW, "batch_size": max(1, round(batch * line / WINDOW))}
    return TrainConfig(
        **{**scale.train, **shape},
        steps=steps,
        eval_every=scale.eval_every or max(1, steps // 10),
        checkpoint_every=max(1, steps // 10),
        stop_at=scale.stop_at,
        seed=seed,
        device=device,
    )


def settings(
    scale_name: str,
    seed: int,
    device: str,
    layout: Layout | None = None,
    encodings: tuple[str, ...] | None = None,
) -> Settings:
    """``layout``: the rows the models train on (``--layout``), the scale's unless given;
    ``encodings``: the encodings trained (``--encodings``; NoPE among them), all unless given."""
    scale = SCALES[scale_name]
    if layout is not None:
        scale = replace(scale, layout=layout)
    chosen = chosen_encodings(encodings)
    resolve_device(device)
    runs: dict[tuple[str, str], TrainRun] = {}
    stages: dict[tuple[str, str], tuple[TrainRun, ...]] = {}
    analyses: dict[str, AnalysisConfig] = {}
    for task in TASKS:
        task_cfg = task_config(scale, task)
        train_cfg = train_config(scale, task_cfg, scale.steps[task], seed, device)
        earlier = [
            (replace(task_cfg, max_len=stage.max_len, train_size=stage.train_size), stage.steps)
            for stage in scale.curriculum.get(task, ())
        ]
        for pe in chosen:
            # every stage trains the model of the last one (its positions fit the longest line)
            model = ModelConfig(**scale.model, max_seq_len=train_cfg.seq_len, pos_encoding=pe)
            runs[task, pe] = TrainRun(model=model, train=train_cfg, task=task_cfg)
            stages[task, pe] = tuple(
                TrainRun(model, train_config(scale, cfg, steps, seed, device), task=cfg)
                for cfg, steps in earlier
            )
        analyses[task] = AnalysisConfig(
            seq_len=max_prompt_len(task_cfg),
            samples=scale.samples,
            batch_size=min(scale.samples, 64),
            input="prompts",
            sites=SITES,
            seed=seed,
            device=device,
        )
    workers = default_workers(device) if scale.workers is None else scale.workers
    return Settings(scale, runs, stages, analyses, workers)


def chosen_encodings(encodings: tuple[str, ...] | None) -> tuple[PosEncoding, ...]:
    """``--encodings``' names in :data:`POS_ENCODINGS`' order (all when not given): each one of
    them, NoPE among them (the part's claim, heat maps and probes are NoPE's)."""
    if encodings is None:
        return POS_ENCODINGS
    allowed, names = ", ".join(POS_ENCODINGS), ",".join(encodings)
    if unknown := [e for e in encodings if e not in POS_ENCODINGS]:
        raise UserError(f"--encodings: {unknown[0]!r} is not trained here; allowed: {allowed}")
    if "none" not in encodings:
        raise UserError(f"--encodings: must include none (NoPE, the part's subject); got {names}")
    return tuple(e for e in POS_ENCODINGS if e in encodings)


def cost(settings: Settings, key: tuple[str, str]) -> int:
    """A model's training work in characters (steps x line length over its stages)."""
    runs = (*settings.stages[key], settings.runs[key])
    return sum(run.train.steps * run.train.batch_size * run.train.seq_len for run in runs)


def run(settings: Settings, out: Path) -> None:
    names = {key: f"{key[0]}-{key[1]}" for key in settings.runs}
    # NoPE models go first (the part's claim is about them), the longest first within an
    # encoding (so that the last models to start are short ones); the results do not depend on
    # the order
    order = sorted(
        settings.runs, key=lambda key: (settings.encodings.index(key[1]), -cost(settings, key))
    )
    jobs = [
        training_job(
            names[key],
            train_and_analyze,
            (settings.runs[key], settings.analyses[key[0]], settings.stages[key]),
            settings.runs[key],
            settings.stages[key],
        )
        for key in order
    ]
    run_jobs(jobs, out / "runs", "zuo2025 task models", settings.workers, what="models")
    rows, accuracy, heatmaps = [], [], {}
    for (task, pe), train_run in settings.runs.items():
        folder = out / "runs" / names[task, pe]
        result = read_trained(folder)
        summary = result.summary
        rows += result.rows(task=task, pos_encoding=pe)
        stages = [
            (stage, model_file(out, stage_folder(folder, number).name))
            for number, stage in enumerate(settings.stages[task, pe], 1)
        ]
        trained_steps = summary["steps"] + sum(done["steps"] for _, done in stages)
        accuracy.append(
            {
                "task": task,
                "max_len": train_run.task_config.max_len,
                "pos_encoding": pe,
                "accuracy": summary["final_eval"]["accuracy"],
                "steps": train_run.train.steps,
                "steps_trained": trained_steps,
                "steps_to_target": trained_steps if summary.get("steps_to_target") else None,
                "curriculum": "; ".join(
                    f"max_len {stage.task_config.max_len}, {done['steps']} steps: "
                    f"{done['final_eval']['accuracy']:.3f}"
                    for stage, done in stages
                ),
                "train_seconds": summary["train_seconds"]
                + sum(done["train_seconds"] for _, done in stages),
                "tokens_per_second": summary["tokens_per_second"],
            }
        )
        if pe == "none":
            for state, analysis in (("init", result.init), ("trained", result.trained)):
                for (site, layer), matrix in analysis.cosine.items():
                    if site == "attn_heads":
                        heatmaps[f"{task} {state} L{layer}"] = matrix
    scores, accuracy_table = pd.DataFrame(rows), pd.DataFrame(accuracy)
    first = next(iter(settings.runs.values()))
    plots.cosine_heatmaps(
        heatmaps,
        out / "heatmaps.png",
        ncols=first.model.n_layers,
        title="NoPE attn_heads cosine similarity (test prompts), init and trained",
    )
    for site in ("attn_heads", "attn_out"):
        figures.trained_scores(scores[scores["site"] == site], out / f"scores-{site}.png")
    write_outputs(
        out,
        {"scores": scores, "accuracy": accuracy_table},
        summary_text(settings, accuracy_table, scores),
        {"accuracy": accuracy, "rows": rows},
    )


def _score_table(
    scores: pd.DataFrame, site: str, encodings: tuple[PosEncoding, ...]
) -> pd.DataFrame:
    """Rows (task, encoding, state), columns per layer: adjacency mean ± std at ``site``."""
    frame = scores[scores["site"] == site]
    cells = mean_std(frame["adjacency_mean"], frame["adjacency_std"], digits=(".3f", ".3f"))
    order = pd.MultiIndex.from_product([TASKS, encodings, ("init", "trained")])
    return by_layer(frame, ["task", "pos_encoding", "state"], cells, order).reset_index()


def summary_text(settings: Settings, accuracy: pd.DataFrame, scores: pd.DataFrame) -> str:
    """``summary.md``: accuracy per task and encoding (with the optional blocks: steps to mastery,
    the curriculum's stages), and the adjacency score per layer at both attention sites."""
    first = next(iter(settings.runs.values()))
    m, t, task_cfg = first.model, first.train, first.task_config
    acc = accuracy.pivot(index="task", columns="pos_encoding", values="accuracy")
    encodings = list(settings.encodings)
    acc = acc.reindex(index=list(TASKS), columns=encodings)
    acc.insert(0, "max_len", [settings.scale.lengths[task] for task in TASKS])
    acc.insert(
        1,
        "steps" if t.stop_at is None else "step cap",
        [settings.scale.steps[task] for task in TASKS],
    )
    mastery = ""  # the optional tables: steps to mastery, the curriculum's stages
    if t.stop_at is not None:
        reached = accuracy.assign(
            shown=[
                f"{steps:.0f}" if steps == steps else f"not by {cap}"  # NaN: not reached
                for steps, cap in zip(
                    accuracy["steps_to_target"], accuracy["steps_trained"], strict=True
                )
            ]
        )
        table = reached.pivot(index="task", columns="pos_encoding", values="shown")
        mastery = markdown_table(table.reindex(index=list(TASKS), columns=encodings).reset_index())
    nope = scores[(scores["pos_encoding"] == "none") & (scores["site"] == "attn_heads")]
    trained = nope[nope["state"] == "trained"].groupby("task")["adjacency_mean"].max()
    pattern = ", ".join(f"{task} {trained[task]:.3f}" for task in TASKS if task in trained)
    staged = accuracy[accuracy["curriculum"] != ""]
    curriculum = ""
    if len(staged):
        stages = staged.pivot(index="task", columns="pos_encoding", values="curriculum")
        curriculum = markdown_table(stages.reindex(columns=encodings).reset_index())
    return fill(
        "zuo2025.trained",
        **shape_values(m),
        dropout=m.dropout,
        init=m.init,
        batch_size=t.batch_size,
        layout=task_cfg.layout,
        seq_len=t.seq_len,
        loss_mode=task_cfg.loss_mode,
        lr=f"{t.lr:g}",
        warmup=t.warmup,
        weight_decay=t.weight_decay,
        grad_clip=t.grad_clip,
        seed=t.seed,
        samples=settings.analyses["add"].samples,
        accuracy_table=markdown_table(acc.reset_index(), ".3f"),
        stop_at=f"{t.stop_at:g}" if t.stop_at is not None else None,
        eval_every=t.eval_every,
        mastery_table=mastery,
        curriculum_table=curriculum,
        pattern=pattern,
        heads_table=markdown_table(_score_table(scores, "attn_heads", settings.encodings)),
        out_table=markdown_table(_score_table(scores, "attn_out", settings.encodings)),
    )
