"""Zuo et al. 2025, trained: does the adjacency pattern survive (or appear with) training?

NoPE, learned-PE and RoPE models are trained on ``add``, ``reverse``, ``order`` and ``wherex``
with the nanoGPT recipe (AdamW, weight decay 0.1, beta2 0.99, clip 1.0, warm-up then cosine
decay). Each model is analysed at init and after training on the same held-out task lines:
test accuracy, cosine heatmaps and adjacency scores per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nopelab import plots
from nopelab.analysis import resolve_device
from nopelab.config import AnalysisConfig, ModelConfig, TrainConfig
from nopelab.experiments.trained import train_and_analyze
from nopelab.report import markdown_table
from nopelab.rundir import write_json
from nopelab.tasks import TaskConfig
from nopelab.train import TrainRun

TASKS = ("add", "reverse", "order", "wherex")
POS_ENCODINGS = ("none", "learned", "rope")
SITES = ("attn_out", "resid_post")
SCALES = {
    "smoke": dict(
        model=dict(d_model=32, n_layers=2, n_heads=2),
        train=dict(steps=20, batch_size=16, seq_len=48, lr=3e-3, warmup=2),
        task=dict(train_size=2000, test_size=64),
        samples=8,
    ),
    "small": dict(
        model=dict(d_model=128, n_layers=4, n_heads=4),
        train=dict(steps=600, batch_size=64, seq_len=64, lr=3e-3, warmup=60),
        task=dict(train_size=10_000, test_size=500),
        samples=64,
    ),
    "paper": dict(  # Zuo's setting: 6 x 6 x 384, context 256, batch 256, 5000 iterations
        model=dict(d_model=384, n_layers=6, n_heads=6, dropout=0.2),
        train=dict(steps=5000, batch_size=256, seq_len=256, lr=2.6e-4, warmup=400),
        task=dict(train_size=10_000, test_size=1000),
        samples=512,
    ),
}


@dataclass(frozen=True)
class Settings:
    runs: dict[tuple[str, str], TrainRun]  # (task, pos_encoding) -> run
    analysis: AnalysisConfig


def settings(scale: str, seed: int, device: str) -> Settings:
    s = SCALES[scale]
    resolve_device(device)
    seq_len = s["train"]["seq_len"]
    train_cfg = TrainConfig(
        **s["train"],
        eval_every=s["train"]["steps"],
        checkpoint_every=s["train"]["steps"],
        seed=seed,
        device=device,
    )
    runs = {
        (task, pe): TrainRun(
            model=ModelConfig(**s["model"], max_seq_len=seq_len, pos_encoding=pe),
            train=train_cfg,
            task=TaskConfig(name=task, **s["task"]),
        )
        for task in TASKS
        for pe in POS_ENCODINGS
    }
    analysis = AnalysisConfig(
        seq_len=seq_len,
        samples=s["samples"],
        batch_size=min(s["samples"], 32),
        input="data",
        sites=SITES,
        seed=seed,
        device=device,
    )
    return Settings(runs, analysis)


def run(settings: Settings, out: Path) -> None:
    rows, accuracy, heatmaps = [], [], {}
    for (task, pe), train_run in settings.runs.items():
        result = train_and_analyze(f"{task}-{pe}", train_run, settings.analysis, out)
        rows += result.rows(task=task, pos_encoding=pe)
        accuracy.append(
            {
                "task": task,
                "pos_encoding": pe,
                "accuracy": result.summary["final_eval"]["accuracy"],
                "tokens_per_second": result.summary["tokens_per_second"],
            }
        )
        if pe == "none":
            for state, capture in (("init", result.init), ("trained", result.trained)):
                for (site, layer), stats in capture.sites.items():
                    if site == "attn_out":
                        heatmaps[f"{task} {state} L{layer}"] = stats.cosine

    scores = pd.DataFrame(rows)
    scores.to_parquet(out / "scores.parquet", index=False)
    accuracy_table = pd.DataFrame(accuracy)
    accuracy_table.to_parquet(out / "accuracy.parquet", index=False)
    write_json(out / "summary.json", {"accuracy": accuracy, "rows": rows})
    attn = scores[scores["site"] == "attn_out"]
    first = next(iter(settings.runs.values()))
    plots.cosine_heatmaps(
        heatmaps,
        out / "heatmaps.png",
        ncols=first.model.n_layers,
        title="NoPE attn_out cosine similarity, init and trained, per task and layer",
    )
    plots.trained_scores(attn, out / "scores.png")

    def cell(frame: pd.DataFrame) -> pd.Series:
        return pd.Series(
            [
                f"{m:.3f} ± {s:.3f}"
                for m, s in zip(frame["adjacency_mean"], frame["adjacency_std"], strict=True)
            ],
            index=frame.index,
        )

    order = pd.MultiIndex.from_product([TASKS, POS_ENCODINGS, ("init", "trained")])
    table = (
        attn.assign(score=cell(attn))
        .pivot(index=["task", "pos_encoding", "state"], columns="layer", values="score")
        .reindex(
            order.intersection(attn.set_index(["task", "pos_encoding", "state"]).index, sort=False)
        )
        .rename_axis(["task", "pos_encoding", "state"])
        .reset_index()
    )
    table.columns = [f"L{c}" if isinstance(c, int) else c for c in table.columns]
    acc = accuracy_table.pivot(index="task", columns="pos_encoding", values="accuracy")
    acc = acc.reindex(index=list(TASKS), columns=list(POS_ENCODINGS)).reset_index()
    m, t, a = first.model, first.train, settings.analysis
    (out / "summary.md").write_text(
        f"""# Zuo et al. 2025 — the adjacency pattern in trained models

Model: pre-LN, d = {m.d_model}, {m.n_heads} heads, {m.n_layers} layers, no biases, tied
embeddings, dropout {m.dropout}. Training: {t.steps} steps, batch {t.batch_size} packed sequences of
{t.seq_len} characters, AdamW lr {t.lr:g} (warm-up {t.warmup}, cosine decay), loss on answer tokens
only; seed {t.seed}. Analysis: {a.samples} held-out sequences of packed test lines.

## Test accuracy (exact match, greedy decoding)

{markdown_table(acc, ".3f")}

## Adjacency score of `attn_out` per layer, at init and after training

Mean ± std over samples; 0.5 = chance, 1 = perfect. Both states see the same held-out lines.

{markdown_table(table)}

Figures: `heatmaps.png` (NoPE, init and trained, every task and layer), `scores.png` (adjacency
per layer, init dashed and trained solid, per task and encoding). Tables: `accuracy.parquet`,
`scores.parquet` (also `resid_post` and the norm score), `summary.json`; every trained run, with its
metrics, checkpoint and both analyses, under `runs/TASK-ENCODING/`.
"""
    )
