"""Shared by the trained-model parts: train a model, then analyse or probe it.

:func:`lm_runs` builds the byte-level language models on the embedded corpus that the
pretrained-LM parts compare (one per positional encoding, otherwise identical);
:func:`train_into` trains one run into ``out/runs/NAME``; :func:`train_and_analyze` also
analyses its initial and trained weights on the same held-out data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nopelab.analysis import analyze_model, build_model
from nopelab.capture import CaptureResult
from nopelab.config import AnalysisConfig, CorpusConfig, ModelConfig, RunConfig, TrainConfig
from nopelab.report import summary_rows, write_analysis
from nopelab.train import TrainRun, load_trained, make_source, train

PERPLEXITY_LENGTHS = ("perplexity", "perplexity_2x", "perplexity_4x")


def lm_runs(
    pos_encodings: tuple[str, ...],
    model: dict[str, Any],
    train_cfg: dict[str, Any],
    seed: int,
    device: str,
) -> dict[str, TrainRun]:
    """Byte-level language models on the embedded corpus, one per encoding, keyed by it.

    ``model`` and ``train_cfg`` hold a scale's ModelConfig and TrainConfig fields. Every model
    can take 4x the training length, so each is evaluated there too; a learned table's rows
    beyond the training length are never trained.
    """
    steps, seq_len = train_cfg["steps"], train_cfg["seq_len"]
    cfg = TrainConfig(
        **train_cfg,
        eval_every=max(1, steps // 4),
        checkpoint_every=steps,
        seed=seed,
        device=device,
    )
    return {
        pe: TrainRun(
            model=ModelConfig(**model, vocab_size=256, max_seq_len=4 * seq_len, pos_encoding=pe),
            train=cfg,
            corpus=CorpusConfig(source="default", tokenizer="byte"),
        )
        for pe in pos_encodings
    }


def perplexity_row(summary: dict[str, Any], **labels: Any) -> dict[str, Any]:
    """A text run's held-out perplexity at 1x, 2x and 4x the training length, and its speed."""
    final = summary["final_eval"]
    return {
        **labels,
        **{name: final.get(name) for name in PERPLEXITY_LENGTHS},
        "tokens_per_second": summary["tokens_per_second"],
    }


def train_into(name: str, run: TrainRun, out: Path) -> tuple[Path, dict[str, Any]]:
    """Train ``run`` into ``out/runs/NAME``; return that folder and the training summary."""
    folder = out / "runs" / name
    return folder, train(run, folder)


@dataclass
class Trained:
    """A trained run's summary and the statistics of its model at init and after training."""

    summary: dict[str, Any]
    init: CaptureResult
    trained: CaptureResult

    def rows(self, **labels: Any) -> list[dict[str, Any]]:
        """Summary rows of both states, labelled (``state`` is ``init`` or ``trained``)."""
        return [
            {**labels, "state": state, **row}
            for state, result in (("init", self.init), ("trained", self.trained))
            for row in summary_rows(result)
        ]


def train_and_analyze(name: str, run: TrainRun, analysis: AnalysisConfig, out: Path) -> Trained:
    """Train ``run`` into ``out/runs/NAME``; analyse its initial and trained weights on the
    same held-out data, writing both analyses beside the checkpoint."""
    folder, summary = train_into(name, run, out)
    source = make_source(run, folder)
    results = {}
    for state in ("init", "trained"):
        start = time.perf_counter()
        model = (
            build_model(run.model, run.train.seed)  # the weights training started from
            if state == "init"
            else load_trained(folder)[1]
        )
        results[state] = analyze_model(model, analysis, f"{name} {state}", source=source)
        (folder / f"analysis-{state}").mkdir()
        write_analysis(
            folder / f"analysis-{state}",
            RunConfig(run.model, analysis),
            results[state],
            time.perf_counter() - start,
            title=f"{name}, {state}",
            figures=False,
            random_init=state == "init",
        )
    return Trained(summary, results["init"], results["trained"])
