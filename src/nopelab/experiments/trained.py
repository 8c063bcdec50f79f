"""Shared by the trained-model parts: train a model, then analyse or probe it.

:func:`lm_runs` builds the byte-level language models on the embedded corpus that the
pretrained-LM parts compare (one per positional encoding, otherwise identical);
:func:`train_into` trains one run into ``out/runs/NAME`` (continuing an interrupted one, and
reading a finished one's summary instead of training again); :func:`train_many` trains several,
in parallel single-thread processes on the CPU; :func:`analyze_trained` analyses a trained
run's initial and trained weights on the same held-out data.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nopelab.config import AnalysisConfig, CorpusConfig, ModelConfig, RunConfig, TrainConfig
from nopelab.measure.analysis import analyze_model, build_model
from nopelab.measure.capture import CaptureResult
from nopelab.measure.report import summary_rows, write_analysis
from nopelab.training.checkpoint import STATE_FILE
from nopelab.training.train import TrainRun, load_trained, make_source, train

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
    """Train ``run`` into ``out/runs/NAME``; return that folder and the training summary.

    A folder that already holds the finished run is read, not retrained; one with a checkpoint
    continues from it (a resumed run retraces the uninterrupted one exactly).
    """
    folder = out / "runs" / name
    if (folder / "summary.json").is_file():
        return folder, json.loads((folder / "summary.json").read_text())
    resume = (folder / STATE_FILE).is_file()
    started = folder.is_dir() and any(folder.iterdir())  # stopped before its first checkpoint
    summary = train(run, folder, resume=resume, force=started and not resume, label=name)
    assert summary is not None
    return folder, summary


def _train_one_thread(name: str, run: TrainRun, out: Path) -> tuple[Path, dict[str, Any]]:
    torch.set_num_threads(1)
    return train_into(name, run, out)


def train_many(
    runs: dict[str, TrainRun], out: Path, workers: int
) -> dict[str, tuple[Path, dict[str, Any]]]:
    """:func:`train_into` for every run, by name. With ``workers`` > 1 they train in that many
    processes of one thread each (small models on a CPU train faster side by side than one
    after another with all threads); the results do not depend on ``workers``' value > 1. An
    error or interrupt stops every process; finished models and checkpoints stay."""
    if workers <= 1:
        return {name: train_into(name, run, out) for name, run in runs.items()}
    pool = multiprocessing.get_context("spawn").Pool(workers)
    try:
        pending = {
            name: pool.apply_async(_train_one_thread, (name, run, out))
            for name, run in runs.items()
        }
        results = {name: result.get() for name, result in pending.items()}
    except BaseException:  # an error, Ctrl-C or SIGTERM: stop the other models at once
        pool.terminate()
        raise
    finally:
        pool.close()
        pool.join()
    return results


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
    """Train ``run`` into ``out/runs/NAME``, then :func:`analyze_trained` it."""
    folder, summary = train_into(name, run, out)
    return analyze_trained(name, run, folder, summary, analysis)


def analyze_trained(
    name: str, run: TrainRun, folder: Path, summary: dict[str, Any], analysis: AnalysisConfig
) -> Trained:
    """Analyse a trained run's initial and trained weights on the same held-out data, writing
    both analyses beside its checkpoint (replacing earlier ones)."""
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
        (folder / f"analysis-{state}").mkdir(exist_ok=True)
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
