"""What ``nopelab evaluate`` runs: a language model, its held-out tokens and the lengths it is
evaluated at, each checked against this machine's memory before any weight is read (a Hugging
Face model) or any output exists."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from nopelab.config import ModelConfig
from nopelab.encodings import encoding
from nopelab.errors import ConfigError, UserError
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


def hf_target(
    path: str,
    text: str,
    train_len: int | None,
    trust_remote_code: bool,
    asked: dict[str, Any],
) -> EvaluationTarget:
    """A Hugging Face model read as ``nopelab analyze hf:PATH`` reads it; everything is
    checked before its weights are read."""
    from nopelab.hf.load import TextWindows, load_model
    from nopelab.hf.sites import architecture

    checked: dict[str, Any] = {}

    def check(config: Any, tokenizer: Any) -> None:
        if tokenizer is None:
            raise ConfigError("model", f"{path} has no tokenizer; evaluate reads text with it")
        positions = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        length = train_len or positions
        if length is None:
            raise UserError(f"--train-len: {path} does not say how long its context is; give it")
        try:
            stream = TextWindows(tokenizer, text).stream
        except ConfigError as exc:  # load_text names the training flag
            raise UserError(f"--text: {exc.message}") from None
        table = None if architecture(config.model_type).rope else positions
        held_out = len(stream.val)
        window_bytes = _hf_window_bytes(config)
        plan = plan_lengths(length, held_out, window_bytes, table=table, **asked)
        checked.update(stream=stream, train_len=length, plan=plan)

    model, _, _ = load_model(path, trust_remote_code, check=check)
    return EvaluationTarget(model, checked["stream"], checked["train_len"], checked["plan"])


def _hf_window_bytes(config: Any) -> Callable[[int], int]:
    """The memory of one window's forward pass through a Hugging Face model, as
    :func:`~nopelab.limits.forward_bytes` counts a native one's; eager attention (not
    PyTorch's fused attention) holds a layer's attention matrix too."""
    d_model, heads = int(config.hidden_size), int(config.num_attention_heads)
    hidden = int(getattr(config, "intermediate_size", None) or 4 * d_model)  # GPT-2: 4d
    ratio = max(1, -(-hidden // d_model))
    shape = ModelConfig(vocab_size=config.vocab_size, d_model=d_model, n_heads=1, mlp_ratio=ratio)
    eager = getattr(config, "_attn_implementation", None) == "eager"

    def window_bytes(length: int) -> int:
        matrix = 4 * heads * length * length if eager else 0
        return forward_bytes(shape, 1, length) + matrix + 4 * length * config.vocab_size

    return window_bytes
