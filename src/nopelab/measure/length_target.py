"""What ``nopelab evaluate`` runs: a language model, its held-out tokens and the lengths it is
evaluated at, each checked against this machine's memory before any weight is read (a Hugging
Face model) or any output exists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from nopelab.encodings import encoding
from nopelab.errors import UserError
from nopelab.limits import forward_bytes
from nopelab.measure.length import LengthPlan, plan_lengths
from nopelab.training.corpus import TokenStream
from nopelab.training.run import read_run
from nopelab.training.sources import TextSource
from nopelab.training.trained import load_trained, make_source


@dataclass(frozen=True)
class EvaluationTarget:
    """A language model to evaluate, its held-out tokens and what to run at each length."""

    model: nn.Module
    stream: TokenStream
    train_len: int
    plan: list[LengthPlan]


def native_target(run_dir: Path, asked: dict[str, Any]) -> EvaluationTarget:
    """A training run on text; a task run is refused. ``asked``: the lengths, windows and
    batch size, for :func:`~nopelab.measure.length.plan_lengths`."""
    run = read_run(run_dir)
    if run.task is not None:
        raise UserError(
            f"run: evaluate needs a language model trained on text; {run_dir} was trained on "
            f"the task {run.task.name}"
        )
    if run.corpus is not None and run.corpus.objective == "masked":
        raise UserError(
            f"run: evaluate measures a causal language model's next-token loss; {run_dir} is a "
            "masked LM"
        )
    source = make_source(run, run_dir)
    assert isinstance(source, TextSource)  # a run without a task has a corpus
    cfg, train_len = run.model, run.train.seq_len
    scores = encoding(cfg.pos_encoding).scores  # a bias is a T x T matrix

    def window_bytes(length: int) -> int:  # the forward pass and the loss's log-softmax
        return forward_bytes(cfg, 1, length, scores) + 4 * length * cfg.vocab_size

    table = cfg.max_seq_len if encoding(cfg.pos_encoding).table else None
    held_out = len(source.stream.val)
    plan = plan_lengths(train_len, held_out, window_bytes, table=table, **asked)
    _, model = load_trained(run_dir)
    return EvaluationTarget(model, source.stream, train_len, plan)
