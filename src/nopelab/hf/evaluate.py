"""What ``nopelab evaluate hf:PATH`` runs: a Hugging Face language model, held-out text through
its tokenizer and the lengths it is evaluated at, checked against this machine's memory before
any weight is read (a native run's counterpart: :mod:`nopelab.measure.length_target`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nopelab.config import ModelConfig
from nopelab.errors import ConfigError, UserError
from nopelab.limits import forward_bytes
from nopelab.measure.length import plan_lengths
from nopelab.measure.length_target import EvaluationTarget


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
