"""A training run's folder read back: its trained model and its data.

Everything that uses a trained run (analyses, probes, interventions, length evaluation, the
papers' parts) reads it through these two, below the training loop itself.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nopelab.errors import UserError
from nopelab.models.transformer import Transformer
from nopelab.training.checkpoint import STATE_FILE, load_checkpoint
from nopelab.training.run import TrainRun, read_run
from nopelab.training.sources import Source, TaskSource, TextSource, load_tokenizer


def make_source(run: TrainRun, out: Path | None = None) -> Source:
    """The run's data, checked against the model. ``out``: reuse a saved tokenizer."""
    source: TaskSource | TextSource
    if run.task is not None:
        source = TaskSource(run.task, run.train.seed, run.train.eval_samples)
    else:
        assert run.corpus is not None  # TrainRun: a task or a corpus
        tokenizer = load_tokenizer(out) if out is not None else None
        source = TextSource(run.corpus, run.train.eval_tokens, tokenizer)
    source.check_model(run.model, run.train.seq_len)
    return source


def load_trained(out: Path, device: torch.device | None = None) -> tuple[TrainRun, Transformer]:
    """A trained model and its configuration, from a run directory."""
    run = read_run(out)
    if not (out / STATE_FILE).is_file():
        raise UserError(f"run: {out} holds no checkpoint yet")
    model = Transformer(run.model)
    load_checkpoint(out, model)
    for name, weight in model.state_dict().items():
        if not weight.isfinite().all():
            raise UserError(f"run: {out} holds non-finite weights (NaN or inf) in {name}")
    return run, model.to(device or "cpu").eval()
