"""``nopelab evaluate``: held-out loss by position, and perplexity past the training length."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nopelab.cli import resolve
from nopelab.cli.app import ANALYSIS, HF, Force, Out, app
from nopelab.cli.options import Given, Group, with_options
from nopelab.config import MAX_SEED, AnalysisConfig, HFConfig
from nopelab.errors import ConfigError, UserError

if TYPE_CHECKING:
    from torch import nn

    from nopelab.measure.length import LengthPlan
    from nopelab.training.corpus import TokenStream

EVALUATION = "Evaluation"
ALLOWED = "comma-separated whole numbers >= 1 in increasing order (e.g. 1,2,4,8,16)"


@app.command()
@with_options(
    Group("analysis", AnalysisConfig, ANALYSIS, only=("batch_size", "device")),
    Group("hf", HFConfig, HF, only=("trust_remote_code",)),
)
def evaluate(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A training run directory of a language model trained on text, or hf:PATH, "
            "a Hugging Face model folder or .gguf file"
        ),
    ],
    lengths: Annotated[
        str,
        typer.Option(
            help="Comma-separated multiples of the training length to evaluate at",
            rich_help_panel=EVALUATION,
        ),
    ] = "1,2,4,8,16",
    windows: Annotated[
        int,
        typer.Option(
            min=1,
            help="Held-out windows per length (as many as the held-out text holds, up to this)",
            rich_help_panel=EVALUATION,
        ),
    ] = 8,
    buckets: Annotated[
        int,
        typer.Option(
            min=1, help="Log-spaced buckets of positions per length", rich_help_panel=EVALUATION
        ),
    ] = 32,
    seed: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_SEED,
            help="Seed of the choice of windows where the held-out text holds more than --windows",
            rich_help_panel=EVALUATION,
        ),
    ] = 0,
    text: Annotated[
        str,
        typer.Option(
            help="Held-out text: default (the corpus's held-out tail), a file or folder",
            rich_help_panel=HF,
        ),
    ] = "default",
    train_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The length the model was trained on \\[the config's max_position_embeddings]",
            show_default=False,
            rich_help_panel=HF,
        ),
    ] = None,
    out: Out = None,
    force: Force = False,
    *,
    given: Given,
) -> None:
    """Held-out loss by position and perplexity at multiples of the length a language model was
    trained on: a training run on text, or hf:PATH for a Hugging Face model."""
    from nopelab.measure.length import chosen_windows, position_loss, result_tables, write_result
    from nopelab.runtime.device import resolve_device
    from nopelab.runtime.progress import stage
    from nopelab.runtime.rundir import check_out, default_out, staged_run

    factors = parse_lengths(lengths)
    analysis = AnalysisConfig(**given.section("analysis"))
    device = resolve_device(analysis.device)
    out = out or default_out(f"evaluate-{Path(str(run_dir)).name}")
    check_out(out, force, resolve.inputs(run_dir))
    hf = resolve.hf_path(run_dir)
    asked = {"factors": factors, "windows": windows, "batch_size": analysis.batch_size}
    if hf is None:
        typed = given.flags("hf")
        typed[:0] = ["--train-len"] if train_len is not None else []
        typed[:0] = ["--text"] if text != "default" else []
        if typed:
            raise UserError(f"{typed[0]}: only applies to an hf:PATH model")
        target = _native(run_dir, asked)
    else:
        trust = bool(given.section("hf").get("trust_remote_code"))
        target = _hugging_face(hf, text, train_len, trust, asked)
    model = target.model.to(device).eval()
    settings = {
        "source": str(run_dir),
        "train_len": target.train_len,
        "lengths": list(factors),
        "windows": windows,
        "buckets": buckets,
        "seed": seed,
        "batch_size": analysis.batch_size,
        "device": str(device),
        **({"text": text} if hf else {}),
    }
    with staged_run(out, force, resolve.inputs(run_dir), command="evaluate") as staging:
        start, losses = time.perf_counter(), {}
        for plan in target.plan:
            stage(f"evaluate: {plan.factor}x ({plan.length} tokens), {plan.windows} windows")
            pairs = chosen_windows(target.stream, plan.length, plan.windows, seed)
            losses[plan] = position_loss(model, pairs, plan.length, plan.batch_size, device)
        seconds = time.perf_counter() - start
        stage("evaluate: writing tables, figure and summary")
        result = result_tables(losses, buckets)
        write_result(staging, result, settings, resolve.title(run_dir), seconds)
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` → ``(1, 2, 4)``, or a one-line error naming ``--lengths``."""
    try:
        factors = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"--lengths: expected {ALLOWED}; got {text!r}") from None
    if min(factors) < 1 or any(a >= b for a, b in itertools.pairwise(factors)):
        raise UserError(f"--lengths: expected {ALLOWED}; got {text!r}")
    return factors


@dataclass(frozen=True)
class Target:
    """A language model to evaluate, its held-out tokens and what to run at each length."""

    model: nn.Module
    stream: TokenStream
    train_len: int
    plan: list[LengthPlan]


def _native(run_dir: Path, asked: dict[str, Any]) -> Target:
    """A training run on text; a task run is refused. ``asked``: the lengths, windows and
    batch size, for :func:`~nopelab.measure.length.plan_lengths`."""
    from nopelab.limits import forward_bytes
    from nopelab.measure.length import plan_lengths
    from nopelab.training.run import read_run
    from nopelab.training.sources import TextSource
    from nopelab.training.train import load_trained, make_source

    run = read_run(run_dir)
    if run.task is not None:
        raise UserError(
            f"run: evaluate needs a language model trained on text; {run_dir} was trained on "
            f"the task {run.task.name}"
        )
    source = make_source(run, run_dir)
    assert isinstance(source, TextSource)  # a run without a task has a corpus
    cfg, train_len = run.model, run.train.seq_len
    scores = cfg.pos_encoding == "alibi"  # its bias is a T x T matrix

    def window_bytes(length: int) -> int:  # the forward pass and the loss's log-softmax
        return forward_bytes(cfg, 1, length, scores) + 4 * length * cfg.vocab_size

    table = cfg.max_seq_len if cfg.pos_encoding == "learned" else None
    held_out = len(source.stream.val)
    plan = plan_lengths(train_len, held_out, window_bytes, table=table, **asked)
    _, model = load_trained(run_dir)
    return Target(model, source.stream, train_len, plan)


def _hugging_face(
    path: str,
    text: str,
    train_len: int | None,
    trust_remote_code: bool,
    asked: dict[str, Any],
) -> Target:
    """A Hugging Face model read as ``nopelab analyze hf:PATH`` reads it; everything is
    checked before its weights are read."""
    from nopelab.hf.load import TextWindows, load_model
    from nopelab.hf.sites import architecture
    from nopelab.measure.length import plan_lengths

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
    return Target(model, checked["stream"], checked["train_len"], checked["plan"])


def _hf_window_bytes(config: Any) -> Callable[[int], int]:
    """The memory of one window's forward pass through a Hugging Face model, as
    :func:`~nopelab.limits.forward_bytes` counts a native one's; eager attention (not
    PyTorch's fused attention) holds a layer's attention matrix too."""
    from nopelab.config import ModelConfig
    from nopelab.limits import forward_bytes

    d_model, heads = int(config.hidden_size), int(config.num_attention_heads)
    hidden = int(getattr(config, "intermediate_size", None) or 4 * d_model)  # GPT-2: 4d
    ratio = max(1, -(-hidden // d_model))
    shape = ModelConfig(vocab_size=config.vocab_size, d_model=d_model, n_heads=1, mlp_ratio=ratio)
    eager = getattr(config, "_attn_implementation", None) == "eager"

    def window_bytes(length: int) -> int:
        matrix = 4 * heads * length * length if eager else 0
        return forward_bytes(shape, 1, length) + matrix + 4 * length * config.vocab_size

    return window_bytes
