"""Shared by the trained-model parts: train a model, then analyse it before and after training."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nopelab.analysis import analyze_model, build_model
from nopelab.capture import CaptureResult
from nopelab.config import AnalysisConfig, RunConfig
from nopelab.report import summary_rows, write_analysis
from nopelab.train import TrainRun, load_trained, make_source, train


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
    folder = out / "runs" / name
    summary = train(run, folder)
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
